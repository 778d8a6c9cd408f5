"""Triton kernel of Dustin's low-rank key ranking (``layer_scores="keys"``, :mod:`specdec.selectors.key_rank`).

:func:`lowrank_mass` gives, per (sequence, KV head) and cached position, the softmax attention mass the verify rows'
projected queries ``q P`` put on the projected keys ``k P``, summed over the KV group's query heads and rows; the
positions the per-layer part may not add are ``-inf``. Two launches, each of ``B · H_kv · ceil(C / chunk)``
programs (a sequence, a KV head and a chunk of positions: :func:`default_chunk` keeps a launch at >= 512 programs, so a
batch of one still fills the GPU): the first reads its chunk of projected keys for each query row's maximum and
normaliser over the chunk; the second combines the chunks' statistics (an online softmax across chunks) and reads its
chunk again for the mass. The logits are float32 products: with bfloat16 projected keys (the GPU's cache dtype) as
three bfloat16 tensor-core products of the keys with three bfloat16 pieces of the float32 rows (each product exact, the
sums in float32; both passes 140-157 us against 206-217 us for three TF32 products at B 64 x 8k x rank 32 on an H100,
2026-12-06, the same top-2,000 sets: ``benchmarks/results/gpu_keyrank_bf16_2026-12-06.md``), with other keys as three
TF32 products (Triton's ``"tf32x3"``: ~1e-5 relative error, 3.4x faster than its FMA ``"ieee"`` path); the torch
path (:meth:`~specdec.selectors.key_rank.KeyRankPlan.indices_for`) materialises the ``(B, H, G, T, C)`` logits and their softmax in float32. This reads ``2 · C · r`` key elements per row and writes
``C`` floats.
Its output feeds :func:`specdec.cuda.triton_select.select_top`.

This module imports nothing from specdec.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rows_and_keys_base(QR, K, H, R, r, stride_kb, stride_kh, pid, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """This (sequence, KV head)'s scaled query rows ``(BLOCK_R, BLOCK_D)`` (zero padded) and its keys' base pointer."""
    b = pid // H
    h = pid % H
    rows = tl.arange(0, BLOCK_R)
    dims = tl.arange(0, BLOCK_D)
    qr = tl.load(QR + pid.to(tl.int64) * R * r + rows[:, None] * r + dims[None, :],
                 mask=(rows < R)[:, None] & (dims < r)[None, :], other=0.0)
    return qr, K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh


@triton.jit
def _split_rows(qr):
    """``qr`` (float32) as three bfloat16 pieces ``q1 + q2 + q3``: float32's 24 bits, 8 per piece."""
    q1 = qr.to(tl.bfloat16)
    rest = qr - q1.to(tl.float32)
    q2 = rest.to(tl.bfloat16)
    q3 = (rest - q2.to(tl.float32)).to(tl.bfloat16)
    return q1, q2, q3


@triton.jit
def _logits(qr, q1, q2, q3, k, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, WIDEN: tl.constexpr):
    """``(BLOCK_R, BLOCK_C)`` float32 logits of the rows against a block of keys ``k`` ``(BLOCK_C, BLOCK_D)``.
    ``SPLIT`` 0: float32 products at ``DOT_PREC`` (keys of any float dtype, widened); 2 or 3: bfloat16 keys against
    that many bfloat16 pieces of the rows, on bfloat16 tensor cores (each product of two bfloat16 numbers is exact in
    the float32 accumulator: 3 pieces are the rows' float32 values, 2 pieces their first 16 bits). ``WIDEN``: the
    pieces' products as exact float32 products instead (Triton's CPU interpreter multiplies a bfloat16 dot's raw bits)."""
    if SPLIT == 0:
        s = tl.dot(qr, tl.trans(k.to(tl.float32)), input_precision=DOT_PREC)
    elif WIDEN:
        kt = tl.trans(k.to(tl.float32))
        s = tl.dot(q1.to(tl.float32), kt, input_precision="ieee")
        s = tl.dot(q2.to(tl.float32), kt, s, input_precision="ieee")
        if SPLIT == 3:
            s = tl.dot(q3.to(tl.float32), kt, s, input_precision="ieee")
    else:
        kt = tl.trans(k)
        s = tl.dot(q1, kt)
        s = tl.dot(q2, kt, s)
        if SPLIT == 3:
            s = tl.dot(q3, kt, s)
    return s


@triton.jit
def _chunk_stats_kernel(QR, K, LENS, STATS, H, R, r, NCH, stride_kb, stride_kh, stride_kc,
                        CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                        DOT_PREC: tl.constexpr, SPLIT: tl.constexpr = 0,
                        WIDEN: tl.constexpr = False):
    """Pass 1, one program per (sequence, KV head) and chunk of ``CHUNK`` positions: each query row's maximum logit
    and normaliser over the chunk's cached positions (``-inf`` / 0 where it holds none)."""
    pid = tl.program_id(0)
    ch = tl.program_id(1)
    length = tl.load(LENS + pid // H).to(tl.int32)
    qr, kbase = _rows_and_keys_base(QR, K, H, R, r, stride_kb, stride_kh, pid, BLOCK_R, BLOCK_D)
    q1, q2, q3 = _split_rows(qr)
    dims = tl.arange(0, BLOCK_D)
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    z = tl.zeros((BLOCK_R,), tl.float32)
    for c0 in range(ch * CHUNK, tl.minimum(ch * CHUNK + CHUNK, length), BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        seen = cs < length
        k = tl.load(kbase + cs[:, None].to(tl.int64) * stride_kc + dims[None, :],
                    mask=seen[:, None] & (dims < r)[None, :], other=0.0)
        s = _logits(qr, q1, q2, q3, k, SPLIT, DOT_PREC, WIDEN)  # (BLOCK_R, BLOCK_C)
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), axis=1)
        m = m_new
    rows = tl.arange(0, BLOCK_R)
    base = STATS + (pid.to(tl.int64) * NCH + ch) * 2 * BLOCK_R
    tl.store(base + rows, m)
    tl.store(base + BLOCK_R + rows, z)


@triton.jit
def _chunk_mass_kernel(QR, K, LENS, NEW, STATS, OUT, H, C, R, r, NCH, stride_kb, stride_kh, stride_kc,
                       CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                       BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr, SPLIT: tl.constexpr = 0,
                       WIDEN: tl.constexpr = False):
    """Pass 2, same grid: combine every chunk's statistics into each row's maximum and normaliser, then write the
    mass of this chunk's positions (``-inf`` where the part may not add one)."""
    pid = tl.program_id(0)
    ch = tl.program_id(1)
    b = pid // H
    length = tl.load(LENS + b).to(tl.int32)
    qr, kbase = _rows_and_keys_base(QR, K, H, R, r, stride_kb, stride_kh, pid, BLOCK_R, BLOCK_D)
    q1, q2, q3 = _split_rows(qr)
    dims = tl.arange(0, BLOCK_D)
    rows = tl.arange(0, BLOCK_R)
    chunks = tl.arange(0, BLOCK_N)
    sbase = STATS + pid.to(tl.int64) * NCH * 2 * BLOCK_R
    at = sbase + chunks[:, None] * 2 * BLOCK_R + rows[None, :]
    cm = tl.load(at, mask=(chunks < NCH)[:, None], other=float("-inf"))  # (BLOCK_N, BLOCK_R)
    cz = tl.load(at + BLOCK_R, mask=(chunks < NCH)[:, None], other=0.0)
    m = tl.max(cm, axis=0)
    has = m > float("-inf")
    m = tl.where(has, m, 0.0)
    z = tl.sum(tl.where(cz > 0, cz * tl.exp(cm - m[None, :]), 0.0), axis=0)
    ok_row = (rows < R) & has & (z > 0)
    inv = tl.where(ok_row, 1.0 / tl.where(ok_row, z, 1.0), 0.0)  # padded rows (and a finished sequence's) weigh nothing
    m = tl.where(ok_row, m, 0.0)
    obase = OUT + pid.to(tl.int64) * C
    lo = ch * CHUNK
    end = tl.minimum(lo + CHUNK, C)
    # the blocks that hold cached positions are scored; the rest of the chunk (past the length: a finished sequence,
    # whose plan ranks nothing, has length 0) only reads -inf, without a product
    mid = tl.minimum(end, lo + tl.cdiv(tl.maximum(length - lo, 0), BLOCK_C) * BLOCK_C)
    for c0 in range(lo, mid, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        inside = (cs < C) & (cs < lo + CHUNK)
        seen = cs < length
        k = tl.load(kbase + cs[:, None].to(tl.int64) * stride_kc + dims[None, :],
                    mask=seen[:, None] & (dims < r)[None, :], other=0.0)
        s = _logits(qr, q1, q2, q3, k, SPLIT, DOT_PREC, WIDEN)
        p = tl.exp(s - m[:, None]) * inv[:, None]
        mass = tl.sum(p, axis=0)  # (BLOCK_C,)
        ok = tl.load(NEW + b.to(tl.int64) * C + cs, mask=inside, other=0) != 0
        tl.store(obase + cs, tl.where(ok & seen, mass, float("-inf")), mask=inside)
    for c0 in range(mid, end, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        tl.store(obase + cs, tl.full((BLOCK_C,), float("-inf"), tl.float32), mask=(cs < C) & (cs < lo + CHUNK))


#: the dot's precision: three TF32 products (float32 accuracy to ~1e-5, on tensor cores); ``"ieee"`` (FMA) is exact
#: float32 and 3-4x slower on an H100 (2026-12-06: both passes 633 vs 186 us at B 64, 8k, r 32)
DOT_PREC = "tf32x3"


#: bfloat16 pieces of the rows against bfloat16 keys (``SPLIT``): 3 carry the float32 rows whole (every product exact,
#: float32 accumulation), on bfloat16 tensor cores at half TF32's cost per product and without widening the keys
BF16_SPLIT = 3


def default_chunk(rows: int, positions: int) -> int:
    """Positions per program: 1024 where a launch still has >= 512 programs (``B · H_kv`` rows of ``positions``),
    else 256 (a small batch: more, shorter programs fill the SMs). At B 64 x 8k on an H100 1024 was 1.2x faster."""
    return 1024 if rows * triton.cdiv(positions, 1024) >= 512 else 256


def lowrank_mass(qr: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor,
                 chunk: int | None = None, split: int | None = None) -> torch.Tensor:
    """``(B, H, C)`` float32: per (sequence, KV head) the softmax mass of the ``R`` query rows of ``qr`` over the
    projected keys of the first ``lengths[b]`` positions, summed over the rows; ``-inf`` where ``new`` is false or at
    ``lengths[b]`` and after.

    Args:
        qr: ``(B, H, R, r)`` float32, contiguous: the projected queries already multiplied by the softmax scale.
        keys: ``(B, H, C, r)`` projected keys in any float dtype, last dimension contiguous.
        lengths: ``(B,)`` cached positions per sequence.
        new: ``(B, C)`` bool, contiguous: the positions the per-layer part may add.
        chunk: positions per program, a power of two >= 16 (default :func:`default_chunk`; tests use small ones).
        split: bfloat16 keys only: the products as 2 or 3 bfloat16 pieces of the rows (default :data:`BF16_SPLIT`),
            or 0 for three TF32 products (:data:`DOT_PREC`), which keys of other dtypes always take.
    """
    B, H, C, r = keys.shape
    R = qr.shape[2]
    if (qr.dtype != torch.float32 or not qr.is_contiguous() or qr.shape != (B, H, R, r) or keys.stride(-1) != 1
            or new.shape != (B, C) or not new.is_contiguous() or lengths.shape != (B,)):
        raise ValueError(f"lowrank_mass: want float32 contiguous qr (B, H, R, r), keys (B, H, C, r), new (B, C), "
                         f"lengths (B,); got qr {qr.dtype} {tuple(qr.shape)}, keys {tuple(keys.shape)}, "
                         f"new {tuple(new.shape)}, lengths {tuple(lengths.shape)}")
    if chunk is None:
        chunk = default_chunk(B * H, C)
    if chunk < 16 or chunk & (chunk - 1):
        raise ValueError(f"lowrank_mass: chunk must be a power of two >= 16, got {chunk}")
    if split is None:
        split = BF16_SPLIT if keys.dtype == torch.bfloat16 else 0
    if split not in (0, 2, 3) or (split and keys.dtype != torch.bfloat16):
        raise ValueError(f"lowrank_mass: split must be 0, or 2 or 3 with bfloat16 keys; got {split} with "
                         f"{keys.dtype} keys")
    out = torch.empty((B, H, C), dtype=torch.float32, device=keys.device)
    if B * H == 0 or C == 0:
        return out
    block_r = max(16, triton.next_power_of_2(R))
    block_d = max(16, triton.next_power_of_2(r))
    # 128 positions per block on the bfloat16 path (both passes 140-157 vs 161-187 us at 64, B 64 x 8k x rank 32,
    # three H100 sweeps of benchmarks/gpu/keyrank_sweep.py, 2026-12-06)
    block_c = min(chunk, (128 if split else 64) if block_r <= 32 else 32)
    nch = triton.cdiv(C, chunk)
    stats = torch.empty((B * H, nch, 2, block_r), dtype=torch.float32, device=keys.device)
    grid = (B * H, nch)
    strides = (keys.stride(0), keys.stride(1), keys.stride(2))
    _chunk_stats_kernel[grid](qr, keys, lengths, stats, H, R, r, nch, *strides,
                              CHUNK=chunk, BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_D=block_d, DOT_PREC=DOT_PREC,
                              SPLIT=split, WIDEN=not keys.is_cuda, num_warps=4)
    _chunk_mass_kernel[grid](qr, keys, lengths, new.view(torch.uint8), stats, out, H, C, R, r, nch, *strides,
                             CHUNK=chunk, BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_D=block_d,
                             BLOCK_N=max(16, triton.next_power_of_2(nch)), DOT_PREC=DOT_PREC, SPLIT=split,
                             WIDEN=not keys.is_cuda, num_warps=4)
    return out
