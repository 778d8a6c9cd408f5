"""Base of the KV selectors: sinks + recent window + top-k over a score, with one budget meaning.

A selector that only scores tokens overrides :meth:`BudgetSelector.score`; the base keeps the
``sinks`` first tokens and the ``recent`` last verified tokens, then fills the rest of the budget
with the highest-scoring positions. ``budget`` always counts *everything* a sparse step sees
(sinks + recent + selected) so equal budgets compare fairly across methods; the tokens written
during the current iteration (≤ γ) are visible on top of it.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field, model_validator

from specdec.cache import KVCache
from specdec.interfaces import KVSelector, SparsePlan
from specdec.registry import ComponentConfig

#: Whether :meth:`BudgetSelector.plan` picks its top-k with one Triton launch
#: (:func:`specdec.cuda.triton_select.select_top`) instead of ``torch.topk`` + the per-sequence cut:
#: ``False`` (default), ``True`` (on CUDA, rows of at most 16384 positions;
#: ``"always"``: also on the CPU under ``TRITON_INTERPRET=1``, for tests). The same index sets (ties at the
#: threshold: lowest positions first), written in position order instead of score order. Read when a plan
#: is built: a plan CUDA graph captured before a change keeps the old setting. Stays opt-in: no measurable gain
#: on the H200 at the embedded shape (30 layers x B 64 x 8k, benchmarks/results/gpu_select_2026-12-01d.md): Vegas'
#: selection 0.692 vs 0.716 ms per iteration (plan 0.571 vs 0.585 ms), the same index sets; end to end Vegas 0.92x
#: of the torch plan (paired median of 3 rounds, gpu_gemm_splits_2026-12-01d.md).
TRITON_SELECT: bool | str = False


def _triton_select(s: torch.Tensor):
    """:func:`specdec.cuda.triton_select.select_top` when :data:`TRITON_SELECT` applies to ``s``, else ``None``."""
    if not TRITON_SELECT or (TRITON_SELECT != "always" and not s.is_cuda):
        return None
    try:
        from specdec.cuda.triton_select import MAX_L, select_top
    except ImportError:  # triton is an optional extra
        return None
    return select_top if s.shape[-1] <= MAX_L else None


class BudgetConfig(ComponentConfig):
    """Budget shared by every selector.

    Exactly one of ``budget`` (entries) and ``budget_ratio`` (share of the context) is set, and
    ``budget_ratio`` is 0.05 when neither is given (the one place of both rules); the effective
    budget is ``max(min_budget, ceil(budget_ratio * length))`` per sequence.
    """

    budget: int | None = Field(default=None, gt=0, description="total KV entries one sparse step sees")
    budget_ratio: float | None = Field(default=None, gt=0, le=1, description="budget as a share of the context")
    min_budget: int = Field(default=0, ge=0, description="floor for a ratio budget (Vegas' code uses 256)")
    sinks: int = Field(default=4, ge=0, description="first tokens always kept (attention sinks)")
    recent: int = Field(default=16, ge=0, description="last verified tokens always kept")

    @model_validator(mode="after")
    def _one_budget(self):
        if self.budget is None and self.budget_ratio is None:
            object.__setattr__(self, "budget_ratio", 0.05)
        if self.budget is not None and self.budget_ratio is not None:
            raise ValueError("budget and budget_ratio (--budget, --budget-ratio) were both given; pass only one, budget or budget_ratio")
        return self

    def max_room(self, capacity: int) -> int:
        """Most top-k slots (budget - sinks - recent) of any plan of a cache of ``capacity`` positions (host
        arithmetic): the budget grows with the length, so its value at the full capacity bounds every plan."""
        if self.budget is not None:
            b = min(self.budget, capacity)
        else:
            b = min(max(self.min_budget, math.ceil(capacity * self.budget_ratio)), capacity)
        return max(0, b - self.sinks - self.recent)

    def budget_for(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(B,)`` int64 budget per sequence, never more than its length."""
        if self.budget is not None:
            k = torch.full_like(lengths, self.budget)
        else:
            k = torch.ceil(lengths.double() * self.budget_ratio).long().clamp(min=self.min_budget)
        return torch.minimum(k, lengths)


def fixed_positions(lengths: torch.Tensor, budget: torch.Tensor, sinks: int, recent: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Always-kept positions (sinks + recent window) and how many top-k slots remain per sequence.

    Returns:
        ``fixed`` ``(B, sinks + recent)`` int64 (``-1`` = unused) and ``room`` ``(B,)`` int64.
    """
    B = lengths.shape[0]
    dev = lengths.device
    s = torch.minimum(torch.full_like(lengths, sinks), budget)
    r = torch.minimum(torch.full_like(lengths, recent), budget - s)
    j = torch.arange(sinks, device=dev).view(1, -1).expand(B, -1)
    sink_pos = torch.where(j < s.view(B, 1), j, torch.full_like(j, -1))
    i = torch.arange(recent, device=dev).view(1, -1).expand(B, -1)
    rec_pos = lengths.view(B, 1) - recent + i
    rec_ok = (i >= recent - r.view(B, 1)) & (rec_pos >= s.view(B, 1))
    rec_pos = torch.where(rec_ok, rec_pos, torch.full_like(rec_pos, -1))
    used = (sink_pos >= 0).sum(1) + (rec_pos >= 0).sum(1)
    return torch.cat([sink_pos, rec_pos], dim=1), (budget - used).clamp(min=0)


class BudgetSelector(KVSelector):
    """Sinks + recent window + top-k of :meth:`score` within the budget.

    Subclasses implement :meth:`score`; see :class:`specdec.selectors.sliding_window.SlidingWindow`
    for the smallest example. :meth:`score` reads the cache, the lengths and the selector's own
    attributes and changes nothing (it may run inside a CUDA graph; nothing else is asked of it).
    """

    Config = BudgetConfig

    def __init__(self, config: BudgetConfig | None = None) -> None:
        self.config = config or self.Config()

    def score(self, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        """Importance of each cached position: ``(N or 1, B, H_kv or 1, L)``; higher is kept first.

        ``L`` is the cache capacity (or any length covering every sequence): positions at or past
        a sequence's length are never picked.
        """
        raise NotImplementedError

    def max_selected(self, capacity: int) -> int:
        """Most top-k slots a plan needs for a cache of ``capacity`` positions (host arithmetic).

        The budget grows with the length, so the budget at the full capacity bounds every plan of
        that cache; sinks and the recent window take their share first. Plans therefore have a
        fixed size per cache (no host read of the lengths, the same CUDA-graph shape every iteration).
        """
        return self.config.max_room(capacity)

    def plan(self, cache: KVCache | None, lengths: torch.Tensor) -> SparsePlan:
        """Sinks + recent window + the top-:meth:`max_selected` positions of :meth:`score`.

        Only computes indices: the cache's :class:`~specdec.planner.Planner` loads them into its
        buffers (and on a GPU replays this construction as one CUDA graph). ``cache`` may be ``None``
        when :meth:`score` does not need it; the plan then spans the score's positions.
        """
        c = self.config
        budget = c.budget_for(lengths)
        fixed, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        B = lengths.shape[0]
        if cache is not None and self.max_selected(cache.capacity) == 0:
            return SparsePlan(indices=fixed.view(1, B, 1, -1), dense_from=lengths.clone(), static_size=True)
        s = self.score(cache, lengths).float()  # (N', B, Hs, L)
        Np, _, Hs, L = s.shape
        k_sel = min(self.max_selected(L if cache is None else cache.capacity), L)
        if k_sel == 0:
            return SparsePlan(indices=fixed.view(1, B, 1, -1), dense_from=lengths.clone(), static_size=True)
        pos = torch.arange(L, device=lengths.device)
        blocked = pos.view(1, L) >= lengths.view(B, 1)  # not cached yet
        blocked = blocked | (pos.view(1, L) < c.sinks) | (pos.view(1, L) >= (lengths - c.recent).view(B, 1))
        s = s.masked_fill(blocked.view(1, B, 1, L), float("-inf"))
        select = _triton_select(s)
        if select is not None:  # one launch: the room[b] best positions in position order, -1 after
            top = select(s.contiguous(), k_sel, room)
        else:
            top = torch.topk(s, k_sel, dim=-1).indices  # (N', B, Hs, k_sel), best first
            slot = torch.arange(k_sel, device=lengths.device).view(1, 1, 1, k_sel)
            top = torch.where(slot < room.view(1, B, 1, 1), top, torch.full_like(top, -1))
        fixed = fixed.view(1, B, 1, -1).expand(Np, B, Hs, -1)
        return SparsePlan(indices=torch.cat([fixed, top], dim=-1), dense_from=lengths.clone(), static_size=True)
