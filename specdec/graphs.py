"""All CUDA-graph capture of specdec: whole model forwards and plan construction, in one module.

On a GPU, one decode step of a small model is a few hundred kernel launches: the launch and
Python overhead, not the memory traffic, sets its time (docs page *Optimized backends*). :class:`GraphCache`
captures :meth:`SpecdecModel.forward` once per **step description** (:class:`Step`, built by
:func:`describe_step` from the forward's arguments: rows, batch, the cache memory it writes, the
plan's kind and shapes, the score requests, ``logits_to_keep`` and the backend's kind and options —
values, not object identities) into a CUDA graph and replays it: each call copies ``input_ids``
and ``lengths`` into the captured buffers and runs the whole forward with one launch.

Plans are data: a plan loaded by the cache's :class:`~specdec.planner.Planner` lives in buffers
whose addresses do not change, so the captured step reads them directly and a replay copies
nothing; any other plan's tensor fields are copied into the captured step's own buffers (generic
over the plan's dataclass fields, whatever its kind). Plans are padded with ``-1`` to a multiple of
``plan_bucket`` (unless their size is fixed per cache) so a growing ratio budget does not trigger a
capture every few tokens.

:class:`PlanGraphs` replays the construction of a :class:`~specdec.selectors.base.BudgetSelector`
plan as one CUDA graph: the selector's tensor attributes are inputs of the graph (copied into
captured buffers before each replay), so a selector written with no knowledge of capture — the
plugin guide's ``KeyNorm`` — is captured as is.

Before capturing, a step is warmed up once normally and once with host synchronisation forbidden
(``torch.cuda.set_sync_debug_mode("error")``): a step that syncs is refused (``uncapturable``,
run eagerly from then on) before a capture begins, because a capture that fails midway leaves the
CUDA random-number generator unusable.

Requirements: the backend declares ``capture_safe = True`` (no host synchronisation, static
shapes: e.g. ``TorchBackend(TorchConfig(static=True))``), and the forward runs in "static" mode
(the cache skips its host-side capacity check — the engine sizes the cache up front).
Enable with :meth:`SpecdecModel.enable_cuda_graphs`.
"""

from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.cache import KVCache
from specdec.interfaces import ScoreRequest, SparsePlan, plan_tensors


_EVENTS = [0]


def lru_get(graphs: dict, key):
    """``graphs[key]`` moved to the end of the dict (most recently used), or ``None``: the caches of captured graphs
    evict from the front, so this makes them least-recently-used. They evicted the oldest *capture* before, however
    often it replayed: with one more key than slots, every call recaptured."""
    g = graphs.pop(key, None)
    if g is not None:
        graphs[key] = g
    return g


def capture_events() -> int:
    """How many captures (and refused warm-ups) happened so far in this process: an iteration during
    which this grew paid for one, and its wall time is not a steady-state cost (:mod:`specdec.adaptive`)."""
    return _EVENTS[0]


@dataclass(frozen=True)
class Step:
    """What a captured forward depends on besides tensor values: two forwards with equal steps run
    the same kernels on the same buffers, so one graph serves both."""

    rows: int
    batch: int
    cache: tuple  # the memory the forward writes: data pointers, shape and dtype of k and v, rings and layer layout
    plan: tuple | None  # the plan's kind, tensor shapes and settings (None: dense)
    scores: tuple  # the score requests
    logits_to_keep: int
    backend: tuple  # the backend's kind and options
    hidden: bool = False  # the final hidden states are recorded too (``model.keep_hidden``, EAGLE drafters)
    hidden_layers: tuple = ()  # and these decoder layers' outputs (``model.hidden_layers``, fused features)
    chain: int = 0  # > 0: this many greedy steps of the forward in one graph (:meth:`GraphCache.greedy_chain`)
    tree: tuple | None = None  # a draft tree's rows: the tree object's id, paths and lookup branch (its mask is read)
    few_live: int = 0  # a dense forward for at most this many live sequences (``KVCache.few_live``: a valve's re-run)


def plan_description(plan: SparsePlan | None) -> tuple | None:
    """A plan's kind, the shapes and dtypes of its tensor fields and its other settings."""
    if plan is None:
        return None
    parts = [type(plan).__qualname__]
    for f in dataclasses.fields(plan):
        v = getattr(plan, f.name)
        if isinstance(v, torch.Tensor):
            parts.append((f.name, tuple(v.shape), str(v.dtype)))
        elif isinstance(v, (int, float, bool, str, type(None))):
            parts.append((f.name, v))
    return tuple(parts)


def backend_description(backend) -> tuple:
    config = getattr(backend, "config", None)
    return (type(backend).__module__, type(backend).__qualname__, repr(config))


def describe_step(model, input_ids: torch.Tensor, cache: KVCache, plan: SparsePlan | None,
                  scores: tuple[ScoreRequest, ...], logits_to_keep: int, tree=None) -> Step:
    """The :class:`Step` of one forward (``plan`` already padded; ``tree``: a draft tree's rows)."""
    memory = (cache.k.data_ptr(), cache.v.data_ptr(), tuple(cache.k.shape), str(cache.k.dtype),
              _ring_memory(cache))
    return Step(rows=int(input_ids.shape[1]), batch=int(input_ids.shape[0]), cache=memory,
                plan=plan_description(plan), scores=tuple(_score_key(r) for r in scores),
                logits_to_keep=int(logits_to_keep), backend=backend_description(model.backend),
                hidden=bool(getattr(model, "keep_hidden", False)),
                hidden_layers=tuple(getattr(model, "hidden_layers", ())) if getattr(model, "keep_hidden", False) else (),
                tree=None if tree is None else (id(tree), tree.paths, tree.lookup),
                few_live=int(getattr(cache, "few_live", 0)) if plan is None else 0)


def _ring_memory(cache: KVCache) -> tuple | None:
    """The sliding-window rings a forward writes (pointers, shape) and the layer layout: two views
    with the same global buffers but other rings (or another split of the layers) are other steps."""
    rk = getattr(cache, "ring_k", None)
    if rk is None:
        return None
    return (rk.data_ptr(), cache.ring_v.data_ptr(), tuple(rk.shape), tuple(cache.windows))


def _score_key(req: ScoreRequest) -> Any:
    qh = None if req.query_heads is None else tuple(sorted((k, tuple(v)) for k, v in req.query_heads.items()))
    layers = None if req.layers is None else tuple(req.layers)
    from specdec.attention import recording

    how = recording.GROUP_SCORES if req.source == "context" else None  # which kernels a context request runs
    return (tuple(req.rows), req.kind, req.heads, layers, qh, req.per_row, req.source, how)


def _blank(req: ScoreRequest) -> ScoreRequest:
    """A request like ``req`` with its own (empty) result dictionary, for a captured step to fill."""
    return ScoreRequest(rows=list(req.rows), kind=req.kind, heads=req.heads, layers=req.layers,
                        query_heads=req.query_heads, per_row=req.per_row, source=req.source)


def _reason(exc: BaseException) -> str:
    """One line saying why a step was refused (kept in ``uncapturable``)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _warm_up(step) -> None:
    """Run ``step()`` twice on a side stream before a capture: once normally (allocations, autotuning,
    compilation happen off the capture), once with host synchronisation forbidden, so a step that
    syncs raises here, before a capture begins (a capture that fails midway leaves the CUDA RNG
    unusable)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            step()
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("error")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(mode)
    finally:
        torch.cuda.current_stream().wait_stream(side)


@dataclass
class _Graph:
    graph: Any
    ids: torch.Tensor
    lengths: torch.Tensor
    plan: SparsePlan | None
    reqs: tuple[ScoreRequest, ...]
    logits: torch.Tensor = field(default=None)  # type: ignore[assignment]
    backend: Any = None  # the backend captured (kept alive: the graph may read buffers it owns)
    hidden: torch.Tensor | None = None  # the captured final hidden states (``Step.hidden``)
    replan: Any = None  # the backend's token for ``before_replay`` (peers planned on the host: FlashInfer)
    tree: Any = None  # the draft tree captured (kept alive: the graph reads its mask and depths in place)


@dataclass
class _Chain:
    """A captured greedy chain (:meth:`GraphCache.greedy_chain`): its input buffers and its outputs."""

    graph: Any
    ids: torch.Tensor
    lengths: torch.Tensor
    plan: SparsePlan | None
    tokens: torch.Tensor
    flags: torch.Tensor
    backend: Any = None  # the backend captured (kept alive: the graph may read buffers it owns)


def greedy_chain_steps(forward, first: torch.Tensor, lengths: torch.Tensor,
                       gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``gamma`` greedy decode steps from ``first`` ``(B, 1)``: step ``i`` runs ``forward(ids (B, 1), lengths + i)``
    (logits ``(B, 1, V)``) and takes the argmax. Returns the tokens ``(B, gamma)`` and the non-finite flags of the
    steps' logits OR-ed (:func:`specdec.sampling.nonfinite_flags`). The body :meth:`GraphCache.greedy_chain` captures
    (``forward`` an eager static forward) and :meth:`SpecdecModel.greedy_steps` runs without graphs (``forward``
    :meth:`SpecdecModel.forward`): the same kernels per step, so the same tokens."""
    from specdec.sampling import nonfinite_flags

    B = first.shape[0]
    cur, tokens, flags = first.view(B, 1), [], None
    for i in range(gamma):
        logits = forward(cur, lengths + i)[:, -1]
        f = nonfinite_flags(logits)
        flags = f if flags is None else flags | f
        nxt = logits.argmax(dim=-1)
        tokens.append(nxt)
        cur = nxt.view(B, 1)
    return torch.stack(tokens, dim=1), flags


class GraphCache:
    """Captured forwards of one :class:`~specdec.models.SpecdecModel`, keyed by :class:`Step`."""

    def __init__(self, model, plan_bucket: int = 128, max_graphs: int = 32, max_rows: int = 16, pool=None) -> None:
        self.model = model
        self.max_rows = max_rows  # forwards of more tokens per sequence (prefill chunks) run eagerly
        self.plan_bucket = plan_bucket
        self.max_graphs = max_graphs
        self.graphs: dict[Step, _Graph | _Chain] = {}
        #: step shapes whose capture failed (the reason), run eagerly from then on
        self.uncapturable: dict[Any, str] = {}
        # memory pool of the captures; an early-exit view shares its parent's (graphs never run concurrently)
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.captures = 0
        self.replays = 0

    @classmethod
    def for_view(cls, parent: "GraphCache", view) -> "GraphCache":
        """The graphs of a view of ``parent``'s model (an early-exit draft): its own captures, bound to
        the view, with the parent's settings and memory pool (graphs never run concurrently)."""
        return cls(view, plan_bucket=parent.plan_bucket, max_graphs=parent.max_graphs, max_rows=parent.max_rows,
                   pool=parent.pool)

    def _pad_plan(self, plan: SparsePlan) -> SparsePlan:
        if type(plan) is not SparsePlan or plan.static_size:
            # a query-aware plan sizes its own buffers (e.g. Quest's bucketed k_sel); a plan of fixed
            # size per cache (BudgetSelector's) has one shape already: padding would only add tiles
            return plan
        K = plan.indices.shape[-1]
        Kp = -(-K // self.plan_bucket) * self.plan_bucket
        if Kp == K:
            return plan
        pad = plan.indices.new_full((*plan.indices.shape[:-1], Kp - K), -1)
        return SparsePlan(indices=torch.cat([plan.indices, pad], dim=-1), dense_from=plan.dense_from)

    def run(
        self,
        input_ids: torch.Tensor,
        cache: KVCache,
        lengths: torch.Tensor,
        plan: SparsePlan | None,
        scores: tuple[ScoreRequest, ...],
        logits_to_keep: int,
        tree=None,
    ) -> torch.Tensor:
        """Replay (capturing first if needed) the forward of this step shape; returns fresh logits. ``tree``: the rows
        are a :class:`~specdec.tree.DraftTree`'s (any row count up to its size; one graph per tree object)."""
        if input_ids.shape[1] > self.max_rows and tree is None:
            # prefill chunks are few and large (nothing to gain from a graph)
            return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep)
        if plan is not None:
            plan = self._pad_plan(plan)
        key = describe_step(self.model, input_ids, cache, plan, scores, logits_to_keep, tree)
        if key in self.uncapturable:  # this step shape runs eagerly (e.g. a score path that syncs)
            return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, tree=tree)
        g = lru_get(self.graphs, key)
        if g is None:
            if len(self.graphs) >= self.max_graphs:  # bound memory: drop the least recently used shape
                self.graphs.pop(next(iter(self.graphs)))
            try:
                g = self._capture(key, input_ids, cache, lengths, plan, scores, logits_to_keep, tree)
            except RuntimeError as exc:
                _EVENTS[0] += 1
                self.uncapturable[key] = _reason(exc)
                torch.cuda.synchronize()
                return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, tree=tree)
        else:
            g.ids.copy_(input_ids)
            g.lengths.copy_(lengths)
            if plan is not None:
                _load_plan(plan, g.plan)
            if g.replan is not None:  # a peer whose plan is host work (FlashInfer): re-plan it for these lengths
                g.backend.before_replay(g.replan, lengths)
            g.graph.replay()
            self.replays += 1
        for live, captured in zip(scores, g.reqs):
            if not captured.scores:
                continue
            # one copy of all layers (views of one tensor) instead of a clone per layer
            layers = list(captured.scores)
            vals = [captured.scores[layer] for layer in layers]
            if all(v.shape == vals[0].shape for v in vals):
                live.scores = dict(zip(layers, torch.stack(vals).unbind(0)))
            else:
                live.scores = {layer: v.clone() for layer, v in zip(layers, vals)}
        if g.hidden is not None:
            self.model.last_hidden = g.hidden.clone()
        return g.logits.clone()

    def greedy_chain(self, first: torch.Tensor, cache: KVCache, lengths: torch.Tensor, plan: SparsePlan | None,
                     gamma: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``gamma`` greedy single-token steps from ``first`` ``(B, 1)`` (a sparse draft: every step reads ``plan``)
        replayed as **one** CUDA graph per step description and ``gamma``: the forwards, the argmax and the
        non-finite flags between them. Stepping through :meth:`run` costs ``gamma`` graph launches plus ~10 small
        launches and a step description per step on the host, which the GPU waits for when a step is short (a 5 %
        draft step of a small model). Returns what :func:`greedy_chain_steps` returns (fresh tensors), or ``None``
        where the chain is not captured (a forward that records hidden states, a step shape or chain that failed to
        capture, a backend that re-plans its peers per forward): then the caller steps through :meth:`run`."""
        if plan is not None:
            plan = self._pad_plan(plan)
        step = describe_step(self.model, first, cache, plan, (), 0)
        key = dataclasses.replace(step, chain=int(gamma))
        if step.hidden or step in self.uncapturable or key in self.uncapturable:
            return None
        g = lru_get(self.graphs, key)
        if g is None:
            if len(self.graphs) >= self.max_graphs:
                self.graphs.pop(next(iter(self.graphs)))
            try:
                g = self._capture_chain(key, first, cache, lengths, plan, gamma)
            except RuntimeError as exc:
                _EVENTS[0] += 1
                self.uncapturable[key] = _reason(exc)
                torch.cuda.synchronize()
                return None
            if g is None:
                return None
        else:
            g.ids.copy_(first)
            g.lengths.copy_(lengths)
            if plan is not None:
                _load_plan(plan, g.plan)
            g.graph.replay()
            self.replays += 1
        return g.tokens.clone(), g.flags.clone()

    def _capture_chain(self, key, first, cache, lengths, plan, gamma) -> _Chain | None:
        ids = first.clone()
        lens = lengths.clone()
        splan = None if plan is None else _own_plan(plan)

        def chain():
            return greedy_chain_steps(lambda x, at: self.model._eager_forward(x, cache, at, splan, (), 0, static=True),
                                      ids, lens, gamma)

        backend = self.model.backend
        graph, (tokens, flags), replan = self._warm_and_capture(chain)
        _EVENTS[0] += 1
        if replan is not None:  # each step's peers would need a re-plan at its own lengths: step one by one
            self.uncapturable[key] = "the backend re-plans its peers before each forward's replay"
            return None
        graph.replay()
        g = _Chain(graph=graph, ids=ids, lengths=lens, plan=splan, tokens=tokens, flags=flags, backend=backend)
        self.graphs[key] = g
        self.captures += 1
        return g

    def _warm_and_capture(self, fn) -> tuple[Any, Any, Any]:
        """Warm ``fn`` up (:func:`_warm_up`) and capture it into a graph of this cache's pool: ``(graph, fn's outputs,
        the backend's re-plan token)``. A backend whose peers plan on the host (FlashInfer) records what the forwards
        run, plans it at the first warm-up and returns a token to re-plan it before every replay
        (``TritonBackend.capture_begin`` / ``capture_end``); ``None`` when nothing needs it."""
        backend = self.model.backend
        begin, end = getattr(backend, "capture_begin", None), getattr(backend, "capture_end", None)
        if begin is not None:
            begin()
        try:
            _warm_up(fn)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                out = fn()
        finally:
            replan = end() if end is not None else None
        return graph, out, replan

    def _capture(self, key, input_ids, cache, lengths, plan, scores, logits_to_keep, tree=None) -> _Graph:
        ids = input_ids.clone()
        lens = lengths.clone()
        splan = None if plan is None else _own_plan(plan)
        reqs = tuple(_blank(r) for r in scores)

        def step():
            return self.model._eager_forward(ids, cache, lens, splan, reqs, logits_to_keep, static=True, tree=tree)

        backend = self.model.backend
        graph, logits, replan = self._warm_and_capture(step)
        graph.replay()  # the captured run leaves outputs unset until the first replay
        hidden = self.model.last_hidden if key.hidden else None  # the captured run's buffer (the hook kept it)
        g = _Graph(graph=graph, ids=ids, lengths=lens, plan=splan, reqs=reqs, logits=logits, backend=backend,
                   hidden=hidden, replan=replan, tree=tree)
        self.graphs[key] = g
        self.captures += 1
        _EVENTS[0] += 1
        return g


#: buffers whose address never changes while they are in use (a planner's buffers,
#: :mod:`specdec.planner` registers them): a captured step reads them in place
_STABLE: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def keep_address(t: torch.Tensor) -> torch.Tensor:
    """Register ``t`` as a buffer a captured step may read in place (its owner keeps its address); returns ``t``."""
    _STABLE[id(t)] = t
    return t


def forget_address(t: torch.Tensor) -> None:
    """Undo :func:`keep_address` (the owner replaced the buffer)."""
    if _STABLE.get(id(t)) is t:
        del _STABLE[id(t)]


def has_stable_address(t: torch.Tensor) -> bool:
    """Whether ``t`` was registered with :func:`keep_address` (a planner's buffer)."""
    return _STABLE.get(id(t)) is t


def _own_plan(plan: SparsePlan) -> SparsePlan:
    """The plan a captured step reads: ``plan`` itself when its tensors are a planner's buffers (their
    addresses never change), else a copy with its own buffers."""
    tensors = plan_tensors(plan)
    if all(has_stable_address(t) for t in tensors.values()):
        return plan
    return dataclasses.replace(plan, **{n: t.clone() for n, t in tensors.items() if not has_stable_address(t)})


def _load_plan(live: SparsePlan, static: SparsePlan) -> None:
    """Before a replay: copy each tensor field of ``live`` that is not already the captured buffer."""
    st = plan_tensors(static)
    for name, t in plan_tensors(live).items():
        if t.data_ptr() != st[name].data_ptr():
            st[name].copy_(t)


def call_key(key: Any, inputs) -> tuple:
    """:class:`CapturedCall`'s graph key: ``key`` and each input's shape, dtype, device and, for a buffer whose owner
    keeps its address (:func:`keep_address`), that address (the graph reads it in place)."""
    return (key, tuple((tuple(t.shape), t.dtype, str(t.device), t.data_ptr() if has_stable_address(t) else None)
                       for t in inputs))


class CapturedCall:
    """Replay a function of tensors as one CUDA graph per key (used for plan building, where an
    eager run is ~30 small launches the GPU waits on between the acceptance and the next draft).

    ``fn(*inputs)`` must read only its ``inputs`` and buffers that stay the same for one ``key``
    (pass their owner as ``keep`` so it outlives the graph), and must not synchronise with the host.
    The first call with a key warms ``fn`` up twice on a side stream (the second time with host
    synchronisation forbidden, so a syncing ``fn`` is refused before a capture begins), captures it
    and returns its outputs; later calls copy the inputs into the captured buffers and replay. The
    outputs are the captured buffers: overwritten by the next call with the same key, so callers
    that keep them clone them. A key whose warm-up fails runs eagerly from then on
    (:attr:`uncapturable` holds the reason).
    """

    def __init__(self, max_graphs: int = 8) -> None:
        self.max_graphs = max_graphs
        self.graphs: dict[Any, tuple] = {}
        self.uncapturable: dict[Any, str] = {}
        self.captures = 0
        self.replays = 0

    def __call__(self, key: Any, fn, *inputs: torch.Tensor, keep: Any = None):
        # an input whose owner keeps its address (keep_address: a planner's buffer, Vegas' score buffer)
        # is read in place by the graph: no copy per call (Vegas' scores are ~63 MB at B = 64 x 8k); its
        # address is part of the key, so a replaced buffer is another graph
        full = call_key(key, inputs)
        if full in self.uncapturable or torch.cuda.is_current_stream_capturing():
            return fn(*inputs)
        g = lru_get(self.graphs, full)
        if g is not None:
            graph, statics, outs, _ = g
            for s, t in zip(statics, inputs):
                if s is not t:
                    s.copy_(t)
            graph.replay()
            self.replays += 1
            return outs
        if len(self.graphs) >= self.max_graphs:
            self.graphs.pop(next(iter(self.graphs)))
        statics = tuple(t if has_stable_address(t) else t.clone() for t in inputs)
        try:
            _warm_up(lambda: fn(*statics))
        except RuntimeError as exc:
            _EVENTS[0] += 1
            torch.cuda.synchronize()
            self.uncapturable[full] = _reason(exc)
            return fn(*inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = fn(*statics)
        graph.replay()  # the capture itself computes nothing
        self.graphs[full] = (graph, statics, outs, keep)
        self.captures += 1
        _EVENTS[0] += 1
        return outs


class PlanGraphs:
    """Plan construction of :class:`~specdec.selectors.base.BudgetSelector` selectors replayed as CUDA
    graphs (an eager build is ~30 small launches the GPU waits on between the acceptance and the next
    draft).

    The graph's inputs are ``lengths`` and every tensor attribute of the selector (Vegas' scores, a
    plugin's statistics): they are copied into captured buffers before each replay, and during the
    capture the selector's attributes point at those buffers. The key is the selector's type, the
    cache memory and capacity, and the shapes of the inputs, so a selector needs no capture code; a
    build that synchronises with the host is refused at its warm-up and runs eagerly from then on.
    Plan construction must not modify the selector (``score`` is a function of the cache, the
    lengths and the selector's state).
    """

    def __init__(self, max_graphs: int = 8) -> None:
        # per cache: a method's plan with and without scores (first plan, re-plan after dense steps), and another
        # method's (engines built in turn on a reused cache); 4 was one short of the a14 benchmark's set
        self.calls = CapturedCall(max_graphs=max_graphs)

    @staticmethod
    def applies(selector, lengths: torch.Tensor) -> bool:
        """Whether ``selector``'s plans are built through a graph: a :class:`BudgetSelector` that keeps
        the base ``plan``, or one whose ``capturable_plan`` is true (Dustin's hybrid set with a static split:
        a pure function of the lengths and its signals, widths known on the host), on a GPU; others (Quest,
        the adaptive or per-layer hybrid) run eagerly."""
        from specdec.selectors.base import BudgetSelector

        pure = ((isinstance(selector, BudgetSelector) and type(selector).plan is BudgetSelector.plan
                 and not selector.plans_in_one_launch(lengths))  # the fused plan: one launch, nothing to capture
                or getattr(selector, "capturable_plan", False) is True)  # a plan() that declares itself pure
        return lengths.is_cuda and pure and not torch.cuda.is_current_stream_capturing()

    @property
    def captures(self) -> int:
        return self.calls.captures

    @property
    def replays(self) -> int:
        return self.calls.replays

    @property
    def uncapturable(self) -> dict:
        return self.calls.uncapturable

    @staticmethod
    def _key(selector, cache: KVCache) -> tuple[tuple, list[str]]:
        names = sorted(n for n, v in vars(selector).items() if isinstance(v, torch.Tensor))
        absent = tuple(sorted(n for n, v in vars(selector).items() if v is None))
        # the settings too: two selectors of one type on one cache (engines built in turn on a reused cache)
        # must not replay each other's plan
        key = (type(selector), repr(getattr(selector, "config", None)), cache.k.data_ptr(), cache.capacity,
               tuple(names), absent)
        return key, names

    @classmethod
    def key(cls, selector, cache: KVCache, lengths: torch.Tensor) -> tuple:
        """The graph key a plan of ``selector`` on ``cache`` would replay now (equal keys: one captured graph)."""
        key, names = cls._key(selector, cache)
        return call_key(key, [lengths] + [getattr(selector, n) for n in names])

    def __call__(self, selector, cache: KVCache, lengths: torch.Tensor) -> SparsePlan:
        key, names = self._key(selector, cache)
        state = [getattr(selector, n) for n in names]

        def build(lens, *tensors):
            saved = [getattr(selector, n) for n in names]
            for n, t in zip(names, tensors):
                setattr(selector, n, t)
            try:
                return selector.plan(cache, lens)
            finally:
                for n, t in zip(names, saved):
                    setattr(selector, n, t)

        # no keep=cache: these graphs belong to the cache's planner, which lives as long as the cache
        out = self.calls(key, build, lengths, *state)
        # the graph's output buffers are rewritten by the next replay: hand out a plan object of its own
        return copy.copy(out)
