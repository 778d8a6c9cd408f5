"""``specdec.selectors.base.TRITON_SELECT``: the plan's top-k in one Triton launch (here under the interpreter).

Per (layer, sequence, head) row the picked positions equal ``torch.topk``'s cut to the sequence's room (as sets),
slots past the room are -1, ties at the threshold go to the lowest positions, and greedy Vegas emits dense's tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEV = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEV == "cpu" and not INTERPRETED, reason="Triton on the CPU needs TRITON_INTERPRET=1")

from conftest import make_tiny  # noqa: E402
from specdec import SELECTORS, KVCache, PipelineConfig, build_engine  # noqa: E402
from specdec.cuda.triton_select import select_top  # noqa: E402
from specdec.interfaces import ScoreRequest  # noqa: E402
from specdec.selectors import base  # noqa: E402


def _plans(monkeypatch, per_kv_head: bool, lengths: list[int]):
    N, B, H, L = 3, len(lengths), 2, 200
    cache = KVCache(N, B, H, L, 8, torch.float32, torch.device(DEV))
    sel = SELECTORS.build("collect2", budget_ratio=0.3, sinks=2, recent=4, per_kv_head=per_kv_head)
    sel.reset(cache)
    assert sel.max_selected(L) == 54  # top-k picks beyond sinks and the recent window
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    g = torch.Generator().manual_seed(3)
    req.scores = dict(enumerate(torch.rand(N, B, H, L, generator=g).to(DEV).unbind(0)))
    lens = torch.tensor(lengths, device=DEV)
    sel.on_verify(req, lens)
    out = {}
    for flag in (False, "always"):
        monkeypatch.setattr(base, "TRITON_SELECT", flag)
        out[flag] = sel.plan(cache, lens).indices
    return out


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_triton_select_picks_the_same_sets(monkeypatch, per_kv_head):
    p = _plans(monkeypatch, per_kv_head, [200, 150, 90, 37, 7])
    want, got = p[False], p["always"]
    assert want.shape == got.shape == (3, 5, 2 if per_kv_head else 1, 60)
    assert (want == -1).sum() > 0  # short sequences leave slots empty
    torch.testing.assert_close(got.sort(-1).values, want.sort(-1).values, rtol=0, atol=0)


def test_select_top_ties_and_room():
    s = torch.tensor([[1.0, 5.0, 3.0, 5.0, 3.0, 3.0, float("-inf"), 0.5]]).view(1, 1, 1, 8).to(DEV)
    room = torch.tensor([4], device=DEV)
    # 5, 5, then two of the three 3s: the lowest positions (2, 4); in position order; -1 past the room
    assert select_top(s, 6, room).view(-1).tolist() == [1, 2, 3, 4, -1, -1]
    assert select_top(s, 6, torch.tensor([0], device=DEV)).view(-1).tolist() == [-1] * 6
    assert select_top(s, 3, torch.tensor([9], device=DEV)).view(-1).tolist() == [1, 2, 3]  # room capped at k_sel
    with pytest.raises(ValueError, match="contiguous float32"):
        select_top(s.double(), 6, room)


def test_triton_select_greedy_vegas_equals_dense(monkeypatch):
    m = make_tiny("llama")
    m.hf.to(DEV)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    want = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    monkeypatch.setattr(base, "TRITON_SELECT", "always")
    cfg = PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3)
    assert build_engine(m, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens == want
