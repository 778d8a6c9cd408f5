"""The four component contracts of specdec and the small dataclasses they exchange.

Shapes follow one convention everywhere:

* ``B``      sequences in the batch (cache slots)
* ``H``      query heads, ``H_kv`` key/value heads, ``G = H // H_kv`` query heads per KV group
* ``T``      query rows of one forward (1 for a decode/draft step, γ+1 for a verify pass)
* ``L``      cache capacity (positions), ``D`` head dimension
* ``K``      entries in a sparse plan (per sequence and KV head)
* ``N``      layers

A forward of ``T`` rows for sequence ``b`` writes its keys/values at positions
``lengths[b] .. lengths[b] + T - 1`` and row ``t`` attends causally to positions
``<= lengths[b] + t`` (dense) or to ``plan`` entries plus positions ``>= plan.dense_from[b]``
(sparse).
"""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Sequence

import torch

from specdec.errors import SpecdecError

if TYPE_CHECKING:  # pragma: no cover
    from specdec.cache import KVCache

ScoreKind = Literal["logits", "softmax", "sink_softmax"]


@dataclass
class SparsePlan:
    """Which cached KV entries a sparse attention step may see.

    Attributes:
        indices: ``(N or 1, B, H_kv or 1, K)`` int64 cache positions per layer, sequence and KV head;
            ``-1`` pads unused slots. A leading dimension of 1 shares one plan across layers.
        dense_from: ``(B,)`` int64; every position ``>= dense_from[b]`` (up to the row's own
            position) is visible as well: the tokens written since the plan was built.
        static_size: the number of entries ``K`` is fixed for the cache (it does not follow the
            lengths): it is used as is instead of being padded to a bucket.
    """

    indices: torch.Tensor
    dense_from: torch.Tensor
    static_size: bool = False

    def __post_init__(self) -> None:
        # shapes only (no value is read: plans are built inside captured graphs); a plugin's 2-D indices failed
        # later inside a backend with "tuple index out of range"
        i, d = self.indices, self.dense_from
        if i is None and type(self) is not SparsePlan:
            return  # a plan kind that fills its fields itself
        if not isinstance(i, torch.Tensor) or i.dim() != 4 or i.dtype.is_floating_point or i.dtype == torch.bool:
            got = f"a {i.dtype} tensor of shape {tuple(i.shape)}" if isinstance(i, torch.Tensor) else type(i).__name__
            raise SpecdecError(f"SparsePlan.indices must be an integer tensor (N or 1, B, H_kv or 1, K) with -1 "
                               f"padding; got {got}.")
        if not isinstance(d, torch.Tensor) or d.dim() != 1 or d.shape[0] != i.shape[1]:
            got = f"shape {tuple(d.shape)}" if isinstance(d, torch.Tensor) else type(d).__name__
            raise SpecdecError(f"SparsePlan.dense_from must be a (B,) tensor with B = {i.shape[1]} (indices' "
                               f"second dimension); got {got}.")

    def for_layer(self, layer: int) -> torch.Tensor:
        """``(B, H_kv, K)`` indices of one layer."""
        return self.indices[0] if self.indices.shape[0] == 1 else self.indices[layer]

    @property
    def budget(self) -> int:
        """Entries per (sequence, KV head) the plan holds, padding included."""
        return int(self.indices.shape[-1])

    def indices_for(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, K)`` indices for one layer given this step's queries ``q`` ``(B, H, T, D)``.

        The default ignores ``q`` (the plan was fixed when built). A query-aware plan kind (Quest's
        :class:`~specdec.selectors.quest.QuestPlan`) picks entries per draft step from its own
        fields; the backend executes it (:meth:`AttentionBackend.plan_indices`). A plan is data:
        every tensor it reads is one of its dataclass fields (so a planner can own them).
        """
        return self.for_layer(layer)


def plan_tensors(plan: SparsePlan) -> dict[str, torch.Tensor]:
    """The tensor fields of a plan (``indices``, ``dense_from`` and a plan kind's own), by name."""
    return {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)
            if isinstance(getattr(plan, f.name), torch.Tensor)}


@dataclass
class ScoreRequest:
    """Ask a forward for per-KV-token attention scores: the one way scores are recorded.

    Attributes:
        rows: query rows (0-based within the ``T`` rows of this forward) whose scores are kept.
        kind: ``"logits"`` (pre-softmax ``q·k·scale``, the Vegas formula) or ``"softmax"``
            (attention weights, the authors' public code) or ``"sink_softmax"`` (one-pass softmax:
            ``exp(logit - ref)`` with ``ref`` the row's log-sum-exp over its anchor positions -- the
            first and the last 16 of the sequence that it sees --, i.e. the softmax weights times one
            factor per row; exponent clamped at 60; no second pass in a kernel).
        heads: ``"group"`` sums over the ``G`` query heads of each KV group → ``(B, H_kv, L)``;
            ``"all"`` sums over every query head → broadcast to ``(B, H_kv, L)``; ``"each"`` keeps
            the query heads apart → ``(B, h, L)`` for the ``h`` heads of ``query_heads[layer]`` (all
            ``H`` heads when ``query_heads`` is ``None``), in that order (``source="context"`` only).
        layers: restrict collection to these layers (``None`` = every layer).
        query_heads: restrict the sum to these query heads per layer (``{layer: [heads]}``);
            used by Dustin's retrieval heads. ``None`` = all heads.
        per_row: keep the rows separate: ``scores[layer]`` is ``(B, H_kv, R, L)`` with ``R =
            len(rows)`` in the order of ``rows`` instead of their sum (used by Vegas' last-token
            mode and the overlap measurement).
        source: ``"attention"`` (default): the scores of the attention the backend computes (over
            the plan for a sparse forward), fused into its kernel where it can; ``"context"``: the
            dense softmax attention of the chosen heads over the whole cached context, whatever the
            plan, computed beside the backend (Dustin's SRH estimation and calibration; ``kind``
            must be ``"softmax"``).
    """

    rows: Sequence[int]
    kind: ScoreKind = "logits"
    heads: Literal["group", "all", "each"] = "group"
    layers: Sequence[int] | None = None
    query_heads: dict[int, Sequence[int]] | None = None
    per_row: bool = False
    source: Literal["attention", "context"] = "attention"
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    """Filled by the forward: ``{layer: (B, H_kv, L) float32}`` (``(B, H_kv, R, L)`` with ``per_row``,
    ``(B, h, L)`` with ``heads="each"``); positions a row cannot see are 0."""
    seconds: float = 0.0
    """Host time spent computing ``source="context"`` scores (eager forwards only; a replayed CUDA
    graph does not run Python)."""

    def __post_init__(self) -> None:
        if self.source == "context" and self.kind != "softmax":
            raise ValueError("a source='context' score request records softmax weights; set kind='softmax'.")
        if self.heads == "each" and self.source != "context":
            raise ValueError("heads='each' is only available with source='context'.")
        if self.per_row and self.source == "context":
            raise ValueError("per_row is only available with source='attention'.")

    def wants(self, layer: int) -> bool:
        """Whether scores of ``layer`` are requested."""
        return self.layers is None or layer in self.layers

    def heads_of(self, layer: int) -> Sequence[int] | None:
        """Query heads of ``layer`` included (``None`` = all)."""
        return None if self.query_heads is None else self.query_heads.get(layer, ())


def as_requests(scores: "ScoreRequest | Sequence[ScoreRequest] | None") -> tuple[ScoreRequest, ...]:
    """One request, several or none → a tuple of requests."""
    if scores is None:
        return ()
    if isinstance(scores, ScoreRequest):
        return (scores,)
    return tuple(scores)


@dataclass
class AttentionMetadata:
    """Everything one attention call needs besides the tensors (vLLM's ``attn_metadata``).

    Built once per layer by the attention route (:mod:`specdec.models`) and handed to
    :meth:`AttentionBackend.attend`; tests build it directly.

    Attributes:
        lengths: ``(B,)`` int64 cached tokens *before* the new rows; row ``t`` of sequence ``b``
            sits at position ``lengths[b] + t``.
        scale: softmax scale (usually ``D ** -0.5``).
        plan_indices: ``(B, H_kv or 1, K)`` int64 sparse positions (``-1`` = unused; a size-1 head
            dimension shares one list across KV heads), or ``None`` for dense causal attention.
        dense_from: ``(B,)`` int64, with a plan: positions ``>= dense_from[b]`` stay visible.
        score_rows: rows whose per-KV-token scores to return, or ``None`` (no scores).
        score_kind: ``"logits"`` or ``"softmax"``.
        score_heads: query heads included in the score sum (``None`` = all).
        score_per_row: return ``(B, H_kv, R, L)`` scores (one slice per entry of ``score_rows``)
            instead of their sum.
        layer: the layer of this call (``0`` outside a model forward): on a global layer its global
            index ``g`` (what plans and score requests index), on a sliding-window layer its model layer.
        window: sliding-window layers: a row at position ``p`` sees only positions ``> p - window``
            (``None`` = the full context), and ``k_cache``/``v_cache`` are the layer's **ring** of
            ``C`` slots, position ``q`` in slot ``q % C`` (a ring that has not wrapped reads like a
            linear cache; see :func:`specdec.attention.reference.window_mask`). Never with a plan or
            scores. Backends declare ``supports_window``.
        softcap: logits become ``softcap · tanh(logits / softcap)`` before the softmax (Gemma 2);
            backends declare ``supports_softcap``.
        static: CUDA-graph capture in progress: the backend must not synchronise with the host.
        tree: ``(T, T)`` bool, or ``None``: the new rows are a draft tree (:mod:`specdec.tree`); row ``t`` sees
            the cached positions ``< lengths[b]`` and new row ``j`` only where ``tree[t, j]`` (itself and its
            ancestors) instead of every new row ``<= t``. Backends declare ``supports_tree``.
        live_order, live_count: a dense call in which few sequences are live (the confidence valve's re-run,
            :attr:`specdec.cache.KVCache.few_live`): ``(B,)`` int32 sequence ids with the live ones first and ``(1,)``
            int32 how many are live, both on the device, and ``live_bound`` a host int that the count never exceeds.
            Only the live sequences' rows are used; a backend may compute just those (the Triton split kernel runs
            programs for them alone, ``live_bound`` slots) or ignore these fields.
    """

    lengths: torch.Tensor
    scale: float
    plan_indices: torch.Tensor | None = None
    dense_from: torch.Tensor | None = None
    score_rows: Sequence[int] | None = None
    score_kind: ScoreKind = "logits"
    score_heads: Sequence[int] | None = None
    score_per_row: bool = False
    layer: int = 0
    window: int | None = None
    softcap: float | None = None
    static: bool = False
    tree: torch.Tensor | None = None
    live_order: torch.Tensor | None = None
    live_count: torch.Tensor | None = None
    live_bound: int = 0

    @property
    def sparse(self) -> bool:
        return self.plan_indices is not None

    @property
    def wants_scores(self) -> bool:
        return self.score_rows is not None

    def replace(self, **changes) -> "AttentionMetadata":
        """A copy with some fields changed (e.g. ``lengths`` of a chunk of rows)."""
        return dataclasses.replace(self, **changes)

    def dense(self) -> "AttentionMetadata":
        """The same call without a plan (dense causal attention)."""
        return dataclasses.replace(self, plan_indices=None, dense_from=None)

    def without_scores(self) -> "AttentionMetadata":
        return dataclasses.replace(self, score_rows=None, score_per_row=False, score_heads=None)

    def needs(self) -> list[str]:
        """Backend capabilities this call needs (names of :class:`AttentionBackend` class attributes)."""
        out = []
        if self.sparse:
            out.append("supports_sparse")
        if self.wants_scores:
            out.append("supports_scores")
            if self.score_per_row:
                out.append("supports_per_row_scores")
        if self.window is not None:
            out.append("supports_window")
        if self.softcap is not None:
            out.append("supports_softcap")
        if self.tree is not None:
            out.append("supports_tree")
        if self.static:
            out.append("capture_safe")
        return out


@dataclass
class ForwardContext:
    """Everything the routed attention function needs for one model forward.

    Attributes:
        cache: the KV cache the forward reads and appends to.
        lengths: ``(B,)`` int64 tokens already cached per sequence (before this forward).
        backend: the attention backend that computes this forward.
        plan: sparse plan, or ``None`` for dense causal attention.
        requests: score requests, filled in place.
        attention_request: the one request of ``requests`` whose scores the backend computes.
        static: CUDA-graph capture: no host synchronisation (the cache skips its capacity check).
    """

    cache: "KVCache"
    lengths: torch.Tensor
    backend: AttentionBackend
    plan: SparsePlan | None = None
    requests: tuple[ScoreRequest, ...] = ()
    attention_request: ScoreRequest | None = None
    static: bool = False
    #: when a list: the route appends each layer it serves (the attach-time check counts them)
    routed: list | None = None
    #: tensors every layer of this forward would compute alike (see :func:`per_forward`)
    memo: dict = field(default_factory=dict)
    #: ``(T, T)`` bool: the rows are a draft tree (:attr:`AttentionMetadata.tree`), or ``None``
    tree: torch.Tensor | None = None


def per_forward(lengths: torch.Tensor, key: tuple, build):
    """``build()``, computed once per model forward for ``key`` when ``lengths`` is the running forward's
    own lengths (every sliding-window layer of a step builds the same window mask and ring slots: 15 of
    Gemma 3 270M's 18 layers, ~20 launches each); outside a forward, or for other lengths (a prefill
    piece's ``lengths + a``), it is simply called. Lives as long as the forward's context, so a CUDA graph
    captures the one computation inside the forward and replays it."""
    ctx = FORWARD_CONTEXT.get()
    if ctx is None or ctx.lengths is not lengths:
        return build()
    if key not in ctx.memo:
        ctx.memo[key] = build()
    return ctx.memo[key]



#: the running specdec forward's context (``None`` outside one): set by
#: :meth:`~specdec.models.SpecdecModel.forward`, read by the routed attention and by the fused
#: modules of :mod:`specdec.fusion` (which write the KV cache themselves)
FORWARD_CONTEXT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("specdec_ctx", default=None)

class AttentionBackend(ABC):
    """Computes attention over the cache for ``T`` new query rows per sequence.

    A backend declares what it supports as class attributes (vLLM's ``ClassVar`` style; a backend
    whose options change one sets it per instance in ``__init__``) and a call that needs a missing
    capability is refused with one sentence naming it (:meth:`refusal`), before any kernel runs.
    """

    name: ClassVar[str] = "abstract"
    #: sparse plans (``meta.plan_indices``)
    supports_sparse: ClassVar[bool] = True
    #: per-KV-token scores of the attended rows (``meta.score_rows``)
    supports_scores: ClassVar[bool] = True
    #: scores kept per row (``meta.score_per_row``)
    supports_per_row_scores: ClassVar[bool] = True
    #: sliding-window layers (``meta.window``: the cache is the layer's ring, see :class:`AttentionMetadata`)
    supports_window: ClassVar[bool] = False
    #: attention-logit soft-capping (``meta.softcap``, Gemma 2)
    supports_softcap: ClassVar[bool] = False
    #: draft-tree rows (``meta.tree``: each new row sees its ancestors among the new rows, :mod:`specdec.tree`)
    supports_tree: ClassVar[bool] = False
    #: a forward through it can be captured as a CUDA graph (no host synchronisation, static shapes)
    capture_safe: ClassVar[bool] = False

    @abstractmethod
    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of new rows over the cache (their own K/V already written).

        Args:
            q: ``(B, H, T, D)`` queries of the new rows.
            k_cache: ``(B, H_kv, L, D)`` one layer's keys.
            v_cache: ``(B, H_kv, L, D)`` one layer's values.
            meta: lengths, scale, plan and score request of this call (:class:`AttentionMetadata`).

        Returns:
            ``out``: ``(B, H, T, D)`` in ``q.dtype``; ``scores``: ``(B, H_kv, L)`` float32 summed
            over ``meta.score_rows`` and over the selected query heads of each KV group
            (``(B, H_kv, R, L)`` with ``meta.score_per_row``), 0 where a row cannot see the
            position, or ``None`` when not requested.
        """

    def plan_indices(self, plan: SparsePlan, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Execute ``plan`` for one layer: ``(B, H_kv or 1, K)`` entries the queries ``q`` ``(B, H, T, D)``
        attend to. The default runs the plan kind's own selection (:meth:`SparsePlan.indices_for`:
        fixed indices, or Quest's query-aware top-k); a backend may override it to fuse a kind."""
        return plan.indices_for(layer, q)

    def missing(self, needs: Sequence[str]) -> list[str]:
        """The capabilities among ``needs`` this backend lacks."""
        return [n for n in needs if not getattr(self, n, False)]

    def refusal(self, needs: Sequence[str]) -> str | None:
        """``None`` when this backend has every capability in ``needs``, else one sentence naming the missing ones."""
        miss = self.missing(needs)
        if not miss:
            return None
        return (f"the {self.name!r} attention backend cannot run this forward: it lacks "
                f"{', '.join(f'{m} (= False)' for m in miss)}; choose a backend that has "
                f"{'it' if len(miss) == 1 else 'them'}.")

    def validate(self, device: torch.device, dtype: torch.dtype) -> str | None:
        """Return ``None`` when the backend can run here, else one sentence saying why not."""
        return None


class KVSelector(ABC):
    """Builds a :class:`SparsePlan` once per iteration; kernels only consume it.

    ``budget`` is the total number of cached entries one sparse step may see (sinks, recent
    window and selected tokens together); the tokens written during the current iteration are
    visible on top of it.
    """

    name: str = "abstract"

    def reset(self, cache: "KVCache") -> None:
        """Called once before generation with the freshly prefilled cache."""

    def on_verify(self, scores: ScoreRequest | None, lengths: torch.Tensor) -> None:
        """Receive the verification pass's scores and the new (accepted) lengths."""

    @abstractmethod
    def plan(self, cache: "KVCache", lengths: torch.Tensor) -> SparsePlan:
        """Build the plan for the coming draft steps.

        Args:
            cache: the KV cache (read-only here).
            lengths: ``(B,)`` verified tokens per sequence.
        """

    def score_request(self, gamma: int) -> ScoreRequest | None:
        """The score request for a verify pass of ``gamma + 1`` rows (``None`` = no scores)."""
        return None


class Drafter(ABC):
    """Proposes ``gamma`` tokens per sequence from the engine's :class:`specdec.engine.DecodeState`."""

    #: drafts from the target's own cache, so the engine may run plain dense steps between rounds
    #: (:mod:`specdec.adaptive`); then :meth:`on_verify` is called with ``scores=None`` after each
    dense_steps_ok: bool = False

    def prefill(self, state) -> None:  # noqa: ANN001 - DecodeState
        """Called once after the target's prefill (a model drafter prefills its own cache here)."""

    @abstractmethod
    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:  # noqa: ANN001
        """Propose drafts after ``state.pending``.

        Returns:
            ``tokens`` ``(B, gamma)`` and, when sampling, the warped draft distributions
            ``q`` ``(B, gamma, V)`` (``None`` when greedy).
        """

    def score_request(self, gamma: int) -> ScoreRequest | None:
        """Scores this drafter wants collected by the coming verification pass."""
        return None

    def on_verify(self, state, scores: ScoreRequest | None) -> None:  # noqa: ANN001
        """After acceptance: ``state.lengths`` holds the new verified lengths (and ``state.pending``,
        ``state.active`` the new values). The engine calls it before the host has the iteration's tokens — it
        queues the next plan, then appends to ``state.tokens`` while the GPU builds it — so read the device
        state here, not ``state.tokens``."""

    #: whether a greedy :meth:`draft` reads device state only (``state.lengths``, ``state.pending``,
    #: ``state.active``, the drafter's own tensors; not ``state.tokens``, no host read), so that :meth:`draft_ahead`
    #: may run it early
    drafts_ahead: bool = False

    def draft_ahead(self, state, gamma: int) -> None:  # noqa: ANN001
        """Start the next iteration's draft of ``gamma`` tokens early. The engine calls it when γ is fixed (no
        adaptive controller) right after :meth:`on_verify`, before the host has the iteration's tokens: work queued
        here overlaps the host's emission, and the GPU need not wait for the host to launch the draft. The default
        runs a greedy :meth:`draft` now when :attr:`drafts_ahead` says it reads device state only, and keeps the
        result for the next :meth:`draft` call with the same ``gamma``, which returns it (:meth:`take_ahead`);
        otherwise it does nothing. A generation may end without that call (:meth:`take_ahead` in :meth:`prefill`
        forgets the early draft)."""
        if self.drafts_ahead and state.sampling.greedy:
            self._ahead = (gamma, self.draft(state, gamma))

    def take_ahead(self, gamma: int | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The draft :meth:`draft_ahead` started for ``gamma``, or ``None``; either way it is gone afterwards (call it
        first thing in :meth:`draft`, and with ``None`` in :meth:`prefill`)."""
        ahead = getattr(self, "_ahead", None)
        self._ahead = None
        return ahead[1] if ahead is not None and ahead[0] == gamma else None

    def take_flags(self) -> torch.Tensor | None:
        """The last greedy draft's non-finite flags ``(2,)`` (:func:`specdec.sampling.nonfinite_flags` OR-ed over its
        steps), still on the device: the engine reads them with its one host transfer of the iteration and raises
        (:func:`specdec.sampling.raise_nonfinite`, naming the drafter). A drafter records them as ``self._flags`` when
        it drafts; taking them clears them, and :meth:`raise_untaken_flags` (in :meth:`on_verify`) raises those nobody
        took (a drafter driven without the engine). ``None``: nothing pending."""
        flags = getattr(self, "_flags", None)
        if flags is not None:
            self._flags = None
        return flags

    def raise_untaken_flags(self) -> None:
        """:meth:`take_flags`' flags if the engine did not take them, raised here (one host read)."""
        flags = self.take_flags()
        if flags is not None:
            from specdec.sampling import raise_nonfinite

            raise_nonfinite(flags, "drafter")

    def drafts_replaced(self, state, drafts: torch.Tensor, mask: torch.Tensor) -> None:  # noqa: ANN001
        """A wrapper (:class:`specdec.lookup.LookupDrafter`) verifies ``drafts (B, γ)`` instead of this drafter's
        own where ``mask (B, γ)`` is true: a drafter whose state holds its own drafts fixes it here."""


class Verifier(ABC):
    """Scores ``gamma + 1`` rows (the pending token + the drafts) with the target model."""

    def prefill(self, state) -> None:  # noqa: ANN001 - DecodeState
        """Called once after the target's prefill and the drafter's (reset per-generation state here)."""

    @abstractmethod
    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:  # noqa: ANN001
        """Target logits ``(B, gamma + 1, V)`` for ``tokens`` ``(B, gamma + 1)`` at ``state.lengths``."""

    def on_verify(self, state) -> None:  # noqa: ANN001
        """After acceptance: ``state.lengths`` holds the new verified lengths and ``state.tokens`` the iteration's
        tokens (called after the drafter's ``on_verify`` and the host's emission)."""
