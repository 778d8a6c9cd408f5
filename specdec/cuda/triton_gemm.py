"""Small-row GEMMs with the decoder layer's element-wise work fused in: two launches instead of six.

At decode sizes (one to a few rows per sequence) every kernel of a small model's decoder layer runs for a
few microseconds, and the launches, not the bytes, set a step's time: at SmolLM2-135M, B 64 x 8k, a
sparse draft step ran ~320 launches in 1.56 ms where its bytes take ~0.2 ms. The layer of
:mod:`specdec.fusion` with its Triton kernels is ``norm -> qkv GEMM -> RoPE + KV write -> attention ->
o_proj GEMM -> residual add + norm -> gate/up GEMM -> SiLU·mul -> down GEMM``. Here the GEMMs that
follow a norm take the norm (and the residual add, and the previous GEMM's split-K partial sums) as
their prologue and the next element-wise step as their epilogue:

- :func:`norm_qkv_rope_write` — ``rmsnorm(residual + sum(parts))`` then the fused QKV projection, RoPE
  of q and k, and the write of the rotated keys and the values into the KV cache: one launch (was 3).
- :func:`norm_gate_up_silu` — ``rmsnorm(residual + sum(parts))`` then the fused gate/up projection and
  ``silu(gate) * up``: one launch (was 3).

A program owns a block of rows and a block of output columns (one head, for the QKV kernel: both halves
of it, so RoPE's ``rotate_half`` stays inside the program) and reads its rows in ONE pass: each block of
``BLOCK_K`` columns of ``r = residual + sum(partials)`` adds to the rows' sum of squares and, multiplied by
the norm's weight, is the GEMM's left operand; the norm's ``1 / rms`` scales the GEMM's float32 sums at the
end (the program of column block 0 also stores the new residual). The weights are read once per row block.

Rounding: the residual sum, the projection's output, each RoPE product and sum, SiLU's output and the
product are rounded to the model dtype where Hugging Face's modules round them. The norm is where this
differs from the per-kernel layer: torch rounds ``r / rms`` and then ``weight · (r / rms)`` to the model
dtype before the GEMM; here ``weight · r`` is rounded once and ``1 / rms`` applied in float32 after it (one
rounding of the model dtype instead of two, and another order of sums: the RMS over blocks, the projection
in ``tl.dot`` blocks instead of cuBLAS' order, split partials summed in float32 before one rounding).
Shapes only decide launch sizes: no host synchronisation,
CUDA-graph capturable. With programmatic dependent launch on
(:mod:`specdec.cuda.triton_pdl`) each kernel waits for its predecessor first.

This module imports nothing from specdec but :mod:`specdec.cuda.triton_pdl`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.cuda.triton_pdl import pdl_args

#: launch configuration of both kernels (measured on the H200 by ``benchmarks/gpu/gemm14.py --parts kernels``):
#: ``block_k`` the K (hidden) block of the loop; ``block_m`` rows per program up to 64 rows (more rows: 64);
#: ``block_n`` the gate/up kernel's output columns per program; ``num_warps``; ``num_stages`` (``None``: Triton's)
TUNE = dict(block_k=256, block_m=16, block_n=64, num_warps=4, num_stages=None)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _row_chunk(X, Res, RO, rows, kk, msk, sx, ss, sr, so,
               HAS_RES: tl.constexpr, SPLITS: tl.constexpr, STORE: tl.constexpr):
    """Rows ``rows`` x columns ``kk`` of ``residual + sum(partials)`` (each sum rounded to the model dtype, as
    the split GEMM's output and torch's residual add round); stores it to ``RO`` when ``STORE``."""
    x = tl.load(X + rows[:, None] * sx + kk[None, :], mask=msk, other=0.0)
    if SPLITS > 1:
        acc = x.to(tl.float32)
        for s in tl.static_range(1, SPLITS):
            acc += tl.load(X + s * ss + rows[:, None] * sx + kk[None, :], mask=msk, other=0.0).to(tl.float32)
        x = acc.to(X.dtype.element_ty)
    if HAS_RES:
        res = tl.load(Res + rows[:, None] * sr + kk[None, :], mask=msk, other=0.0)
        x = (res.to(tl.float32) + x.to(tl.float32)).to(X.dtype.element_ty)
        if STORE:
            tl.store(RO + rows[:, None] * so + kk[None, :], x, mask=msk)
    return x


@triton.jit
def _scaled_chunk(X, Res, RO, NW, rows, kk, rmask, sx, ss, sr, so, K, store,
                  HAS_RES: tl.constexpr, SPLITS: tl.constexpr):
    """One K block of the GEMM's left operand before the norm's scale: ``(r · weight)`` rounded to the model dtype,
    and ``r²`` summed over the block (float32), for rows ``rows`` of ``r = residual + sum(partials)``; with a
    residual, the program whose ``store`` is true writes ``r`` to ``RO`` on the way."""
    kmask = kk < K
    msk = rmask[:, None] & kmask[None, :]
    if store:
        x = _row_chunk(X, Res, RO, rows, kk, msk, sx, ss, sr, so, HAS_RES, SPLITS, True)
    else:
        x = _row_chunk(X, Res, RO, rows, kk, msk, sx, ss, sr, so, HAS_RES, SPLITS, False)
    xf = x.to(tl.float32)
    w = tl.load(NW + kk, mask=kmask, other=0.0).to(tl.float32)
    return (xf * w[None, :]).to(X.dtype.element_ty), tl.sum(xf * xf, axis=1)


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """``acc + a @ b``; ``IEEE``: in float32 without TF32 (float32 models, and 16-bit ones under Triton's CPU
    interpreter, which miscomputes bf16 dots: the 16-bit operands are exact in float32)."""
    if IEEE:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


# -- RMSNorm (+ residual, + partials) -> QKV GEMM (+ bias) -> RoPE -> KV-cache write ------------------------
@triton.jit
def _norm_qkv_kernel(
    X, Res, RO, NW, W, Bias, Cos, Sin, QO, KC, VC, Lens,
    sx, ss, sr, so, scb, sct, ssb, sst, sob, soh, sot,
    skcb, skch, skcl, svcb, svch, svcl,
    M, T, K, Hq, Hkv, L, eps,
    HAS_RES: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_m = tl.program_id(0)
    j = tl.program_id(1)  # the head of the QKV output: q heads, then k heads, then v heads
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    c = tl.arange(0, BLOCK_H)
    hmask = c < HALF
    col1 = j.to(tl.int64) * (2 * HALF) + c  # the head's first half of output columns (weight rows)
    acc1 = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_H], dtype=tl.float32)
    ssq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        h, sq = _scaled_chunk(X, Res, RO, NW, rows, kk, rmask, sx, ss, sr, so, K, j == 0, HAS_RES, SPLITS)
        ssq += sq
        wm = (kk < K)[:, None] & hmask[None, :]
        w1 = tl.load(W + col1[None, :] * K + kk[:, None], mask=wm, other=0.0)  # (BLOCK_K, BLOCK_H): W[cols, kk].T
        w2 = tl.load(W + (col1 + HALF)[None, :] * K + kk[:, None], mask=wm, other=0.0)
        acc1 = _dot(h, w1, acc1, IEEE)
        acc2 = _dot(h, w2, acc2, IEEE)
    rstd = 1.0 / tl.sqrt(ssq / K + eps)  # the norm's scale, applied to the GEMM's float32 sums
    acc1 = acc1 * rstd[:, None]
    acc2 = acc2 * rstd[:, None]
    if HAS_BIAS:
        acc1 += tl.load(Bias + col1, mask=hmask, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(Bias + col1 + HALF, mask=hmask, other=0.0).to(tl.float32)[None, :]
    dt = X.dtype.element_ty
    x1 = acc1.to(dt)  # the projection's output, rounded as the GEMM's
    x2 = acc2.to(dt)
    b = rows // T
    t = rows % T
    om = rmask[:, None] & hmask[None, :]
    if j < Hq + Hkv:  # q and k: RoPE, each product and the sum rounded as torch's ``q*cos + rotate_half(q)*sin``
        cb = Cos + b[:, None] * scb + t[:, None] * sct + c[None, :]
        sb = Sin + b[:, None] * ssb + t[:, None] * sst + c[None, :]
        c1 = tl.load(cb, mask=om, other=0.0).to(tl.float32)
        c2 = tl.load(cb + HALF, mask=om, other=0.0).to(tl.float32)
        s1 = tl.load(sb, mask=om, other=0.0).to(tl.float32)
        s2 = tl.load(sb + HALF, mask=om, other=0.0).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        x1n = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
        x2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
        x1 = x1n
    if j < Hq:
        dst = QO + b[:, None] * sob + j.to(tl.int64) * soh + t[:, None] * sot + c[None, :]
        tl.store(dst, x1, mask=om)
        tl.store(dst + HALF, x2, mask=om)
    else:
        pos = tl.load(Lens + b, mask=rmask, other=0).to(tl.int64) + t
        ok = om & ((pos >= 0) & (pos < L))[:, None]
        if j < Hq + Hkv:
            kh = (j - Hq).to(tl.int64)
            dst = KC + b[:, None] * skcb + kh * skch + pos[:, None] * skcl + c[None, :]
            tl.store(dst, x1.to(KC.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, x2.to(KC.dtype.element_ty), mask=ok)
        else:
            vh = (j - Hq - Hkv).to(tl.int64)
            dst = VC + b[:, None] * svcb + vh * svch + pos[:, None] * svcl + c[None, :]
            tl.store(dst, x1.to(VC.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, x2.to(VC.dtype.element_ty), mask=ok)


def _block_m(rows: int) -> int:
    """Rows per program: ``TUNE["block_m"]`` up to 64 rows (more programs for a small batch), else 64."""
    return TUNE["block_m"] if rows <= 64 else 64


def _block_k(bm: int, bn: int, dtype: torch.dtype) -> int:
    """``TUNE["block_k"]``, halved (down to 64) while one pipeline stage of the row and weight tiles would pass
    80 KB (3 stages must fit the SM's 227 KB of shared memory: float32 tiles of 256 columns do not)."""
    bk = TUNE["block_k"]
    size = torch.finfo(dtype).bits // 8
    while bk > 64 and (bm * bk + 2 * bk * bn) * size > 80 * 1024:
        bk //= 2
    return bk


def _launch_opts(device) -> dict:
    opts = dict(num_warps=TUNE["num_warps"], **pdl_args(device))
    if TUNE["num_stages"] is not None:
        opts["num_stages"] = TUNE["num_stages"]
    return opts


def _inputs(x: torch.Tensor, residual: torch.Tensor | None, splits: int, K: int, name: str):
    """``x`` (``(..., K)``, or ``(splits, ..., K)`` partials) as ``(R, K)`` rows + split stride, the residual's rows,
    the shape of one row set, and the new residual's buffer (``None`` without a residual)."""
    if splits < 1 or (splits > 1 and (x.dim() < 2 or x.shape[0] != splits)):
        raise ValueError(f"{name}: {splits} splits need x of shape (splits, ..., K), got {tuple(x.shape)}")
    if splits > 1 and residual is None:
        raise ValueError(f"{name}: split partial sums need the residual they add to")
    shape = x.shape[1:] if splits > 1 else x.shape
    if shape[-1] != K:
        raise ValueError(f"{name}: x's last dim {shape[-1]} is not the projection's input dim {K}")
    if splits > 1:
        x = x.contiguous()
        x2 = x.view(splits, -1, K)[0]
    else:
        x2 = x.reshape(-1, K)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
    if residual is not None:
        if residual.shape != shape:
            raise ValueError(f"{name}: residual shape {tuple(residual.shape)} differs from x {tuple(shape)}")
        r2 = residual.reshape(-1, K)
        if r2.stride(-1) != 1:
            r2 = r2.contiguous()
        ro = torch.empty(shape, dtype=x.dtype, device=x.device)
        ro2 = ro.view(-1, K)
    else:
        r2 = ro2 = x2
        ro = None
    return x2, x2.shape[0] * K, r2, ro, ro2, shape


def _check(name: str, x: torch.Tensor, *weights: torch.Tensor) -> None:
    if x.dtype not in _DTYPES:
        raise ValueError(f"{name}: dtype {x.dtype} is not one of bfloat16, float16, float32")
    for w in weights:
        if w.dtype != x.dtype or w.device != x.device:
            raise ValueError(f"{name}: weight {w.dtype} on {w.device} does not match activations {x.dtype} on "
                             f"{x.device}")
        if not w.is_contiguous():
            raise ValueError(f"{name}: weight of shape {tuple(w.shape)} must be contiguous")


def norm_qkv_rope_write(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                        bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, lengths: torch.Tensor, num_heads: int,
                        residual: torch.Tensor | None = None,
                        splits: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The input norm, the QKV projection, RoPE and the KV-cache write of one decoder layer, in one launch.

    Computes ``h = norm_weight * rmsnorm(r)`` with ``r = residual + sum(x partials)`` (or ``r = x`` without a
    residual), ``qkv = h @ weight.T (+ bias)``, RoPE of the q and k heads, and writes
    ``k_cache[b, h, lengths[b] + t] = rope(k)[b, t, h]`` (the values alike, unrotated).

    Args:
        x: ``(B, T, K)`` hidden states; with ``splits > 1``, ``(splits, B, T, K)`` partial sums of the previous
            layer's split down GEMM (their sum rounded to the model dtype is the GEMM's output).
        norm_weight: ``(K,)`` the input RMSNorm's weight; ``eps`` its ``variance_epsilon``.
        weight: ``(Hq·D + 2·Hkv·D, K)`` the fused QKV projection's weight (contiguous, model dtype).
        bias: its ``(Hq·D + 2·Hkv·D,)`` bias (Qwen2) or ``None``.
        cos: ``(B, T, D)`` the rotary embedding's cosines (any strides with unit stride along ``D``).
        sin: ``(B, T, D)`` its sines.
        k_cache: ``(B, Hkv, L, D)`` one layer of the key cache (unit stride along ``D``).
        v_cache: ``(B, Hkv, L, D)`` the same layer of the value cache.
        lengths: ``(B,)`` integer tokens cached before this write (read on the device); positions outside
            ``[0, L)`` are not written (callers check the capacity first).
        num_heads: ``Hq``, the query heads (``Hkv`` follows from the weight and the cache).
        residual: ``(B, T, K)`` the residual stream ``x`` adds to, or ``None``.
        splits: partial sums in ``x`` (1: ``x`` is the activation itself).

    Returns:
        ``(q, r)``: ``(B, Hq, T, D)`` the rotated queries (contiguous, as the attention function takes them) and
        ``r`` (``(B, T, K)``, the new residual stream) when a residual was given, else ``None``.
    """
    name = "norm_qkv_rope_write"
    B, Hkv, L, D = k_cache.shape
    K = weight.shape[1]
    _check(name, x, norm_weight, weight, *(() if bias is None else (bias,)))
    if D % 2 or v_cache.shape != k_cache.shape:
        raise ValueError(f"{name}: caches {tuple(k_cache.shape)}/{tuple(v_cache.shape)} must match with an even head dim")
    if weight.shape[0] != (num_heads + 2 * Hkv) * D:
        raise ValueError(f"{name}: weight rows {weight.shape[0]} are not ({num_heads} + 2·{Hkv}) heads x {D}")
    if norm_weight.shape != (K,) or (bias is not None and bias.shape != (weight.shape[0],)):
        raise ValueError(f"{name}: norm weight {tuple(norm_weight.shape)} / bias do not fit a ({weight.shape[0]}, {K}) "
                         "projection")
    x2, split_stride, r2, ro, ro2, shape = _inputs(x, residual, splits, K, name)
    if len(shape) != 3 or shape[0] != B:
        raise ValueError(f"{name}: hidden states {tuple(shape)} are not (B={B}, T, {K})")
    T = shape[1]
    if tuple(cos.shape) != (B, T, D) or tuple(sin.shape) != (B, T, D):
        raise ValueError(f"{name}: cos/sin shapes {tuple(cos.shape)}/{tuple(sin.shape)} are not {(B, T, D)}")
    for n, t in (("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: {n} needs unit stride along the head dim")
    qo = torch.empty((B, num_heads, T, D), dtype=x.dtype, device=x.device)
    M = B * T
    if M:
        half = D // 2
        bm = _block_m(M)
        _norm_qkv_kernel[(triton.cdiv(M, bm), num_heads + 2 * Hkv)](
            x2, r2, ro2, norm_weight, weight, weight if bias is None else bias, cos, sin, qo, k_cache, v_cache,
            lengths,
            x2.stride(0), split_stride, r2.stride(0), ro2.stride(0),
            cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), qo.stride(0), qo.stride(1), qo.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2),
            M, T, K, num_heads, Hkv, L, float(eps),
            HAS_RES=residual is not None, SPLITS=splits, HAS_BIAS=bias is not None, HALF=half,
            BLOCK_H=max(16, triton.next_power_of_2(half)), BLOCK_M=bm,
            BLOCK_K=_block_k(bm, max(16, triton.next_power_of_2(half)), x.dtype),
            IEEE=x.dtype == torch.float32 or x.device.type != "cuda", **_launch_opts(x.device),
        )
    return qo, ro


# -- RMSNorm (+ residual, + partials) -> gate/up GEMM -> SiLU(gate) * up -------------------------------------
@triton.jit
def _norm_gate_up_kernel(
    X, Res, RO, NW, W, Y,
    sx, ss, sr, so, sy,
    M, K, I, eps,
    HAS_RES: tl.constexpr, SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rmask = rows < M
    cols = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    nmask = cols < I
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ssq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        h, sq = _scaled_chunk(X, Res, RO, NW, rows, kk, rmask, sx, ss, sr, so, K, pid_n == 0, HAS_RES, SPLITS)
        ssq += sq
        wm = (kk < K)[:, None] & nmask[None, :]
        wg = tl.load(W + cols[None, :] * K + kk[:, None], mask=wm, other=0.0)
        wu = tl.load(W + (cols + I)[None, :] * K + kk[:, None], mask=wm, other=0.0)
        acc_g = _dot(h, wg, acc_g, IEEE)
        acc_u = _dot(h, wu, acc_u, IEEE)
    rstd = 1.0 / tl.sqrt(ssq / K + eps)  # the norm's scale, applied to the GEMM's float32 sums
    acc_g = acc_g * rstd[:, None]
    acc_u = acc_u * rstd[:, None]
    dt = X.dtype.element_ty
    g = acc_g.to(dt).to(tl.float32)  # the projection's outputs, rounded as the GEMM's
    u = acc_u.to(dt)
    a = (g / (1.0 + tl.exp(-g))).to(dt)  # torch: silu in float, rounded to the model dtype
    y = (a.to(tl.float32) * u.to(tl.float32)).to(dt)
    tl.store(Y + rows[:, None] * sy + cols[None, :], y, mask=rmask[:, None] & nmask[None, :])


def norm_gate_up_silu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                      residual: torch.Tensor | None = None,
                      splits: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The post-attention norm, the fused gate/up projection and ``silu(gate) * up``, in one launch.

    Args:
        x: ``(..., K)`` the attention's output projection; with ``splits > 1``, ``(splits, ..., K)`` partial sums
            of the split o_proj GEMM.
        norm_weight: ``(K,)`` the RMSNorm's weight; ``eps`` its ``variance_epsilon``.
        weight: ``(2I, K)`` the fused ``gate_up`` projection's weight (``cat([gate, up])``; contiguous, no bias).
        residual: ``(..., K)`` the residual stream ``x`` adds to, or ``None``.
        splits: partial sums in ``x`` (1: ``x`` is the activation itself).

    Returns:
        ``(act, r)``: ``(..., I)`` ``silu(gate) * up`` and the new residual ``r = residual + x`` (``None`` without a
        residual).
    """
    name = "norm_gate_up_silu"
    two_i, K = weight.shape
    _check(name, x, norm_weight, weight)
    if two_i % 2 or norm_weight.shape != (K,):
        raise ValueError(f"{name}: weight {tuple(weight.shape)} is not cat([gate, up]) over a ({K},) norm")
    I = two_i // 2
    x2, split_stride, r2, ro, ro2, shape = _inputs(x, residual, splits, K, name)
    y = torch.empty((*shape[:-1], I), dtype=x.dtype, device=x.device)
    M = x2.shape[0]
    if M:
        bm = _block_m(M)
        bn = TUNE["block_n"]
        _norm_gate_up_kernel[(triton.cdiv(M, bm), triton.cdiv(I, bn))](
            x2, r2, ro2, norm_weight, weight, y.view(-1, I),
            x2.stride(0), split_stride, r2.stride(0), ro2.stride(0), I,
            M, K, I, float(eps),
            HAS_RES=residual is not None, SPLITS=splits, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_block_k(bm, bn, x.dtype),
            IEEE=x.dtype == torch.float32 or x.device.type != "cuda", **_launch_opts(x.device),
        )
    return y, ro
