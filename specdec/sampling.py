"""Token choice and the speculative acceptance rule (greedy match and lossless rejection sampling).

Rejection sampling (Leviathan et al., 2023; Chen et al., 2023): for draft token ``x_i ~ q_i``,
accept with probability ``min(1, p_i(x_i) / q_i(x_i))``; at the first rejection sample the
correction from ``norm(max(0, p_i - q_i))``; if all γ are accepted sample a bonus from ``p_γ``.
The output then follows ``p`` exactly. ``p`` and ``q`` are the *warped* distributions
(temperature, top-k, top-p), so the generated text follows the warped target — the same
distribution plain sampling with those settings gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pydantic import Field

from specdec.registry import ComponentConfig


class SamplingConfig(ComponentConfig):
    """``temperature == 0`` means greedy decoding."""

    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 = off")
    seed: int | None = Field(default=None, ge=0, le=2**64 - 1, description="seed of the sampling generator (0 to 2**64 - 1)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def check_finite(logits: torch.Tensor, where: str) -> None:
    """Refuse logits no token can be chosen from, instead of emitting a silent wrong token.

    ``-inf`` entries are legitimate (a token masked out), but NaN, ``+inf`` or a row that is
    ``-inf`` everywhere have no meaningful argmax or softmax.
    """
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise FloatingPointError(
            f"{where} produced NaN or +inf logits: the model's weights or activations are not finite "
            "(a corrupt checkpoint, or an overflow in float16 — then run in float32 or bfloat16)."
        )
    if bool((logits.amax(dim=-1) == float("-inf")).any()):
        raise FloatingPointError(f"{where} produced a row of logits that is -inf everywhere; no token can be chosen.")


def nonfinite_flags(logits: torch.Tensor) -> torch.Tensor:
    """``(2,)`` bool on the device: (NaN or +inf somewhere, a row -inf everywhere). OR them over several
    steps and check once with :func:`raise_nonfinite` instead of a host read per step.

    One pass over the logits: a row's max is NaN where the row holds a NaN (max propagates it), +inf where it holds
    +inf and no NaN, -inf where every entry is -inf (``isnan``/``isposinf`` over the whole tensor were two more)."""
    m = logits.amax(dim=-1)
    return torch.stack([(torch.isnan(m) | torch.isposinf(m)).any(), (m == float("-inf")).any()])


def raise_nonfinite(flags, where: str) -> None:
    """:func:`check_finite`'s errors for flags from :func:`nonfinite_flags` (one host read), or for
    the same two flags already read to the host (a sequence)."""
    nan, dead = flags.tolist() if isinstance(flags, torch.Tensor) else flags
    if nan:
        raise FloatingPointError(
            f"{where} produced NaN or +inf logits: the model's weights or activations are not finite "
            "(a corrupt checkpoint, or an overflow in float16 — then run in float32 or bfloat16)."
        )
    if dead:
        raise FloatingPointError(f"{where} produced a row of logits that is -inf everywhere; no token can be chosen.")


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p: ``(..., V)`` float32 → ``(..., V)``."""
    x = logits.float() / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if cfg.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass strictly above each token
        drop_sorted = before >= cfg.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def choose(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Pick one token per row: ``(B, V)`` logits → ``(B,)`` tokens and ``(B, V)`` probs (None if greedy)."""
    if cfg.greedy:
        return logits.argmax(dim=-1), None
    probs = warp(logits, cfg)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1), probs


@dataclass
class Acceptance:
    """Result of verifying γ drafts for ``B`` sequences.

    Attributes:
        n_accepted: ``(B,)`` draft tokens accepted (0..γ).
        next_token: ``(B,)`` the correction (first rejection) or bonus token.
    """

    n_accepted: torch.Tensor
    next_token: torch.Tensor


def accept(
    drafts: torch.Tensor,
    target_logits: torch.Tensor,
    cfg: SamplingConfig,
    draft_probs: torch.Tensor | None = None,
    gen: torch.Generator | None = None,
) -> Acceptance:
    """Verify drafts against the target.

    Args:
        drafts: ``(B, γ)`` proposed tokens.
        target_logits: ``(B, γ + 1, V)``; row ``i`` is the target's distribution for draft ``i``
            (row γ gives the bonus token).
        draft_probs: ``(B, γ, V)`` warped draft distributions ``q_i`` (sampling only).
    """
    B, gamma = drafts.shape
    dev = drafts.device
    if cfg.greedy:
        target = target_logits.argmax(dim=-1)  # (B, γ+1)
        ok = drafts == target[:, :gamma]
        n = torch.cumprod(ok.long(), dim=1).sum(dim=1)
        return Acceptance(n, target.gather(1, n.view(B, 1)).squeeze(1))
    if draft_probs is None:
        raise ValueError("rejection sampling needs the draft probabilities q (draft_probs)")
    p = warp(target_logits, cfg)  # (B, γ+1, V)
    p_x = p[:, :gamma].gather(2, drafts.unsqueeze(-1)).squeeze(-1)  # (B, γ)
    q_x = draft_probs.gather(2, drafts.unsqueeze(-1)).squeeze(-1)
    u = torch.rand(B, gamma, generator=gen, device=dev)
    ok = u * q_x < p_x  # u < p/q without dividing by a zero q
    n = torch.cumprod(ok.long(), dim=1).sum(dim=1)
    rows = torch.arange(B, device=dev)
    p_n = p[rows, n]  # (B, V): target row at the first rejection (or bonus row)
    q_n = torch.zeros_like(p_n)
    rej = n < gamma
    q_n[rej] = draft_probs[rows[rej], n[rej]]
    residual = (p_n - q_n).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    # p == q exactly leaves no residual mass; any token of p is then a correct draw
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    nxt = torch.multinomial(residual, 1, generator=gen).squeeze(-1)
    return Acceptance(n, nxt)
