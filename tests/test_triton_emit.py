"""The emission's device side in one Triton launch (``specdec.cuda.triton_emit``, here under the interpreter): the
same state as the torch operations (``specdec.engine.emit_update_torch``) on random emissions, and an engine that
emits through the kernel gives the same tokens, EOS and ``max_new_tokens`` included."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEV = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEV == "cpu" and not INTERPRETED, reason="Triton on the CPU needs TRITON_INTERPRET=1")

from conftest import make_tiny  # noqa: E402
from specdec import PipelineConfig, build_engine  # noqa: E402
from specdec import engine as engine_mod  # noqa: E402
from specdec.cuda.triton_emit import emit_update  # noqa: E402
from specdec.engine import emit_update_torch  # noqa: E402


@pytest.mark.parametrize("g", [0, 1, 4, 7])
@pytest.mark.parametrize("n_eos", [0, 1, 3])
@pytest.mark.parametrize("advance", [True, False])
def test_kernel_equals_the_torch_rule(g, n_eos, advance):
    gen = torch.Generator().manual_seed(100 * g + 10 * n_eos + advance)
    B, V, max_new = 37, 12, 9
    for _ in range(3):
        n_acc = torch.randint(0, g + 1, (B,), generator=gen)
        nxt = torch.randint(0, V, (B,), generator=gen)
        drafts = torch.randint(0, V, (B, g), generator=gen) if g else None
        active = torch.rand(B, generator=gen) < 0.8
        produced = torch.randint(0, max_new, (B,), generator=gen)  # some sequences one token from their limit
        lengths = torch.randint(10, 50, (B,), generator=gen)
        pending = torch.randint(0, V, (B,), generator=gen)
        eos = torch.randperm(V, generator=gen)[:n_eos]
        ref = [t.clone() for t in (active, produced, lengths, pending)]
        emit_update_torch(n_acc, nxt, drafts, *ref, eos, max_new, advance)
        got = [t.clone().to(DEV) for t in (active, produced, lengths, pending)]
        on = [None if t is None else t.to(DEV) for t in (n_acc, nxt, drafts, eos)]
        emit_update(on[0], on[1], on[2], *got, on[3], max_new, advance)
        for name, r, k in zip(("active", "produced", "lengths", "pending"), ref, got):
            assert torch.equal(r, k.cpu()), name
        assert not torch.equal(ref[0], active) or not torch.equal(ref[1], produced)  # the case changed something


@pytest.mark.skipif(not INTERPRETED, reason="forces the kernel on the CPU model (a CUDA engine uses it by itself)")
def test_engine_emitting_through_the_kernel_gives_the_same_tokens(monkeypatch):
    """MagicDec with two EOS ids that end sequences mid-draft and a limit that cuts others: the kernel's state
    equals the host's rule (the engine checks every iteration) and the tokens equal the torch path's."""
    m = make_tiny("llama", seed=5)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7, [9, 9, 2] * 5]
    free = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 14).tokens
    eos = [free[0][5], free[1][9]]
    cfg = PipelineConfig.make(method="magicdec", gamma=4, budget=12, sinks=2, recent=4, adaptive=False)
    want = build_engine(m, cfg, eos_token_id=eos).generate(prompts, 14).tokens
    calls = []

    def kernel(*a):
        calls.append(1)
        return emit_update(*a)

    monkeypatch.setattr(engine_mod, "emit_update", kernel)
    got = build_engine(m, cfg, eos_token_id=eos).generate(prompts, 14).tokens
    assert calls and got == want
    assert [len(t) for t in got] != [14] * 3  # some sequence ended at an EOS
