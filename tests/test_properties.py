"""Property-based tests (hypothesis): selectors' plans, the acceptance rule, the cache rollback.

Bounded example counts and no deadline: the CI machines are shared, slow and noisy.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec import SELECTORS, KVCache
from specdec.attention.reference import ReferenceBackend
from specdec.sampling import SamplingConfig, accept, warp
from specdec.interfaces import AttentionMetadata

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def needs_more_than_a_budget(name: str) -> bool:
    """Whether selector ``name``'s config has a required field besides the shared budget fields."""
    return any(f.is_required() for f in SELECTORS.get(name).config_cls.model_fields.values())


def drafting_selectors() -> list[str]:
    """Drafting selectors built from the shared budget fields alone. Those are validated here, not in a
    ``try``: a selector whose config breaks fails the tests instead of silently leaving the matrix."""
    out = [n for n in SELECTORS.names()
           if getattr(SELECTORS.get(n).cls, "role", "draft") == "draft" and not needs_more_than_a_budget(n)]
    for n in out:
        SELECTORS.config(n, budget=8)
    return out


# -- selectors ---------------------------------------------------------------------------------
N_LAYERS, H_KV, G, D = 2, 2, 2, 8


def feed_scores(selector, cache: KVCache, lengths: torch.Tensor, gamma: int, seed: int) -> None:
    """Give the selector what a verification pass would: scores of its requested rows (reference backend)."""
    req = selector.score_request(gamma)
    if req is None:
        selector.on_verify(None, lengths)
        return
    g = torch.Generator().manual_seed(seed)
    be = ReferenceBackend()
    B = lengths.shape[0]
    T = gamma + 1
    extra = {"score_per_row": True} if getattr(req, "per_row", False) else {}
    for layer in range(cache.n_layers):
        if not req.wants(layer):
            continue
        q = torch.randn(B, H_KV * G, T, D, generator=g)
        heads = req.query_heads.get(layer, ()) if req.query_heads is not None else None
        start = (lengths - T).clamp(min=0)  # the verify rows end at the verified length
        _, s = be.attend(q, cache.k[layer], cache.v[layer], AttentionMetadata(start, D ** -0.5, score_rows=req.rows, score_kind=req.kind, score_heads=heads, **extra))
        if req.heads == "all":
            s = s.sum(dim=1, keepdim=True).expand_as(s).contiguous()
        req.scores[layer] = s
    selector.on_verify(req, lengths)


def plan_indices(plan, layer: int, B: int, seed: int) -> torch.Tensor:
    """``(B, H_kv, K)`` indices of one layer (query-aware plans get a random query)."""
    if hasattr(plan, "indices_for"):
        q = torch.randn(B, H_KV * G, 1, D, generator=torch.Generator().manual_seed(seed))
        return plan.indices_for(layer, q)
    return plan.for_layer(layer)


@pytest.mark.parametrize("name", drafting_selectors())
@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 90), min_size=1, max_size=3),
    budget=st.integers(1, 100),
    sinks=st.integers(0, 8),
    recent=st.integers(0, 20),
    gamma=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_plan_is_within_budget_with_sinks_and_recent(name, lengths, budget, sinks, recent, gamma, seed):
    if sinks + recent > budget:  # explicit values that do not fit are refused; the defaults (4 + 16) shrink to it
        selector = SELECTORS.build(name, budget=budget)
        sinks, recent = selector.config.sinks, selector.config.recent
    else:
        selector = SELECTORS.build(name, budget=budget, sinks=sinks, recent=recent)
    g = torch.Generator().manual_seed(seed)
    L_cap = max(lengths) + gamma + 2
    cache = KVCache(N_LAYERS, len(lengths), H_KV, L_cap, D)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    lens = torch.tensor(lengths)
    selector.reset(cache)
    if hasattr(selector, "update"):
        selector.update(cache, lens)
    feed_scores(selector, cache, lens, gamma, seed)
    plan = selector.plan(cache, lens)
    assert torch.equal(plan.dense_from.cpu(), lens), "tokens written after the plan must stay visible"
    k_b = selector.config.budget_for(lens).tolist()
    for layer in range(N_LAYERS):
        idx = plan_indices(plan, layer, len(lengths), seed)
        assert idx.shape[0] == len(lengths)
        for b, L in enumerate(lengths):
            s = min(sinks, k_b[b], L)
            r = min(recent, k_b[b] - s, L - s)
            must = set(range(s)) | set(range(L - r, L))
            for h in range(idx.shape[1]):
                row = idx[b, h]
                valid = row[row >= 0].tolist()
                assert len(valid) == len(set(valid)), f"duplicates in {valid}"
                assert all(0 <= i < L for i in valid), f"index beyond length {L}: {valid}"
                assert len(valid) <= k_b[b], f"{len(valid)} entries for budget {k_b[b]}"
                assert must <= set(valid), f"sinks/recent {sorted(must - set(valid))} missing"
                if k_b[b] >= L:  # a budget covering the whole context keeps all of it
                    assert set(valid) == set(range(L))


# -- acceptance rule ---------------------------------------------------------------------------
@SETTINGS
@given(B=st.integers(1, 4), gamma=st.integers(1, 6), V=st.integers(2, 9), seed=st.integers(0, 2**16),
       agree=st.floats(0, 1))
def test_greedy_accepts_the_longest_matching_prefix(B, gamma, V, seed, agree):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, gamma + 1, V, generator=g)
    target = logits.argmax(-1)
    drafts = torch.randint(0, V, (B, gamma), generator=g)
    keep = torch.rand(B, gamma, generator=g) < agree  # copy the target's choice with prob `agree`
    drafts = torch.where(keep, target[:, :gamma], drafts)
    acc = accept(drafts, logits, SamplingConfig())
    for b in range(B):
        n = 0
        while n < gamma and drafts[b, n] == target[b, n]:
            n += 1
        assert int(acc.n_accepted[b]) == n
        assert int(acc.next_token[b]) == int(target[b, n])


@SETTINGS
@given(B=st.integers(1, 4), gamma=st.integers(1, 5), V=st.integers(2, 9), seed=st.integers(0, 2**16),
       temperature=st.floats(0.3, 2.0), top_p=st.floats(0.2, 1.0), top_k=st.integers(0, 6))
def test_rejection_sampling_never_leaves_the_target_support(B, gamma, V, seed, temperature, top_p, top_k):
    cfg = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
    g = torch.Generator().manual_seed(seed)
    t_logits = torch.randn(B, gamma + 1, V, generator=g) * 3
    q = warp(torch.randn(B, gamma, V, generator=g) * 3, SamplingConfig(temperature=1.0))
    drafts = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, gamma)
    acc = accept(drafts, t_logits, cfg, q, g)
    p = warp(t_logits, cfg)
    for b in range(B):
        n = int(acc.n_accepted[b])
        assert 0 <= n <= gamma
        for i in range(n):  # an accepted draft has positive target probability
            assert float(p[b, i, drafts[b, i]]) > 0
        assert float(p[b, n, acc.next_token[b]]) > 0  # the correction / bonus too


# -- cache write / rollback against a Python list model -----------------------------------------
@SETTINGS
@given(
    B=st.integers(1, 3),
    steps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 5), st.integers(0, 2)), min_size=1, max_size=25),
)
def test_cache_write_and_rollback_match_a_list_model(B, steps):
    cap = 64
    cache = KVCache(1, B, 1, cap, 2)
    lengths = torch.zeros(B, dtype=torch.long)
    model = [[] for _ in range(B)]
    counter = 0.0
    for T, n_acc, frozen in steps:
        if int(lengths.max()) + T > cap:
            with pytest.raises(ValueError, match="overflow"):
                cache.write(0, torch.zeros(B, 1, T, 2), torch.zeros(B, 1, T, 2), lengths)
            break
        vals = torch.arange(counter, counter + B * T).view(B, 1, T, 1).expand(B, 1, T, 2).float()
        counter += B * T
        cache.write(0, vals, -vals, lengths)
        adv = torch.zeros(B, dtype=torch.long)
        for b in range(B):
            keep = 0 if b == frozen % B and frozen else min(n_acc, T)  # a frozen sequence keeps nothing
            model[b] = model[b][: int(lengths[b])] + vals[b, 0, :keep, 0].tolist()
            adv[b] = keep
        lengths += adv  # rollback = keeping only `keep` of the T written entries
        for b in range(B):
            L = int(lengths[b])
            assert cache.k[0, b, 0, :L, 0].tolist() == model[b]
            assert cache.v[0, b, 0, :L, 1].tolist() == [-x for x in model[b]]


def test_bounded_cache_skips_the_host_capacity_check():
    """The engine sizes its cache for every write (``bounded``): no host read of ``lengths`` per forward."""
    from specdec.cache import KVCache

    c = KVCache(1, 2, 1, 8, 4)
    too_far = torch.tensor([7, 3])
    with pytest.raises(ValueError, match="overflow"):
        c.check_capacity(too_far, 2)
    c.bounded = True
    c.check_capacity(too_far, 2)  # trusted: returns without reading lengths
    assert c.rows(0, 1).bounded and not KVCache._from(c.k, c.v).bounded
