"""Pure-PyTorch attention over the KV cache: the correctness oracle every kernel is checked against."""

from __future__ import annotations

import torch

from specdec.interfaces import AttentionBackend, AttentionMetadata, per_forward
from specdec.registry import BACKENDS, ComponentConfig

#: ``sink_softmax`` scores: ``exp(min(logit - ref, SINK_CLAMP))`` (no overflow in float32 even summed
#: over many rows and heads; the Triton kernel applies the same bound to its per-row factor)
SINK_CLAMP = 60.0
#: ``sink_softmax``: its per-row normaliser is the log-sum-exp over the first and the last
#: ``SINK_ANCHORS`` positions of the sequence that the row sees (attention sinks and recent tokens)
SINK_ANCHORS = 16


def visibility_mask(
    lengths: torch.Tensor,
    T: int,
    L: int,
    plan_indices: torch.Tensor | None = None,
    dense_from: torch.Tensor | None = None,
    tree: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask of the cache positions each new row may see.

    Returns:
        ``(B, H_kv or 1, T, L)``: causal (``pos <= lengths[b] + t``) and, with a plan, restricted
        to ``plan_indices`` plus positions ``>= dense_from[b]``. With ``tree`` ``(T, T)`` (a draft tree,
        :class:`~specdec.interfaces.AttentionMetadata`), new row ``j`` is seen by row ``t`` only where
        ``tree[t, j]``.
    """
    device = lengths.device
    B = lengths.shape[0]
    pos = torch.arange(L, device=device)
    if tree is None:
        row_pos = lengths.view(B, 1) + torch.arange(T, device=device)  # (B, T)
        mask = (pos.view(1, 1, L) <= row_pos.view(B, T, 1)).unsqueeze(1)  # (B, 1, T, L)
    else:
        rel = pos.view(1, L) - lengths.view(B, 1)  # (B, L): new row j sits at rel == j
        new = (rel >= 0) & (rel < T)
        seen = tree.to(device)[:, rel.clamp(0, T - 1)].permute(1, 0, 2)  # (B, T, L)
        mask = ((rel < 0).unsqueeze(1) | (new.unsqueeze(1) & seen)).unsqueeze(1)
    if plan_indices is None:
        return mask
    Hkv = plan_indices.shape[1]
    sel = torch.zeros(B, Hkv, L + 1, dtype=torch.bool, device=device)
    idx = plan_indices.clamp(min=-1).long()
    idx = torch.where((idx < 0) | (idx >= L), torch.full_like(idx, L), idx)  # padding → dump slot
    sel.scatter_(2, idx, True)
    sel = sel[..., :L]
    if dense_from is not None:
        sel = sel | (pos.view(1, 1, L) >= dense_from.view(B, 1, 1))
    return mask & sel.unsqueeze(2)


def ring_positions(lengths: torch.Tensor, T: int, C: int) -> torch.Tensor:
    """Position held by each slot of a sliding-window ring of ``C`` slots after writing ``T`` rows.

    Returns:
        ``(B, C)`` int64: slot ``s`` of sequence ``b`` holds the newest position ``p <= lengths[b] + T - 1``
        with ``p % C == s`` (negative: never written). Without wrap-around (``C`` larger than every
        position) this is ``s`` itself, so a ring that never wraps reads like a linear cache.
    """
    B = lengths.shape[0]
    s = torch.arange(C, device=lengths.device).view(1, C)
    newest = (lengths + T - 1).view(B, 1)
    return s + C * torch.div(newest - s, C, rounding_mode="floor")


def window_mask(lengths: torch.Tensor, T: int, C: int, window: int) -> torch.Tensor:
    """``(B, 1, T, C)`` boolean: ring slots row ``t`` sees (``row - window < position <= row``, Hugging
    Face's ``kv_idx > q_idx - sliding_window``)."""
    def build() -> torch.Tensor:
        B = lengths.shape[0]
        pos = ring_positions(lengths, T, C).view(B, 1, 1, C)
        row = (lengths.view(B, 1) + torch.arange(T, device=lengths.device)).view(B, 1, T, 1)
        return (pos <= row) & (pos > row - window) & (pos >= 0)

    return per_forward(lengths, ("window_mask", T, C, window), build)  # one per step, not one per local layer


class ReferenceConfig(ComponentConfig):
    """The reference backend takes no options."""


@BACKENDS.register("reference", ReferenceConfig)
class ReferenceBackend(AttentionBackend):
    """Dense, sparse and score-emitting attention written as plain einsums in float32.

    Slow and memory-hungry on purpose: it is the definition, not the implementation.
    """

    name = "reference"
    Config = ReferenceConfig
    #: a sliding-window layer's ring (``meta.window``, see :func:`window_mask`) and soft-capping
    supports_window = True
    supports_softcap = True
    #: draft trees (``meta.tree``)
    supports_tree = True

    def __init__(self, config: ReferenceConfig | None = None) -> None:
        self.config = config or ReferenceConfig()

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        lengths, scale = meta.lengths, meta.scale
        plan_indices, dense_from = meta.plan_indices, meta.dense_from
        score_rows, score_kind, score_heads = meta.score_rows, meta.score_kind, meta.score_heads
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        G = H // Hkv
        window = meta.window
        if window is not None:
            if plan_indices is not None or score_rows is not None:
                raise ValueError("a sliding-window layer takes no sparse plan and emits no scores.")
            used = L  # a ring: every slot may hold a visible position
        else:
            used = min(L, int(lengths.max()) + T)  # positions anyone can see
        k = k_cache[:, :, :used].float()
        v = v_cache[:, :, :used].float()
        qg = q.float().view(B, Hkv, G, T, D)
        logits = torch.einsum("bhgtd,bhld->bhgtl", qg, k) * scale  # (B, Hkv, G, T, used)
        if meta.softcap is not None:
            logits = torch.tanh(logits / meta.softcap) * meta.softcap
        if window is not None:
            mask = window_mask(lengths, T, L, window).unsqueeze(2)  # (B, 1, 1, T, L)
        else:
            mask = visibility_mask(lengths, T, used, plan_indices, dense_from, meta.tree).unsqueeze(2)  # (B,*,1,T,used)
        raw = logits
        logits = logits.masked_fill(~mask, float("-inf"))
        # a row that sees no position (fully masked) attends to nothing: output 0, not NaN
        probs = torch.softmax(logits, dim=-1).masked_fill(~mask, 0.0)
        out = torch.einsum("bhgtl,bhld->bhgtd", probs, v).reshape(B, H, T, D).to(q.dtype)

        scores = None
        if score_rows is not None:
            if score_kind == "sink_softmax":  # exp(logit - log-sum-exp over the row's anchor positions)
                pos = torch.arange(used, device=q.device).view(1, 1, used)
                row_end = (lengths.view(B, 1, 1) + torch.arange(T, device=q.device).view(1, T, 1))  # last seen
                n_ctx = lengths.view(B, 1, 1) + T
                anchor = ((pos < SINK_ANCHORS) | (pos >= n_ctx - SINK_ANCHORS)) & (pos <= row_end)  # (B, T, used)
                ref = raw.masked_fill(~anchor.view(B, 1, 1, T, used), float("-inf")).logsumexp(-1, keepdim=True)
                src = torch.exp((logits - ref).clamp(max=SINK_CLAMP))
            else:
                src = logits if score_kind == "logits" else probs
            rows = torch.as_tensor(list(score_rows), device=q.device, dtype=torch.long)
            s = src.index_select(3, rows)  # (B, Hkv, G, R, used)
            s = s.masked_fill(~mask.expand_as(logits).index_select(3, rows), 0.0)
            if score_heads is not None:
                keep = torch.zeros(H, dtype=torch.bool, device=q.device)
                keep[torch.as_tensor(list(score_heads), device=q.device, dtype=torch.long)] = True
                s = s * keep.view(1, Hkv, G, 1, 1)
            if meta.score_per_row:  # (B, Hkv, R, L): one slice per requested row
                scores = torch.zeros(B, Hkv, len(rows), L, dtype=torch.float32, device=q.device)
                scores[..., :used] = s.sum(dim=2)
            else:
                scores = torch.zeros(B, Hkv, L, dtype=torch.float32, device=q.device)
                scores[..., :used] = s.sum(dim=(2, 3))
        return out, scores
