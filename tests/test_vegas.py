"""Vegas selectors on hand-made scores, score collection (per-row, modes), presets and real-model parity."""

import pytest
import torch

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine
from specdec.errors import SpecdecError
from specdec.interfaces import ScoreRequest
from specdec.observations import overlap_vs_distance, recall_of_future_rows
from specdec.presets import PipelineConfig, build_engine, method_names
from specdec.selectors.verification_guided import (Collect2Query, VerificationGuidedSelector, collected_rows,
                                                   spread_forward)

from conftest import make_tiny, real_prompts


def _request(sel, gamma, scores):
    """A filled ScoreRequest as the verify pass would return it: ``scores`` ``{layer: tensor}``."""
    req = sel.score_request(gamma)
    req.scores = scores
    return req


def test_collected_rows():
    assert collected_rows("all", 4) == [0, 1, 2, 3, 4]
    assert collected_rows("collect2", 4) == [0, 4]
    assert collected_rows("collect2", 1) == [0, 1]
    assert collected_rows("last", 3) == [0, 1, 2, 3]
    with pytest.raises(SpecdecError, match="rows"):
        collected_rows("first", 3)


def test_request_matches_mode():
    assert Collect2Query().score_request(6).rows == [0, 6]
    r = SELECTORS.build("verification_guided", rows="last", score_kind="logits").score_request(3)
    assert r.per_row and r.kind == "logits" and list(r.rows) == [0, 1, 2, 3]


def test_default_score_kind():
    """``sink_softmax`` is the default (H200, 2026-12-01: 1.456x dense vs 1.412x for exact softmax at the
    same tau); ``rows='last'`` keeps its rows apart, so there the default is ``softmax``; explicit kinds stay."""
    assert Collect2Query().score_request(4).kind == "sink_softmax"
    assert SELECTORS.build("verification_guided", rows="all").score_request(4).kind == "sink_softmax"
    last = SELECTORS.build("verification_guided", rows="last")
    assert last.config.score_kind == "softmax" and last.score_request(3).kind == "softmax"
    for kind in ("logits", "softmax"):
        assert SELECTORS.build("collect2", score_kind=kind).score_request(4).kind == kind
        assert SELECTORS.build("verification_guided", rows="last", score_kind=kind).config.score_kind == kind


def test_topk_on_handmade_scores_per_layer():
    """Two layers, one sequence of 40 tokens: sinks 2 + recent 4 + the 4 best-scored positions."""
    sel = SELECTORS.build("verification_guided", budget=10, sinks=2, recent=4, spread=0)
    lengths = torch.tensor([40])
    sel.on_verify(None, lengths)
    s0 = torch.zeros(1, 3, 64)
    s0[0, 0, [10, 11, 12, 13]] = 5.0  # head 0 likes 10..13
    s0[0, 2, [20, 0, 38]] = 9.0       # a sink and a recent position score high: never counted twice
    s1 = torch.zeros(1, 3, 64)
    s1[0, 1, [30, 31, 32, 33, 34]] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    sel.on_verify(_request(sel, 3, {0: s0, 1: s1}), lengths)
    plan = sel.plan(None, lengths)
    assert plan.indices.shape[:3] == (2, 1, 1)
    l0 = set(plan.indices[0, 0, 0].tolist()) - {-1}
    l1 = set(plan.indices[1, 0, 0].tolist()) - {-1}
    fixed = {0, 1, 36, 37, 38, 39}
    # 4 slots: 20 (score 9), then three of the tied 10..13 (which three is topk's tie-break)
    assert len(l0) == 10 and fixed | {20} <= l0 and len(l0 - fixed - {20}) == 3 and l0 - fixed - {20} <= {10, 11, 12, 13}
    assert 20 in l0 and l1 == fixed | {31, 32, 33, 34}
    assert int((plan.indices >= 0).sum(-1).max()) == 10
    assert torch.equal(plan.dense_from, lengths)


def test_per_kv_head_selection():
    sel = SELECTORS.build("verification_guided", budget=4, sinks=0, recent=0, per_kv_head=True, spread=0)
    lengths = torch.tensor([30])
    sel.on_verify(None, lengths)
    s = torch.zeros(1, 2, 32)
    s[0, 0, [1, 2, 3, 4]] = 1.0
    s[0, 1, [5, 6, 7, 8]] = 1.0
    s[0, 0, 31] = 100.0  # beyond the verified length: never selected
    sel.on_verify(_request(sel, 2, {0: s}), lengths)
    idx = sel.plan(None, lengths).indices  # (1, 1, 2, 4)
    assert idx.shape == (1, 1, 2, 4)
    assert set(idx[0, 0, 0].tolist()) == {1, 2, 3, 4} and set(idx[0, 0, 1].tolist()) == {5, 6, 7, 8}


def test_last_mode_keeps_the_last_accepted_row():
    """Batch of 2: sequence 0 accepted 2 drafts (row 2), sequence 1 none (row 0)."""
    sel = SELECTORS.build("verification_guided", budget=2, sinks=0, recent=0, rows="last", spread=0)
    old = torch.tensor([20, 20])
    sel.on_verify(None, old)
    s = torch.zeros(2, 1, 4, 32)  # (B, H_kv, R = γ+1, L)
    for r in range(4):
        s[:, 0, r, [2 * r, 2 * r + 1]] = 1.0
    req = _request(sel, 3, {0: s})
    new = old + torch.tensor([3, 1])
    sel.on_verify(req, new)
    idx = sel.plan(None, new).indices[0, :, 0]
    assert set(idx[0].tolist()) == {4, 5} and set(idx[1].tolist()) == {0, 1}


def test_spread_forward():
    s = torch.tensor([[0.0, 5.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    assert spread_forward(s, 2).tolist() == [[0.0, 5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 0.0]]
    assert torch.equal(spread_forward(s, 0), s)
    logits = torch.tensor([[-3.0, -1.0, -2.0, -5.0]])  # logits may be negative: the padding is -inf, not 0
    assert spread_forward(logits, 1).tolist() == [[-3.0, -1.0, -1.0, -2.0]]


def test_spread_keeps_the_entries_after_an_attended_one():
    """``spread`` (default 8): one hot position and a weaker cluster elsewhere; the plan keeps the hot position and
    the ``spread`` after it (the text a draft reads next when it follows it), also per KV head; ``spread=0`` is the
    paper's plain top-k (the hot position, then the cluster). Nothing at or past the length is picked."""
    lengths = torch.tensor([60])

    def plan(hot=10, **kw):
        sel = SELECTORS.build("verification_guided", budget=6, sinks=0, recent=0, **kw)
        sel.on_verify(None, lengths)
        s = torch.zeros(1, 2, 64)
        s[0, 0, hot] = 9.0                           # the attended entry (head 0)
        s[0, 1, [40, 41, 42, 43, 44, 45]] = 2.0      # a weaker cluster (head 1)
        sel.on_verify(_request(sel, 3, {0: s}), lengths)
        idx = sel.plan(None, lengths).indices
        return [set(idx[0, 0, h].tolist()) - {-1} for h in range(idx.shape[2])]

    assert Collect2Query().config.spread == 8
    assert plan(spread=5) == [{10, 11, 12, 13, 14, 15}]
    plain = plan(spread=0)[0]
    assert len(plain) == 6 and 10 in plain and plain - {10} <= {40, 41, 42, 43, 44, 45}
    kv = plan(spread=5, per_kv_head=True)  # each KV head spreads its own scores
    assert kv[0] == {10, 11, 12, 13, 14, 15} and len(kv[1]) == 6 and kv[1] <= set(range(40, 51))
    near_end = plan(hot=57, spread=5)[0]   # 57..62 score 9: only 57..59 are cached
    assert {57, 58, 59} <= near_end and max(near_end) < 60


def test_first_plan_falls_back_to_recency():
    sel = Collect2Query(Collect2Query.Config(budget=6, sinks=2, recent=2))
    lengths = torch.tensor([50])
    sel.on_verify(None, lengths)
    assert set(sel.plan(None, lengths).indices.flatten().tolist()) == {0, 1, 46, 47, 48, 49}


def test_budget_ratio_with_floor():
    sel = SELECTORS.build("collect2", budget_ratio=0.05, min_budget=12, sinks=2, recent=2)
    lengths = torch.tensor([100, 1000])
    assert sel.config.budget_for(lengths).tolist() == [12, 50]
    with pytest.raises(SpecdecError, match="score_kind"):
        SELECTORS.build("collect2", score_kind="probs")
    with pytest.raises(SpecdecError, match="sink_softmax.*rows='last'"):
        SELECTORS.build("verification_guided", rows="last", score_kind="sink_softmax")


def test_per_row_scores_match_summed_scores():
    """ScoreRequest(per_row=True) returns the rows separately; their sum equals the summed request."""
    model = make_tiny("llama", seed=1)
    cache = model.new_cache(2, 64)
    lengths = torch.tensor([20, 33])
    model.forward(torch.randint(0, 96, (2, 33)), cache, torch.zeros(2, dtype=torch.long))
    x = torch.randint(0, 96, (2, 4))
    for kind in ("logits", "softmax"):
        a = ScoreRequest(rows=[0, 2, 3], kind=kind)
        b = ScoreRequest(rows=[0, 2, 3], kind=kind, per_row=True)
        model.forward(x, cache, lengths, scores=a)
        model.forward(x, cache, lengths, scores=b)
        for layer in a.scores:
            assert b.scores[layer].shape == (2, 2, 3, 64)
            torch.testing.assert_close(b.scores[layer].sum(2), a.scores[layer], rtol=1e-5, atol=1e-5)
        single = ScoreRequest(rows=[2], kind=kind)
        model.forward(x, cache, lengths, scores=single)
        torch.testing.assert_close(b.scores[0][:, :, 1], single.scores[0], rtol=1e-5, atol=1e-5)


def test_observation_helpers():
    s = torch.zeros(1, 1, 5, 10)
    for r in range(5):
        s[0, 0, r, r : r + 3] = 1.0  # row r attends r..r+2: sets drift by one per row
    ov = overlap_vs_distance(s, 3, 4)
    assert ov[1] == pytest.approx(2 / 3) and ov[3] == 0.0
    rec = recall_of_future_rows(s.softmax(-1), 3, 1)
    assert rec["oracle"] >= rec["all"] - 1e-6 and rec["oracle"] >= rec["last"] - 1e-6


def test_presets_registered_and_option_clash():
    model = make_tiny("qwen2", seed=3)
    for name in ("vegas", "vegas-all", "vegas-last", "quest"):
        assert name in method_names()
        eng = build_engine(model, PipelineConfig.make(method=name, gamma=3, budget=8, sinks=2, recent=2))
        assert eng.method == name
    with pytest.raises(SpecdecError, match="rows"):
        build_engine(model, PipelineConfig.make(method="vegas", options={"rows": "all"}))


@pytest.mark.parametrize("rows,kind", [(r, k) for r in ("all", "collect2", "last") for k in ("logits", "softmax")]
                         + [("collect2", "sink_softmax"), ("all", "sink_softmax")])
def test_modes_lossless_tiny(rows, kind):
    model = make_tiny("llama", seed=5)
    prompts = [list(range(3, 70)), [5, 9, 2] * 15]
    ref = SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=12).tokens
    sel = SELECTORS.build("verification_guided", budget=12, sinks=2, recent=3, rows=rows, score_kind=kind,
                          per_kv_head=(kind == "logits"))
    res = SpeculativeEngine(model, SparseSelfDrafter(model, sel), gamma=4, eos_token_id=-1).generate(prompts, max_new_tokens=12)
    assert res.tokens == ref


@pytest.mark.slow
def test_real_model_greedy_equals_dense(smol):
    """vegas, vegas-all and quest reproduce dense greedy decoding on a ~1k-token real prompt."""
    ids = real_prompts(smol.tokenizer, 1000, count=2)[1]  # standard-library source
    dense = build_engine(smol, PipelineConfig.make(method="dense"), eos_token_id=-1)
    pre = dense.prefill([ids])
    ref = dense.generate([ids], max_new_tokens=24, prefilled=pre).tokens
    for name in ("vegas", "vegas-all", "quest"):
        eng = build_engine(smol, PipelineConfig.make(method=name, gamma=4, budget_ratio=0.05), eos_token_id=-1)
        res = eng.generate([ids], max_new_tokens=24, prefilled=pre)
        assert res.tokens == ref, name
        assert res.stats.mean_accepted_length > 1.0


def test_score_every_skips_requests_and_keeps_scores():
    """``score_every=2``: every other verification asks for no scores and the plan reuses the last ones;
    still lossless (scores only steer which positions the drafter reads)."""
    sel = SELECTORS.build("collect2", budget=12, sinks=2, recent=3, score_every=2)
    model = make_tiny("llama", seed=5)
    cache = model.new_cache(1, 64)
    sel.reset(cache)
    lengths = torch.tensor([40])
    assert sel.score_request(4) is not None  # no scores yet: always collect
    req = ScoreRequest(rows=[0, 4], kind="softmax", heads="group")
    N, Hkv = model.dims.n_layers, model.dims.n_kv_heads
    req.scores = {i: torch.rand(1, Hkv, 64) for i in range(N)}
    sel.on_verify(req, lengths)
    kept = sel.score(cache, lengths).clone()
    assert sel.score_request(4) is None  # the second verification: no scores
    sel.on_verify(None, lengths + 3)
    torch.testing.assert_close(sel.score(cache, lengths + 3), kept)
    assert sel.score_request(4) is not None  # the third collects again
    sel.on_verify(None, lengths + 5)  # a None after a real request (e.g. dense steps): scores dropped
    assert sel._scores is None
    prompts = [list(range(3, 70)), [5, 9, 2] * 15]
    ref = SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=12).tokens
    calls = []
    sel = SELECTORS.build("collect2", budget=12, sinks=2, recent=3, score_every=2, score_kind="sink_softmax")
    orig = sel.score_request
    sel.score_request = lambda g: calls.append(orig(g)) or calls[-1]
    # γ fixed: every verification is a round here (the adaptive controller's dense steps would re-plan without scores)
    res = SpeculativeEngine(model, SparseSelfDrafter(model, sel), gamma=4, eos_token_id=-1,
                            adaptive=False).generate(prompts, max_new_tokens=12)
    assert res.tokens == ref
    assert [c is None for c in calls[:4]] == [False, True, False, True]
