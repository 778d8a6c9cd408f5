"""CUDA-graph capture of whole model forwards (draft steps, verify passes, dense steps).

On a GPU, one decode step of a small model is a few hundred kernel launches: the launch and
Python overhead, not the memory traffic, sets its time (docs page *Optimized backends*). :class:`GraphCache`
captures :meth:`SpecdecModel.forward` once per *step shape* — ``(cache, active backend, B, T, plan
entries bucket, logits_to_keep, score request)`` (:func:`step_key`) — into a CUDA graph with static input buffers and
replays it: each call copies ``input_ids``, ``lengths`` and the plan into the buffers and runs the
whole forward with one launch. Plans are padded with ``-1`` to a multiple of ``plan_bucket`` so a
growing ratio budget does not trigger a capture every few tokens. A query-aware plan (Quest's)
is captured through the plan protocol: ``graph_key()`` (what the step depends on besides tensor
values), ``static_copy()`` (the buffers the captured step reads) and ``copy_into(static)`` (load a
live plan before a replay); a plan with ``capturable = False`` runs eagerly.

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

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.cache import KVCache
from specdec.interfaces import ScoreRequest, SparsePlan


def step_key(model, input_ids: torch.Tensor, cache: KVCache, plan: SparsePlan | None, scores: ScoreRequest | None,
             logits_to_keep: int) -> tuple:
    """Key of one captured step shape. It includes the model's *active backend* (a wrapper such as
    Dustin's :class:`~specdec.verifiers.SRHScoringBackend` swapped in with ``using_backend`` runs
    other kernels than the plain backend: a graph captured with one must not replay for the other).
    ``plan`` is already padded."""
    return (id(cache), id(model.backend), tuple(input_ids.shape), None if plan is None else plan.graph_key(),
            logits_to_keep, _score_key(scores))


def _score_key(req: ScoreRequest | None) -> Any:
    if req is None:
        return None
    qh = None if req.query_heads is None else tuple(sorted((k, tuple(v)) for k, v in req.query_heads.items()))
    layers = None if req.layers is None else tuple(req.layers)
    return (tuple(req.rows), req.kind, req.heads, layers, qh, req.per_row)


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
    req: ScoreRequest | None
    logits: torch.Tensor = field(default=None)  # type: ignore[assignment]
    backend: Any = None  # the backend captured (kept alive so its id in the key is not reused)


class GraphCache:
    """Captured forwards of one :class:`~specdec.models.SpecdecModel`, keyed by step shape."""

    def __init__(self, model, plan_bucket: int = 128, max_graphs: int = 32, max_rows: int = 16, pool=None) -> None:
        self.model = model
        self.max_rows = max_rows  # forwards of more tokens per sequence (prefill chunks) run eagerly
        self.plan_bucket = plan_bucket
        self.max_graphs = max_graphs
        self.graphs: dict[Any, _Graph] = {}
        #: step shapes whose capture failed (the reason), run eagerly from then on
        self.uncapturable: dict[Any, str] = {}
        # memory pool of the captures; an early-exit view shares its parent's (graphs never run concurrently)
        self.pool = torch.cuda.graph_pool_handle() if pool is None else pool
        self.captures = 0
        self.replays = 0

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
        scores: ScoreRequest | None,
        logits_to_keep: int,
    ) -> torch.Tensor:
        """Replay (capturing first if needed) the forward of this step shape; returns fresh logits."""
        if input_ids.shape[1] > self.max_rows or (plan is not None and not getattr(plan, "capturable", True)):
            # prefill chunks are few and large (nothing to gain from a graph); a plan that declares
            # itself not capturable (host-side choices inside the forward) runs eagerly
            return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, None)
        if plan is not None:
            plan = self._pad_plan(plan)
        key = step_key(self.model, input_ids, cache, plan, scores, logits_to_keep)
        if key in self.uncapturable:  # this step shape runs eagerly (e.g. a score path that syncs)
            return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, None)
        g = self.graphs.get(key)
        if g is None:
            if len(self.graphs) >= self.max_graphs:  # bound memory: drop the oldest shape
                self.graphs.pop(next(iter(self.graphs)))
            try:
                g = self._capture(key, input_ids, cache, lengths, plan, scores, logits_to_keep)
            except RuntimeError as exc:
                self.uncapturable[key] = _reason(exc)
                torch.cuda.synchronize()
                return self.model._eager_forward(input_ids, cache, lengths, plan, scores, logits_to_keep, None)
        else:
            g.ids.copy_(input_ids)
            g.lengths.copy_(lengths)
            if plan is not None:
                plan.copy_into(g.plan)
            g.graph.replay()
            self.replays += 1
        if scores is not None and g.req is not None and g.req.scores:
            # one copy of all layers (views of one tensor) instead of a clone per layer
            layers = list(g.req.scores)
            vals = [g.req.scores[layer] for layer in layers]
            if all(v.shape == vals[0].shape for v in vals):
                stacked = torch.stack(vals)
                scores.scores = dict(zip(layers, stacked.unbind(0)))
                scores.stacked = (layers, stacked)
            else:
                scores.scores = {layer: v.clone() for layer, v in zip(layers, vals)}
        return g.logits.clone()

    def _capture(self, key, input_ids, cache, lengths, plan, scores, logits_to_keep) -> _Graph:
        ids = input_ids.clone()
        lens = lengths.clone()
        splan = None if plan is None else plan.static_copy()
        req = None
        if scores is not None:
            req = ScoreRequest(rows=list(scores.rows), kind=scores.kind, heads=scores.heads, layers=scores.layers,
                               query_heads=scores.query_heads, per_row=scores.per_row)

        def step():
            return self.model._eager_forward(ids, cache, lens, splan, req, logits_to_keep, None, static=True)

        _warm_up(step)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = step()
        graph.replay()  # the captured run leaves outputs unset until the first replay
        g = _Graph(graph=graph, ids=ids, lengths=lens, plan=splan, req=req, logits=logits, backend=self.model.backend)
        self.graphs[key] = g
        self.captures += 1
        return g


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
        full = (key, tuple((tuple(t.shape), t.dtype, str(t.device)) for t in inputs))
        if full in self.uncapturable or torch.cuda.is_current_stream_capturing():
            return fn(*inputs)
        g = self.graphs.get(full)
        if g is not None:
            graph, statics, outs, _ = g
            for s, t in zip(statics, inputs):
                s.copy_(t)
            graph.replay()
            self.replays += 1
            return outs
        if len(self.graphs) >= self.max_graphs:
            self.graphs.pop(next(iter(self.graphs)))
        statics = tuple(t.clone() for t in inputs)
        try:
            _warm_up(lambda: fn(*statics))
        except RuntimeError as exc:
            torch.cuda.synchronize()
            self.uncapturable[full] = _reason(exc)
            return fn(*inputs)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = fn(*statics)
        graph.replay()  # the capture itself computes nothing
        self.graphs[full] = (graph, statics, outs, keep)
        self.captures += 1
        return outs
