"""Plan once, run pure (FlashInfer's ``plan()`` / ``run()``): one :class:`Planner` per KV cache.

A selector's ``plan()`` only computes indices. The planner of the cache writes them into buffers
it owns — one fixed-size buffer per plan field, allocated once per cache and shape — and hands the
attention that plan; the attention only reads it. Because the buffers keep their addresses from one
iteration to the next, a CUDA graph captured reading them (:mod:`specdec.graphs`) replays with no
copy, and nothing about capture leaks into selectors or plans. Selectors that keep per-cache state
the sparse steps read (Quest's page bounds) take it from :meth:`Planner.buffer` for the same reason.

On a GPU, :meth:`Planner.plan` also replays the construction of a :class:`BudgetSelector` plan (a
few dozen small kernels) as one CUDA graph when it can (:class:`specdec.graphs.PlanGraphs`); a
plugin selector needs no code for it.

Usage (what the drafters and verifiers do)::

    plan = planner_for(state.cache).plan(selector, state.lengths)
"""

from __future__ import annotations

import weakref

import torch

from specdec.cache import KVCache
from specdec.graphs import PlanGraphs, forget_address, keep_address
from specdec.interfaces import KVSelector, SparsePlan, plan_tensors  # noqa: F401  (plan_tensors re-exported)

_PLANNERS: "weakref.WeakKeyDictionary[KVCache, Planner]" = weakref.WeakKeyDictionary()


def planner_for(cache: KVCache) -> "Planner":
    """The planner of ``cache`` (made on first use, dropped with the cache)."""
    p = _PLANNERS.get(cache)
    if p is None:
        p = _PLANNERS[cache] = Planner(cache)
    return p


class Planner:
    """Fixed-size buffers of one KV cache that sparse steps read: plan fields and selector state.

    Attributes:
        cache: the cache planned for.
        plan_graphs: the CUDA-graph replays of plan construction (:class:`specdec.graphs.PlanGraphs`),
            made on first use on a GPU.
    """

    def __init__(self, cache: KVCache) -> None:
        self._cache = weakref.ref(cache)
        self._buffers: dict[str, torch.Tensor] = {}
        self.plan_graphs = None

    @property
    def cache(self) -> KVCache:
        return self._cache()

    def buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
               zero: bool = False) -> torch.Tensor:
        """The buffer ``name`` of this cache: the same tensor on every call with the same shape and dtype
        (allocated zeroed on first use or when they change); ``zero=True`` clears it."""
        shape = tuple(int(s) for s in shape)
        b = self._buffers.get(name)
        if b is None or tuple(b.shape) != shape or b.dtype != dtype:
            if b is not None:
                forget_address(b)
            b = self._buffers[name] = keep_address(torch.zeros(shape, dtype=dtype, device=self.cache.k.device))
        elif zero:
            b.zero_()
        return b

    def owns(self, t: torch.Tensor) -> bool:
        return any(t is b for b in self._buffers.values())

    def load(self, plan: SparsePlan) -> SparsePlan:
        """``plan`` with each tensor field written into this planner's buffer of that field and pointing
        at it (fields that already are buffers of this planner, e.g. Quest's page bounds, stay as they
        are). The plan object itself is returned: a selector makes a new one per call."""
        for name, t in plan_tensors(plan).items():
            if self.owns(t):
                continue
            buf = self.buffer(f"plan.{type(plan).__name__}.{name}", tuple(t.shape), t.dtype)
            buf.copy_(t)
            setattr(plan, name, buf)
        return plan

    def plan(self, selector: KVSelector, lengths: torch.Tensor) -> SparsePlan:
        """Build ``selector``'s plan for ``lengths`` ``(B,)`` and load it into this planner's buffers."""
        cache = self.cache
        if PlanGraphs.applies(selector, lengths):
            if self.plan_graphs is None:
                self.plan_graphs = PlanGraphs()
            plan = self.plan_graphs(selector, cache, lengths)
        else:
            plan = selector.plan(cache, lengths)
        return self.load(plan)


def planner_owns(t: torch.Tensor) -> bool:
    """Whether ``t`` is a buffer of some cache's planner (its address is stable)."""
    return any(p.owns(t) for p in list(_PLANNERS.values()))
