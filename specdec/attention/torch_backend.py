"""A fast pure-PyTorch backend: SDPA for dense rows, gather-then-attend for sparse plans.

The reference backend masks the whole cache even for a sparse plan, so a sparse step costs as
much as a dense one. Here a sparse step gathers only the plan's ``K`` entries plus the dense tail
(positions ``>= dense_from``) per (sequence, KV head) and attends over those: its cost scales with
the budget, not the context. Scores, when requested, are computed exactly as the reference does.
Checked against :class:`~specdec.attention.reference.ReferenceBackend` in ``tests/test_torch_backend.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.attention.reference import ReferenceBackend, visibility_mask, window_mask
from specdec.interfaces import AttentionBackend, AttentionMetadata, per_forward
from pydantic import Field

from specdec.registry import BACKENDS, ComponentConfig


class TorchConfig(ComponentConfig):
    """Options of the torch backend.

    Attributes:
        static: CUDA-graph mode — no host synchronisation: dense rows attend over the whole cache
            capacity (masked) and a sparse step gathers a fixed tail of ``T + max_draft`` positions.
        max_draft: bound on tokens drafted since the plan was built (γ ≤ 64 is enforced upstream).
    """

    static: bool = False
    max_draft: int = Field(default=64, ge=1)


@BACKENDS.register("torch", TorchConfig)
class TorchBackend(AttentionBackend):
    """Dense: ``scaled_dot_product_attention`` with a ragged causal mask. Sparse: gather + attend."""

    name = "torch"
    Config = TorchConfig
    #: sliding-window rings: SDPA over the ring's ``C`` slots with a window mask (no host sync);
    #: a soft-capped call goes to the reference backend (SDPA has no soft-capping)
    supports_window = True
    supports_softcap = True
    #: draft trees (``meta.tree``): dense rows through SDPA with the tree mask, sparse ones through the reference
    supports_tree = True

    def __init__(self, config: TorchConfig | None = None) -> None:
        self.config = config or TorchConfig()
        self._ref = ReferenceBackend()
        #: only in static mode (no host synchronisation) can a forward be captured as a CUDA graph
        self.capture_safe = self.config.static

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        if meta.wants_scores or meta.softcap is not None or (meta.tree is not None and meta.sparse):
            # the oracle computes these
            return self._ref.attend(q, k_cache, v_cache, meta)
        if meta.window is not None:
            if meta.sparse:
                raise ValueError("a sliding-window layer takes no sparse plan.")
            return self._window(q, k_cache, v_cache, meta.lengths, meta.scale, meta.window), None
        if meta.plan_indices is None:
            return self._dense(q, k_cache, v_cache, meta.lengths, meta.scale, meta.tree), None
        return self._sparse(q, k_cache, v_cache, meta.lengths, meta.scale, meta.plan_indices, meta.dense_from), None

    def _dense(self, q, k_cache, v_cache, lengths, scale, tree=None) -> torch.Tensor:
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        used = L if self.config.static else min(L, int(lengths.max()) + T)
        mask = visibility_mask(lengths, T, used, tree=tree)  # (B, 1, T, used)
        k = k_cache[:, :, :used].to(q.dtype)
        v = v_cache[:, :, :used].to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=H != Hkv)

    def _window(self, q, k_cache, v_cache, lengths, scale, window) -> torch.Tensor:
        """Dense attention over a sliding-window ring ``(B, H_kv, C, D)`` (every slot, masked: no host sync)."""
        H, Hkv = q.shape[1], k_cache.shape[1]
        T, C = q.shape[2], k_cache.shape[2]

        def bias() -> torch.Tensor:  # (B, 1, T, C): 0 where seen, -inf elsewhere, as SDPA turns a boolean mask
            seen = window_mask(lengths, T, C, window)
            return torch.zeros(seen.shape, dtype=q.dtype, device=q.device).masked_fill_(~seen, float("-inf"))

        # built once per step and shared by every local layer (SDPA would convert a boolean mask per call)
        mask = per_forward(lengths, ("window_bias", T, C, window, q.dtype), bias)
        return F.scaled_dot_product_attention(q, k_cache.to(q.dtype), v_cache.to(q.dtype), attn_mask=mask,
                                              scale=scale, enable_gqa=H != Hkv)

    def _sparse(self, q, k_cache, v_cache, lengths, scale, plan_indices, dense_from) -> torch.Tensor:
        """``plan_indices`` ``(B, H_kv, K)`` + tail ``dense_from[b] .. lengths[b] + T - 1``."""
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        G = H // Hkv
        dev = q.device
        if dense_from is None:  # plan entries only (as in the reference)
            dense_from = lengths + T
        if self.config.static:
            tail_len = T + self.config.max_draft  # fixed shape; positions past a row are masked
        else:
            tail_len = int((lengths + T - dense_from).max())
        tail = dense_from.view(B, 1, 1) + torch.arange(tail_len, device=dev).view(1, 1, tail_len)
        tail = tail.expand(B, Hkv, tail_len)
        plan = plan_indices.long().expand(B, Hkv, -1)  # a plan may share one list across KV heads
        # entries at or past dense_from are already in the tail: drop them so nothing counts twice
        plan = torch.where(plan >= dense_from.view(B, 1, 1), torch.full_like(plan, -1), plan)
        idx = torch.cat([plan, tail], dim=-1)  # (B, Hkv, K')
        row_pos = lengths.view(B, 1, 1, 1) + torch.arange(T, device=dev).view(1, 1, T, 1)  # (B,1,T,1)
        valid = (idx >= 0) & (idx < L)
        safe = torch.where(valid, idx, torch.zeros_like(idx))
        k = k_cache.gather(2, safe.unsqueeze(-1).expand(-1, -1, -1, D))  # (B, Hkv, K', D)
        v = v_cache.gather(2, safe.unsqueeze(-1).expand(-1, -1, -1, D))
        mask = valid.unsqueeze(2) & (idx.unsqueeze(2) <= row_pos)  # (B, Hkv, T, K')
        qg = q.reshape(B, Hkv, G * T, D)  # q of Gemma 3 (normed after the transpose) is not contiguous
        mask = mask.unsqueeze(2).expand(B, Hkv, G, T, -1).reshape(B, Hkv, G * T, -1)
        out = F.scaled_dot_product_attention(qg, k.to(q.dtype), v.to(q.dtype), attn_mask=mask, scale=scale)
        return out.reshape(B, H, T, D)
