"""CUDA-graph and compiled paths against eager execution (runs only where a CUDA GPU exists)."""

import pytest
import torch

from specdec import BACKENDS, PipelineConfig, SparsePlan, build_engine
from specdec.planner import _PLANNERS, planner_for

from conftest import make_tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _cuda_tiny(backend):
    m = make_tiny("llama", seed=5)
    m.hf.cuda()
    m.backend = backend
    return m


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_graph_replay_equals_eager(backend):
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    cache = m.new_cache(2, 96)
    cache.k.normal_()
    cache.v.normal_()
    L = torch.tensor([40, 70], device="cuda")
    plan = SparsePlan(indices=torch.randint(0, 39, (1, 2, 1, 10), device="cuda"), dense_from=L.clone())
    for kw, T in (({}, 1), ({"plan": plan}, 1), ({}, 5)):
        x = torch.randint(0, 96, (2, T), device="cuda")
        eager = m.forward(x, cache, L, **kw)
        m.enable_cuda_graphs()
        first, again = m.forward(x, cache, L, **kw), m.forward(x, cache, L, **kw)
        m.disable_cuda_graphs()
        torch.testing.assert_close(first, eager, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(again, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_tree_forward_replays_as_a_graph(backend):
    """A draft tree's verify forward with graphs: one capture per tree, replays equal to the eager forward (the
    Triton backend: the split-K kernel's tree mask inside the graph)."""
    from specdec.tree import DraftTree

    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    cache = m.new_cache(2, 96)
    cache.k.normal_()
    cache.v.normal_()
    t = DraftTree.default(lookup=4)
    m.enable_cuda_graphs()
    try:
        for seed, lens in ((0, [40, 70]), (1, [41, 66])):
            L = torch.tensor(lens, device="cuda")
            x = torch.randint(0, 96, (2, t.nodes + 1), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
            got = m.forward(x, cache, L, tree=t)
            graphs = m._graphs
            m._graphs = None
            eager = m.forward(x, cache, L, tree=t)
            m._graphs = graphs
            torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
        assert m._graphs.captures == 1 and m._graphs.replays == 1
    finally:
        m.disable_cuda_graphs()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_greedy_chain_replays_as_one_graph(backend):
    """``greedy_steps`` with graphs: the γ steps are one captured graph (``GraphCache.greedy_chain``) giving the tokens
    and flags of stepping eagerly, and its replays read new first tokens, lengths and plan values."""
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    cache = m.new_cache(2, 96)
    cache.k.normal_()
    cache.v.normal_()
    cases = []
    for seed, lens in ((0, [40, 70]), (1, [41, 66]), (2, [52, 60])):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        L = torch.tensor(lens, device="cuda")
        plan = SparsePlan(indices=torch.randint(0, 39, (1, 2, 1, 10), device="cuda", generator=gen), dense_from=L.clone())
        cases.append((torch.randint(0, 96, (2,), device="cuda", generator=gen), L, plan))
    eager = [m.greedy_steps(f, cache, L, 4, plan=p) for f, L, p in cases]
    m.enable_cuda_graphs()
    try:
        graphed = [m.greedy_steps(f, cache, L, 4, plan=p) for f, L, p in cases]
        g = m._graphs
    finally:
        m.disable_cuda_graphs()
    for (t0, f0), (t1, f1) in zip(eager, graphed):
        assert torch.equal(t0, t1) and torch.equal(f0, f1)
    assert not g.uncapturable, g.uncapturable
    assert [k.chain for k in g.graphs] == [4] and g.captures == 1 and g.replays == 2


@pytest.mark.parametrize("method", ["magicdec", "quest", "vegas"])
def test_greedy_methods_with_graphs_equal_dense(method):
    be = BACKENDS.build("torch", static=True)
    m = _cuda_tiny(be)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 16).tokens
    m.enable_cuda_graphs()
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4)
    out = build_engine(m, cfg, eos_token_id=-1).generate(prompts, 16).tokens
    assert out == dense


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_compiled_forward_equals_eager(backend):
    """torch.compile of the decode-sized forwards (alone and under CUDA graphs) matches eager."""
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    cache = m.new_cache(2, 96)
    cache.k.normal_()
    cache.v.normal_()
    L = torch.tensor([40, 70], device="cuda")
    plan = SparsePlan(indices=torch.randint(0, 39, (1, 2, 1, 10), device="cuda"), dense_from=L.clone())
    cases = [(({}, 1)), ({"plan": plan}, 1), ({}, 5)]
    eager = []
    for kw, T in cases:
        x = torch.arange(T * 2, device="cuda").view(2, T) + 7
        eager.append(m.forward(x, cache, L, **kw))
    m.enable_compile()
    try:
        for graphs in (False, True):
            if graphs:
                m.enable_cuda_graphs()
            for (kw, T), ref in zip(cases, eager):
                x = torch.arange(T * 2, device="cuda").view(2, T) + 7
                torch.testing.assert_close(m.forward(x, cache, L, **kw), ref, rtol=1e-3, atol=1e-3)
            m.disable_cuda_graphs()
    finally:
        m._compiled = None


@pytest.mark.parametrize("method", ["magicdec", "vegas"])
def test_greedy_methods_compiled_with_graphs_equal_dense(method):
    be = BACKENDS.build("triton")
    m = _cuda_tiny(be)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 16).tokens
    m.enable_compile()
    m.enable_cuda_graphs()
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4)
    out = build_engine(m, cfg, eos_token_id=-1).generate(prompts, 16).tokens
    assert out == dense


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_quest_draft_steps_are_captured(backend):
    """Quest's query-aware plan is captured too (static shapes: bucketed top-k over the cache capacity)."""
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 16).tokens
    m.enable_cuda_graphs()
    cfg = PipelineConfig.make(method="quest", gamma=3, budget=12, sinks=2, recent=4)
    out = build_engine(m, cfg, eos_token_id=-1).generate(prompts, 16).tokens
    g = m._graphs
    m.disable_cuda_graphs()
    assert out == dense
    assert not g.uncapturable, g.uncapturable
    assert any(k.plan is not None and k.plan[0] == "QuestPlan" for k in g.graphs) and g.replays > 0
    # the plan itself (page-bound update + fixed part, no host read) replays as one graph per cache
    plans = [p.plan_graphs for p in list(_PLANNERS.values()) if p.plan_graphs is not None and p.plan_graphs.captures]
    assert plans and plans[-1].replays > 0 and not plans[-1].uncapturable, plans[-1].uncapturable
    assert any(k.chain == 3 and k.plan[0] == "QuestPlan" for k in g.graphs)  # the draft: one greedy chain


@pytest.mark.parametrize("method", ["magicdec", "vegas"])
def test_plans_are_built_in_captured_graphs(method):
    """The select phase replays one CUDA graph per cache: same tokens as dense, nothing refused."""
    be = BACKENDS.build("triton")
    m = _cuda_tiny(be)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 24).tokens
    m.enable_cuda_graphs()
    # γ fixed: the adaptive controller may fall back to dense steps on a tiny model, which build no plans
    cfg = PipelineConfig.make(method=method, gamma=3, budget_ratio=0.3, sinks=2, recent=4, adaptive=False)
    eng = build_engine(m, cfg, eos_token_id=-1)
    out = eng.generate(prompts, 24).tokens
    assert out == dense
    sel = eng.drafter.selector
    caches = [c for c in list(_PLANNERS) if _PLANNERS[c].plan_graphs is not None]
    assert caches
    calls = _PLANNERS[caches[-1]].plan_graphs
    assert calls.captures >= 1 and calls.replays >= 3 and not calls.uncapturable
    # the eager construction gives the same plan as the replayed one
    cache = caches[-1]
    L = torch.tensor([50, 45], device="cuda")
    eager = sel.plan(cache, L)
    replayed = planner_for(cache).plan(sel, L)
    assert torch.equal(eager.indices, replayed.indices) and torch.equal(eager.dense_from, replayed.dense_from)


def _tutorial_keynorm():
    """The KeyNorm selector of tutorial 02, exactly as the tutorial writes it (no capture code)."""
    import json
    import types
    from pathlib import Path

    nb = json.loads((Path(__file__).parent.parent / "tutorials" / "02_selector_plugin.ipynb").read_text())
    src = next("".join(c["source"]) for c in nb["cells"] if "class KeyNormSelector" in "".join(c["source"]))
    mod = types.ModuleType("knorm_plugin_test")
    exec(src.split("\n", 1)[1], mod.__dict__)  # drop the %%writefile line
    return mod.KeyNormSelector


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_plugin_selector_without_capture_code_runs_under_cuda_graphs(backend):
    """A plugin written with no knowledge of capture (tutorial 02's KeyNorm, unchanged): its draft steps
    replay captured graphs reading the planner's buffers, and greedy output equals dense decoding."""
    from specdec import SparseSelfDrafter, SpeculativeEngine

    KeyNorm = _tutorial_keynorm()
    be = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    m = _cuda_tiny(be)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 24).tokens
    m.enable_cuda_graphs()
    try:
        sel = KeyNorm(KeyNorm.Config(budget=16, sinks=2, recent=4))
        out = SpeculativeEngine(m, SparseSelfDrafter(m, sel), gamma=3, eos_token_id=-1).generate(prompts, 24)
        g = m._graphs
        assert out.tokens == dense
        assert not g.uncapturable, g.uncapturable
        sparse_steps = [k for k in g.graphs if k.plan is not None and k.rows == 1]
        assert sparse_steps and g.replays > 3
        assert all(k.chain == 3 for k in sparse_steps)  # each draft's 3 steps replay as one graph
    finally:
        m.disable_cuda_graphs()


def test_phase_events_time_without_changing_tokens():
    """Phases timed by CUDA events (the default) and with a sync at every edge: equal tokens, every phase that ran has
    a positive time, and the disjoint phases fit in the decode time."""
    m = _cuda_tiny(BACKENDS.build("triton"))
    m.enable_cuda_graphs()
    # fixed γ: at this size the adaptive controller would fall back to dense steps (no draft phase)
    eng = build_engine(m, PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=4, adaptive=False),
                       eos_token_id=-1)
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    out = {}
    for sync in (False, True, False):
        eng.sync_timing = sync
        out[sync] = eng.generate(prompts, 12)
    m.disable_cuda_graphs()
    assert out[False].tokens == out[True].tokens
    for res in out.values():
        s = res.stats
        assert s.phase_seconds["draft"] > 0 and s.phase_seconds["verify"] > 0
        # (select runs inside the draft too: left out of the sum)
        assert sum(s.phase_seconds[k] for k in ("draft", "verify", "sample")) <= s.decode_seconds * 1.05


@pytest.mark.parametrize("method", ["magicdec", "vegas", "quest"])
def test_warm_up_captures_every_step_a_controller_may_pick(method):
    """After ``engine.warm_up`` no call captures a graph, whatever γ_t (or dense step) it runs in whatever order;
    the tokens are dense's. (Before it, a rung the controller first tried in a later call was captured there.)"""
    from specdec.adaptive import ScriptedPacing
    from specdec.graphs import capture_events

    m = _cuda_tiny(BACKENDS.build("triton"))
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 24).tokens
    m.enable_cuda_graphs()
    try:
        eng = build_engine(m, PipelineConfig.make(method=method, gamma=4, budget=12, sinks=2, recent=4),
                           eos_token_id=-1)
        assert eng.adaptive and eng.warm_up(prompts, 24) > 0
        before = capture_events()
        eng._script = ScriptedPacing([1, 0, 0, 2, 4, 0, 1, 2, 2, 4, 1, 0, 4, 4])  # another order than the warm-up's
        scripted = eng.generate(prompts, 24).tokens
        eng._script = None
        adaptive = eng.generate(prompts, 24).tokens
        assert capture_events() == before
    finally:
        m.disable_cuda_graphs()
    assert scripted == dense and adaptive == dense
