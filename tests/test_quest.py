"""Quest: page metadata stays equal to a recomputation after random append/rollback, page scores,
budget accounting and the query-aware plan."""

import random

import pytest
import torch

from specdec.planner import plan_tensors

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine
from specdec.cache import KVCache
from specdec.selectors.quest import Quest, QuestConfig, page_minmax

from conftest import make_tiny


def _recompute(cache: KVCache, lengths: torch.Tensor, ps: int):
    """Page bounds straight from the cache: ``(N, B, H_kv, P, D)`` min and max over valid positions."""
    N, B, H, L, D = cache.k.shape
    P = -(-L // ps)
    kmin = torch.zeros(N, B, H, P, D)
    kmax = torch.zeros(N, B, H, P, D)
    for b, n in enumerate(lengths.tolist()):
        for p in range(-(-n // ps)):
            blk = cache.k[:, b, :, p * ps : min((p + 1) * ps, n)]
            kmin[:, b, :, p] = blk.amin(dim=2)
            kmax[:, b, :, p] = blk.amax(dim=2)
    return kmin, kmax


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metadata_equals_recomputation_after_random_append_rollback(seed):
    rng = random.Random(seed)
    ps = 4
    cache = KVCache(2, 3, 2, 64, 8)
    sel = Quest(QuestConfig(budget=12, sinks=1, recent=2, page_size=ps))
    lengths = torch.tensor([5, 0, 17])
    cache.k.normal_()
    sel.reset(cache)
    for step in range(40):
        # drafts/verification write new keys past the verified lengths (overwriting stale entries)
        T = rng.randint(1, 6)
        if int(lengths.max()) + T + 3 >= cache.capacity:  # start over lower (a big rollback)
            lengths = torch.tensor([rng.randint(0, 20) for _ in range(3)])
        else:
            for b in range(3):
                n = int(lengths[b])
                cache.k[:, b, :, n : n + T] = torch.randn(2, 2, T, 8)
            # accept a random number of them; sometimes roll back below the previous length
            acc = torch.tensor([rng.randint(0, T) for _ in range(3)])
            if rng.random() < 0.2:
                acc = -torch.tensor([rng.randint(0, 5) for _ in range(3)])
            lengths = (lengths + acc).clamp(min=0)
            if rng.random() < 0.3:  # after a rollback, entries past the new length are rewritten
                for b in range(3):
                    n = int(lengths[b])
                    cache.k[:, b, :, n : n + 3] = torch.randn(2, 2, 3, 8)
        # the selector sees every length change (as in the engine, where verified entries never change)
        sel.plan(cache, lengths)
        kmin, kmax = _recompute(cache, lengths, ps)
        torch.testing.assert_close(sel.kmin, kmin, rtol=0, atol=0, msg=f"kmin at step {step}")
        torch.testing.assert_close(sel.kmax, kmax, rtol=0, atol=0, msg=f"kmax at step {step}")


def test_page_minmax_partial_page():
    k = torch.arange(2 * 1 * 10 * 2, dtype=torch.float32).view(2, 1, 10, 2)
    kmin, kmax = page_minmax(k, 7, 4)
    assert kmin.shape == (2, 1, 2, 2)
    torch.testing.assert_close(kmin[0, 0, 1], k[0, 0, 4])
    torch.testing.assert_close(kmax[0, 0, 1], k[0, 0, 6])  # positions 7.. are not valid


def test_query_aware_pages_and_budget():
    """One layer, one KV head, D=2: the query points at the page whose keys are large along it."""
    ps = 4
    cache = KVCache(1, 1, 1, 64, 2)
    cache.k[0, 0, 0, :, :] = 0.1
    cache.k[0, 0, 0, 20:24, 0] = 5.0    # page 5: big along +x
    cache.k[0, 0, 0, 32:36, 1] = -5.0   # page 8: big along -y
    lengths = torch.tensor([48])
    sel = Quest(QuestConfig(budget=2 + 2 + 4, sinks=2, recent=2, page_size=ps))
    sel.reset(cache)
    plan = sel.plan(cache, lengths)
    q = torch.zeros(1, 2, 1, 2)  # two query heads share the KV head
    q[0, :, 0, 0] = 1.0
    idx = plan.indices_for(0, q)  # (B, H_kv, K)
    assert set(idx[0, 0].tolist()) - {-1} == {0, 1, 46, 47, 20, 21, 22, 23}  # -1: top-k padding (k_bucket)
    q = torch.zeros(1, 2, 1, 2)
    q[0, :, 0, 1] = -1.0  # q⁻·kmin: the page with very negative y
    idx = plan.indices_for(0, q)
    assert set(idx[0, 0].tolist()) - {-1} == {0, 1, 46, 47, 32, 33, 34, 35}
    assert plan.budget == 8 and sel.draft_select_seconds > 0


def test_quest_upper_bound_holds():
    """Σ_d max(q_d kmax_d, q_d kmin_d) bounds q·k of every key in the page."""
    torch.manual_seed(0)
    k = torch.randn(1, 1, 32, 16)
    kmin, kmax = page_minmax(k, 32, 8)
    q = torch.randn(16)
    bound = (q.clamp(min=0) * kmax[0, 0]).sum(-1) + (q.clamp(max=0) * kmin[0, 0]).sum(-1)  # (P,)
    dots = (k[0, 0] @ q).view(4, 8)
    assert bool((dots <= bound.view(4, 1) + 1e-5).all())


def test_quest_lossless_ragged_tiny():
    model = make_tiny("qwen3", seed=2)
    prompts = [list(range(2, 75)), [9, 3, 8, 1] * 12]
    ref = SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=12).tokens
    sel = SELECTORS.build("quest", budget=20, sinks=2, recent=4, page_size=8)
    res = SpeculativeEngine(model, SparseSelfDrafter(model, sel), gamma=4, eos_token_id=-1).generate(prompts, max_new_tokens=12)
    assert res.tokens == ref


def test_planner_loads_a_later_plan_into_the_same_buffers():
    """Plan once, run pure: the cache's planner writes each plan into buffers it owns, so a captured step
    reads the same addresses every iteration and gets exactly the later plan's choice."""
    from specdec.planner import planner_for

    g = torch.Generator().manual_seed(3)
    cache = KVCache(2, 2, 1, 96, 4)
    cache.k.normal_(generator=g)
    sel = Quest(QuestConfig(budget_ratio=0.3, sinks=2, recent=4, page_size=4, k_bucket=16))
    sel.reset(cache)
    planner = planner_for(cache)
    first = planner.plan(sel, torch.tensor([60, 50]))
    ptrs = {n: t.data_ptr() for n, t in plan_tensors(first).items()}
    later_live = sel.plan(cache, torch.tensor([63, 52]))
    later = planner.plan(sel, torch.tensor([63, 52]))
    assert {n: t.data_ptr() for n, t in plan_tensors(later).items()} == ptrs  # same buffers
    assert later.k_sel == first.k_sel  # bucketed k: the same captured step serves both
    q = torch.randn(2, 2, 1, 4, generator=g)
    for layer in range(2):
        assert torch.equal(later.indices_for(layer, q), later_live.indices_for(layer, q))
    assert planner.owns(sel.kmin) and later.kmin is sel.kmin  # page bounds: the planner's buffers
    kmin = sel.kmin
    sel.reset(cache)  # a new generation on the same cache keeps the planner's buffers
    assert sel.kmin is kmin and float(kmin.abs().sum()) == 0
