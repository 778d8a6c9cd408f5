"""Draft trees through the Triton backend (the split-K kernel with the tree mask; the interpreter on the CPU): a
tree's forward equals the reference backend's, and a tree engine on the Triton backend emits dense greedy's tokens."""

from __future__ import annotations

import os

if os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the Triton kernels need the optional 'triton' package")

from specdec import PipelineConfig, build_engine  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.tree import DraftTree  # noqa: E402

from conftest import make_tiny  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu",
                                reason="the tiny model runs on the CPU")

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=2)


def _backend():
    return TritonBackend(TritonConfig(block_n=16, num_splits=3))


@pytest.mark.parametrize("tree", [DraftTree.default(), DraftTree([(0,), (1,), (0, 0)], lookup=5)])
def test_tree_forward_matches_reference(target, tree):
    B, L0 = 2, 21
    ctx = torch.tensor([list(range(3, 3 + L0)), [(7 * i) % 90 + 4 for i in range(L0)]])
    rows = torch.randint(4, 90, (B, tree.nodes + 1), generator=torch.Generator().manual_seed(5))
    G = target.dims.n_heads // target.dims.n_kv_heads
    assert (tree.nodes + 1) * G <= TritonConfig().max_packed_rows  # the kernel's path, not the torch fall-back

    def run():
        cache = target.new_cache(B, 64)
        target.forward(ctx, cache, torch.zeros(B, dtype=torch.long))
        logits = target.forward(rows, cache, torch.full((B,), L0), tree=tree)
        return logits, cache.k[:, :, :, : L0 + tree.nodes + 1].clone()

    want, k_want = run()
    with target.using_backend(_backend()):
        got, k_got = run()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(k_got, k_want, rtol=1e-5, atol=1e-5)


def test_tree_engine_on_triton_emits_dense_tokens(target):
    """A lookup drafter over an oracle tree drafter (dense greedy's tokens on the (1, 0, 0, 0) branch, wrong ones
    elsewhere; the head's role is not under test here): with the tree verified through the kernel, the branch is
    accepted whole every round and the tokens are dense greedy's."""
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from test_tree import _Oracle

    dense = build_engine(target, PipelineConfig.make(method="dense"), eos_token_id=-1)
    want = dense.generate(PROMPTS, 20).tokens
    truth = [p + w for p, w in zip(PROMPTS, want)]
    with target.using_backend(_backend()):
        eng = SpeculativeEngine(target, LookupDrafter(_Oracle(truth, (1, 0, 0, 0)), 1, 3), tree=True, eos_token_id=-1)
        res = eng.generate(PROMPTS, 20)
    assert res.tokens == want
    assert res.stats.mean_accepted_length == pytest.approx(5.0)  # 1 + 4 x 5 = 20 + 1 (the branch accepted whole)
