"""Dustin: ARR vs brute force, the hybrid set, sparse verification (full budget == dense), presets, safety valve."""

import itertools

import pytest
import torch

from specdec import PipelineConfig, SpeculativeEngine, build_engine
from specdec.errors import SpecdecError
from specdec.selectors.hybrid_srh import HybridSRHConfig, HybridSRHSelector, hybrid_select
from specdec.srh import attention_recall

from conftest import make_tiny

PROMPTS = [list(range(3, 60)), [5, 9, 17, 33, 2, 8] * 9, [11, 4] * 15]


@pytest.fixture(scope="module")
def target():
    return make_tiny("qwen2", seed=2, num_hidden_layers=3)


def engine(model, method="dustin", budget=12, gamma=3, **options):
    cfg = PipelineConfig.make(method=method, gamma=gamma, budget=budget, sinks=2, recent=4, options=options)
    return build_engine(model, cfg, eos_token_id=-1)


def test_arr_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    N, B, H, T, L = 3, 2, 4, 3, 20
    lengths = torch.tensor([14, 17])
    logits = torch.randn(N, B, H, T, L, generator=g)
    pos = torch.arange(L)
    visible = pos.view(1, 1, L) <= (lengths.view(B, 1, 1) + torch.arange(T).view(1, T, 1))  # (B, T, L)
    p = torch.softmax(logits.masked_fill(~visible.view(1, B, 1, T, L), float("-inf")), -1)
    mass = p.mean(dim=(2, 3))  # (N, B, L)
    idx = torch.tensor([[0, 1, 5, 9, 13, -1], [2, 3, 4, 16, -1, -1]])
    got = attention_recall(idx, mass, lengths)
    for l, b in itertools.product(range(N), range(B)):
        keep = {int(i) for i in idx[b] if i >= 0} | set(range(int(lengths[b]), L))
        total = 0.0
        for h, t in itertools.product(range(H), range(T)):
            total += sum(float(p[l, b, h, t, i]) for i in keep)
        assert float(got[l, b]) == pytest.approx(total / (H * T), abs=1e-5)
    full = torch.arange(L).expand(B, L)
    assert torch.allclose(attention_recall(full, mass, lengths), torch.ones(N, B), atol=1e-5)


def test_hybrid_set_sinks_recent_top_m_then_target():
    lengths = torch.tensor([40, 30])
    budget = torch.tensor([12, 12])
    draft = torch.zeros(2, 40)
    target = torch.zeros(2, 40)
    draft[:, [10, 11, 12]] = torch.tensor([3.0, 2.0, 1.0])
    target[:, [10, 20, 21, 22]] = torch.tensor([9.0, 3.0, 2.0, 1.0])
    idx = hybrid_select(lengths, budget, 2, 4, draft, target, torch.tensor([2, 2]))
    for b, L in enumerate(lengths.tolist()):
        s = [int(i) for i in idx[b] if i >= 0]
        assert len(s) == len(set(s)) == 12
        assert {0, 1} | set(range(L - 4, L)) <= set(s)
        assert {10, 11} <= set(s)  # top-m of the draft signal
        assert {20, 21, 22} <= set(s)  # then the best of the target signal (10 already taken)
        assert max(s) < L




def _valid(idx: torch.Tensor) -> list[list[int]]:
    """Each row's positions in order, ``-1`` padding left out."""
    return [[int(v) for v in row if v >= 0] for row in idx]


@pytest.mark.parametrize("signals", ["both", "draft", "target", "none"])
def test_hybrid_plan_builds_fixed_positions_once_and_equals_the_selection(monkeypatch, signals):
    """A plan computes the budget's fixed positions once (they were built twice, ~35 launches each on a GPU)
    and still picks what the paper's pieces spelled out pick (first-pass cases: one signal missing)."""
    import types

    import specdec.selectors.hybrid_srh as hs
    from specdec.selectors.base import fixed_positions

    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([300, 180, 41])
    sel = HybridSRHSelector(HybridSRHConfig(budget_ratio=0.25, sinks=4, recent=8, m_ratio=0.6))
    d, t = torch.rand(3, 320, generator=g), torch.rand(3, 320, generator=g)
    sel.draft_signal = d if signals in ("both", "draft") else None
    sel.target_signal = t if signals in ("both", "target") else None
    budget = sel.config.budget_for(lengths)
    _, room = fixed_positions(lengths, budget, 4, 8)
    m = (room if sel.target_signal is None else torch.zeros_like(room) if sel.draft_signal is None
         else torch.round(room.double() * 0.6).long())
    ref = hybrid_select(lengths, budget, 4, 8, sel.draft_signal, sel.target_signal, m)
    calls = []
    real = hs.fixed_positions
    monkeypatch.setattr(hs, "fixed_positions", lambda *a: calls.append(1) or real(*a))
    plan = sel.plan(types.SimpleNamespace(n_kv_heads=2, capacity=320), lengths)
    # one set for every KV head, as wide as the cache's largest budget (host bounds): the same positions in
    # the same order as the width-by-lengths selection, padded with -1 (without signals every score ties: which
    # positions fill the free slots is topk's choice, only their number is fixed)
    assert plan.indices.shape == (1, 3, 1, 4 + 8 + sel.max_room(320)) and plan.static_size
    got, want_ = _valid(plan.indices[0, :, 0]), _valid(ref)
    assert (got == want_) if signals != "none" else [len(set(r)) for r in got] == [len(r) for r in want_]
    assert len(calls) == 1
    want = hybrid_select(lengths, budget, 4, 8, d, t, torch.round(room.double() * 0.6).long())
    calls.clear()
    assert torch.equal(sel.select(lengths, draft=d, target=t), want)
    assert len(calls) == 1


@pytest.mark.parametrize("method", ["dustin", "dustin-adaptive"])
def test_full_budget_sparse_verification_equals_dense(target, method):
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=14).tokens
    eng = engine(target, method, budget=10_000)
    res = eng.generate(PROMPTS, max_new_tokens=14)
    assert res.tokens == dense
    assert res.stats.lossless is False  # the method stays labelled near-lossless
    assert eng.verifier.report()["kv_read_vs_dense"] == pytest.approx(1.0)


def test_small_budget_reads_less_and_runs_ragged(target):
    eng = engine(target, budget=10)
    batch = eng.generate(PROMPTS, max_new_tokens=10)
    rep = eng.verifier.report()
    assert rep["dense_passes"] == rep["dense_first"] == 1 and rep["kv_read_vs_dense"] < 0.6
    assert [len(t) for t in batch.tokens] == [10] * 3
    alone = engine(target, budget=10).generate(PROMPTS[1:2], max_new_tokens=10)
    assert alone.tokens[0] == batch.tokens[1]


def test_safety_valve_dense_every_pass_is_exact(target):
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=10).tokens
    eng = engine(target, budget=8, dense_every=1)
    assert eng.generate(PROMPTS, max_new_tokens=10).tokens == dense
    rep = eng.verifier.report()
    assert rep["dense_share"] == 1.0 and rep["dense_periodic"] + rep["dense_first"] == rep["passes"]
    assert rep["dense_first"] == 1
    eng = engine(target, budget=8, disagree=0.0)
    eng.generate(PROMPTS, max_new_tokens=10)
    assert eng.verifier.report()["dense_disagree"] >= 1


def test_adaptive_m_moves_per_sequence(target):
    eng = engine(target, "dustin-adaptive", budget=16)
    eng.generate(PROMPTS, max_new_tokens=12)
    sel = eng.verifier.selector
    assert sel.m_ratio is not None and sel.m_ratio.shape == (3,)
    assert all(0.0 <= float(r) <= 1.0 for r in sel.m_ratio)


def test_selector_is_registered_for_verification_only():
    from specdec import SELECTORS

    sel = SELECTORS.build("hybrid_srh", budget=32)
    assert isinstance(sel, HybridSRHSelector) and sel.role == "verify"


@pytest.mark.parametrize("options, match", [
    (dict(bogus=1), "unknown dustin option"),
    (dict(draft_layers=3), "draft_layers"),
    (dict(dense_every=-1), "dense_every"),
    (dict(m_ratio=2.0), "m_ratio"),
    (dict(dense_first="maybe"), "dense_first"),
    (dict(adaptive="sometimes"), "adaptive"),
])
def test_bad_options_are_one_clear_error(target, options, match):
    with pytest.raises(SpecdecError, match=match) as e:
        engine(target, **options)
    assert "\n" not in str(e.value)


def test_bad_heads_and_missing_artifact(target):
    with pytest.raises(SpecdecError, match="target_heads"):
        from specdec.verifiers import SparseVerifier

        SparseVerifier(target, HybridSRHSelector(HybridSRHConfig(budget=8, target_heads=[(5, 0)])))
    with pytest.raises(SpecdecError, match="profile-srh"):
        engine(target, srh="/nonexistent/srh.json")


# -- per-layer verification sets and the confidence valve (issue 15) -------------------------------------------
def _plans(eng):
    """Record every sparse plan the verifier hands the model."""
    seen = []
    fwd = eng.verifier.model.forward

    def forward(*a, plan=None, **k):
        if plan is not None:
            seen.append(plan)
        return fwd(*a, plan=plan, **k)

    eng.verifier.model.forward = forward
    return seen


def test_layer_share_sets_differ_per_layer_and_head_within_the_budget(target):
    from specdec.selectors.hybrid_srh import LayerSetPlan

    eng = engine(target, budget=16, layer_share=0.5, page_size=4)
    seen = _plans(eng)
    try:
        eng.generate(PROMPTS, max_new_tokens=8)
    finally:
        del eng.verifier.model.forward
    assert seen and all(isinstance(p, LayerSetPlan) for p in seen)
    p = seen[-1]
    D = target.dims.head_dim
    H = target.dims.n_heads
    distinct = set()
    for layer in range(target.dims.n_global):
        q = torch.randn(len(PROMPTS), H, 4, D)
        idx = p.indices_for(layer, q)  # (B, H_kv, K)
        for b in range(idx.shape[0]):
            L = int(p.lengths[b])
            for h in range(idx.shape[1]):
                s = [int(i) for i in idx[b, h] if i >= 0]
                assert len(s) == len(set(s)) <= 16 and max(s) < L  # no duplicate, within the budget, cached only
                assert {0, 1} | set(range(L - 4, L)) <= set(s)
                distinct.add(tuple(sorted(s)))
    assert len(distinct) > 1  # the per-layer part follows each layer's and KV head's queries
    from specdec.verifiers import plan_reads

    # the cost counts the shared part, the per-layer slots and the page bounds read (one K+V entry per page)
    want = (p.indices[0, :, 0] >= 0).sum(1) + p.room + (p.lengths + 3) // 4
    assert torch.equal(plan_reads(p, p.lengths), want.to(torch.float64))
    rep = eng.verifier.report()
    assert 0 < rep["kv_read_vs_dense"] < 1


def test_layer_share_full_budget_equals_dense(target):
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=10).tokens
    assert engine(target, budget=10_000, layer_share=1.0, page_size=4).generate(PROMPTS, max_new_tokens=10).tokens == dense


def test_margin_valve_reverifies_low_margin_passes_densely(target):
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=10).tokens
    # margin 0 records the margins and re-verifies nothing
    eng = engine(target, budget=8, margin=0)
    sparse = eng.generate(PROMPTS, max_new_tokens=10).tokens
    rep0 = eng.verifier.report()
    assert rep0["dense_margin"] == 0 and eng.verifier.last_margin is not None
    assert sparse != dense  # a budget this small does leave dense decoding here
    # every sparse pass below an infinite margin: each one is re-verified densely, the output is dense's
    eng = engine(target, budget=8, margin=1e9)
    assert eng.generate(PROMPTS, max_new_tokens=10).tokens == dense
    rep = eng.verifier.report()
    assert rep["dense_margin"] >= rep["passes"] - rep["dense_passes"] > 0
    assert rep["kv_read_vs_dense"] > 1.0  # the re-runs cost a dense read on top of the sparse one


def test_margin_valve_deciding_rows():
    """Only the rows up to the first rejected draft decide; a low margin after it does not fire the valve."""
    from types import SimpleNamespace

    from specdec.verifiers import SparseVerifier

    v = SparseVerifier.__new__(SparseVerifier)
    v.margin, v._stats = 1.0, dict(dense_margin=0)
    tokens = torch.tensor([[7, 1, 2, 3]])  # pending 7, drafts 1 2 3
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 1] = 5.0  # row 0 accepts draft 1 (margin 5)
    logits[0, 1, 4] = 5.0  # row 1 rejects draft 2 (margin 5): rows 0-1 decide
    logits[0, 2, 3] = 0.1  # row 2: tiny margin, but after the rejection
    state = SimpleNamespace(active=torch.tensor([True]), lengths=torch.tensor([10]), cache=None)
    out, redo = v._margin_valve(state, tokens, logits, None, None)
    assert out is logits and int(redo) == 0 and float(v.last_margin[0]) == pytest.approx(5.0)
    assert int(v.last_deciding[0]) == 2
    logits[0, 1, 2] = 5.0  # row 1 now accepts draft 2 (tie with 4: margin 0): the valve must fire
    logits[0, 1, 4] = 4.95
    called = []
    v.model = SimpleNamespace(forward=lambda *a, **k: (called.append(1), torch.ones(1, 4, 5))[1])
    v.selector = SimpleNamespace(target_heads={})
    out, redo = v._margin_valve(state, tokens, logits, None, torch.zeros(1, 10))
    assert called and torch.equal(out, torch.ones(1, 4, 5)) and int(redo) == 10


# -- per-layer sets ranked by low-rank keys (layer_scores="keys") -------------------------------------------------
def test_key_rank_plan_at_full_rank_picks_the_top_attention_mass():
    """At ``key_rank = D`` the ranking is the exact softmax attention of the rows' queries over the verified keys,
    summed over the group's heads and the rows: the plan's per-layer part is its top ``room`` outside the shared part
    (brute force here), within ``new``, never past a sequence's length."""
    from specdec.cache import KVCache
    from specdec.selectors.key_rank import KeyRankIndex, KeyRankPlan

    g = torch.Generator().manual_seed(0)
    N, B, H, C, D, Hq, T = 2, 2, 2, 40, 8, 4, 3
    cache = KVCache(N, B, H, C, D)
    cache.k.copy_(torch.randn(N, B, H, C, D, generator=g))
    lengths = torch.tensor([30, 37])
    index = KeyRankIndex(D)
    index.update(cache, lengths)
    shared = torch.tensor([[0, 1, 26, 27, 28, 29, -1], [0, 1, 33, 34, 35, 36, 12]])
    new = torch.arange(C).view(1, C) < lengths.view(B, 1)
    new[:, :2] = False
    new[0, 26:] = False
    new[1, 33:] = False
    new[1, 12] = False
    room = torch.tensor([5, 3])
    plan = KeyRankPlan(indices=shared.view(1, B, 1, -1), dense_from=lengths.clone(), lengths=lengths, room=room,
                       basis=index.basis, keys=index.keys, new=new, k_sel=5)
    q = torch.randn(B, Hq, T, D, generator=g)
    for layer in range(N):
        got = plan.indices_for(layer, q)
        assert got.shape == (B, H, 7 + 5)
        for b in range(B):
            L = int(lengths[b])
            for h in range(H):
                k = cache.k[layer, b, h, :L]
                qs = q[b, h * (Hq // H):(h + 1) * (Hq // H)]  # (G, T, D)
                mass = torch.softmax(qs @ k.T * D ** -0.5, -1).sum((0, 1))
                mass[~new[b, :L]] = float("-inf")
                want = set(mass.topk(int(room[b])).indices.tolist())
                sel = [int(i) for i in got[b, h, 7:] if i >= 0]
                assert set(sel) == want and len(sel) == int(room[b]), (layer, b, h)
                assert got[b, h, :7].tolist() == shared[b].tolist()
    # low rank: the projected keys follow the cache as it grows (only the newly verified positions are projected)
    low = KeyRankIndex(3)
    low.update(cache, lengths)
    cache.k[:, 0, :, 30:33] += 1.0
    low.update(cache, torch.tensor([33, 37]))
    assert torch.allclose(low.keys[:, 0, :, 30:33], torch.einsum("nhcd,nhdr->nhcr", cache.k[:, 0, :, 30:33],
                                                                  low.basis[:, 0]), atol=1e-5)
    assert low.basis.shape == (N, B, H, D, 3)


def test_key_rank_basis_is_prompt_work_and_the_host_lengths_keep_every_verified_key_projected(target):
    """With ``layer_scores="keys"`` the verifier takes the key basis at the prefill (outside the decode loop) and,
    before each sparse plan, projects the newly verified keys over a span it knows from the host's token lists (no
    device read): at every plan the host's lengths are the device's for the active sequences, and at the end every
    verified position's projected key equals a fresh projection of the cache with the same basis."""
    eng = engine(target, budget=16, layer_share=1.0, layer_scores="keys", key_rank=4)
    sel = eng.verifier.selector
    calls = []
    real_prefill, real_prepare = eng.verifier.prefill, sel.prepare

    def prefill(state):
        real_prefill(state)
        calls.append(("prefill", sel._keys.basis is not None))

    def prepare(cache, lengths, host_lengths=None):
        live = [b for b, a in enumerate(cache.live.tolist()) if a]
        calls.append(("prepare", host_lengths is not None and all(host_lengths[b] == int(lengths[b]) for b in live)))
        real_prepare(cache, lengths, host_lengths)

    eng.verifier.prefill, sel.prepare = prefill, prepare
    try:
        out = eng.generate(PROMPTS, max_new_tokens=24)
    finally:
        del eng.verifier.prefill, sel.prepare
    # the prefill's prepare took the basis; one prepare per sparse plan after it
    assert calls[:2] == [("prepare", True), ("prefill", True)] and len(calls) > 4 and all(ok for _, ok in calls)
    state = eng.verifier._state
    index, cache = sel._keys, state.cache
    fresh = torch.einsum("nbhcd,nbhdr->nbhcr", cache.k.float(), index.basis).to(index.keys.dtype)
    for b, L in enumerate(state.lengths.tolist()):
        assert L > len(PROMPTS[b]) + 8  # generation went on well past the prompt
        assert torch.allclose(index.keys[:, b, :, :L], fresh[:, b, :, :L], atol=1e-5), b
    assert out.stats.method == "dustin"


def test_key_rank_index_refuses_host_lengths_of_another_batch_in_one_line():
    from specdec.cache import KVCache
    from specdec.selectors.key_rank import KeyRankIndex

    cache = KVCache(1, 2, 1, 16, 4)
    with pytest.raises(SpecdecError, match=r"host_lengths has 3 values for a batch of 2") as e:
        KeyRankIndex(2).update(cache, torch.tensor([5, 6]), [5, 6, 7])
    assert "\n" not in str(e.value)


def test_key_rank_sets_stay_in_the_budget_and_a_full_budget_equals_dense(target, monkeypatch):
    import specdec.models as models
    from specdec.selectors.key_rank import KeyRankPlan
    from specdec.verifiers import plan_reads

    # every sequence's plan in full, also after a faster sequence has finished (which otherwise ranks and picks
    # nothing: tests/test_finished_reads.py); the plans share their buffers, so the last one holds the final lengths
    monkeypatch.setattr(models, "SKIP_FINISHED_READS", False)
    eng = engine(target, budget=16, layer_share=1.0, layer_scores="keys", key_rank=4)
    seen = _plans(eng)
    try:
        out = eng.generate(PROMPTS, max_new_tokens=8)
    finally:
        del eng.verifier.model.forward
    assert seen and all(isinstance(p, KeyRankPlan) for p in seen)
    assert out.stats.method == "dustin" and not out.stats.lossless
    p = seen[-1]
    D = target.dims.head_dim
    distinct = set()
    for layer in range(target.dims.n_global):
        idx = p.indices_for(layer, torch.randn(len(PROMPTS), target.dims.n_heads, 4, D))
        for b in range(idx.shape[0]):
            L = int(p.lengths[b])
            for h in range(idx.shape[1]):
                s = [int(i) for i in idx[b, h] if i >= 0]
                assert len(s) == len(set(s)) == 16 and max(s) < L  # no duplicate, exactly the budget, cached only
                assert {0, 1} | set(range(L - 4, L)) <= set(s)
                distinct.add(tuple(sorted(s)))
    assert len(distinct) > 1  # the per-layer part follows each layer's and KV head's queries
    # the cost: the entries attended to plus key_rank / 2D of an entry per verified token (the ranking's read)
    want = (p.indices[0, :, 0] >= 0).sum(1) + p.room + p.lengths * (4 / (2 * D))
    assert torch.allclose(plan_reads(p, p.lengths), want.to(torch.float64))
    assert 0 < eng.verifier.report()["kv_read_vs_dense"] < 1
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=10).tokens
    full = engine(target, budget=10_000, layer_share=1.0, layer_scores="keys", key_rank=4)
    assert full.generate(PROMPTS, max_new_tokens=10).tokens == dense


def test_key_rank_options_are_refused_where_they_cannot_work(target):
    with pytest.raises(SpecdecError, match=r"layer_scores='keys' ranks the per-layer part, which layer_share 0 turns "
                                           r"off; set layer_share > 0"):
        engine(target, layer_scores="keys")
    D = target.dims.head_dim
    with pytest.raises(SpecdecError, match=rf"^key_rank {D + 1} exceeds the head dimension {D}; use key_rank <= {D}"):
        engine(target, layer_share=1.0, layer_scores="keys", key_rank=D + 1)


def test_key_rank_buffers_belong_to_the_planner(target):
    """The projected keys are the cache planner's buffers: loading a plan does not copy them (they hold
    ``N x B x H_kv x capacity x key_rank`` values), as Quest's page bounds."""
    from specdec.planner import planner_for

    eng = engine(target, budget=16, layer_share=1.0, layer_scores="keys", key_rank=4)
    seen = _plans(eng)
    try:
        eng.generate(PROMPTS, max_new_tokens=8)
    finally:
        del eng.verifier.model.forward
    p = seen[-1]
    keys = eng.verifier.selector._keys
    assert p.keys is keys.keys and p.basis is keys.basis
    assert planner_for(eng.verifier._state.cache).owns(p.keys)
