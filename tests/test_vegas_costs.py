"""Vegas' own costs (issue 14): its scores live in one buffer the plan graph reads in place."""

from __future__ import annotations

import pytest
import torch

from specdec import SELECTORS, KVCache
from specdec.graphs import CapturedCall, PlanGraphs, has_stable_address, keep_address
from specdec.interfaces import ScoreRequest
from specdec.planner import planner_for


def _request(N, B, H, L, seed):
    g = torch.Generator().manual_seed(seed)
    req = ScoreRequest(rows=[0, 4], kind="softmax", heads="group")
    req.scores = {layer: torch.rand(B, H, L, generator=g) for layer in range(N)}
    return req


@pytest.mark.parametrize("spread", [0, 8])
@pytest.mark.parametrize("per_kv_head", [False, True])
def test_scores_land_in_one_buffer_with_the_head_sum(per_kv_head, spread):
    from specdec.selectors.verification_guided import spread_forward

    sel = SELECTORS.build("collect2", budget=8, per_kv_head=per_kv_head, spread=spread)
    addr = None
    for seed in range(3):
        req = _request(3, 2, 2, 32, seed)
        sel.on_verify(req, torch.tensor([20, 30]))
        want = torch.stack([req.scores[i] for i in range(3)])  # (N, B, H, L)
        if not per_kv_head:
            want = want.sum(2, keepdim=True)
        if spread:  # the head sums (or each KV head's scores), spread forward
            want = spread_forward(want, spread)
        torch.testing.assert_close(sel._scores, want, rtol=0, atol=1e-6)
        assert has_stable_address(sel._scores)
        assert addr is None or sel._scores.data_ptr() == addr  # same memory every iteration
        addr = sel._scores.data_ptr()
    sel.on_verify(None, torch.tensor([21, 31]))
    assert sel._scores is None  # no scores: recency, as before


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
def test_captured_call_reads_stable_inputs_in_place():
    calls = CapturedCall()
    a = keep_address(torch.arange(4.0, device="cuda"))
    b = torch.ones(4, device="cuda")
    out = calls("k", lambda x, y: x * 2 + y, a, b)
    torch.testing.assert_close(out, torch.tensor([1.0, 3, 5, 7], device="cuda"))
    (_, statics, _, _), = calls.graphs.values()
    assert statics[0] is a and statics[1] is not b  # the stable one in place, the other copied in
    a.fill_(1.0)  # written where the graph reads it: no copy needed
    out = calls("k", lambda x, y: x * 2 + y, a, b + 1)
    torch.testing.assert_close(out, torch.full((4,), 4.0, device="cuda"))
    assert calls.captures == 1 and calls.replays == 1


@pytest.mark.gpu
@gpu
def test_vegas_plan_graph_reads_the_score_buffer_in_place():
    cache = KVCache(3, 2, 2, 64, 8, device="cuda")
    sel = SELECTORS.build("collect2", budget=16, sinks=2, recent=4)
    sel.reset(cache)
    planner = planner_for(cache)
    for seed in range(3):
        req = _request(3, 2, 2, 64, seed)
        req.scores = {k: v.cuda() for k, v in req.scores.items()}
        L = torch.tensor([30 + seed, 40 + seed], device="cuda")
        sel.on_verify(req, L)
        got = planner.plan(sel, L)
        want = sel.plan(cache, L)
        assert torch.equal(got.indices, want.indices)
    pg = planner.plan_graphs
    assert pg.captures == 1 and pg.replays == 2
    (_, statics, _, _), = pg.calls.graphs.values()
    assert any(s is sel._scores for s in statics)  # the ~63 MB (B = 64 x 8k) tensor is not copied per call
    assert isinstance(pg, PlanGraphs)
