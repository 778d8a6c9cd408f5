"""Finished sequences stop reading their context (specdec.models.SKIP_FINISHED_READS): in a batch whose sequences end
at different steps, a dense forward (a dense step, a verification) reads each ended sequence as if it held no tokens;
the others' tokens are unchanged, for every lossless method, and a reused cache starts every call with all live."""

import pytest
import torch

import specdec.models as models
from specdec import PipelineConfig, build_engine

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20]


def _engine(m, method, eos):
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4, adaptive=False)
    return build_engine(m, cfg, eos_token_id=eos)


def _record_dense_reads(monkeypatch, m):
    """Every dense attention call's ``meta.lengths`` after the prefill (decode steps and verifications; one copy per
    call)."""
    seen = []
    attend = m.backend.attend

    def spy(q, k, v, meta):
        if meta.plan_indices is None and q.shape[2] <= 8:
            seen.append(meta.lengths.clone())
        return attend(q, k, v, meta)

    monkeypatch.setattr(m.backend, "attend", spy)
    return seen


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama")


def _eos(m):
    """A token sequence 0 emits early (its 3rd) and sequence 1 does not emit in 12: they end at different steps."""
    free = _engine(m, "dense", -1).generate(PROMPTS, max_new_tokens=12).tokens
    for t in free[0][1:4]:
        if t not in free[1]:
            return t, free
    raise AssertionError(f"no token of {free[0][1:4]} ends sequence 0 early without ending sequence 1: {free[1]}")


def test_a_finished_sequence_reads_nothing_and_the_others_are_unchanged(tiny, monkeypatch):
    eos, free = _eos(tiny)
    seen = _record_dense_reads(monkeypatch, tiny)
    out = _engine(tiny, "dense", eos).generate(PROMPTS, max_new_tokens=12)
    cut = free[0].index(eos) + 1
    assert out.tokens[0] == free[0][:cut] and len(out.tokens[1]) == 12
    n_layers = tiny.dims.n_layers
    steps = [seen[i] for i in range(0, len(seen), n_layers)]  # one record per forward (every layer reads alike)
    assert all(torch.equal(s, seen[i * n_layers + j]) for i, s in enumerate(steps) for j in range(n_layers))
    zero0 = [int(s[0]) == 0 for s in steps]
    # the decode steps after sequence 0's last token read none of its context; sequence 1 keeps reading all of its
    assert zero0.count(True) >= 12 - cut - 1 and not zero0[0] and zero0[-1]
    assert all(int(s[1]) >= len(PROMPTS[1]) for s in steps)
    models_off = _engine(tiny, "dense", eos)
    monkeypatch.setattr(models, "SKIP_FINISHED_READS", False)
    seen.clear()
    off = models_off.generate(PROMPTS, max_new_tokens=12)
    assert off.tokens == out.tokens
    assert all(int(s[0]) >= len(PROMPTS[0]) for s in seen[::n_layers])  # switched off: the whole context


@pytest.mark.parametrize("method", ["magicdec", "vegas", "quest"])
def test_speculative_methods_emit_the_same_tokens_with_finished_reads_skipped(tiny, monkeypatch, method):
    eos, _ = _eos(tiny)
    dense = _engine(tiny, "dense", eos).generate(PROMPTS, max_new_tokens=12).tokens
    seen = _record_dense_reads(monkeypatch, tiny)
    eng = _engine(tiny, method, eos)
    on = eng.generate(PROMPTS, max_new_tokens=12).tokens
    assert on == dense
    assert any(int(s[0]) == 0 for s in seen)  # verifications after sequence 0 ended skipped its context
    again = eng.generate(PROMPTS, max_new_tokens=12).tokens  # the same cache again: every sequence live at the start
    assert again == dense
    monkeypatch.setattr(models, "SKIP_FINISHED_READS", False)
    assert _engine(tiny, method, eos).generate(PROMPTS, max_new_tokens=12).tokens == dense


def test_outside_a_decode_loop_every_sequence_reads_its_whole_context(tiny, monkeypatch):
    """After generate (and after an error in the middle of its loop) the cache's live flags are all set again: a
    forward on the same cache, or its next owner (new_cache(reuse=True)), reads every sequence's whole context."""
    eos, _ = _eos(tiny)
    eng = _engine(tiny, "dense", eos)
    eng.generate(PROMPTS, max_new_tokens=12)
    cache = tiny.new_cache(len(PROMPTS), 64, reuse=True)
    assert cache.live is not None and bool(cache.live.all())
    cache.live[0] = False  # left so by someone: the next owner of the reused cache still gets every sequence live
    assert tiny.new_cache(len(PROMPTS), 64, reuse=True) is cache and bool(cache.live.all())

    def boom(*a, **k):
        raise RuntimeError("planted")

    calls = {"n": 0}
    dense_step = eng._dense_step

    def late_boom(state, run):
        calls["n"] += 1
        if calls["n"] == 6:  # after sequence 0 ended
            assert not bool(state.active[0])
            boom()
        return dense_step(state, run)

    monkeypatch.setattr(eng, "_dense_step", late_boom)
    with pytest.raises(RuntimeError, match="planted"):
        eng.generate(PROMPTS, max_new_tokens=12)
    assert bool(eng.model._reusable_cache.live.all())


def test_a_switch_value_other_than_true_or_false_is_refused(tiny, monkeypatch):
    monkeypatch.setattr(models, "SKIP_FINISHED_READS", "yes")
    from specdec.errors import SpecdecError

    with pytest.raises(SpecdecError, match="SKIP_FINISHED_READS is 'yes'; set True"):
        _engine(tiny, "dense", -1).generate(PROMPTS, max_new_tokens=2)


def test_a_finished_sequence_ranks_and_picks_nothing_in_dustins_keys_plan(tiny, monkeypatch):
    """Dustin's per-layer sets by low-rank keys (``layer_scores=keys``): once a sequence has finished, its plan ranks
    none of its context (length 0) and picks nothing (room 0), so the ranking, the selection and the sparse attention
    cost it nothing in the batch's last iterations; the live sequences' tokens are the same as with every sequence
    read (``SKIP_FINISHED_READS=False``)."""
    from specdec.selectors.key_rank import KeyRankPlan

    eos, _ = _eos(tiny)
    opts = {"layer_share": 1.0, "layer_scores": "keys", "key_rank": 4}
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=12, sinks=2, recent=4, adaptive=False, options=opts)
    plans = []
    real = KeyRankPlan.indices_for

    def spy(self, layer, q):
        if layer == 0:
            plans.append((self.lengths.clone(), self.room.clone()))
        return real(self, layer, q)

    monkeypatch.setattr(KeyRankPlan, "indices_for", spy)
    on = build_engine(tiny, cfg, eos_token_id=eos).generate(PROMPTS, max_new_tokens=12).tokens
    finished = [p for p in plans if int(p[0][0]) == 0]
    assert finished and all(int(p[1][0]) == 0 and int(p[0][1]) > 0 and int(p[1][1]) > 0 for p in finished)
    monkeypatch.setattr(models, "SKIP_FINISHED_READS", False)
    plans.clear()
    off = build_engine(tiny, cfg, eos_token_id=eos).generate(PROMPTS, max_new_tokens=12).tokens
    assert not any(int(p[0][0]) == 0 for p in plans)
    assert on == off and len(on[0]) < 12
