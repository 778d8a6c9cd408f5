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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Sequence

import torch

if TYPE_CHECKING:  # pragma: no cover
    from specdec.cache import KVCache

ScoreKind = Literal["logits", "softmax"]


@dataclass
class SparsePlan:
    """Which cached KV entries a sparse attention step may see.

    Attributes:
        indices: ``(N or 1, B, H_kv or 1, K)`` int64 cache positions per layer, sequence and KV head;
            ``-1`` pads unused slots. A leading dimension of 1 shares one plan across layers.
        dense_from: ``(B,)`` int64; every position ``>= dense_from[b]`` (up to the row's own
            position) is visible as well: the tokens written since the plan was built.
        static_size: the number of entries ``K`` is fixed for the cache (it does not follow the
            lengths), so CUDA-graph capture uses it as is instead of padding it to a bucket.
    """

    indices: torch.Tensor
    dense_from: torch.Tensor
    static_size: bool = False

    def for_layer(self, layer: int) -> torch.Tensor:
        """``(B, H_kv, K)`` indices of one layer."""
        return self.indices[0] if self.indices.shape[0] == 1 else self.indices[layer]

    @property
    def budget(self) -> int:
        """Entries per (sequence, KV head) the plan holds, padding included."""
        return int(self.indices.shape[-1])

    def indices_for(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, K)`` indices for one layer given this step's queries ``q`` ``(B, H, T, D)``.

        The default ignores ``q`` (the plan was fixed when built). Query-aware plans (Quest)
        override it to pick entries per draft step; the attention route calls this method.
        """
        return self.for_layer(layer)

    # -- CUDA-graph capture (specdec.graphs): a captured step reads a static copy of the plan, and each
    # replay copies the live plan's tensors into it. Query-aware plans override the three methods.
    def graph_key(self) -> tuple:
        """What a captured step depends on besides tensor values (shapes, host-side sizes)."""
        return ("plan", tuple(self.indices.shape))

    def static_copy(self) -> "SparsePlan":
        """A plan with its own buffers, for a captured step to read."""
        return SparsePlan(indices=self.indices.clone(), dense_from=self.dense_from.clone(), static_size=self.static_size)

    def copy_into(self, static: "SparsePlan") -> None:
        """Load this plan's values into ``static`` (made by :meth:`static_copy` of a plan with the same key)."""
        static.indices.copy_(self.indices)
        static.dense_from.copy_(self.dense_from)


@dataclass
class ScoreRequest:
    """Ask the attention backend for per-KV-token scores during a forward.

    Attributes:
        rows: query rows (0-based within the ``T`` rows of this forward) whose scores are kept.
        kind: ``"logits"`` (pre-softmax ``q·k·scale``, the Vegas formula) or ``"softmax"``
            (attention weights, the authors' public code).
        heads: ``"group"`` sums over the ``G`` query heads of each KV group → ``(B, H_kv, L)``;
            ``"all"`` sums over every query head → broadcast to ``(B, H_kv, L)``.
        layers: restrict collection to these layers (``None`` = every layer).
        query_heads: restrict the sum to these query heads per layer (``{layer: [heads]}``);
            used by Dustin's retrieval heads. ``None`` = all heads.
        per_row: keep the rows separate: ``scores[layer]`` is ``(B, H_kv, R, L)`` with ``R =
            len(rows)`` in the order of ``rows`` instead of their sum (used by Vegas' last-token
            mode and the overlap measurement). Backends that do not support it raise.
    """

    rows: Sequence[int]
    kind: ScoreKind = "logits"
    heads: Literal["group", "all"] = "group"
    layers: Sequence[int] | None = None
    query_heads: dict[int, Sequence[int]] | None = None
    per_row: bool = False
    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    """Filled by the forward: ``{layer: (B, H_kv, L) float32}`` (``(B, H_kv, R, L)`` with ``per_row``);
    positions a row cannot see are 0."""
    stacked: tuple[list[int], torch.Tensor] | None = None
    """Optionally set with :attr:`scores`: ``(layers, tensor)`` where ``tensor[i]`` is
    ``scores[layers[i]]`` (the values of ``scores`` are views of it), so a consumer of every layer
    can skip stacking them again (a replayed CUDA graph returns them this way)."""

    def wants(self, layer: int) -> bool:
        """Whether scores of ``layer`` are requested."""
        return self.layers is None or layer in self.layers


@dataclass
class ForwardContext:
    """Everything the routed attention function needs for one model forward.

    Attributes:
        cache: the KV cache the forward reads and appends to.
        lengths: ``(B,)`` int64 tokens already cached per sequence (before this forward).
        backend: the attention backend that computes this forward.
        plan: sparse plan, or ``None`` for dense causal attention.
        scores: optional score request, filled in place.
        static: CUDA-graph capture: no host synchronisation (the cache skips its capacity check).
    """

    cache: "KVCache"
    lengths: torch.Tensor
    backend: AttentionBackend
    plan: SparsePlan | None = None
    scores: ScoreRequest | None = None
    static: bool = False



#: the running specdec forward's context (``None`` outside one): set by
#: :meth:`~specdec.models.SpecdecModel.forward`, read by the routed attention and by the fused
#: modules of :mod:`specdec.fusion` (which write the KV cache themselves)
FORWARD_CONTEXT: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar("specdec_ctx", default=None)

class AttentionBackend(ABC):
    """Computes attention over the cache for ``T`` new query rows per sequence.

    A backend declares what it supports (``supports``) and explains refusals
    (``validate``) instead of failing deep inside a kernel.
    """

    name: str = "abstract"

    @abstractmethod
    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        lengths: torch.Tensor,
        scale: float,
        plan_indices: torch.Tensor | None = None,
        dense_from: torch.Tensor | None = None,
        score_rows: Sequence[int] | None = None,
        score_kind: ScoreKind = "logits",
        score_heads: Sequence[int] | None = None,
        **options,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of new rows over the cache (their own K/V already written).

        Args:
            q: ``(B, H, T, D)`` queries of the new rows.
            k_cache: ``(B, H_kv, L, D)`` one layer's keys.
            v_cache: ``(B, H_kv, L, D)`` one layer's values.
            lengths: ``(B,)`` int64 cached tokens *before* the new rows; row ``t`` of
                sequence ``b`` sits at position ``lengths[b] + t``.
            scale: softmax scale (usually ``D ** -0.5``).
            plan_indices: ``(B, H_kv or 1, K)`` int64 sparse positions (``-1`` = unused; a size-1
                head dimension shares one list across KV heads) or ``None``.
            dense_from: ``(B,)`` int64, with a plan: positions ``>= dense_from[b]`` stay visible.
            score_rows: rows whose per-KV-token scores to return, or ``None``.
            score_kind: ``"logits"`` or ``"softmax"``.
            score_heads: query heads included in the score sum (``None`` = all).
            options: optional capabilities passed only when requested; ``score_per_row=True``
                returns ``(B, H_kv, R, L)`` scores (one slice per entry of ``score_rows``).

        Returns:
            ``out``: ``(B, H, T, D)`` in ``q.dtype``; ``scores``: ``(B, H_kv, L)`` float32 summed
            over ``score_rows`` and over the selected query heads of each KV group, 0 where a
            row cannot see the position, or ``None`` when not requested.
        """

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
        """After acceptance: ``state.lengths`` holds the new verified lengths."""


class Verifier(ABC):
    """Scores ``gamma + 1`` rows (the pending token + the drafts) with the target model."""

    def prefill(self, state) -> None:  # noqa: ANN001 - DecodeState
        """Called once after the target's prefill and the drafter's (reset per-generation state here)."""

    @abstractmethod
    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:  # noqa: ANN001
        """Target logits ``(B, gamma + 1, V)`` for ``tokens`` ``(B, gamma + 1)`` at ``state.lengths``."""

    def on_verify(self, state) -> None:  # noqa: ANN001
        """After acceptance: ``state.lengths`` holds the new verified lengths."""
