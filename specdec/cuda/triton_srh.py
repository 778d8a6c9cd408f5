"""Triton kernels: Dustin's target-history scores (the SRH "context" request) at the cost of their key bytes.

``group_scores`` computes what :func:`specdec.attention.recording.group_attention` computes -- the dense causal
softmax weights of some query heads' rows over the whole cached context, summed per KV group, ``(B, H_kv, L)``
float32 -- without a float32 copy of the keys and without the ``(B, H_kv, G·T, L)`` logit tensor: two passes over
each KV head's keys (bf16, read twice), no value reads, one ``(B, H_kv, L)`` store.

* ``_srh_lse_kernel``: per (sequence, KV head, chunk) the running max and sum of ``exp`` of each packed row
  (``m = g·T + t``: the ``T`` rows of the group's ``G`` query heads, as in ``triton_attention``): partials
  ``(B·H_kv·S, BLOCK_M)``.
* ``_srh_scores_kernel``: each program merges the ``S`` partials of its rows into their log-sum-exp (a few
  loads), re-reads its chunk of keys and stores ``sum_m w_m · exp(s_mp − lse_m)`` for every position of its
  chunk of the capacity (0 where no row sees the position: the buffer needs no fill).

Row ``t`` of a sequence of length ``lengths[b]`` sees positions ``<= lengths[b] + t``. ``w_m`` is the number of
times query head ``g`` of the group is requested times the number of times row ``t`` is (0: not requested), so a
head or row listed twice counts twice, as in ``group_attention``. Launch sizes depend on shapes only: capturable
in a CUDA graph, no host read of ``lengths``.

At SmolLM2's geometry, B = 64 x 8k (3 KV heads, 64-dim bf16 keys): 2 x 201 MB of keys, ~0.1 ms at 4 TB/s, where
``group_attention``'s float32 matmul + mask + softmax measured 1.01 ms on an H200 (2026-12-01).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specdec.cuda.triton_attention import _packed_rows_q

LOG2E = 1.4426950408889634


@triton.jit
def _srh_lse_kernel(
    Q, K, Lens, PartM, PartL,
    sm_scale,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_kl,
    L, NUM_SPLITS,
    HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    _, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q = _packed_rows_q(
        Q, Lens, pid_bh, stride_qb, stride_qh, stride_qt, HKV, T, G, D, BLOCK_M, UPCAST)
    per_split = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * per_split
    end = tl.minimum(tl.minimum(start + per_split, L), n_ctx)
    k_base = K + b64 * stride_kb + h * stride_kh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for j0 in range(start, end, BLOCK_N):
        pos = j0 + tl.arange(0, BLOCK_N)
        ok = pos < end
        kt = tl.load(k_base + pos[None, :] * stride_kl + offs_d[:, None], mask=ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * sm_scale
        s = tl.where(ok[None, :] & (pos[None, :] <= (length + t)[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.math.exp2((m_i - m_safe) * 1.4426950408889634) + tl.sum(
            tl.math.exp2((s - m_safe[:, None]) * 1.4426950408889634), axis=1)
        m_i = m_new
    part = pid_bh.to(tl.int64) * NUM_SPLITS + pid_s
    tl.store(PartM + part * BLOCK_M + offs_m, m_i)
    tl.store(PartL + part * BLOCK_M + offs_m, l_i)


@triton.jit
def _srh_scores_kernel(
    Q, K, Lens, W, PartM, PartL, Out,
    sm_scale,
    stride_qb, stride_qh, stride_qt,
    stride_kb, stride_kh, stride_kl,
    L, NUM_SPLITS,
    HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    _, b64, h, length, n_ctx, offs_m, g, t, row_valid, offs_d, q = _packed_rows_q(
        Q, Lens, pid_bh, stride_qb, stride_qh, stride_qt, HKV, T, G, D, BLOCK_M, UPCAST)
    # each row's log-sum-exp over the whole sequence: merge the chunks' partials
    base = pid_bh.to(tl.int64) * NUM_SPLITS
    m_run = tl.full([BLOCK_M], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    for sp in range(0, NUM_SPLITS):
        m_s = tl.load(PartM + (base + sp) * BLOCK_M + offs_m)
        l_s = tl.load(PartL + (base + sp) * BLOCK_M + offs_m)
        m_new = tl.maximum(m_run, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        den = den * tl.math.exp2((m_run - m_safe) * 1.4426950408889634) + l_s * tl.math.exp2(
            (m_s - m_safe) * 1.4426950408889634)
        m_run = m_new
    w = tl.load(W + h * (G * T) + offs_m, mask=row_valid, other=0.0)
    use = row_valid & (den > 0.0) & (w != 0.0)
    lse = tl.where(use, m_run + tl.log(tl.where(use, den, 1.0)), 0.0)
    per_split = tl.cdiv(tl.cdiv(L, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = pid_s * per_split
    end = tl.minimum(start + per_split, L)
    k_base = K + b64 * stride_kb + h * stride_kh
    for j0 in range(start, end, BLOCK_N):
        pos = j0 + tl.arange(0, BLOCK_N)
        seen = pos < n_ctx  # keys past the last row's position are not read; their scores are 0
        kt = tl.load(k_base + pos[None, :] * stride_kl + offs_d[:, None], mask=seen[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * sm_scale
        vis = use[:, None] & seen[None, :] & (pos[None, :] <= (length + t)[:, None])
        p = tl.where(vis, tl.math.exp2((s - lse[:, None]) * 1.4426950408889634), 0.0)
        sc = tl.sum(p * w[:, None], axis=0)
        tl.store(Out + pid_bh.to(tl.int64) * L + pos, sc, mask=pos < end)


_WEIGHTS: dict[tuple, torch.Tensor] = {}


def row_weights(heads, rows, H: int, Hkv: int, T: int, device: torch.device) -> torch.Tensor:
    """``(H_kv, G·T)`` float32: weight of packed row ``g·T + t`` of KV head ``j`` = (times query head ``j·G + g``
    is in ``heads``) x (times ``t`` is in ``rows``; ``None``: every row once). Made once per device."""
    heads_l = tuple(int(h) for h in heads)
    rows_l = tuple(range(T)) if rows is None else tuple(int(r) for r in rows)
    key = (heads_l, rows_l, H, Hkv, T, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        G = H // Hkv
        vals = [[float(heads_l.count(j * G + m // T) * rows_l.count(m % T)) for m in range(G * T)]
                for j in range(Hkv)]
        w = _WEIGHTS[key] = torch.tensor(vals, dtype=torch.float32, device=device)
    return w


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 2  # interpreter: a few chunks, so the merge of the partials is exercised
    return torch.cuda.get_device_properties(device).multi_processor_count


def group_scores(q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, heads, scale: float,
                 rows=None, num_splits: int | None = None, block_n: int = 64, num_warps: int = 4,
                 num_stages: int = 3) -> torch.Tensor:
    """``group_attention(q, k_cache, lengths, heads, scale, rows, full=True)`` in two Triton launches.

    Args:
        q: ``(B, H, T, D)`` queries of the new rows (row ``t`` sits at ``lengths[b] + t``; last dim contiguous).
        k_cache: ``(B, H_kv, L, D)`` one layer's keys (the new rows' keys already written; last dim contiguous).
        lengths: ``(B,)`` int cached lengths before the new rows (``lengths + T <= L``).
        heads: host sequence of query heads (a head listed twice counts twice); ``rows``: host sequence of rows
            (``None``: all ``T``).
        num_splits: chunks per (sequence, KV head); ``None``: enough programs for ~4 per SM.

    Returns:
        ``(B, H_kv, L)`` float32: per KV head, the requested heads' and rows' softmax weights summed; 0 where no
        requested row sees a position and for groups with no requested head.
    """
    B, H, T, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    if H % Hkv or k_cache.shape[0] != B or k_cache.shape[3] != D:
        raise ValueError(f"group_scores: q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)} do not fit "
                         "(B, H, T, D) and (B, H_kv, L, D) with H a multiple of H_kv.")
    if D & (D - 1) or D < 16:
        raise ValueError(f"group_scores needs a power-of-two head dim >= 16, got {D}.")
    G = H // Hkv
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k_cache.stride(-1) != 1:
        raise ValueError("group_scores: k_cache needs a contiguous last dimension.")
    dev = q.device
    w = row_weights(heads, rows, H, Hkv, T, dev)
    block_m = max(16, triton.next_power_of_2(G * T))
    if num_splits is None:
        want = math.ceil(4 * _sm_count(dev) / max(1, B * Hkv))
        num_splits = max(1, min(want, math.ceil(L / (4 * block_n))))
    S = int(num_splits)
    part_m = torch.empty((B * Hkv * S, block_m), dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    out = torch.empty((B, Hkv, L), dtype=torch.float32, device=dev)
    lengths = lengths.to(device=dev)
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"
    upcast = dev.type != "cuda" and q.dtype == torch.bfloat16
    common = dict(HKV=Hkv, T=T, G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n, DOT_PREC=dot_prec, UPCAST=upcast,
                  num_warps=num_warps, num_stages=num_stages)
    strides = (q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2))
    _srh_lse_kernel[(B * Hkv, S)](q, k_cache, lengths, part_m, part_l, float(scale), *strides, L, S, **common)
    _srh_scores_kernel[(B * Hkv, S)](q, k_cache, lengths, w, part_m, part_l, out, float(scale), *strides, L, S,
                                     **common)
    return out
