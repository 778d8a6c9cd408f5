"""Dustin's verification set: sinks + local window + top-m by the draft signal + the rest by the target signal.

``I_verify`` (Dustin; docs page *Dustin*) is one fixed-size set per sequence, shared by every layer and
KV head (the paper's *global importance map*). Both signals are computed only on the Semantic
Retrieval Heads (SRHs) found offline by ``specdec profile-srh`` (:mod:`specdec.srh`):

* draft lookahead ``d`` ``(B, L)``: the draft model's softmax attention while drafting the γ new
  tokens, summed over the draft SRHs (recorded by :class:`specdec.drafters.ModelDrafter`);
* target history ``t`` ``(B, L)``: the target's softmax attention over the full context in the
  previous verification pass(es), summed over the target SRHs (recorded by
  :class:`specdec.verifiers.SparseVerifier`), optionally an exponential moving average.

Beyond the paper: with ``adaptive=True`` the split ``m`` is chosen per iteration and per sequence
from the last verification pass (an online ARR proxy on the SRHs; see :meth:`HybridSRHSelector.adapt`).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import KVSelector, SparsePlan
from specdec.registry import SELECTORS
from specdec.selectors.base import BudgetConfig, fixed_positions, selector_config
from specdec.selectors.key_rank import KeyRankIndex, KeyRankPlan
from specdec.selectors.quest import Quest, QuestConfig, QuestPlan, blocked_positions, page_counts

Heads = list[tuple[int, int]]


class HybridSRHConfig(BudgetConfig):
    """Budget (sinks + recent + draft top-m + target rest) and the retrieval heads.

    ``m`` (or ``m_ratio`` of the slots left after sinks and recent) goes to the draft signal.
    ``target_heads`` / ``draft_heads`` are ``[layer, query head]`` pairs; ``layer_map[l]`` is the
    draft layer that corresponds to target layer ``l``. A ``specdec profile-srh`` artifact holds all
    three and ``m_ratio`` (:func:`specdec.artifacts.load_srh`; the ``dustin`` method applies it).
    """

    m: int | None = Field(default=None, ge=0, description="slots chosen by the draft signal (None = m_ratio)")
    m_ratio: float = Field(default=0.5, ge=0, le=1, description="share of the free slots chosen by the draft signal")
    adaptive: bool = Field(default=False, description="choose m per iteration from the last verification (beyond the paper)")
    m_grid: int = Field(default=5, ge=2, le=33, description="candidate m ratios for adaptive m (evenly spaced in [0, 1])")
    adapt_decay: float = Field(default=0.5, ge=0, lt=1, description="smoothing of the adaptive-m proxy across iterations")
    history_decay: float = Field(default=0.0, ge=0, lt=1, description="EMA weight of older target passes (0 = last pass)")
    target_heads: Heads | None = Field(default=None, description="target SRHs as [layer, head] pairs")
    draft_heads: Heads | None = Field(default=None, description="draft SRHs as [layer, head] pairs")
    layer_map: list[int] | None = Field(default=None, description="draft layer of each target layer")
    layer_share: float = Field(default=0.0, ge=0, le=1, description="share of the free slots picked per layer and KV head "
                               "by Quest page bounds of the verify rows' queries (0 = one shared set, the paper)")
    page_size: int = Field(default=16, gt=0, le=4096, description="tokens per page of the per-layer part (layer_share > 0)")
    page_kernels: Literal["auto", "torch", "triton"] = Field(default="auto", description="kernels of the per-layer "
                                                             "part (its page bounds, or with layer_scores='keys' its "
                                                             "ranking): Triton ('auto': on CUDA) or torch")
    layer_scores: Literal["pages", "keys"] = Field(default="pages", description="how the per-layer part ranks tokens: "
                                                   "Quest page bounds ('pages') or the queries against rank-key_rank "
                                                   "keys ('keys', Loki-style; eager plans)")
    key_rank: int = Field(default=16, ge=1, le=1024, description="dimensions of the low-rank keys (layer_scores='keys')")

    @model_validator(mode="after")
    def _keys_need_a_layer_part(self):
        if self.layer_scores == "keys" and self.layer_share == 0:
            raise ValueError("layer_scores='keys' ranks the per-layer part, which layer_share 0 turns off; "
                             "set layer_share > 0 (1.0: every free slot per layer)")
        return self


def heads_by_layer(heads: Heads | None) -> dict[int, list[int]]:
    """``[(layer, head), ...]`` → ``{layer: [heads]}``."""
    out: dict[int, list[int]] = {}
    for layer, h in heads or []:
        out.setdefault(int(layer), []).append(int(h))
    return out


def hybrid_select(
    lengths: torch.Tensor,
    budget: torch.Tensor,
    sinks: int,
    recent: int,
    draft: torch.Tensor | None,
    target: torch.Tensor | None,
    m: torch.Tensor,
    fixed: tuple[torch.Tensor, torch.Tensor] | None = None,
    bounds: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """``I_verify`` per sequence.

    Args:
        lengths: ``(B,)`` verified tokens; positions ``>= lengths`` are the new rows (always visible).
        budget: ``(B,)`` entries in the set (sinks + recent + selected).
        draft: ``(B, L')`` draft lookahead signal (``L' >= max(lengths)``), or ``None`` (= no signal).
        target: ``(B, L')`` target history signal, or ``None``.
        m: ``(B,)`` slots chosen by the draft signal (clipped to the free slots).
        fixed: ``fixed_positions(lengths, budget, sinks, recent)`` when the caller already has it (a plan
            computes it once for ``m`` and the selection: ~35 small launches fewer per plan).
        bounds: host-known ``(L, m_max, r_max)``: signal width scanned and the most slots of the draft and target
            parts (:meth:`HybridSRHSelector.static_bounds`). With them the selection reads nothing from the
            device (CUDA-graph capturable) and its width is fixed per cache; without them the four maxima are
            read from the device in one synchronisation and the width follows this call's lengths.

    Returns:
        ``(B, K)`` int64 positions, ``-1`` = unused; no duplicates.
    """
    B = lengths.shape[0]
    dev = lengths.device
    fixed, room = fixed_positions(lengths, budget, sinks, recent) if fixed is None else fixed  # (B, S+R), (B,)
    m = torch.minimum(m.to(device=room.device, dtype=room.dtype).clamp(min=0), room)
    rest = room - m
    if bounds is None:
        # the shapes below need four maxima on the host: read them in one synchronisation
        L, room_max, m_max, r_max = torch.stack([lengths.max(), room.max(), m.max(), rest.max()]).tolist()
        if room_max == 0:
            return fixed
    else:
        L, m_max, r_max = bounds
        if m_max + r_max == 0:
            return fixed
    pos = torch.arange(L, device=dev).view(1, L)
    blocked = (pos >= lengths.view(B, 1)) | (pos < sinks) | (pos >= (lengths - recent).view(B, 1))

    def ranked(signal: torch.Tensor | None, extra_block: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.zeros(B, L, device=dev) if signal is None else signal[:, :L].float()
        if s.shape[1] < L:  # a signal only as wide as the longest sequence (host bounds: the cache's width)
            s = torch.nn.functional.pad(s, (0, L - s.shape[1]))
        s = s.masked_fill(blocked | extra_block, float("-inf"))
        val, idx = torch.topk(s, k, dim=-1)  # (B, k)
        return idx, val > float("-inf")

    none = torch.zeros(B, L, dtype=torch.bool, device=dev)
    parts = [fixed]
    taken = none
    if m_max > 0:
        idx, ok = ranked(draft, none, m_max)
        ok = ok & (torch.arange(m_max, device=dev).view(1, -1) < m.view(B, 1))
        d_idx = torch.where(ok, idx, torch.full_like(idx, -1))
        parts.append(d_idx)
        taken = torch.zeros(B, L + 1, dtype=torch.bool, device=dev)
        taken.scatter_(1, torch.where(ok, idx, torch.full_like(idx, L)), True)
        taken = taken[:, :L]
    if r_max > 0:
        idx, ok = ranked(target, taken, r_max)
        ok = ok & (torch.arange(r_max, device=dev).view(1, -1) < rest.view(B, 1))
        parts.append(torch.where(ok, idx, torch.full_like(idx, -1)))
    return torch.cat(parts, dim=1)


def captured(indices: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Share of ``mass`` ``(B, L)`` on ``indices`` ``(B, K)`` (``-1`` ignored) → ``(B,)``."""
    B, L = mass.shape
    sel = torch.zeros(B, L + 1, dtype=mass.dtype, device=mass.device)
    sel.scatter_(1, torch.where(indices < 0, torch.full_like(indices, L), indices.clamp(max=L)), 1.0)
    total = mass.sum(1).clamp(min=1e-30)
    return (mass * sel[:, :L]).sum(1) / total


@SELECTORS.register("hybrid_srh", HybridSRHConfig)
class HybridSRHSelector(KVSelector):
    """Dustin's hybrid verification set on Semantic Retrieval Heads.

    Paper: *Dustin* — sparse verification for long-context speculative decoding with hybrid
    draft-lookahead / target-history attention on Semantic Retrieval Heads (docs page
    *Dustin*). ``I_verify = sinks ∪ recent ∪ top_m(d) ∪
    top_{k-|·|}(t)`` with ``d`` the draft lookahead signal and ``t`` the target history signal,
    both summed over the SRHs only.

    It guides *verification*, not drafting (``role = "verify"``): the shared drafting test matrix
    skips it. Call :meth:`observe_draft` before :meth:`plan` and :meth:`observe_target` after each
    verification pass (:class:`specdec.verifiers.SparseVerifier` does both).
    """

    name = "hybrid_srh"
    role = "verify"
    Config = HybridSRHConfig

    def __init__(self, config: HybridSRHConfig | None = None, **fields) -> None:
        self.config = selector_config(type(self), config, fields)
        c = self.config
        self.grid = torch.linspace(0, 1, c.m_grid)
        self.reset(None)

    # -- state ---------------------------------------------------------------------------------------
    def reset(self, cache: KVCache | None) -> None:
        self.draft_signal: torch.Tensor | None = None  # (B, L)
        self.target_signal: torch.Tensor | None = None  # (B, L)
        self.m_ratio: torch.Tensor | None = None  # (B,) per-sequence ratio when adaptive
        self._proxy: torch.Tensor | None = None  # (B, m_grid) smoothed ARR proxy
        self._last: tuple | None = None  # (lengths, draft, target) of the last plan
        if getattr(self, "_quest", None) is None:
            self._quest: Quest | None = None  # page bounds of the per-layer part (layer_share > 0)
        self._keys: KeyRankIndex | None = None  # low-rank keys of the per-layer part (layer_scores="keys")
        # the index's buffers once prepare() has brought it up to date for the coming plan (None otherwise): tensor
        # attributes, so a captured plan's key holds their addresses (specdec.graphs.PlanGraphs)
        self.keys_basis: torch.Tensor | None = None
        self.keys_projected: torch.Tensor | None = None
        if self.config.layer_scores == "keys":
            self._keys = KeyRankIndex(self.config.key_rank)
        elif cache is not None and self.config.layer_share > 0:
            # zero the cache's page bounds in place even when this selector has not planned yet: another selector's
            # plan graph on this (reused) cache may serve its plans, and it reads these buffers from their state
            self._layer_quest().reset(cache)
        elif cache is not None and self._quest is not None:
            self._quest.reset(cache)

    @property
    def target_heads(self) -> dict[int, list[int]]:
        return heads_by_layer(self.config.target_heads)

    @property
    def draft_heads(self) -> dict[int, list[int]]:
        return heads_by_layer(self.config.draft_heads)

    def check_heads(self, n_layers: int, n_heads: int, who: str = "target") -> None:
        heads = self.config.target_heads if who == "target" else self.config.draft_heads
        for layer, h in heads or []:
            if not (0 <= layer < n_layers and 0 <= h < n_heads):
                raise SpecdecError(
                    f"{who}_heads entry ({layer}, {h}) is outside the {who} model's {n_layers} layers × {n_heads} "
                    f"heads; re-run `specdec profile-srh` for this model pair."
                )

    def observe_draft(self, lookahead: torch.Tensor | None) -> None:
        """Draft lookahead signal ``(B, L)`` of the coming verification."""
        self.draft_signal = lookahead

    def observe_target(self, scores: torch.Tensor, lengths: torch.Tensor) -> None:
        """Target SRH attention ``(B, L)`` over the full context from a verification pass.

        Each pass is normalised per sequence before the moving average, so passes weigh equally.
        With ``adaptive`` the split ``m`` is updated first (:meth:`adapt`).
        """
        s = scores.float()
        s = s / s.sum(1, keepdim=True).clamp(min=1e-30)
        if self.config.adaptive and self._last is not None:
            self.adapt(s)
        self._last = None
        a = self.config.history_decay
        if self.target_signal is None or a == 0 or self.target_signal.shape != s.shape:
            self.target_signal = s
        else:
            self.target_signal = a * self.target_signal + (1 - a) * s

    # -- m -------------------------------------------------------------------------------------------
    def budget_for(self, lengths: torch.Tensor) -> torch.Tensor:
        return self.config.budget_for(lengths)

    def m_for(self, lengths: torch.Tensor, room: torch.Tensor | None = None) -> torch.Tensor:
        """``(B,)`` slots for the draft signal this iteration (``room``: the free slots, when known)."""
        c = self.config
        if room is None:
            _, room = fixed_positions(lengths, self.budget_for(lengths), c.sinks, c.recent)
        if c.adaptive and self.m_ratio is not None and self.m_ratio.shape == room.shape:
            return torch.round(room.double() * self.m_ratio.to(room.device)).long()
        if c.m is not None:
            return torch.full_like(room, c.m)
        return torch.round(room.double() * c.m_ratio).long()

    def adapt(self, truth: torch.Tensor) -> None:
        """Input-aware ``m`` (beyond the paper): score each grid ratio by the share of the *new*
        target SRH attention ``truth`` ``(B, L)`` its set would have captured last iteration
        (same signals, same lengths), smooth, and keep the best ratio per sequence."""
        lengths, d, t = self._last
        c = self.config
        budget = self.budget_for(lengths)
        _, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        L = int(lengths.max())
        mass = truth[:, :L] * (torch.arange(L, device=truth.device).view(1, L) < lengths.view(-1, 1))
        proxy = []
        for r in self.grid.tolist():
            idx = hybrid_select(lengths, budget, c.sinks, c.recent, d, t, torch.round(room.double() * r).long())
            proxy.append(captured(idx, mass))
        proxy = torch.stack(proxy, dim=1)  # (B, m_grid)
        if self._proxy is None or self._proxy.shape != proxy.shape:
            self._proxy = proxy
        else:
            self._proxy = c.adapt_decay * self._proxy + (1 - c.adapt_decay) * proxy
        # ties → the configured (profiled) ratio: prefer the grid point closest to it
        prior = -(self.grid - c.m_ratio).abs().to(proxy.device) * 1e-6
        self.m_ratio = self.grid.to(proxy.device)[torch.argmax(self._proxy + prior, dim=1)]

    # -- plan ----------------------------------------------------------------------------------------
    def select(self, lengths: torch.Tensor, m: torch.Tensor | None = None, draft: torch.Tensor | None = None,
               target: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, K)`` positions of ``I_verify`` (``-1`` = unused) for explicit signals and ``m``."""
        c = self.config
        budget = self.budget_for(lengths)
        fixed = fixed_positions(lengths, budget, c.sinks, c.recent)
        m = self.m_for(lengths, room=fixed[1]) if m is None else m
        return hybrid_select(lengths, budget, c.sinks, c.recent, draft, target, m, fixed=fixed)

    def plan(self, cache: KVCache, lengths: torch.Tensor) -> SparsePlan:
        """One plan shared by all layers: ``indices`` ``(1, B, H_kv, K)``; the γ+1 new rows stay visible."""
        d, t = self.draft_signal, self.target_signal
        c = self.config
        if c.layer_share > 0:
            m = None
            if t is None or d is None:  # one signal missing (first pass / no drafter signal): the other takes all slots
                _, room = fixed_positions(lengths, self.budget_for(lengths), c.sinks, c.recent)
                m = room if t is None else torch.zeros_like(room)
            return self._layer_plan(cache, lengths, m)
        # budget and the fixed positions once per plan, shared by m and the selection (host launches are
        # most of a plan's cost on a GPU)
        budget = self.budget_for(lengths)
        fixed = fixed_positions(lengths, budget, c.sinks, c.recent)
        room = fixed[1]
        # one signal missing (first pass / no drafter signal): the other takes all slots
        m = room if t is None else torch.zeros_like(room) if d is None else self.m_for(lengths, room=room)
        # host-known widths (no device read) unless m is adaptive (its bound would double the width)
        bounds = None if c.adaptive else self.static_bounds(cache.capacity, d is not None, t is not None)
        idx = hybrid_select(lengths, budget, c.sinks, c.recent, d, t, m, fixed=fixed, bounds=bounds)  # (B, K)
        if c.adaptive:  # only adapt() reads it; a captured plan must not modify the selector
            self.mark(lengths)
        B, K = idx.shape
        # one set shared by the KV heads: (1, B, 1, K), as BudgetSelector's (the kernels broadcast it)
        return SparsePlan(indices=idx.view(1, B, 1, K), dense_from=lengths.clone(), static_size=bounds is not None)

    @property
    def prepares(self) -> bool:
        """Whether :meth:`prepare` has work to do (``layer_scores="keys"``): callers skip it, and the host lengths it
        takes, otherwise."""
        return self._keys is not None

    def prepare(self, cache: KVCache, lengths: torch.Tensor, host_lengths: list[int] | None = None) -> None:
        """Eager work before the next :meth:`plan` for ``lengths``: with ``layer_scores="keys"``, the low-rank keys
        brought up to date (the basis at the first call: :class:`~specdec.selectors.key_rank.KeyRankIndex`).
        ``host_lengths``: the host's copy of ``lengths`` (the engine's token lists), so nothing waits for the device.

        :class:`~specdec.verifiers.SparseVerifier` calls it at the prefill (the basis is prompt work) and before each
        sparse plan; the plan itself is then a pure function of the lengths and the signals, replayed as a CUDA graph.
        A plan without it (a direct :meth:`plan` call) updates the keys itself, eagerly. Other settings: nothing."""
        if self._keys is None:
            return
        self._keys.update(cache, lengths, host_lengths)
        self.keys_basis, self.keys_projected = self._keys.basis, self._keys.keys

    @property
    def capturable_plan(self) -> bool:
        """Whether :meth:`plan` is a pure function of the lengths and the signals with shapes fixed per cache
        (static ``m``; per-layer sets with their page bounds kept by the Triton kernels, or ranked by low-rank keys
        that :meth:`prepare` has brought up to date): the planner then replays it as one CUDA graph
        (:class:`PlanGraphs`)."""
        c = self.config
        if c.adaptive:
            return False
        if c.layer_share == 0:
            return True
        if c.layer_scores == "keys":
            return self.keys_projected is not None
        return c.page_kernels != "torch"

    def max_room(self, capacity: int) -> int:
        """Most free slots (budget - sinks - recent) of any plan of a cache of ``capacity`` positions (host)."""
        return self.config.max_room(capacity)

    def static_bounds(self, capacity: int, has_draft: bool = True, has_target: bool = True) -> tuple[int, int, int]:
        """``(L, m_max, r_max)`` for :func:`hybrid_select` from host values only: every plan of a cache of
        ``capacity`` positions fits (the budget grows with the length; ``room - round(room * r)`` and
        ``round(room * r)`` never decrease with ``room``)."""
        c = self.config
        room = self.max_room(capacity)
        if not has_target:
            m_max = room
        elif not has_draft:
            m_max = 0
        elif c.m is not None:
            m_max = min(c.m, room)
        else:
            m_max = round(room * c.m_ratio)  # float64 product, half to even: torch.round's (m_for)
        return capacity, m_max, room - m_max

    def _layer_plan(self, cache: KVCache, lengths: torch.Tensor, m: torch.Tensor | None) -> "LayerSetPlan":
        """Per layer and KV head (beyond the paper): a share ``layer_share`` of the free slots goes to the
        pages with the best Quest bound for the verify rows' own queries in that layer and KV head; the
        rest is the shared hybrid set (sinks + recent + draft top-m + target history).

        Nothing is read from the device and every width is host-known (:meth:`layer_bounds`), so the plan is
        replayed as one CUDA graph like the shared one; the page bounds are brought up to date in place."""
        c = self.config
        budget = self.budget_for(lengths)
        _, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        per = torch.round(room.double() * c.layer_share).long()
        shared_room = room - per
        if m is None:
            m = self.m_for(lengths, room=room)
        m = torch.round(m.double() * (1 - c.layer_share)).long() if c.layer_share < 1 else torch.zeros_like(room)
        m = torch.minimum(m, shared_room)
        d, t = self.draft_signal, self.target_signal
        k_sel, m_max, r_max = self.layer_bounds(cache.capacity, d is not None, t is not None)
        shared = hybrid_select(lengths, budget - per, c.sinks, c.recent, d, t, m,
                               bounds=(cache.capacity, m_max, r_max))  # (B, F)
        if c.adaptive:  # only adapt() reads it; a captured plan must not modify the selector
            self.mark(lengths)
        B = lengths.shape[0]
        if c.layer_scores == "keys":
            if self.keys_projected is None:  # not prepared for this plan: bring the keys up to date here (eager)
                self._keys.update(cache, lengths)
            new = _addable(lengths, shared, cache.capacity, c.sinks, c.recent)
            room = torch.minimum(per, new.sum(1))  # never more picks than addable tokens (the kernel's contract)
            live = _finished_skipped(cache, lengths)
            ranked = lengths.clone()
            if live is not None:  # a finished sequence ranks and picks nothing (its rows are dropped anyway)
                ranked.masked_fill_(~live, 0)
                room = torch.where(live, room, torch.zeros_like(room))
            return KeyRankPlan(indices=shared.view(1, B, 1, -1), dense_from=lengths.clone(), lengths=ranked,
                               room=room, basis=self._keys.basis, keys=self._keys.keys, new=new, k_sel=k_sel,
                               use_triton=self._layer_quest().use_triton(cache.k.device))
        q = self._layer_quest()
        q.update(cache, lengths)
        ps = c.page_size
        P = q.kmin.shape[3]
        new = _addable(lengths, shared, P * ps, c.sinks, c.recent)
        counts = page_counts(new, ps)
        return LayerSetPlan(indices=shared.view(1, B, 1, -1), dense_from=lengths.clone(), lengths=lengths.clone(),
                            room=per, kmin=q.kmin, kmax=q.kmax, width=P * ps, k_sel=k_sel, page_size=ps,
                            sinks=c.sinks, recent=c.recent, use_triton=q.use_triton(cache.k.device), clock=q._clock,
                            new=new, counts=counts)

    def _layer_quest(self) -> Quest:
        """The page bounds of the per-layer part (made on first use)."""
        c = self.config
        q = self._quest
        if q is None or q.config.page_size != c.page_size or q.config.kernels != c.page_kernels:
            q = self._quest = Quest(QuestConfig(page_size=c.page_size, sinks=c.sinks, recent=c.recent, budget_ratio=1.0,
                                                kernels=c.page_kernels))
        return q

    def layer_bounds(self, capacity: int, has_draft: bool = True, has_target: bool = True) -> tuple[int, int, int]:
        """``(k_sel, m_max, r_max)`` of a per-layer plan on a cache of ``capacity`` positions, from host values
        only: the most per-layer slots, and the most slots of the shared part's draft and target parts, over
        every free-slot count a plan of this cache can have (the same float64 roundings as :meth:`_layer_plan`)."""
        key = (capacity, has_draft, has_target)
        if getattr(self, "_bounds", None) and self._bounds[0] == key:
            return self._bounds[1]
        import numpy as np  # host arithmetic (no tensor: nothing a captured plan could mistake for a device read)

        c = self.config
        room = np.arange(self.max_room(capacity) + 1, dtype=np.int64)
        rnd = lambda x: np.rint(x).astype(np.int64)  # noqa: E731 - float64, half to even: torch.round's
        per = rnd(room * c.layer_share)
        shared_room = room - per
        if not has_target:
            m = room
        elif not has_draft:
            m = np.zeros_like(room)
        elif c.m is not None:
            m = np.full_like(room, c.m)
        else:
            m = rnd(room * c.m_ratio)
        m = rnd(m * (1 - c.layer_share)) if c.layer_share < 1 else np.zeros_like(room)
        m = np.minimum(m, shared_room)
        out = (int(per.max()), int(m.max()), int((shared_room - m).max()))
        self._bounds = (key, out)
        return out

    def mark(self, lengths: torch.Tensor) -> None:
        """Remember this iteration's signals so the next :meth:`observe_target` can adapt ``m``."""
        # a copy of the draft signal: the drafter rewrites its buffer in place, and may start the next draft
        # (draft_ahead) before the verifier's on_verify reads this
        d = self.draft_signal
        self._last = (lengths.clone(), None if d is None else d.clone(), self.target_signal)

    def disagreement(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(B,)`` 1 − overlap of the draft-only and target-only choices for the free slots (0 = same)."""
        c = self.config
        budget = self.budget_for(lengths)
        _, room = fixed_positions(lengths, budget, c.sinks, c.recent)
        if self.draft_signal is None or self.target_signal is None:
            return torch.zeros_like(room, dtype=torch.float32)
        a = hybrid_select(lengths, budget, c.sinks, c.recent, self.draft_signal, None, room)
        b = hybrid_select(lengths, budget, c.sinks, c.recent, None, self.target_signal, torch.zeros_like(room))
        L = int(lengths.max())
        both = torch.zeros(a.shape[0], L + 1, device=a.device)
        for idx in (a, b):
            both.scatter_add_(1, torch.where(idx < 0, torch.full_like(idx, L), idx), torch.ones_like(idx, dtype=torch.float32))
        overlap = (both[:, :L] >= 2).sum(1) - (budget - room)  # the fixed positions are in both
        return torch.where(room > 0, 1 - overlap.float() / room.clamp(min=1).float(), torch.zeros_like(overlap, dtype=torch.float32))


def _finished_skipped(cache: KVCache, lengths: torch.Tensor) -> torch.Tensor | None:
    """:func:`specdec.models.skipped_live` (imported when called: models imports the selectors' registry)."""
    from specdec import models

    return models.skipped_live(cache, lengths)


def _addable(lengths: torch.Tensor, shared: torch.Tensor, width: int, sinks: int, recent: int) -> torch.Tensor:
    """``(B, width)`` bool: the tokens a per-layer part may add — cached, outside sinks and recent, not in the shared
    part ``shared`` ``(B, F)`` (``-1`` padded)."""
    new = ~blocked_positions(lengths, width, sinks, recent)
    new = torch.nn.functional.pad(new, (0, 1))  # column ``width`` takes the shared part's -1 pads
    new.scatter_(1, torch.where(shared < 0, torch.full_like(shared, width), shared), False)
    return new[:, :width]


class LayerSetPlan(QuestPlan):
    """A verification plan with a part per layer and KV head (``HybridSRHConfig.layer_share``).

    ``indices`` ``(1, B, 1, F)`` is the shared part (sinks + recent + the hybrid set, ``-1`` padded); in each
    layer the backend adds, per KV head, the ``room`` new tokens of the pages with the best Quest bound for the
    verify rows' queries (:meth:`indices_for`): tokens ranked by their page's bound, ties by position.

    Its ``new`` / ``counts`` mark the tokens outside the shared part (as well as outside sinks, recent and the
    uncached positions): the per-layer part never repeats a shared position.
    """

    def scoring_reads(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(B,)`` K+V entries' worth one layer and KV head reads to rank: a page's min and max keys per page."""
        return (lengths + self.page_size - 1) // self.page_size
