"""Quest: query-aware page selection (the MagicDec-Quest drafter).

The cache is cut into pages of ``page_size`` tokens; each page keeps the per-channel minimum and
maximum of its keys. At every draft step and layer the page's upper bound on ``q·k`` is
``Σ_d max(q_d·kmax_d, q_d·kmin_d) = q⁺·kmax + q⁻·kmin`` (two small matrix products), summed over the
query heads of a KV group; the best pages fill the budget. Sinks and the recent window (which holds
the current, partial page when ``recent >= page_size - 1``) are always kept, and the budget counts
them, exactly as for every other selector.

Page metadata is maintained incrementally: only pages at or after the first position that changed
since the last call (the tail page after a rollback or an append) are recomputed from the cache.

Both steps have Triton kernels (``specdec/cuda/triton_quest.py``; scoring is fused with the
expansion to tokens and the blocked mask, top-k stays ``torch.topk``): ``kernels="auto"`` (default)
uses them when the cache is on a CUDA device and triton is installed, ``"triton"`` forces them
(on the CPU only under ``TRITON_INTERPRET=1``), ``"torch"`` keeps the PyTorch code below.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field

from specdec.cache import KVCache
from specdec.interfaces import SparsePlan
from specdec.planner import planner_for
from specdec.registry import SELECTORS
from specdec.selectors.base import BudgetConfig, BudgetSelector, fixed_positions


class QuestConfig(BudgetConfig):
    """Options of :class:`Quest` (budget fields: :class:`BudgetConfig`)."""

    page_size: int = Field(default=16, gt=0, le=4096, description="tokens per page (at most 4096: a page is at most one tile of the pick kernel)")
    kernels: Literal["auto", "torch", "triton"] = Field(
        default="auto",
        description="page scoring / min-max update: Triton kernels ('auto': on CUDA when triton is installed)",
    )
    k_bucket: int = Field(default=64, ge=1, description="top-k size rounded up to a multiple of this (CUDA-graph reuse)")


def _triton_quest():
    """The Triton kernels module, or ``None`` when triton is not installed."""
    try:
        from specdec.cuda import triton_quest
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return triton_quest


def _triton_select():
    """The Triton selection kernels (:func:`specdec.cuda.triton_select.select_pages`); triton is installed when asked."""
    from specdec.cuda import triton_select

    return triton_select


def page_minmax(k: torch.Tensor, length: int, page_size: int, first_page: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-page, per-channel key min/max of positions ``< length``, pages ``first_page..``.

    Args:
        k: ``(N, H_kv, L, D)`` keys of one sequence.
        length: number of valid positions; positions ``>= length`` are ignored.
        page_size: positions per page.
        first_page: first page to summarise (pages before it are skipped, e.g. already up to date).

    Returns:
        ``kmin``, ``kmax`` ``(N, H_kv, P, D)`` float32 for ``P = ceil(length / page_size) - first_page``
        pages (0 for a page with no valid position).
    """
    N, H, _, D = k.shape
    start = first_page * page_size
    n_pages = -(-length // page_size) - first_page
    if n_pages <= 0:
        z = k.new_zeros(N, H, 0, D, dtype=torch.float32)
        return z, z
    end = start + n_pages * page_size
    x = torch.zeros(N, H, n_pages * page_size, D, dtype=torch.float32, device=k.device)
    avail = min(end, k.shape[2]) - start
    x[:, :, :avail] = k[:, :, start : start + avail].float()
    valid = (torch.arange(start, end, device=k.device) < length).view(1, 1, -1, 1)
    x = x.view(N, H, n_pages, page_size, D)
    valid = valid.view(1, 1, n_pages, page_size, 1)
    kmin = x.masked_fill(~valid, float("inf")).amin(dim=3)
    kmax = x.masked_fill(~valid, float("-inf")).amax(dim=3)
    return kmin, kmax


def page_scores_torch(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """``(B, H_kv, P)`` page upper bounds for queries ``q`` ``(B, H, T, D)``, summed over each KV
    group's heads and rows: ``Σ_d max(q_d kmax_d, q_d kmin_d) = q⁺·kmax + q⁻·kmin``."""
    B, H, T, D = q.shape
    Hkv = kmin.shape[1]
    qg = q.float().reshape(B, Hkv, H // Hkv * T, D)
    return (torch.einsum("bhgd,bhpd->bhp", qg.clamp(min=0), kmax.float())
            + torch.einsum("bhgd,bhpd->bhp", qg.clamp(max=0), kmin.float()))


def blocked_positions(lengths: torch.Tensor, L: int, sinks: int, recent: int) -> torch.Tensor:
    """``(B, L)`` positions the query-aware part may not pick: uncached, sinks, recent window."""
    pos = torch.arange(L, device=lengths.device).view(1, L)
    return (pos >= lengths.view(-1, 1)) | (pos < sinks) | (pos >= (lengths - recent).view(-1, 1))


@dataclass
class QuestPlan(SparsePlan):
    """A plan kind whose selected entries depend on each draft step's queries: the backend executes it
    (:meth:`AttentionBackend.plan_indices` → :meth:`indices_for`) from the plan's own fields.

    ``indices`` holds the fixed part ``(1, B, 1, F)`` (sinks + recent); the query-aware part
    (``room`` entries per sequence) is the top of the page bounds ``kmin``/``kmax`` per layer and step.

    Attributes:
        lengths, room: ``(B,)`` verified lengths and query-aware slots per sequence.
        kmin, kmax: ``(N, B, H_kv, P, D)`` page key bounds (buffers of the cache's planner).
        width: positions a layer's part may pick from (the pages' span, at least the cache capacity: a static shape).
        new, counts: ``(B, width)`` bool, the pickable tokens (not uncached, sinks, recent, or a per-layer plan's
            shared part), and ``(B, P)`` int32 their number per page (:func:`page_counts`); the same for every layer
            and step of the plan.
        k_sel: top-k size, the most slots any plan of the cache can have (``max_room(capacity)``, host arithmetic)
            rounded up to ``k_bucket`` (slots past a sequence's room are -1): fixed per cache, so plans and steps
            are captured once.
        page_size, sinks, recent: the selector's settings; ``use_triton``: score pages with the Triton kernel.
        clock: one-element list the host time of the selection is added to (eager steps only).
    """

    lengths: torch.Tensor = None  # type: ignore[assignment]
    room: torch.Tensor = None  # type: ignore[assignment]
    kmin: torch.Tensor = None  # type: ignore[assignment]
    kmax: torch.Tensor = None  # type: ignore[assignment]
    width: int = 0
    k_sel: int = 0
    page_size: int = 16
    sinks: int = 0
    recent: int = 0
    use_triton: bool = False
    clock: list = field(default_factory=lambda: [0.0], repr=False, compare=False)
    new: torch.Tensor = None  # type: ignore[assignment]
    counts: torch.Tensor = None  # type: ignore[assignment]

    @property
    def budget(self) -> int:
        """Entries per (sequence, KV head) the plan selects at most (without the top-k padding)."""
        return int(self.indices.shape[-1]) + (int(self.room.max()) if self.room.numel() else 0)

    def indices_for(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, F + k_sel)``: the fixed entries + this layer's pages for queries ``q`` ``(B, H, T, D)``: per
        KV head the ``room`` new tokens (``new``) ranked by their page's bound, ties by position."""
        t0 = time.perf_counter()
        fixed = self.indices[0, :, 0]  # (B, F)
        kmin, kmax = self.kmin[layer], self.kmax[layer]  # (B, H_kv, P, D)
        if self.k_sel == 0:
            out = fixed.view(fixed.shape[0], 1, -1).expand(-1, kmin.shape[1], -1)
        elif self.use_triton and kmin.shape[2] <= _triton_select().PAGES_MAX:  # two launches per layer
            page = _triton_quest().quest_page_scores(q, kmin, kmax)
            out = _triton_select().select_pages(page, self.counts, self.new, self.room, fixed, self.k_sel,
                                                self.page_size)
        else:
            page = _triton_quest().quest_page_scores(q, kmin, kmax) if self.use_triton else page_scores_torch(q, kmin, kmax)
            out = select_pages_torch(page, self.new, self.room, fixed, self.k_sel, self.page_size)
        self.clock[0] += time.perf_counter() - t0
        return out


def page_counts(new: torch.Tensor, page_size: int) -> torch.Tensor:
    """``(B, P)`` int32: the tokens a query-aware part may pick (``new`` ``(B, P * page_size)`` bool) per page. Per
    plan, shared by every layer and head (the pick kernel ranks a page's tokens itself)."""
    return new.view(new.shape[0], -1, page_size).sum(-1, dtype=torch.int32)


def select_pages_torch(page: torch.Tensor, new: torch.Tensor, room: torch.Tensor, fixed: torch.Tensor, k_sel: int,
                       page_size: int) -> torch.Tensor:
    """:func:`specdec.cuda.triton_select.select_pages` in PyTorch (the reference): the ``room[b]`` first new tokens
    (``new`` ``(B, W)`` bool) of a stable descending sort of the token scores (each page's score on its tokens), in
    position order after the shared part ``fixed`` ``(B, F)``, -1 padded to ``F + k_sel``."""
    B, Hkv, P = page.shape
    W = new.shape[1]
    tok = page.float().repeat_interleave(page_size, dim=-1)[..., :W]
    if tok.shape[-1] < W:
        tok = torch.nn.functional.pad(tok, (0, W - tok.shape[-1]))
    tok = (tok + 0.0).masked_fill(~new.view(B, 1, W), float("-inf"))  # + 0.0: -0.0 and 0.0 are one score
    order = torch.sort(tok, dim=-1, descending=True, stable=True).indices[..., :k_sel]  # ties: lowest position first
    slot = torch.arange(order.shape[-1], device=page.device).view(1, 1, -1)
    ok = (slot < room.view(B, 1, 1)) & (tok.gather(-1, order) > float("-inf"))
    picked = torch.where(ok, order, torch.full_like(order, W)).sort(dim=-1).values  # position order
    picked = torch.where(picked == W, torch.full_like(picked, -1), picked)
    if picked.shape[-1] < k_sel:
        picked = torch.nn.functional.pad(picked, (0, k_sel - picked.shape[-1]), value=-1)
    return torch.cat([fixed.view(B, 1, -1).expand(B, Hkv, -1), picked], dim=-1)


@SELECTORS.register("quest", QuestConfig)
class Quest(BudgetSelector):
    """Query-aware sparsity with per-page key bounds (Tang et al., 2024, *Quest*), as the
    MagicDec-Quest baseline of Vegas (the Vegas paper, §4).

    Attributes:
        kmin, kmax: ``(N, B, H_kv, P, D)`` page key bounds for the verified positions, in the keys' dtype.
        draft_select_seconds: time spent scoring pages inside draft steps; the engine reports it as the
            ``select_in_draft`` phase (it happens inside the draft forwards).
    """

    Config = QuestConfig

    def __init__(self, config: QuestConfig | None = None, **fields) -> None:
        super().__init__(config, **fields)
        self.kmin: torch.Tensor | None = None
        self.kmax: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None  # (B,) positions whose metadata matches the cache
        self._clock = [0.0]  # host time of the query-aware selection inside draft steps

    @property
    def draft_select_seconds(self) -> float:
        return self._clock[0]

    def use_triton(self, device: torch.device) -> bool:
        """Whether the Triton kernels score pages and update the bounds for tensors on ``device``."""
        k = self.config.kernels
        if k == "torch":
            return False
        if k == "triton":
            if _triton_quest() is None:
                raise RuntimeError("QuestConfig(kernels='triton') needs the 'triton' package")
            return True
        return torch.device(device).type == "cuda" and _triton_quest() is not None

    @property
    def capturable_plan(self) -> bool:
        """Whether :meth:`plan` runs without a host read on a GPU: with the Triton page-bound update (``kernels``
        ``"triton"``, or ``"auto"`` where triton imports; the torch update reads the lengths on the host). The
        planner then replays the plan as one CUDA graph (:class:`specdec.graphs.PlanGraphs`)."""
        return self.config.kernels != "torch" and _triton_quest() is not None

    def page_scores(self, q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, P)`` page upper bounds for queries ``q`` ``(B, H, T, D)``, summed over each KV
        group's heads and rows: ``Σ_d max(q_d kmax_d, q_d kmin_d) = q⁺·kmax + q⁻·kmin``."""
        if self.use_triton(q.device):
            return _triton_quest().quest_page_scores(q, kmin, kmax)
        return page_scores_torch(q, kmin, kmax)

    def reset(self, cache: KVCache) -> None:
        N, B, H, L, D = cache.k.shape
        P = -(-L // self.config.page_size)
        # the page bounds are per-cache state the draft steps read: buffers of the cache's planner
        planner = planner_for(cache)
        # in the keys' dtype: a min or max of keys is one of them (exact), and bf16 bounds halve what scoring reads
        self.kmin = planner.buffer("quest.kmin", (N, B, H, P, D), cache.k.dtype, zero=True)
        self.kmax = planner.buffer("quest.kmax", (N, B, H, P, D), cache.k.dtype, zero=True)
        self._valid = planner.buffer("quest.valid", (B,), torch.long, zero=True)  # in place: a captured update reads it
        self._clock[0] = 0.0

    def update(self, cache: KVCache, lengths: torch.Tensor) -> None:
        """Bring the page bounds up to date with ``cache`` for positions ``< lengths`` ``(B,)``.

        Only pages from the first position that may differ (``min(previous, new length)``) on are
        recomputed, so an append touches the tail page(s) and a rollback recomputes the page it cuts.
        """
        if (self.kmin is None or self.kmin.shape[1] != cache.batch or self.kmin.dtype != cache.k.dtype
                or self.kmin.shape[3] * self.config.page_size < cache.capacity):
            self.reset(cache)
        ps = self.config.page_size
        if self.use_triton(cache.k.device):  # one launch, no host synchronisation
            lengths = lengths.to(self._valid.device)
            _triton_quest().quest_update_minmax(cache.k, self.kmin, self.kmax, self._valid, lengths, ps)
            self._valid.copy_(lengths)
            return
        for b, (old, new) in enumerate(zip(self._valid.tolist(), lengths.tolist())):
            if old == new:
                continue
            first = min(old, new) // ps
            kmin, kmax = page_minmax(cache.k[:, b], new, ps, first)
            n = kmin.shape[2]
            self.kmin[:, b, :, first : first + n] = kmin
            self.kmax[:, b, :, first : first + n] = kmax
            stale_end = -(-old // ps)
            if first + n < stale_end:  # pages past a rollback point hold no valid position any more
                self.kmin[:, b, :, first + n : stale_end] = 0
                self.kmax[:, b, :, first + n : stale_end] = 0
        self._valid.copy_(lengths)

    def on_verify(self, scores, lengths: torch.Tensor) -> None:  # noqa: ANN001 - no scores needed
        pass  # the cache is read in plan(); lengths only grow between plans within one run

    def blocked(self, lengths: torch.Tensor, L: int) -> torch.Tensor:
        """``(B, L)`` positions the query-aware part may not pick: uncached, sinks, recent window."""
        return blocked_positions(lengths, L, self.config.sinks, self.config.recent)

    def plan(self, cache: KVCache, lengths: torch.Tensor) -> SparsePlan:
        c = self.config
        self.update(cache, lengths)
        budget = c.budget_for(lengths)
        fixed, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        width = cache.capacity
        # the most top-k slots any plan of this cache can have, from host values (no read of `room`: the plan is
        # capturable), rounded up to a bucket; slots past each sequence's room are dropped (-1), so the selection is
        # the same as with k = room
        k = c.max_room(cache.capacity)
        k_sel = min(-(-k // c.k_bucket) * c.k_bucket, width) if k else 0
        P = self.kmin.shape[3]
        new = ~blocked_positions(lengths, P * c.page_size, c.sinks, c.recent)
        counts = page_counts(new, c.page_size)
        return QuestPlan(indices=fixed.view(1, lengths.shape[0], 1, -1), dense_from=lengths.clone(),
                         lengths=lengths.clone(), room=room, kmin=self.kmin, kmax=self.kmax, width=P * c.page_size,
                         k_sel=k_sel, page_size=c.page_size, sinks=c.sinks, recent=c.recent,
                         use_triton=self.use_triton(cache.k.device), clock=self._clock, new=new, counts=counts)
