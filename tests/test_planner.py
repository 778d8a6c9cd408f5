"""Plan once, run pure: the cache's planner owns the buffers sparse steps read; selectors only compute indices."""

import torch

from specdec import KVCache, SELECTORS
from specdec.graphs import PlanGraphs, describe_step, plan_description
from specdec.planner import plan_tensors, planner_for, planner_owns


def _cache(seed=0):
    g = torch.Generator().manual_seed(seed)
    c = KVCache(3, 2, 2, 64, 8)
    c.k.normal_(generator=g)
    return c


def test_one_planner_per_cache():
    c1, c2 = _cache(), _cache()
    assert planner_for(c1) is planner_for(c1) and planner_for(c2) is not planner_for(c1)


def test_plans_land_in_the_same_buffers_every_iteration():
    cache = _cache()
    planner = planner_for(cache)
    for name in ("sliding_window", "collect2"):
        sel = SELECTORS.build(name, budget_ratio=0.2, sinks=2, recent=4)
        sel.reset(cache)
        sel.on_verify(None, torch.tensor([30, 40]))
        addresses = None
        for lengths in ([30, 40], [33, 41], [36, 47]):
            L = torch.tensor(lengths)
            want = sel.plan(cache, L)  # what the selector computes
            got = planner.plan(sel, L)  # what the sparse steps read
            assert torch.equal(got.indices, want.indices) and torch.equal(got.dense_from, want.dense_from)
            assert all(planner_owns(t) for t in plan_tensors(got).values())
            now = {n: t.data_ptr() for n, t in plan_tensors(got).items()}
            assert addresses is None or now == addresses  # fixed-size buffers: a captured step reads them as is
            addresses = now


def test_plan_graphs_apply_to_base_plans_on_a_gpu_only():
    L = torch.tensor([10])
    assert not PlanGraphs.applies(SELECTORS.build("sliding_window", budget=8), L)  # CPU: eager
    if torch.cuda.is_available():
        Lc = L.cuda()
        assert PlanGraphs.applies(SELECTORS.build("collect2", budget=8), Lc)
        assert not PlanGraphs.applies(SELECTORS.build("quest", budget=8), Lc)  # its own plan(): eager


def test_step_description_of_a_plan_is_its_kind_and_shapes():
    cache = _cache()
    sel = SELECTORS.build("quest", budget_ratio=0.3, sinks=2, recent=4, page_size=4, k_bucket=16)
    sel.reset(cache)
    a = planner_for(cache).plan(sel, torch.tensor([40, 30]))
    b = planner_for(cache).plan(sel, torch.tensor([43, 31]))
    assert plan_description(a) == plan_description(b) and plan_description(a)[0] == "QuestPlan"
    assert describe_step.__doc__


def test_a_captured_step_reads_planner_buffers_in_place():
    """The graphs module learns which tensors keep their address from the planner (no import back)."""
    from specdec.graphs import _own_plan, has_stable_address

    cache = _cache()
    planner = planner_for(cache)
    sel = SELECTORS.build("sliding_window", budget=8, sinks=2, recent=4)
    sel.reset(cache)
    L = torch.tensor([30, 40])
    loaded = planner.plan(sel, L)
    assert all(has_stable_address(t) for t in plan_tensors(loaded).values())
    assert _own_plan(loaded) is loaded  # read in place
    fresh = sel.plan(cache, L)
    own = _own_plan(fresh)  # a copy the graph owns
    assert own is not fresh and not any(has_stable_address(t) for t in plan_tensors(fresh).values())
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(plan_tensors(own).values(), plan_tensors(fresh).values()))
    old = planner.buffer("x", (3,))
    new = planner.buffer("x", (4,))  # replaced: the old one no longer counts as stable
    assert has_stable_address(new) and not has_stable_address(old)
