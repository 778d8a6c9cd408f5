"""Dustin under compile / CUDA graphs, checked on the CPU: the early-exit view never runs the target's
compiled module and follows its compile/graph state, the draft cache view is stable, the SRH score
request gives the per-pass signal, and the graph key includes the active backend."""

import os
from types import SimpleNamespace

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.attention.reference import ReferenceBackend
from specdec.drafters import EarlyExitDrafter, TruncatedModel, truncated_model
from specdec.errors import SpecdecError
from specdec.graphs import GraphCache, describe_step
from specdec.attention.recording import head_attention
from specdec.engine import SpeculativeEngine
from specdec.verifiers import srh_request, srh_scores

from conftest import make_tiny


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=3, num_hidden_layers=3)


def _layer_calls(model):
    calls = []
    hooks = [layer.register_forward_hook(lambda mod, a, o, i=i: calls.append(i))
             for i, layer in enumerate(model.hf.model.layers)]
    return calls, hooks


def test_view_never_uses_the_parents_compiled_module(target, monkeypatch):
    view = truncated_model(target, 1)
    assert isinstance(view, TruncatedModel)
    cache = target.new_cache(1, 16)
    x, L = torch.tensor([[5, 6]]), torch.tensor([0])
    eager = view.forward(x, cache, L)

    compiled_for = []

    def fake_compile(module, **kw):  # stands for torch.compile: records the module, runs it eagerly
        compiled_for.append(module)
        return lambda **a: module(**a)

    def parent_compiled(**a):
        raise AssertionError("the view ran the target's compiled (all-layer) module")

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(target, "_compiled", parent_compiled)
    monkeypatch.setattr(target, "_compile_rows", 16)
    calls, hooks = _layer_calls(target)
    try:
        got = view.forward(x, cache, L)
        view.forward(x, cache, L)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [0, 0]  # only the view's layer ran, twice
    assert compiled_for == [view.hf]  # its own truncated module, compiled once
    torch.testing.assert_close(got, eager)
    # a new compile on the parent → a new one on the view; none on the parent → none on the view
    monkeypatch.setattr(target, "_compiled", lambda **a: None)
    view.forward(x, cache, L)
    assert compiled_for == [view.hf, view.hf]
    monkeypatch.setattr(target, "_compiled", None)
    assert view._compiled is None


def test_view_compiled_with_dynamo_runs_only_its_layers(target):
    """A real torch.compile (dynamo, eager backend: no C compiler needed) of the view after the
    drafter was built matches the eager view and the target stays all-layer."""
    view = truncated_model(target, 2)
    cache = target.new_cache(1, 16)
    x, L = torch.tensor([[7, 8, 9]]), torch.tensor([0])
    ref_view = view.forward(x, cache, L)
    ref_target = target.forward(x, cache, L)
    target.enable_compile(backend="eager")
    try:
        calls, hooks = _layer_calls(target)
        try:
            got_view = view.forward(x, cache, L)
        finally:
            for h in hooks:
                h.remove()
        got_target = target.forward(x, cache, L)
        assert view._compiled is not None and view._compiled is not target._compiled
    finally:
        target._compiled = None
        target._compile_rows = 0
    torch.testing.assert_close(got_view, ref_view, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_target, ref_target, rtol=1e-5, atol=1e-5)


def test_view_graphs_follow_the_parent(target, monkeypatch):
    view = truncated_model(target, 1)
    assert view._graphs is None
    parent_graphs = SimpleNamespace(plan_bucket=64, max_graphs=7, max_rows=8, pool=("pool",))
    monkeypatch.setattr(target, "_graphs", parent_graphs)
    g = view._graphs
    assert isinstance(g, GraphCache) and g.model is view and g is not parent_graphs
    assert (g.plan_bucket, g.max_graphs, g.max_rows, g.pool) == (64, 7, 8, ("pool",))
    assert view._graphs is g  # made once
    monkeypatch.setattr(target, "_graphs", SimpleNamespace(plan_bucket=128, max_graphs=32, max_rows=16, pool=("pool2",)))
    assert view._graphs is not g  # the parent's was replaced
    monkeypatch.setattr(target, "_graphs", None)
    assert view._graphs is None
    with pytest.raises(SpecdecError, match="on the target"):
        view.enable_cuda_graphs()


def test_early_exit_draft_cache_view_has_one_step_description(target):
    """A new view of the same memory each iteration: the same captured steps replay (no memoised view)."""
    d = EarlyExitDrafter(target, 2)
    c1 = target.new_cache(1, 32)
    s1 = SimpleNamespace(cache=c1)
    v1 = d._draft_cache(s1)
    assert v1.n_layers == 2 and v1.k.data_ptr() == c1.k.data_ptr()
    x = torch.zeros(1, 1, dtype=torch.long)
    view = d.draft_model
    assert describe_step(view, x, d._draft_cache(s1), None, (), 0) == describe_step(view, x, v1, None, (), 0)
    c2 = target.new_cache(1, 32)
    v2 = d._draft_cache(SimpleNamespace(cache=c2))
    assert v2.k.data_ptr() == c2.k.data_ptr()
    assert describe_step(view, x, v2, None, (), 0) != describe_step(view, x, v1, None, (), 0)


def test_dustin_drafts_into_one_cache_memory_and_records_srh_in_the_verify_pass(target):
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=12, sinks=2, recent=4, options={"draft_layers": 1})
    eng = build_engine(target, cfg, eos_token_id=-1)
    view = eng.drafter.draft_model
    seen, requests = [], []
    fwd, tfwd = view.forward, target.forward

    def rec(ids, cache, *a, **k):
        seen.append((cache.k.data_ptr(), tuple(cache.k.shape)))
        return fwd(ids, cache, *a, **k)

    def trec(*a, **k):
        requests.append(k.get("scores"))
        return tfwd(*a, **k)

    view.forward = rec
    target.forward = trec
    try:
        eng.generate([list(range(3, 40)), [5, 9, 17] * 10], max_new_tokens=12)
    finally:
        del view.forward, target.forward
    assert len(seen) >= 6 and len(set(seen)) == 1
    # each verify pass carries one context request for the target's retrieval heads (no wrapper backend)
    verify = [r for r in requests if r]
    assert len(verify) >= 2
    for reqs in verify:
        ctx = [r for r in reqs if r.source == "context"]
        assert len(ctx) == 1 and ctx[0].kind == "softmax" and ctx[0].scores


def test_head_attention_full_equals_sliced():
    g = torch.Generator().manual_seed(1)
    B, H, Hkv, T, L, D = 2, 4, 2, 3, 24, 8
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    lengths = torch.tensor([5, 17])
    for heads, rows in (([0, 3], None), ([1, 2], [0, 2])):
        a = head_attention(q, k, lengths, heads, 0.3, rows=rows)
        b = head_attention(q, k, lengths, torch.tensor(heads), 0.3, rows=rows, full=True)
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("heads", [[0, 1, 2, 3, 4, 5], [4], [0, 2, 5], [1, 1, 3]])
@pytest.mark.parametrize("rows,full", [(None, False), ([0, 2], True)])
def test_group_attention_equals_head_attention_summed_per_group(heads, rows, full):
    """Dustin's target history without a key copy per query head: the sum per KV group of head_attention (all
    heads, one group, uneven groups, a head listed twice), bf16 keys as on the GPU."""
    from specdec.attention.recording import group_attention

    g = torch.Generator().manual_seed(2)
    B, H, Hkv, T, L, D = 2, 6, 3, 3, 24, 8
    q = torch.randn(B, H, T, D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, Hkv, L, D, generator=g).to(torch.bfloat16)
    lengths = torch.tensor([5, 17])
    r = None if rows is None else torch.tensor(rows)
    per_head = head_attention(q, k, lengths, heads, 0.3, rows=rows)  # (B, h, L)
    want = torch.zeros(B, Hkv, L).index_add_(1, torch.tensor(heads) // (H // Hkv), per_head)
    got = group_attention(q, k, lengths, heads, 0.3, rows=r, full=full)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_srh_request_gives_each_passs_signal(target):
    heads = {1: [0, 3], 2: [2]}
    cache = target.new_cache(2, 40)
    torch.manual_seed(0)
    cache.k.normal_()
    cache.v.normal_()

    class Reference(ReferenceBackend):  # the per-pass computation by hand: sliced to the used length, summed
        def __init__(self):
            super().__init__()
            self.scores = torch.zeros(cache.batch, cache.capacity)

        def attend(self, q, k_cache, v_cache, meta):
            if meta.layer in heads:
                self.scores += head_attention(q, k_cache, meta.lengths, heads[meta.layer], meta.scale).sum(1)
            return super().attend(q, k_cache, v_cache, meta)

    for L, x in ((torch.tensor([10, 20]), [[1, 2, 3, 4], [5, 6, 7, 8]]), (torch.tensor([12, 7]), [[9, 8, 7, 6], [5, 4, 3, 2]])):
        x = torch.tensor(x)
        ref = Reference()
        with target.using_backend(ref):
            want = target.forward(x, cache, L)
        req = srh_request(heads, x.shape[1])
        got = target.forward(x, cache, L, scores=req)
        torch.testing.assert_close(got, want)
        assert float(ref.scores.sum()) > 0 and sorted(req.scores) == [1, 2]
        torch.testing.assert_close(srh_scores(req, ref.scores), ref.scores)


def test_step_description_names_values_not_objects(target):
    """Graphs are keyed on a step description: the backend's kind and options and the cache memory, not
    object identities (a second equal backend or a new view of the same memory replays the same graph)."""
    from specdec import BACKENDS
    from specdec.cache import KVCache

    cache = target.new_cache(1, 16)
    x = torch.zeros(1, 4, dtype=torch.long)
    k1 = describe_step(target, x, cache, None, (), 0)
    assert describe_step(target, x, cache, None, (), 0) == k1
    with target.using_backend(ReferenceBackend()):  # another object, same kind and options
        assert describe_step(target, x, cache, None, (), 0) == k1
    with target.using_backend(BACKENDS.build("torch", static=True)):
        assert describe_step(target, x, cache, None, (), 0) != k1
    assert describe_step(target, x, KVCache._from(cache.k, cache.v), None, (), 0) == k1  # same memory
    assert describe_step(target, x, target.new_cache(1, 16), None, (), 0) != k1  # other memory
    assert describe_step(target, torch.zeros(1, 5, dtype=torch.long), cache, None, (), 0) != k1


def test_view_follows_the_parents_backend(target):
    view = truncated_model(target, 1)
    assert view.backend is target.backend
    other, mine = ReferenceBackend(), ReferenceBackend()
    with target.using_backend(other):
        assert view.backend is other
    with view.using_backend(mine):
        assert view.backend is mine and target.backend is not mine
    assert view.backend is target.backend


class _FrozenPlanCalls:
    """A stand-in for :class:`specdec.graphs.CapturedCall` in :class:`PlanGraphs` on the CPU: the build and every
    Python value it closed over are frozen at the first call of a key, later calls copy their inputs into the
    captured buffers and re-run the frozen build while any host read of a tensor (``tolist``, ``item``, ``int``,
    ``bool``: what a CUDA graph cannot replay) raises; outputs are the same buffers every time."""

    def __init__(self) -> None:
        self.graphs: dict = {}
        self.captures = self.replays = 0
        self.uncapturable: dict = {}

    @staticmethod
    def _no_host_reads(fn, *args):
        def refuse(*a, **k):
            raise AssertionError("a host read of a device tensor inside a captured plan")

        names = ("tolist", "item", "__int__", "__bool__", "__index__")
        saved = {n: getattr(torch.Tensor, n) for n in names}
        for n in names:
            setattr(torch.Tensor, n, refuse)
        try:
            return fn(*args)
        finally:
            for n, f in saved.items():
                setattr(torch.Tensor, n, f)

    def __call__(self, key, fn, *inputs, keep=None):
        full = (key, tuple((tuple(t.shape), t.dtype) for t in inputs))
        if full not in self.graphs:
            statics = tuple(t.clone() for t in inputs)
            outs = self._no_host_reads(fn, *statics)
            self.graphs[full] = (fn, statics, outs)
            self.captures += 1
            return outs
        frozen, statics, outs = self.graphs[full]
        for s, t in zip(statics, inputs):
            s.copy_(t)
        new = self._no_host_reads(frozen, *statics)
        from specdec.interfaces import plan_tensors

        for name, t in plan_tensors(new).items():  # every tensor field (a per-layer plan has more)
            if getattr(outs, name) is not t:
                getattr(outs, name).copy_(t)
        self.replays += 1
        return outs


def _freeze_plan_graphs(monkeypatch) -> None:
    """Plans of capturable selectors go through :class:`PlanGraphs` on the CPU, with the stand-in above as its calls."""
    from specdec.graphs import PlanGraphs

    monkeypatch.setattr(PlanGraphs, "applies", staticmethod(
        lambda sel, lengths: getattr(sel, "capturable_plan", False) is True))
    real = PlanGraphs.__init__

    def init(self, max_graphs=4):
        real(self, max_graphs)
        self.calls = _FrozenPlanCalls()

    monkeypatch.setattr(PlanGraphs, "__init__", init)


@pytest.mark.parametrize("budget,split", [(dict(budget_ratio=0.25), {}), (dict(budget_ratio=1.0), {}),
                                          (dict(budget=12), dict(m=3)),
                                          (dict(budget_ratio=0.4), dict(layer_share=0.5, page_size=4,
                                                                        page_kernels="triton")),
                                          (dict(budget_ratio=0.4), dict(layer_share=1.0, layer_scores="keys",
                                                                        key_rank=4, page_kernels="torch"))])
def test_dustin_plan_captured_equals_eager(target, monkeypatch, budget, split):
    """The hybrid plan replayed as a graph (stand-in above: no host read, frozen build) gives the eager plan
    at every iteration of a greedy Dustin generation, and the tokens are the eager run's; at budget = the whole
    context both equal dense greedy decoding. Per-layer sets too (their page bounds updated by the Triton kernel,
    the interpreter on the CPU): their shared part and per-layer fields replay, and so do each layer's picks; sets
    ranked by low-rank keys as well (the verifier brings the keys up to date eagerly, from the host's lengths, before
    each plan: the plan itself is captured)."""
    if split.get("page_kernels") == "triton":
        pytest.importorskip("triton", reason="the page-bound kernels need the optional 'triton' package")
        if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):  # read when the kernels are defined
            pytest.skip("the tiny model runs on the CPU: the Triton kernels need TRITON_INTERPRET=1 (the test command's)")
    from specdec.planner import planner_for

    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 5]
    cfg = PipelineConfig.make(method="dustin", gamma=3, sinks=2, recent=4,
                              options=dict(draft="early-exit", draft_layers=1, lookup_min=0, **split), **budget)

    def run(captured: bool):
        eng = build_engine(target, cfg, eos_token_id=-1)
        plans = []
        if captured:
            _freeze_plan_graphs(monkeypatch)
        orig = eng.verifier.verify

        def verify(state, tokens, scores):
            out = orig(state, tokens, scores)
            p = eng.verifier.last_plan
            if p is not None:
                direct = eng.verifier.selector.plan(state.cache, state.lengths)
                plans.append((p.indices.clone(), direct.indices))
                if hasattr(p, "room"):  # a per-layer plan: its fields and one layer's picks for the same queries
                    q = torch.randn(state.lengths.shape[0], target.dims.n_heads, 2, target.dims.head_dim)
                    for name in ("room", "new", "counts"):
                        if hasattr(p, name):
                            plans.append((getattr(p, name).clone(), getattr(direct, name)))
                    plans.append((p.indices_for(1, q), direct.indices_for(1, q)))
            return out

        eng.verifier.verify = verify
        out = eng.generate(prompts, 16)
        pg = planner_for(eng.verifier._state.cache).plan_graphs if captured else None
        monkeypatch.undo()
        return out.tokens, plans, pg

    eager, eager_plans, _ = run(False)
    got, plans, pg = run(True)
    assert got == eager
    assert len(plans) >= 2 and pg is not None and pg.captures >= 1 and pg.replays >= 1
    assert not pg.uncapturable
    for replayed, direct in plans:
        assert torch.equal(replayed, direct)  # the replayed buffers hold this iteration's plan
    if budget.get("budget_ratio") == 1.0:
        dense = SpeculativeEngine(target, method="dense", eos_token_id=-1).generate(prompts, 16).tokens
        assert got == dense


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,rows", [([0, 1, 2, 3, 4, 5], None), ([4], [0, 2]), ([1, 1, 3], [2]), ([0, 5], [1, 1])])
@pytest.mark.parametrize("splits", [1, 3, None])
def test_group_scores_kernel_equals_group_attention(dtype, heads, rows, splits):
    """The Triton SRH scores (two passes over the keys) against the PyTorch group_attention they replace on CUDA:
    ragged lengths (one near the capacity), all / one / uneven groups, a head or a row listed twice, one chunk,
    several chunks whose partials are merged, and the automatic split."""
    from specdec.attention.recording import group_attention
    from specdec.cuda.triton_srh import group_scores

    # the kernel where it runs: on a GPU natively, on the CPU only under the interpreter (the test command's)
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    dev = "cpu" if interpret or not torch.cuda.is_available() else "cuda"
    if dev == "cpu" and not interpret:
        pytest.skip("no GPU: the Triton kernel runs on the CPU only with TRITON_INTERPRET=1 (the test command's)")
    g = torch.Generator().manual_seed(4)
    B, H, Hkv, T, L, D = 2, 6, 3, 3, 200, 16
    q = torch.randn(B, H, T, D, generator=g).to(dtype).to(dev)
    k = (2 * torch.randn(B, Hkv, L, D, generator=g)).to(dtype).to(dev)
    lengths = torch.tensor([5, L - T], device=dev)
    r = None if rows is None else torch.tensor(rows, device=dev)
    want = group_attention(q, k, lengths, heads, 0.3, rows=r, full=True)
    got = group_scores(q, k, lengths, heads, 0.3, rows=rows, num_splits=splits, block_n=16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_srh_request_through_the_kernel_equals_torch(target, monkeypatch):
    """A forward carrying Dustin's SRH request gives the same scores (and logits) with the Triton kernels
    (``GROUP_SCORES="triton"``, as on CUDA) as with group_attention, for all rows and for a subset."""
    from specdec.attention import recording
    from specdec.interfaces import ScoreRequest

    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):  # (on a GPU: test_group_scores_kernel_equals_group_attention)
        pytest.skip("the tiny model runs on the CPU: the Triton kernels need TRITON_INTERPRET=1 (the test command's)")
    cache = target.new_cache(2, 40)
    torch.manual_seed(0)
    cache.k.normal_()
    cache.v.normal_()
    x, L = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]), torch.tensor([10, 20])
    heads = {1: [0, 3], 2: [2, 2]}
    makers = {"all": lambda: srh_request(heads, x.shape[1]),
              "subset": lambda: ScoreRequest(rows=[0, 3], kind="softmax", heads="group", layers=[1, 2],
                                             query_heads=heads, source="context")}
    from specdec.cuda import triton_srh

    calls = []
    kernel = triton_srh.group_scores
    monkeypatch.setattr(triton_srh, "group_scores", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    got, want = {}, {}
    for mode, out in (("torch", want), ("triton", got)):
        monkeypatch.setattr(recording, "GROUP_SCORES", mode)
        for name, make in makers.items():
            req = make()
            logits = target.forward(x, cache, L, scores=req)
            out[name] = (logits, {k: v.clone() for k, v in req.scores.items()})
    assert len(calls) == 4  # the kernel path ran: 2 requests x 2 layers, only with "triton"
    for name in ("all", "subset"):
        torch.testing.assert_close(got[name][0], want[name][0])
        assert sorted(got[name][1]) == [1, 2]
        for layer in (1, 2):
            assert float(want[name][1][layer].sum()) > 0
            torch.testing.assert_close(got[name][1][layer], want[name][1][layer], rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(recording, "GROUP_SCORES", "fast")
    with pytest.raises(ValueError, match="GROUP_SCORES must be"):
        target.forward(x, cache, L, scores=srh_request(heads, x.shape[1]))


def test_graph_step_key_names_the_context_score_kernels(target, monkeypatch):
    """A forward captured with the SRH scores of one implementation is not replayed for the other (the
    benchmarks compare both in one process); requests of the attention's own scores are unaffected."""
    from specdec.attention import recording
    from specdec.interfaces import ScoreRequest

    cache = target.new_cache(1, 16)
    x = torch.zeros(1, 2, dtype=torch.long)
    ctx = srh_request({1: [0]}, 2)
    own = ScoreRequest(rows=[0, 1], kind="logits")
    keys = {}
    for mode in ("auto", "torch"):
        monkeypatch.setattr(recording, "GROUP_SCORES", mode)
        keys[mode] = (describe_step(target, x, cache, None, (ctx,), 1), describe_step(target, x, cache, None, (own,), 1))
    assert keys["auto"][0] != keys["torch"][0]
    assert keys["auto"][1] == keys["torch"][1]


def test_per_layer_page_bounds_are_fresh_when_another_engines_plan_graph_serves(target, monkeypatch):
    """Engines built in turn share the model's reused cache, so the second engine's plans replay the first one's plan
    graph (stand-in above), whose page-bound update reads the cache's planner buffers: the second selector's reset must
    zero them although it never planned itself. Checked against a recomputation of the bounds at every sparse pass."""
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("the tiny model runs on the CPU: the Triton kernels need TRITON_INTERPRET=1 (the test command's)")
    pytest.importorskip("triton", reason="the page-bound kernels need the optional 'triton' package")
    from specdec.planner import planner_for
    from specdec.selectors.quest import page_minmax

    _freeze_plan_graphs(monkeypatch)
    cfg = PipelineConfig.make(method="dustin", gamma=3, sinks=2, recent=4, budget_ratio=0.4,
                              options=dict(draft="early-exit", draft_layers=1, lookup_min=0, layer_share=0.5,
                                           page_size=4, page_kernels="triton"))
    first = build_engine(target, cfg, eos_token_id=-1)
    first.generate([list(range(3, 60)), [7, 1, 9] * 19], 12)
    second = build_engine(target, cfg, eos_token_id=-1)
    checked = []
    orig = second.verifier.verify

    def verify(state, tokens, scores):
        p = planner_for(state.cache)
        out = orig(state, tokens, scores)
        if second.verifier.last_plan is not None:
            kmin = p.buffer("quest.kmin", tuple(second.verifier.last_plan.kmin.shape), state.cache.k.dtype)
            for b, n in enumerate(second.verifier.last_plan.lengths.tolist()):
                want, _ = page_minmax(state.cache.k[:, b], n, 4)
                checked.append(torch.equal(kmin[:, b, :, : want.shape[2]].float(), want))
        return out

    second.verifier.verify = verify
    second.generate([[5, 9, 17, 33, 2, 8] * 5, list(range(40, 70))], 12)
    pg = planner_for(second.verifier._state.cache).plan_graphs
    assert pg is not None and pg.replays >= 1  # the second engine's plans came from the first engine's graph
    assert checked and all(checked), checked
