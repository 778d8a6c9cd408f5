"""Recording attention scores during a forward: the one mechanism behind every score consumer.

A :class:`~specdec.interfaces.ScoreRequest` asks a forward for per-KV-token scores; the attention
route (:mod:`specdec.models`) fills it layer by layer through the two functions here:

* ``source="attention"``: the scores of the attention the backend computes. :func:`layer_metadata`
  puts the request's rows, kind and heads into the :class:`~specdec.interfaces.AttentionMetadata`
  of the layer, so a backend fuses them into its kernel; :func:`record` stores what it returns.
* ``source="context"``: the dense softmax attention of chosen query heads over the whole cached
  context, whatever the plan (Dustin's SRH estimation while verifying sparsely, the SRH
  calibration's per-head recordings). :func:`record` computes it beside the backend with
  :func:`head_attention`.

Vegas' selection, Dustin's lookahead and history signals and the SRH calibration all read
``ScoreRequest.scores``; none of them wraps the backend.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from specdec.interfaces import AttentionMetadata, ScoreRequest


def head_attention(q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, heads, scale: float,
                   rows=None, full: bool = False) -> torch.Tensor:
    """Dense causal softmax attention of selected query heads over the whole cached context.

    Args:
        q: ``(B, H, T, D)`` queries of the new rows (row ``t`` sits at ``lengths[b] + t``).
        k_cache: ``(B, H_kv, L, D)`` one layer's keys (the new rows' keys already written).
        heads: query-head indices to score (a list, or an int64 tensor on ``q``'s device).
        rows: rows to keep (``None`` = all ``T``).
        full: attend over all ``L`` cache positions with the visibility mask instead of slicing to
            the used length: no host read of ``lengths`` (CUDA-graph capturable), same result.

    Returns:
        ``(B, len(heads), L)`` float32 attention weights summed over the rows; 0 where not visible.
    """
    B, H, T, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    if isinstance(heads, torch.Tensor):
        heads_t = heads.to(device=q.device, dtype=torch.long)
    else:
        heads_t = torch.as_tensor(list(heads), dtype=torch.long, device=q.device)
    if rows is None:
        rows_t = torch.arange(T, device=q.device)
    elif isinstance(rows, torch.Tensor):
        rows_t = rows.to(device=q.device, dtype=torch.long)
    else:
        rows_t = torch.as_tensor(list(rows), dtype=torch.long, device=q.device)
    used = L if full else min(L, int(lengths.max()) + T)
    qh = q.index_select(1, heads_t).index_select(2, rows_t).float()  # (B, h, R, D)
    kh = k_cache[:, :, :used].index_select(1, heads_t // G).float()  # (B, h, used, D)
    logits = torch.einsum("bhrd,bhld->bhrl", qh, kh) * scale
    pos = torch.arange(used, device=q.device)
    row_pos = lengths.view(B, 1) + rows_t.view(1, -1)  # (B, R)
    visible = pos.view(1, 1, used) <= row_pos.view(B, -1, 1)  # (B, R, used)
    logits = logits.masked_fill(~visible.unsqueeze(1), float("-inf"))
    if full:
        return torch.softmax(logits, dim=-1).sum(2)
    out = torch.zeros(B, len(heads_t), L, dtype=torch.float32, device=q.device)
    out[..., :used] = torch.softmax(logits, dim=-1).sum(2)
    return out


def group_attention(q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, heads: Sequence[int], scale: float,
                    rows: torch.Tensor | None = None, full: bool = False) -> torch.Tensor:
    """:func:`head_attention` summed over each KV group's selected query heads → ``(B, H_kv, L)`` float32.

    The same values as ``head_attention`` followed by a sum per group (``ScoreRequest.heads="group"``, Dustin's
    target history), without a copy of the keys per query head: each KV head's keys are read (and made float32)
    once for all the query heads of its group, whose weights are 0 where a head is not selected. At SmolLM2's
    geometry (9 query heads on 3 KV heads) that is a third of the key traffic of ``head_attention`` (B = 64 x 8k:
    ~1 GB instead of ~3.6 GB per verify). ``heads``: host list of query heads (a head listed twice counts twice).
    """
    B, H, T, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    groups = sorted({int(h) // G for h in heads})
    U = len(groups)
    weights = [[float(sum(int(h) == j * G + g for h in heads)) for g in range(G)] for j in groups]
    w = _values(tuple(x for row in weights for x in row), q.device, torch.float32).view(1, U, G, 1, 1)
    R = T if rows is None else rows.shape[0]
    used = L if full else min(L, int(lengths.max()) + T)
    k = k_cache[:, :, :used]
    qs = q if rows is None else q.index_select(2, rows)
    qs = qs.reshape(B, Hkv, G * R, D)
    if U < Hkv:
        gi = _index(groups, q.device)
        k, qs = k.index_select(1, gi), qs.index_select(1, gi)
    logits = torch.matmul(qs.float(), k.float().transpose(-1, -2)).view(B, U, G, R, used) * scale
    pos = torch.arange(used, device=q.device)
    rows_t = torch.arange(T, device=q.device) if rows is None else rows
    visible = pos.view(1, 1, used) <= (lengths.view(B, 1) + rows_t.view(1, -1)).view(B, -1, 1)  # (B, R, used)
    logits = logits.masked_fill(~visible.view(B, 1, 1, R, used), float("-inf"))
    a = (torch.softmax(logits, dim=-1) * w).sum((2, 3))  # (B, U, used)
    out = torch.zeros(B, Hkv, L, dtype=torch.float32, device=q.device)
    if U < Hkv:
        out[:, :, :used].index_copy_(1, _index(groups, q.device), a)  # (a view: written in place)
    else:
        out[:, :, :used] = a
    return out


#: How ``heads="group"`` context scores (Dustin's target history) are computed: ``"auto"`` the Triton kernels of
#: :mod:`specdec.cuda.triton_srh` on CUDA tensors and :func:`group_attention` (PyTorch) elsewhere; ``"torch"``
#: always :func:`group_attention`; ``"triton"`` always the kernels (on the CPU: ``TRITON_INTERPRET=1``, tests).
#: Both give the same values (``tests/test_dustin_graphs.py``); on an H200 at B = 64 x 8k the PyTorch path took
#: 1.01 ms per verify, the kernels read the keys twice (~0.1 ms of bytes).
GROUP_SCORES = "auto"


def _group_kernel(q: torch.Tensor) -> bool:
    if GROUP_SCORES not in ("auto", "torch", "triton"):
        raise ValueError(f"recording.GROUP_SCORES must be 'auto', 'torch' or 'triton', not {GROUP_SCORES!r}.")
    return GROUP_SCORES == "triton" or (GROUP_SCORES == "auto" and q.is_cuda)


_INDEX: dict[tuple, torch.Tensor] = {}


def _values(values: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A device tensor of ``values`` made once (as :func:`_index`)."""
    key = (values, str(device), dtype)
    t = _INDEX.get(key)
    if t is None:
        t = _INDEX[key] = torch.tensor(values, dtype=dtype, device=device)
    return t


def _index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """An int64 device tensor of ``values``, made once (a CUDA-graph warm-up fills this before a capture,
    which must not copy from pageable host memory)."""
    key = (tuple(int(v) for v in values), str(device))
    t = _INDEX.get(key)
    if t is None:
        t = _INDEX[key] = torch.tensor(key[0], dtype=torch.long, device=device)
    return t


def attention_request(requests: Sequence[ScoreRequest]) -> ScoreRequest | None:
    """The one ``source="attention"`` request of a forward (``None``: none); two are refused."""
    found = [r for r in requests if r.source == "attention"]
    if len(found) > 1:
        raise ValueError("a forward computes one set of attention scores: pass at most one source='attention' "
                         "ScoreRequest (context requests may be added).")
    return found[0] if found else None


def layer_metadata(layer: int, lengths: torch.Tensor, scale: float, plan_indices: torch.Tensor | None,
                   dense_from: torch.Tensor | None, req: ScoreRequest | None, static: bool) -> AttentionMetadata:
    """The :class:`AttentionMetadata` of one layer's call, with ``req``'s scores when it wants this layer."""
    if req is None or not req.wants(layer):
        return AttentionMetadata(lengths=lengths, scale=scale, plan_indices=plan_indices, dense_from=dense_from,
                                 layer=layer, static=static)
    return AttentionMetadata(lengths=lengths, scale=scale, plan_indices=plan_indices, dense_from=dense_from,
                             score_rows=req.rows, score_kind=req.kind, score_heads=req.heads_of(layer),
                             score_per_row=req.per_row, layer=layer, static=static)


def record(requests: Sequence[ScoreRequest], layer: int, q: torch.Tensor, k_cache: torch.Tensor,
           meta: AttentionMetadata, scores: torch.Tensor | None) -> None:
    """Store one layer's scores in every request that wants them.

    Args:
        q: ``(B, H, T, D)`` queries; ``k_cache``: ``(B, H_kv, L, D)`` the layer's keys.
        meta: the layer's call; ``scores``: what the backend returned for it.
    """
    for req in requests:
        if not req.wants(layer):
            continue
        if req.source == "attention":
            if scores is None:
                continue
            if req.heads == "all":
                scores = scores.sum(dim=1, keepdim=True).expand_as(scores).contiguous()
            req.scores[layer] = scores
            continue
        t0 = time.perf_counter()
        H, Hkv = q.shape[1], k_cache.shape[1]
        heads = req.heads_of(layer)
        heads = list(range(H)) if heads is None else [int(h) for h in heads]
        rows = None if list(req.rows) == list(range(q.shape[2])) else _index(req.rows, q.device)
        # capture and GPUs: attend over the whole capacity (no host read of the lengths; same values)
        if req.heads == "group":  # summed per KV group: each group's keys read once, not once per query head
            if _group_kernel(q):  # two Triton launches at the keys' bytes (specdec.cuda.triton_srh)
                from specdec.cuda.triton_srh import group_scores

                req.scores[layer] = group_scores(q, k_cache, meta.lengths, heads, meta.scale,
                                                 rows=None if rows is None else req.rows)
            else:
                req.scores[layer] = group_attention(q, k_cache, meta.lengths, heads, meta.scale, rows=rows,
                                                    full=meta.static or q.is_cuda)
            if not meta.static:
                req.seconds += time.perf_counter() - t0
            continue
        a = head_attention(q, k_cache, meta.lengths, _index(heads, q.device), meta.scale, rows=rows,
                           full=meta.static or q.is_cuda)  # (B, h, L)
        if req.heads == "group":
            g = torch.zeros(a.shape[0], Hkv, a.shape[2], dtype=a.dtype, device=a.device)
            a = g.index_add_(1, _index([h // (H // Hkv) for h in heads], q.device), a)
        elif req.heads == "all":
            a = a.sum(dim=1, keepdim=True).expand(a.shape[0], Hkv, a.shape[2]).contiguous()
        req.scores[layer] = a
        if not meta.static:
            req.seconds += time.perf_counter() - t0


def stack_layers(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``, as a view without a copy when they already are consecutive slices of one
    buffer (scores copied out of a replayed CUDA graph come that way)."""
    t0 = tensors[0]
    n = len(tensors)
    if n > 1 and t0.is_contiguous() and all(t.shape == t0.shape and t.dtype == t0.dtype for t in tensors):
        base = t0.untyped_storage().data_ptr()
        step = t0.numel()
        if all(t.is_contiguous() and t.untyped_storage().data_ptr() == base
               and t.storage_offset() == t0.storage_offset() + i * step for i, t in enumerate(tensors)):
            return t0.as_strided((n, *t0.shape), (step, *t0.stride()), t0.storage_offset())
    return torch.stack(list(tensors))
