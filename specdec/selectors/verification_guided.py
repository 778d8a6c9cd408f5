"""Vegas: verification-guided sparse drafting, and its Collect-2-Query mode.

The verification pass attends to the whole cache anyway, so it already computes how critical every
KV entry is. Vegas keeps those scores (summed over the collected query rows and the query heads)
and drafts the next γ tokens over their top-k, plus sinks, a recent window and the tokens written
since the verification. No extra pass, no extra query: the selection is a by-product.

Rows of a verify pass (γ+1 of them): row 0 is the pending token (the bonus token of the previous
iteration, i.e. the last accepted one), rows 1..γ are the drafts; row γ's output is the next bonus
token. Collection modes:

* ``all``      rows 0..γ — the paper's formula ``T = argmax_{|T|=k} Σ_t Σ_h Σ_{i∈T} l^(h)_{t,i}``.
* ``collect2`` rows {0, γ}: the two ends of the draft chain. Neighbouring rows select nearly the
  same entries and the overlap decays with distance, so the two most distant rows cover most of
  what all γ+1 rows would; collection cost is constant (2 rows) instead of γ+1.
* ``last``     the row of the last *accepted* token only (row ``n_accepted``): the single-query
  baseline the paper argues against. On this reference path it collects all γ+1 rows separately
  (``ScoreRequest.per_row``) and keeps one, so it costs as much as ``all``; a fused kernel would
  write the γ+1 rows and pick one.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from specdec.attention.recording import stack_layers
from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.graphs import forget_address, keep_address
from specdec.interfaces import ScoreRequest
from specdec.registry import SELECTORS
from specdec.selectors.base import BudgetConfig, BudgetSelector, fused_select
from specdec.selectors.sliding_window import recency

RowMode = Literal["all", "collect2", "last"]

#: How ``spread`` is computed: ``True`` (the default) Triton on CUDA tensors (head sum + forward max in one launch,
#: or two at large shapes: :func:`specdec.cuda.triton_select.spread_scores`), PyTorch elsewhere; ``"always"`` Triton
#: wherever it runs (the CPU too under ``TRITON_INTERPRET=1``: tests); ``False`` PyTorch (sum, padded copy, max-pool,
#: copy) everywhere. The same values up to the rounding of the fp32 head sum: the launch adds the heads in head order,
#: PyTorch's reduction in an order of its own (bitwise equal at SmolLM2's 3 KV heads on the H200, not at 8; plans then
#: differ only among near-equal scores). On the H200 (``benchmarks/results/gpu_spread_2026-12-02.md``) ``on_verify``
#: took 0.247 vs 0.467 ms at SmolLM2 B 64 x 8k, 0.310 vs 0.578 ms at the Llama-3.1-8B shape B 16 x 32k (two passes).
TRITON_SPREAD: bool | str = True


def _spread_launch(s: torch.Tensor):
    """:func:`~specdec.cuda.triton_select.spread_scores` when :data:`TRITON_SPREAD` applies to ``s``, else ``None``."""
    if TRITON_SPREAD not in (True, False, "always"):
        raise ValueError(f"specdec.selectors.verification_guided.TRITON_SPREAD is {TRITON_SPREAD!r}; "
                         f"use True, False or 'always'")
    if TRITON_SPREAD is False or (TRITON_SPREAD is True and not s.is_cuda):
        return None
    from specdec.selectors.base import _triton_runs

    if not _triton_runs(s.device):
        return None
    try:
        from specdec.cuda.triton_select import spread_scores
    except ImportError:  # triton is an optional extra
        return None
    return spread_scores


def collected_rows(mode: str, gamma: int) -> list[int]:
    """Verify rows (0..γ) whose scores a mode collects; see the module docstring."""
    if gamma < 1:
        raise SpecdecError(f"gamma must be >= 1 (got {gamma}); use gamma=4 or so.")
    if mode == "all" or mode == "last":
        return list(range(gamma + 1))
    if mode == "collect2":
        return [0, gamma]
    raise SpecdecError(f"rows must be one of all, collect2, last (got {mode!r}).")


def spread_forward(s: torch.Tensor, n: int) -> torch.Tensor:
    """``out[..., i] = max(s[..., i - n : i + 1])`` over the last dimension (positions), same shape and dtype.

    Each position ranks with the best score of itself and the ``n`` positions before it, so a plan that keeps an
    attended entry keeps the ``n`` after it too (where a draft that copies or paraphrases the context reads next).
    """
    L = s.shape[-1]
    flat = s.reshape(-1, 1, L)
    padded = torch.nn.functional.pad(flat, (n, 0), value=float("-inf"))
    return torch.nn.functional.max_pool1d(padded, kernel_size=n + 1, stride=1).view(s.shape)


class VerificationGuidedConfig(BudgetConfig):
    """Options of :class:`VerificationGuidedSelector` (budget fields: :class:`BudgetConfig`)."""

    rows: RowMode = Field(default="all", description="verify rows whose scores are aggregated")
    score_kind: Literal["logits", "softmax", "sink_softmax"] = Field(
        default="sink_softmax",
        description="sink_softmax (the default: exp(logit - the row's log-sum-exp over the first and last 16 "
                    "positions): softmax up to one factor per row, one pass in the Triton kernel; not with "
                    "rows='last', where the default is softmax), softmax weights (authors' code) or pre-softmax "
                    "logits (paper's formula)",
    )
    per_kv_head: bool = Field(default=False, description="top-k per KV head instead of one set per layer")
    score_every: int = Field(default=1, ge=1, description="collect scores at every n-th verification only; "
                             "the plans in between reuse the last scores (newer tokens come from the recent window "
                             "and the dense tail): verify passes without score emission")
    spread: int = Field(default=8, ge=0, description="each entry also ranks with the best (head-summed) score of "
                        "the `spread` entries before it (a forward max over positions): drafts move on through the "
                        "text they attend to, so the entries after an attended one are the ones later drafts need; "
                        "0: the paper's plain top-k")

    @model_validator(mode="before")
    @classmethod
    def _default_kind_for_rows(cls, data: Any) -> Any:
        """``rows='last'`` keeps the rows apart, which ``sink_softmax`` (the default) cannot: there the
        default is ``softmax``; an explicit ``score_kind`` is kept (and checked below)."""
        if isinstance(data, dict) and data.get("rows") == "last" and "score_kind" not in data:
            data = {**data, "score_kind": "softmax"}
        return data

    @model_validator(mode="after")
    def _kind_fits_rows(self) -> "VerificationGuidedConfig":
        if self.rows == "last" and self.score_kind == "sink_softmax":
            raise ValueError("score_kind='sink_softmax' sums the rows; rows='last' keeps them apart: "
                             "use score_kind='softmax' or 'logits' with rows='last'.")
        return self


@SELECTORS.register("verification_guided", VerificationGuidedConfig)
class VerificationGuidedSelector(BudgetSelector):
    """Top-k of the previous verification's attention scores, per layer (optionally per KV head).

    Vegas (verification-guided sparse attention for self-speculative decoding;
    the Vegas paper, §2A–B). ``score`` returns the aggregated scores
    ``(N, B, H_kv or 1, L)`` kept from the last :meth:`on_verify`; the base class adds sinks and the
    recent window and fills the rest of the budget by top-k. Before the first verification there
    are no scores and the plan falls back to recency (a sliding window).
    """

    Config = VerificationGuidedConfig

    def __init__(self, config: VerificationGuidedConfig | None = None, **fields) -> None:
        super().__init__(config, **fields)
        self._scores: torch.Tensor | None = None  # (N, B, H_kv or 1, L)
        self._lengths: torch.Tensor | None = None  # (B,) lengths when the last request was made
        self._gamma = 0  # γ of the last score request (0: none yet; an int, never None: see reset)
        # the cache whose planner owns the score buffer (set by reset); without one, the selector owns it
        self._cache_ref = None
        self._own: list[torch.Tensor] = []  # that buffer when the selector owns it (a list: not a plan-graph input)
        self._raw: torch.Tensor | None = None  # (N, B, H_kv, L) emitted scores, unsummed (the fused plan's input)
        self._since = 0  # verifications since the last one that collected scores
        self._skipped = False  # the coming on_verify follows a verification without a score request

    # -- the contract -------------------------------------------------------------------------
    def reset(self, cache: KVCache) -> None:
        import weakref

        # _gamma stays an int: the plan graph's key lists the selector's None attributes, and a None here made the
        # first plan after the prefill and the re-plan after dense steps two graphs of one computation
        self._scores, self._raw, self._lengths, self._gamma = None, None, None, 0
        self._since, self._skipped = 0, False
        self._cache_ref = weakref.ref(cache) if cache is not None else None

    def score_request(self, gamma: int) -> ScoreRequest | None:
        c = self.config
        self._gamma = gamma
        # score_every = n: scores at every n-th verification; in between the verify pass emits none and
        # the next plan reuses the last scores (their positions are still in the cache, unchanged)
        self._skipped = self._scores is not None and self._since + 1 < c.score_every
        if self._skipped:
            return None
        return ScoreRequest(rows=collected_rows(c.rows, gamma), kind=c.score_kind, heads="group",
                            per_row=c.rows == "last")

    def on_verify(self, scores: ScoreRequest | None, lengths: torch.Tensor) -> None:
        if self._skipped and scores is None:  # a verification without scores (score_every): keep the last ones
            self._skipped = False
            self._since += 1
            self._lengths = lengths.clone()
            return
        self._skipped, self._since = False, 0
        self._scores = self._raw = None
        if scores is not None and scores.scores:
            layers = sorted(scores.scores)
            s = stack_layers([scores.scores[layer] for layer in layers])  # (N, B, H_kv, [R,] L)
            if scores.per_row:
                s = self._last_accepted_row(s, lengths)
            # the fused plan sums the heads itself: keep s as emitted (unless the sums are to be spread first)
            if fused_select(s.device, s) is not None and not self.config.spread:
                self._raw = s
            else:
                self._scores = self._keep(s)
        self._lengths = lengths.clone()

    def _keep(self, s: torch.Tensor) -> torch.Tensor:
        """The scores the next plan reads, ``(N, B, H_kv or 1, L)`` fp32, written into one buffer of the cache's
        planner (same address every iteration, :func:`specdec.graphs.keep_address`): the plan's CUDA graph reads
        it in place instead of copying it in (~63 MB per iteration at B = 64 x 8k), and the head sum writes
        straight into it.

        The buffer belongs to the cache, not to the selector: every engine decoding on one (reused) cache then
        plans through the same captured graph. A buffer per selector put its address in the plan graph's key, so
        three Vegas engines on one cache (a benchmark's fixed, adaptive and A/A arms) needed six to nine plan
        graphs where the planner keeps four: every timed call of the H200's a14 run recaptured two or three.
        Selectors on one cache run one at a time (each resets at its prefill), so they can share it."""
        N, B, H, L = s.shape
        shape = (N, B, H if self.config.per_kv_head else 1, L)
        cache = self._cache_ref() if self._cache_ref is not None else None
        if cache is not None and cache.k.device == s.device:
            from specdec.planner import planner_for

            buf = planner_for(cache).buffer(f"verification_guided.scores.h{shape[2]}", shape)
        else:  # used without a cache (no reset): a buffer of its own
            buf = self._own[0] if self._own else None
            if buf is None or tuple(buf.shape) != shape or buf.device != s.device:
                if buf is not None:
                    forget_address(buf)
                buf = keep_address(torch.empty(shape, dtype=torch.float32, device=s.device))
                self._own[:] = [buf]
        if self.config.spread:  # the head sums (or each KV head's scores), spread forward
            launch = _spread_launch(s)
            if launch is not None:  # one pass over the scores: the spread sums written straight into the buffer
                launch(s, self.config.spread, not self.config.per_kv_head, out=buf)
            else:
                buf.copy_(spread_forward(s if self.config.per_kv_head else s.sum(2, keepdim=True, dtype=torch.float32),
                                         self.config.spread))
        elif self.config.per_kv_head:
            buf.copy_(s)
        else:
            torch.sum(s, dim=2, keepdim=True, dtype=torch.float32, out=buf)
        return buf

    def _last_accepted_row(self, s: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``(N, B, H_kv, R, L)`` → ``(N, B, H_kv, L)``: row ``n_accepted[b]`` of each sequence."""
        R = s.shape[3]
        if self._lengths is None:
            row = torch.full_like(lengths, R - 1)
        else:  # new length = old length + pending token + accepted drafts
            row = (lengths - self._lengths - 1).clamp(0, R - 1)
        N, B, H, _, L = s.shape
        idx = row.view(1, B, 1, 1, 1).expand(N, B, H, 1, L)
        return s.gather(3, idx).squeeze(3)

    def score(self, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        if self._raw is not None:  # kept for the fused plan (TRITON_SELECT = "fused"): the same sums, made here
            raw = self._raw.float()
            return raw if self.config.per_kv_head else raw.sum(2, keepdim=True)
        if self._scores is None:  # no verification yet: recency
            return recency(cache, lengths)
        return self._scores

    def score_elements(self, lengths: torch.Tensor) -> int | None:
        """The emitted scores kept for the fused plan (layers x B x KV heads x L); with ``spread``, the spread scores
        it ranks instead (layers x B x 1 or KV heads x L); ``None`` without either."""
        if self._raw is not None:
            return self._raw.numel()
        return self._scores.numel() if self.config.spread and self._scores is not None else None

    def fused_scores(self, cache: KVCache, lengths: torch.Tensor) -> tuple[torch.Tensor, bool]:
        if self._raw is not None:
            return self._raw, not self.config.per_kv_head
        return self.score(cache, lengths), False


class Collect2Config(VerificationGuidedConfig):
    """:class:`VerificationGuidedConfig` with ``rows="collect2"``."""

    rows: RowMode = Field(default="collect2", description="verify rows whose scores are aggregated")


@SELECTORS.register("collect2", Collect2Config)
class Collect2Query(VerificationGuidedSelector):
    """Vegas' Collect-2-Query (the Vegas paper, §2B): scores of verify rows
    {0, γ} only — the two ends of the draft chain — at a constant cost of two rows."""

    Config = Collect2Config
