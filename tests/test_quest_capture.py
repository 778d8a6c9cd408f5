"""Quest's plan without a host read: its top-k width comes from the cache's capacity (host arithmetic), so with the
Triton page-bound update the plan is a pure function of the lengths and the planner replays it as one CUDA graph.

On the CPU the Triton kernels run under the interpreter and the graph is the frozen-build stand-in of
``tests/test_dustin_graphs.py`` (any host read of a tensor inside the build raises). The GPU twin is
``tests/test_gpu_graphs.py::test_quest_draft_steps_are_captured``."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="the Quest kernels need the optional 'triton' package")
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):  # read when the kernels are defined
    pytest.skip("the tiny model runs on the CPU: the Triton kernels need TRITON_INTERPRET=1 (the test command's)",
                allow_module_level=True)

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine  # noqa: E402
from specdec.cache import KVCache  # noqa: E402
from specdec.selectors.quest import Quest, QuestConfig  # noqa: E402

from conftest import make_tiny  # noqa: E402
from test_dustin_graphs import _FrozenPlanCalls, _freeze_plan_graphs  # noqa: E402


def test_k_sel_is_the_capacity_bound_and_picks_the_same_entries():
    """k_sel = the bucketed ``max_room(capacity)`` (no read of ``room``), and each layer's picks are those of a plan
    sized by the batch's largest room (the old rule): the extra slots are -1."""
    g = torch.Generator().manual_seed(7)
    N, B, Hkv, G, L, D = 2, 3, 2, 2, 160, 8
    cache = KVCache(N, B, Hkv, L, D)
    cache.k.normal_(generator=g)
    lengths = torch.tensor([150, 61, 9])
    cfg = QuestConfig(budget_ratio=0.3, sinks=2, recent=4, page_size=4, k_bucket=8, kernels="triton")
    sel = Quest(cfg)
    sel.reset(cache)
    plan = _FrozenPlanCalls._no_host_reads(sel.plan, cache, lengths)
    assert plan.k_sel == -(-cfg.max_room(L) // 8) * 8 == 48
    old = -(-int(plan.room.max()) // 8) * 8
    assert old < plan.k_sel  # the batch's largest room needs fewer slots here
    narrow = Quest(cfg)
    narrow.reset(cache)
    ref = narrow.plan(cache, lengths)
    ref.k_sel = old
    q = torch.randn(B, Hkv * G, 1, D, generator=g)
    for layer in range(N):
        a, b = plan.indices_for(layer, q), ref.indices_for(layer, q)
        assert a.shape[-1] == b.shape[-1] + plan.k_sel - old
        assert (a[..., b.shape[-1]:] == -1).all() and torch.equal(a[..., : b.shape[-1]], b)


def test_quest_plan_is_capturable_and_replays_to_dense_tokens(monkeypatch):
    """With the Triton page-bound update Quest declares ``capturable_plan``; its plans then go through the planner's
    graph (the stand-in: frozen build, no host read), replayed at every later iteration, with dense's tokens."""
    from specdec.planner import _PLANNERS

    assert Quest(QuestConfig(kernels="triton")).capturable_plan is True
    assert Quest(QuestConfig(kernels="torch")).capturable_plan is False  # its update reads the lengths on the host
    model = make_tiny("qwen3", seed=2)
    prompts = [list(range(2, 75)), [9, 3, 8, 1] * 12]
    ref = SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=24).tokens
    _freeze_plan_graphs(monkeypatch)
    sel = SELECTORS.build("quest", budget=20, sinks=2, recent=4, page_size=8, kernels="triton")
    res = SpeculativeEngine(model, SparseSelfDrafter(model, sel), gamma=4, eos_token_id=-1).generate(
        prompts, max_new_tokens=24)
    assert res.tokens == ref
    calls = [p.plan_graphs.calls for p in _PLANNERS.values() if p.plan_graphs is not None]
    # at least one plan per draft round (the adaptive controller runs the rest as dense steps; the drafter plans ahead
    # at each verification): the first captured, every later one replayed
    assert calls and calls[-1].captures == 1 and calls[-1].replays >= len(res.stats.gamma_per_round) - 1 >= 2
