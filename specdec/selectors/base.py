"""Base of the KV selectors: sinks + recent window + top-k over a score, with one budget meaning.

A selector that only scores tokens overrides :meth:`BudgetSelector.score`; the base keeps the
``sinks`` first tokens and the ``recent`` last verified tokens, then fills the rest of the budget
with the highest-scoring positions. ``budget`` always counts *everything* a sparse step sees
(sinks + recent + selected) so equal budgets compare fairly across methods; the tokens written
during the current iteration (≤ γ) are visible on top of it.
"""

from __future__ import annotations

import math
import os

import torch
from pydantic import Field, model_validator

from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import KVSelector, SparsePlan
from specdec.registry import ComponentConfig

#: How :meth:`BudgetSelector.plan` picks its top-k:
#:
#: * ``False`` (default): ``torch.topk`` + the per-sequence cut (the reference path; on a GPU the plan's ~30 kernels
#:   replay as one CUDA graph).
#: * ``True`` (on CUDA) / ``"always"`` (also on the CPU under ``TRITON_INTERPRET=1``, for tests): the top-k of the
#:   masked fp32 scores in one Triton launch (:func:`specdec.cuda.triton_select.select_top`; rows of at most 16384
#:   positions). Measured on the H200 at 30 layers x B 64 x 8k (benchmarks/results/gpu_select_2026-12-01d.md): plan
#:   0.571 vs 0.585 ms, no measurable gain.
#: * ``"fused"`` (on CUDA) / ``"fused-always"``: the whole plan in one launch
#:   (:func:`specdec.cuda.triton_select.select_plan`): Vegas' KV-head sum (``on_verify`` then keeps the emitted
#:   scores instead of summing them), the length / sink / recent mask, a radix select (4 passes of 8 bits) and the
#:   fixed positions; no plan CUDA graph (one launch already).
#:
#: * ``"radix16"`` (on CUDA) / ``"radix16-always"``: the same whole plan as ``"fused"`` over 16-bit keys, each row
#:   split over several programs (:func:`specdec.cuda.triton_select.select_plan16`: 4 short launches, two 8-bit radix
#:   passes), no plan CUDA graph; ``"radix16-graph"`` (CUDA only): the same launches replayed in the plan CUDA graph.
#:   Its set may differ from the others' only inside the boundary bucket (scores equal in their top 16 order bits:
#:   there the lowest positions), see :func:`~specdec.cuda.triton_select.select_plan16`.
#:
#: * ``"auto"``: per plan call, radix16's launches where Triton runs (CUDA, or the CPU under ``TRITON_INTERPRET=1``):
#:   eagerly (as ``"radix16"``) when the scores the plan ranks have at least :data:`AUTO_EAGER_ELEMENTS` elements
#:   (:meth:`BudgetSelector.score_elements`: layers x B x KV heads x L of Vegas' emitted scores), in the plan CUDA
#:   graph (as ``"radix16-graph"``) below it or when the size is not known before the plan; the torch path on a CPU
#:   without the interpreter, without Triton, or for scores :func:`~specdec.cuda.triton_select.plan16_refusal`
#:   refuses (dtype, row length, top-k slots). :func:`auto_path` is the rule.
#:
#: Every other setting picks the same index sets; ties at the threshold go to the lowest positions in the Triton paths
#: (``torch.topk`` leaves them unspecified), which write the picks in position order instead of score order. Read
#: when a plan is built: a plan CUDA graph captured before a change keeps the old setting.
TRITON_SELECT: bool | str = False

_SETTINGS = (False, True, "always", "fused", "fused-always", "radix16", "radix16-always", "radix16-graph", "auto")
_CUDA_ONLY = (True, "fused", "radix16", "radix16-graph")

#: ``TRITON_SELECT = "auto"``: plans ranking at least this many score elements (layers x B x KV heads x L) run
#: radix16's launches eagerly, smaller ones inside the plan CUDA graph. Measured 2026-12-01 23:16 UTC on the H200
#: (benchmarks/results/gpu_select_2026-12-01h.md; on_verify + plan ms, eager / in the graph): SmolLM2 B 64 x 8k
#: (46.2M elements) 0.397 / 0.523 fp32, 0.516 / 0.473 bf16; Llama-8B B 16 x 32k (134M) 0.621 / 0.805 fp32, 0.470 /
#: 0.630 bf16; SmolLM2 B 16 x 8k (11.5M) 0.473 / 0.273; B 1 x 8k (0.72M) 0.554 / 0.144. The graph copies the scores
#: into its input buffer at every replay (a cost that grows with them), the eager path pays ~0.3 ms of host launches
#: (flat): the crossover lies between 11.5M and 46.2M; the threshold is their geometric mean (7.7M per KV head at
#: SmolLM2's 3).
AUTO_EAGER_ELEMENTS = 23_000_000


def _setting() -> bool | str:
    if TRITON_SELECT not in _SETTINGS:
        raise ValueError(f"specdec.selectors.base.TRITON_SELECT is {TRITON_SELECT!r}; use one of {_SETTINGS}")
    return TRITON_SELECT


def _triton_select(s: torch.Tensor):
    """:func:`specdec.cuda.triton_select.select_top` when :data:`TRITON_SELECT` applies to ``s``, else ``None``."""
    t = _setting()
    if t not in (True, "always") or (t is True and not s.is_cuda):
        return None
    try:
        from specdec.cuda.triton_select import MAX_L, select_top
    except ImportError:  # triton is an optional extra
        return None
    return select_top if s.shape[-1] <= MAX_L else None


def _triton_runs(device: torch.device) -> bool:
    """Whether Triton kernels run on ``device``: CUDA, or the CPU under ``TRITON_INTERPRET=1``."""
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"))


def auto_path(device: torch.device, scores: torch.Tensor | None = None, k_sel: int | None = None,
              elements: int | None = None) -> str:
    """The path ``TRITON_SELECT = "auto"`` takes for a plan on ``device``: ``"torch"`` (Triton does not run there,
    does not import, or refuses ``scores`` / ``k_sel``), ``"radix16"`` (eager: ``elements`` at least
    :data:`AUTO_EAGER_ELEMENTS`) or ``"radix16-graph"`` (in the plan CUDA graph: fewer, or ``elements`` unknown)."""
    if not _triton_runs(device):
        return "torch"
    try:
        from specdec.cuda.triton_select import plan16_refusal
    except ImportError:  # triton is an optional extra
        return "torch"
    if scores is not None and plan16_refusal(scores, k_sel) is not None:
        return "torch"
    return "radix16" if elements is not None and elements >= AUTO_EAGER_ELEMENTS else "radix16-graph"


def fused_select(device: torch.device, scores: torch.Tensor | None = None, k_sel: int | None = None):
    """:func:`specdec.cuda.triton_select.select_plan` when :data:`TRITON_SELECT` asks for the fused plan on
    ``device`` (and Triton imports), else ``None``; with ``"auto"`` :func:`~specdec.cuda.triton_select.select_plan16`
    unless :func:`auto_path` takes the torch path for ``scores`` (when given) and ``k_sel``."""
    t = _setting()
    if t == "auto":
        if auto_path(device, scores, k_sel) == "torch":
            return None
        from specdec.cuda.triton_select import select_plan16  # auto_path imported it

        return select_plan16
    if not isinstance(t, str) or not t.startswith(("fused", "radix16")):
        return None
    if t in _CUDA_ONLY and torch.device(device).type != "cuda":
        return None
    try:
        from specdec.cuda.triton_select import select_plan, select_plan16
    except ImportError:  # triton is an optional extra
        return None
    return select_plan16 if t.startswith("radix16") else select_plan


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
        # the sinks / recent given must fit an explicit budget (they were clamped to it without a word); a default
        # (4 sinks, 16 recent) shrinks to what the budget leaves, as both do to a short sequence's ratio budget
        given = [(n, getattr(self, n)) for n in ("sinks", "recent") if n in self.model_fields_set]
        if self.budget is not None and sum(v for _, v in given) > self.budget:
            what = " + ".join(f"{n} {v}" for n, v in given)
            raise ValueError(f"{what} exceed{'s' if len(given) == 1 else ''} the budget {self.budget}; "
                             f"use sinks + recent <= budget")
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


def selector_config(cls, config, fields: dict):
    """A selector's config: ``config`` as given, or ``cls.Config(**fields)`` (``SlidingWindow(budget=64)`` as well as
    ``SlidingWindow(SlidingWindow.Config(budget=64))``); a bad field is one line naming it."""
    from pydantic import ValidationError

    from specdec.registry import format_validation_error

    if config is not None:
        if fields:
            raise SpecdecError(f"{cls.__name__}: pass a config or its fields as keywords ({', '.join(fields)}), "
                               "not both.")
        return config
    try:
        return cls.Config(**fields)
    except ValidationError as exc:
        raise SpecdecError(format_validation_error(f"{cls.__name__} config", exc, cls.Config)) from None


def _checked_score(selector, s, batch: int, cache: KVCache | None):
    """``s`` if it has the shape a selector's :meth:`~BudgetSelector.score` promises, else one error naming the
    selector and the shape it returned (a plugin's wrong shape failed deep inside ``torch.cat`` / ``topk``). Shape
    checks only: no value of ``s`` is read (no host sync; plans are captured on a GPU)."""
    want = (f"a float tensor (N or 1, B={batch}, H_kv or 1, L), L at least the longest sequence; see "
            "docs/guides/selector-plugin.md")
    name = type(selector).__name__
    if not isinstance(s, torch.Tensor):
        raise SpecdecError(f"{name}.score() returned {type(s).__name__}; it must return {want}.")
    heads_ok = cache is None or s.dim() != 4 or s.shape[2] in (1, cache.n_kv_heads)
    if s.dim() != 4 or s.shape[1] != batch or not heads_ok or s.dtype == torch.bool:
        raise SpecdecError(f"{name}.score() returned a {s.dtype} tensor of shape {tuple(s.shape)}; it must return "
                           f"{want}.")
    return s


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

    def __init__(self, config: BudgetConfig | None = None, **fields) -> None:
        self.config = selector_config(type(self), config, fields)

    def score(self, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        """Importance of each cached position: ``(N or 1, B, H_kv or 1, L)``; higher is kept first.

        ``L`` is the cache capacity (or any length covering every sequence): positions at or past
        a sequence's length are never picked.
        """
        raise NotImplementedError

    def fused_scores(self, cache: KVCache, lengths: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """What the fused plan (``TRITON_SELECT = "fused"``) ranks: ``(scores, sum_heads)``, where ``sum_heads``
        means the kernel sums the ``H`` rows of ``scores`` ``(N', B, H, L)`` into one (in fp32) before ranking.
        The default is :meth:`score` as it is; Vegas hands over the emitted per-KV-head scores unsummed."""
        return self.score(cache, lengths), False

    def score_elements(self, lengths: torch.Tensor) -> int | None:
        """Elements of the scores the next fused plan ranks, when known before the plan is built (``TRITON_SELECT
        = "auto"`` picks eager launches or the plan graph by it); ``None`` (the default): not known, the graph."""
        return None

    def plans_in_one_launch(self, lengths: torch.Tensor) -> bool:
        """Whether :meth:`plan` runs as fused launches on ``lengths``' device without a plan CUDA graph (``"fused"``,
        ``"radix16"``, ``"auto"`` at :data:`AUTO_EAGER_ELEMENTS` score elements or more; ``"radix16-graph"`` keeps the
        graph around its launches)."""
        if _setting() == "auto":
            return auto_path(lengths.device, elements=self.score_elements(lengths)) == "radix16"
        return fused_select(lengths.device) is not None and _setting() != "radix16-graph"

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
        B = lengths.shape[0]
        fused = fused_select(lengths.device)
        if fused is not None and (cache is None or self.max_selected(cache.capacity) > 0):
            s, sum_heads = self.fused_scores(cache, lengths)  # (N', B, H, L)
            s = _checked_score(self, s, B, None)  # H may be query heads here (sum_heads): no head check
            k_sel = min(self.max_selected(s.shape[-1] if cache is None else cache.capacity), s.shape[-1])
            if _setting() == "auto":  # scores or slots the kernel refuses: the torch path below
                fused = fused_select(lengths.device, s, k_sel)
            if k_sel > 0 and fused is not None:
                idx, dense_from = fused(s, lengths, k_sel, sinks=c.sinks, recent=c.recent, budget=c.budget,
                                        budget_ratio=None if c.budget is not None else c.budget_ratio,
                                        min_budget=c.min_budget, sum_heads=sum_heads)
                return SparsePlan(indices=idx, dense_from=dense_from, static_size=True)
        budget = c.budget_for(lengths)
        fixed, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        if cache is not None and self.max_selected(cache.capacity) == 0:
            return SparsePlan(indices=fixed.view(1, B, 1, -1), dense_from=lengths.clone(), static_size=True)
        s = _checked_score(self, self.score(cache, lengths), B, cache).float()  # (N', B, Hs, L)
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
