"""Triton kernels of the Quest selector: page scoring and the incremental page min/max update.

* :func:`quest_page_scores` -- for each (sequence, KV head, page) the Quest upper bound
  ``sum_rows sum_d max(q_d kmax_d, q_d kmin_d)`` over the ``G * T`` query rows of the KV group
  (the ``G`` heads times the ``T`` rows), i.e. ``(sum_rows q+) . kmax + (sum_rows q-) . kmin``:
  one read of the page bounds, one launch (the torch path: two batched matmuls, clamps, an add).
* :func:`quest_token_scores` -- the same bounds expanded to the tokens of each page, with the
  positions the query-aware part may not pick (uncached, sinks, recent window) set to ``-inf``:
  the input of ``torch.topk`` in one launch (the torch path: page scores, ``repeat_interleave``,
  slice, a blocked mask, ``masked_fill``).
* :func:`quest_update_minmax` -- after the verified lengths move from ``valid`` to ``lengths``,
  recompute the pages from ``min(valid, lengths) // page_size`` up to the last page holding a
  position ``< lengths`` from the cache, and zero the pages past a rollback that no longer hold
  a valid position. One program per (layer, sequence, KV head); no host synchronisation (the torch
  path loops over the sequences on the host).

This module imports nothing from specdec (the GPU benchmarks import it alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _page_bounds(Q, Kmin, Kmax, b, h, offs_p, stride_qb, stride_qh, stride_qt, stride_mb, stride_mh, stride_mp, P,
                 G: tl.constexpr, T: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Quest bound of pages ``offs_p`` of (sequence ``b``, KV head ``h``): ``(Σ q⁺)·kmax + (Σ q⁻)·kmin``
    over the group's query heads and rows; 0 for pages ``>= P``."""
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    g = offs_r // T
    t = offs_r % T
    rmask = offs_r < G * T
    q = tl.load(Q + b * stride_qb + (h * G + g)[:, None] * stride_qh + t[:, None] * stride_qt + offs_d[None, :],
                mask=rmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
    qp = tl.sum(tl.maximum(q, 0.0), axis=0)  # (BLOCK_D,)
    qn = tl.sum(tl.minimum(q, 0.0), axis=0)
    pmask = offs_p < P
    base = b * stride_mb + h * stride_mh + offs_p[:, None].to(tl.int64) * stride_mp + offs_d[None, :]
    m = pmask[:, None] & dmask[None, :]
    kmax = tl.load(Kmax + base, mask=m, other=0.0).to(tl.float32)  # bounds in the keys' dtype (exact), fp32 math
    kmin = tl.load(Kmin + base, mask=m, other=0.0).to(tl.float32)
    return tl.sum(kmax * qp[None, :] + kmin * qn[None, :], axis=1)


@triton.jit
def _quest_page_scores_kernel(
    Q, Kmin, Kmax, Out,
    stride_qb, stride_qh, stride_qt,
    stride_mb, stride_mh, stride_mp,
    P,
    HKV: tl.constexpr, G: tl.constexpr, T: tl.constexpr, D: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)
    h = pid_bh % HKV
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    score = _page_bounds(Q, Kmin, Kmax, b, h, offs_p, stride_qb, stride_qh, stride_qt, stride_mb, stride_mh, stride_mp,
                         P, G, T, D, BLOCK_R, BLOCK_D)
    tl.store(Out + pid_bh.to(tl.int64) * P + offs_p, score, mask=offs_p < P)


def quest_page_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Quest page bounds summed over the query rows of each KV group.

    Args:
        q: ``(B, H, T, D)`` queries (any float dtype, last dim contiguous or not).
        kmin: ``(B, H_kv, P, D)`` per-page minimum of the keys (float32 or the keys' dtype; last dim contiguous).
        kmax: ``(B, H_kv, P, D)`` per-page maximum, same layout and dtype.

    Returns:
        ``(B, H_kv, P)`` float32: ``sum_{g, t} sum_d max(q_d kmax_d, q_d kmin_d)``.
    """
    B, H, T, D = q.shape
    Hkv, P = kmin.shape[1], kmin.shape[2]
    if kmin.stride() != kmax.stride() or kmin.stride(-1) != 1:
        kmin, kmax = kmin.contiguous(), kmax.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    G = H // Hkv
    out = torch.empty((B, Hkv, P), dtype=torch.float32, device=q.device)
    if P == 0 or B == 0:
        return out
    block_d = triton.next_power_of_2(D)
    block_p = max(1, min(triton.next_power_of_2(P), max(16, 8192 // block_d)))
    _quest_page_scores_kernel[(B * Hkv, triton.cdiv(P, block_p))](
        q, kmin, kmax, out,
        q.stride(0), q.stride(1), q.stride(2),
        kmin.stride(0), kmin.stride(1), kmin.stride(2),
        P,
        HKV=Hkv, G=G, T=T, D=D,
        BLOCK_R=max(2, triton.next_power_of_2(G * T)), BLOCK_D=block_d, BLOCK_P=block_p,
        num_warps=4,
    )
    return out


@triton.jit
def _quest_token_scores_kernel(
    Q, Kmin, Kmax, Lens, Out,
    stride_qb, stride_qh, stride_qt,
    stride_mb, stride_mh, stride_mp,
    P, L, SINKS, RECENT,
    HKV: tl.constexpr, G: tl.constexpr, T: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_PS: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_p = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)
    h = pid_bh % HKV
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    score = _page_bounds(Q, Kmin, Kmax, b, h, offs_p, stride_qb, stride_qh, stride_qt, stride_mb, stride_mh, stride_mp,
                         P, G, T, D, BLOCK_R, BLOCK_D)  # (BLOCK_P,), 0 past the last page
    # every token of a page gets the page's score; blocked tokens (uncached, sinks, recent) -inf
    offs_i = tl.arange(0, BLOCK_PS)
    pos = offs_p[:, None] * PS + offs_i[None, :]  # (BLOCK_P, BLOCK_PS)
    length = tl.load(Lens + b)
    blocked = (pos >= length) | (pos < SINKS) | (pos >= length - RECENT)
    tok = tl.where(blocked, float("-inf"), tl.broadcast_to(score[:, None], (BLOCK_P, BLOCK_PS)))
    tl.store(Out + pid_bh.to(tl.int64) * L + pos, tok, mask=(offs_i[None, :] < PS) & (pos < L))


def quest_token_scores(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, lengths: torch.Tensor, L: int,
                       page_size: int, sinks: int, recent: int) -> torch.Tensor:
    """Per-token Quest scores ready for ``torch.topk``, in one launch.

    Token ``l`` gets the bound of its page ``l // page_size`` (as :func:`quest_page_scores`), or
    ``-inf`` where the query-aware part may not pick it (``l >= lengths[b]``, ``l < sinks``,
    ``l >= lengths[b] - recent``); tokens of pages past ``P`` get 0 (as zero padding).

    Returns:
        ``(B, H_kv, L)`` float32.
    """
    B, H, T, D = q.shape
    Hkv, P = kmin.shape[1], kmin.shape[2]
    if kmin.stride() != kmax.stride() or kmin.stride(-1) != 1:
        kmin, kmax = kmin.contiguous(), kmax.contiguous()
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((B, Hkv, L), dtype=torch.float32, device=q.device)
    if L == 0 or B == 0:
        return out
    block_d = triton.next_power_of_2(D)
    block_ps = triton.next_power_of_2(page_size)
    n_pages = -(-L // page_size)  # pages holding a token < L
    block_p = max(1, min(triton.next_power_of_2(n_pages), max(16, 8192 // block_d)))
    _quest_token_scores_kernel[(B * Hkv, triton.cdiv(n_pages, block_p))](
        q, kmin, kmax, lengths, out,
        q.stride(0), q.stride(1), q.stride(2),
        kmin.stride(0), kmin.stride(1), kmin.stride(2),
        P, L, sinks, recent,
        HKV=Hkv, G=H // Hkv, T=T, D=D, PS=page_size,
        BLOCK_R=max(2, triton.next_power_of_2((H // Hkv) * T)), BLOCK_D=block_d,
        BLOCK_P=block_p, BLOCK_PS=block_ps,
        num_warps=4,
    )
    return out


@triton.jit
def _quest_update_kernel(
    K, Kmin, Kmax, Valid, Lens,
    stride_kn, stride_kb, stride_kh, stride_kl,
    stride_mn, stride_mb, stride_mh, stride_mp,
    L,
    B: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    BLOCK_PS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_PG: tl.constexpr,
):
    pid = tl.program_id(0)  # (layer, sequence, KV head)
    n = (pid // (B * HKV)).to(tl.int64)
    b = ((pid // HKV) % B).to(tl.int64)
    h = pid % HKV
    old = tl.load(Valid + b)
    new = tl.load(Lens + b)
    changed = old != new
    first = tl.minimum(old, new) // PS
    end_new = tl.where(changed, tl.cdiv(new, PS), first)  # unchanged: empty loops
    end_old = tl.where(changed, tl.cdiv(old, PS), first)

    offs_g = tl.arange(0, BLOCK_PG)
    offs_i = tl.arange(0, BLOCK_PS)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    k_base = K + n * stride_kn + b * stride_kb + h * stride_kh
    m_base = n * stride_mn + b * stride_mb + h * stride_mh
    for p0 in range(first, end_new, BLOCK_PG):
        pg = p0 + offs_g  # (BLOCK_PG,) pages
        pos = pg[:, None] * PS + offs_i[None, :]  # (BLOCK_PG, BLOCK_PS)
        ok = (pg[:, None] < end_new) & (offs_i[None, :] < PS) & (pos < new) & (pos < L)
        x = tl.load(k_base + pos.to(tl.int64)[:, :, None] * stride_kl + offs_d[None, None, :],
                    mask=ok[:, :, None] & dmask[None, None, :], other=0.0).to(tl.float32)
        kmin = tl.min(tl.where(ok[:, :, None], x, float("inf")), axis=1)  # (BLOCK_PG, BLOCK_D)
        kmax = tl.max(tl.where(ok[:, :, None], x, float("-inf")), axis=1)
        m_ptrs = m_base + pg.to(tl.int64)[:, None] * stride_mp + offs_d[None, :]
        sm = (pg < end_new)[:, None] & dmask[None, :]
        tl.store(Kmin + m_ptrs, kmin, mask=sm)
        tl.store(Kmax + m_ptrs, kmax, mask=sm)
    zero = tl.zeros([BLOCK_PG, BLOCK_D], tl.float32)
    for p0 in range(end_new, end_old, BLOCK_PG):  # pages past a rollback hold no valid position
        pg = p0 + offs_g
        m_ptrs = m_base + pg.to(tl.int64)[:, None] * stride_mp + offs_d[None, :]
        sm = (pg < end_old)[:, None] & dmask[None, :]
        tl.store(Kmin + m_ptrs, zero, mask=sm)
        tl.store(Kmax + m_ptrs, zero, mask=sm)


def quest_update_minmax(k: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, valid: torch.Tensor,
                        lengths: torch.Tensor, page_size: int) -> None:
    """Bring ``kmin``/``kmax`` from the cache state ``valid`` to ``lengths``, in place.

    Args:
        k: ``(N, B, H_kv, L, D)`` keys (last dim contiguous).
        kmin: ``(N, B, H_kv, P, D)`` per-page key minimum (float32 or ``k``'s dtype: a min or max of keys is
            exact in it), ``P * page_size >= L``.
        kmax: the per-page maximum, same shape and strides as ``kmin``.
        valid: ``(B,)`` integer lengths the bounds currently describe.
        lengths: ``(B,)`` integer new lengths.
        page_size: tokens per page.
    """
    N, B, Hkv, L, D = k.shape
    if k.stride(-1) != 1:
        raise ValueError("k needs a contiguous last dimension")
    if kmin.stride() != kmax.stride() or kmin.stride(-1) != 1:
        raise ValueError("kmin/kmax need equal strides and a contiguous last dimension")
    if N * B * Hkv == 0:
        return
    block_d = triton.next_power_of_2(D)
    block_ps = triton.next_power_of_2(page_size)
    block_pg = max(1, min(16, 4096 // (block_ps * block_d)))  # pages per iteration (~4k elements)
    _quest_update_kernel[(N * B * Hkv,)](
        k, kmin, kmax, valid, lengths,
        k.stride(0), k.stride(1), k.stride(2), k.stride(3),
        kmin.stride(0), kmin.stride(1), kmin.stride(2), kmin.stride(3),
        L,
        B=B, HKV=Hkv, D=D, PS=page_size, BLOCK_PS=block_ps, BLOCK_D=block_d, BLOCK_PG=block_pg,
        num_warps=4,
    )
