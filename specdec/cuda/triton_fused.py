"""Triton kernels that merge a decoder layer's small element-wise launches.

At the Llama-3.1-8B shape a sparse draft step spent 1.65 ms in ~850 element-wise launches and
0.6 ms in RMSNorm reductions: Hugging Face's RMSNorm is ~7 kernels (cast, pow, mean, add, rsqrt,
mul, mul), RoPE ~10 (two ``rotate_half`` slices + cat + 4 mul/add, for q and k), SiLU·mul 2, each
residual add 1, the KV-cache write 1. Here:

- :func:`rms_norm` — ``weight * rmsnorm(x)``, optionally fused with the residual add before it
  (``r = x + residual`` stored, the norm taken of ``r``): one launch.
- :func:`silu_mul` — ``silu(gate) * up`` from the fused ``gate_up`` projection's output: one launch.
- :func:`rope_qkv_write` — (Qwen3's per-head q/k RMSNorm,) RoPE of q and k, and the write of the
  rotated keys and the values into the KV cache at each sequence's length: one launch.

Each kernel reproduces the rounding of the torch code it replaces (every intermediate the
Hugging Face module rounds to the model dtype is rounded here too), so results equal the unfused
model's except for the order of the RMS sum (a tree instead of torch's reduction) and, on a GPU, the
``exp`` of SiLU. Shapes only decide launch sizes: no host synchronisation, CUDA-graph capturable.

With programmatic dependent launch on (:mod:`specdec.cuda.triton_pdl`, off by default) each kernel waits for
its predecessor in ``gdc_wait`` before any load or store, and its launch overlaps the predecessor's tail.

This module imports nothing from specdec but :mod:`specdec.cuda.triton_pdl` (a leaf: the switch).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from specdec.cuda.triton_pdl import pdl_args


# -- RMSNorm (+ residual add) ---------------------------------------------------------------------
@triton.jit
def _rms_kernel(X, Res, W, Y, RO, sx, sr, sy, so, ss, N, eps,
                HAS_RES: tl.constexpr, SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < N
    x = tl.load(X + row * sx + c, mask=m, other=0.0)
    if SPLITS > 1:  # the partial sums of a split GEMM: their sum rounded to the model dtype (the GEMM's output)
        acc = x.to(tl.float32)
        for s in tl.static_range(1, SPLITS):
            acc += tl.load(X + s * ss + row * sx + c, mask=m, other=0.0).to(tl.float32)
        x = acc.to(X.dtype.element_ty)
    if HAS_RES:
        # torch: ``residual + hidden`` rounded to the model dtype, then the norm of the rounded sum
        x = (tl.load(Res + row * sr + c, mask=m, other=0.0).to(tl.float32) + x.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(RO + row * so + c, x, mask=m)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) / N
    y = (xf * (1.0 / tl.sqrt(var + eps))).to(X.dtype.element_ty)  # torch: ``.to(input_dtype)``
    w = tl.load(W + c, mask=m, other=0.0)
    tl.store(Y + row * sy + c, (w.to(tl.float32) * y.to(tl.float32)).to(Y.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``(R, N)`` with unit stride along ``N`` (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             splits: int = 1) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Llama-family RMSNorm ``weight * (x / sqrt(mean(x²) + eps))`` over the last dim, in one launch.

    Args:
        x: ``(..., N)`` activations (model dtype); with ``splits > 1``, ``(splits, ..., N)`` partial
            sums of a split GEMM (:func:`split_linear`), whose sum over dim 0 (rounded to the model
            dtype, as the unsplit GEMM's output) is what is normalised.
        weight: ``(N,)`` norm weight.
        eps: the module's ``variance_epsilon``.
        residual: ``(..., N)`` or ``None``. When given, ``r = residual + x`` (rounded to ``x``'s
            dtype) is normalised instead and returned too.
        splits: number of partial sums in ``x`` (1: ``x`` is the activation itself).

    Returns:
        ``y`` (the dtype torch's ``weight * y.to(x.dtype)`` gives), or ``(y, r)`` with a residual.
    """
    if splits < 1 or (splits > 1 and (x.dim() < 2 or x.shape[0] != splits)):
        raise ValueError(f"rms_norm: {splits} splits need x of shape (splits, ..., N), got {tuple(x.shape)}")
    shape = x.shape[1:] if splits > 1 else x.shape
    N = x.shape[-1]
    if weight.shape != (N,):
        raise ValueError(f"rms_norm: weight shape {tuple(weight.shape)} is not ({N},)")
    if splits > 1:
        x = x.contiguous()  # (splits, R, N): partial s of row r at s * R * N + r * N
        x2 = x.view(splits, -1, N)[0]
    else:
        x2 = _rows(x)
    R = x2.shape[0]
    split_stride = x2.shape[0] * N
    y = torch.empty(shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    y2 = y.view(-1, N)
    if residual is not None:
        if residual.shape != shape:
            raise ValueError(f"rms_norm: residual shape {tuple(residual.shape)} differs from x {tuple(shape)}")
        r2 = _rows(residual)
        ro = torch.empty(shape, dtype=x.dtype, device=x.device)
        ro2 = ro.view(-1, N)
    else:
        r2 = ro2 = x2
        ro = None
    if R:
        block = triton.next_power_of_2(N)
        _rms_kernel[(R,)](x2, r2, weight, y2, ro2, x2.stride(0), r2.stride(0), y2.stride(0), ro2.stride(0),
                          split_stride, N, eps, HAS_RES=residual is not None, SPLITS=splits, BLOCK=block,
                          num_warps=min(16, max(1, block // 256)), **pdl_args(x.device))
    return y if ro is None else (y, ro)


def split_linear(x: torch.Tensor, weight: torch.Tensor, splits: int) -> torch.Tensor:
    """``x @ weight.T`` as ``splits`` partial sums over slices of the input dim, in ONE batched GEMM.

    At decode sizes cuBLAS splits such a GEMM over its input dim itself and adds a reduce kernel
    (``splitKreduce_kernel``); here the split is a batch dimension of strided views of ``x`` and
    ``weight`` (no copy) and the sum is left to the kernel that reads the result next
    (:func:`rms_norm` with ``splits``). Partial ``s`` covers inputs ``[s·K/splits, (s+1)·K/splits)``.

    Args:
        x: ``(..., K)`` activations with unit stride along ``K`` (rows contiguous).
        weight: ``(N, K)`` a ``Linear``'s weight (contiguous).
        splits: number of partial sums; must divide ``K``.

    Returns:
        ``(splits, ..., N)`` partial sums in ``x``'s dtype.
    """
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.shape != (N, K) or not weight.is_contiguous():
        raise ValueError(f"split_linear: weight {tuple(weight.shape)} is not a contiguous (N, {K}) matrix")
    if splits < 1 or K % splits:
        raise ValueError(f"split_linear: {splits} splits do not divide the input dim {K}")
    x2 = _rows(x)
    if x2.stride(0) != K:
        x2 = x2.contiguous()
    R, kc = x2.shape[0], K // splits
    xs = x2.as_strided((splits, R, kc), (kc, K, 1))  # (S, R, Kc): slice s of every row
    ws = weight.as_strided((splits, kc, N), (kc, 1, K))  # (S, Kc, N): W[:, slice s].T
    return torch.bmm(xs, ws).view(splits, *x.shape[:-1], N)


# -- SiLU(gate) * up -----------------------------------------------------------------------------
@triton.jit
def _silu_mul_kernel(GU, Y, sg, sy, I, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < I
    g = tl.load(GU + row * sg + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + row * sg + I + c, mask=m, other=0.0)
    a = (g / (1.0 + tl.exp(-g))).to(u.dtype)  # torch: silu in float, rounded to the model dtype
    tl.store(Y + row * sy + c, (a.to(tl.float32) * u.to(tl.float32)).to(Y.dtype.element_ty), mask=m)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up = cat([gate, up], -1)`` is ``(..., 2I)``; returns ``(..., I)``."""
    two_i = gate_up.shape[-1]
    if two_i % 2:
        raise ValueError(f"silu_mul: last dim {two_i} of gate_up is odd (expected cat([gate, up]))")
    I = two_i // 2
    g2 = _rows(gate_up)
    y = torch.empty((*gate_up.shape[:-1], I), dtype=gate_up.dtype, device=gate_up.device)
    y2 = y.view(-1, I)
    if g2.shape[0]:
        block = min(1024, triton.next_power_of_2(I))
        _silu_mul_kernel[(g2.shape[0], triton.cdiv(I, block))](g2, y2, g2.stride(0), y2.stride(0), I, BLOCK=block,
                                                                num_warps=4 if block >= 512 else 1,
                                                                **pdl_args(gate_up.device))
    return y


# -- (q/k norm +) RoPE + KV-cache write ------------------------------------------------------------
@triton.jit
def _load_sum(ptr, mask, ss, SPLITS: tl.constexpr):
    """``ptr``'s values, or with ``SPLITS > 1`` the sum of the partials at ``ptr + s·ss`` rounded to their dtype."""
    x = tl.load(ptr, mask=mask, other=0.0)
    if SPLITS > 1:
        acc = x.to(tl.float32)
        for s in tl.static_range(1, SPLITS):
            acc += tl.load(ptr + s * ss, mask=mask, other=0.0).to(tl.float32)
        x = acc.to(x.dtype)
    return x


@triton.jit
def _rope_qkv_kernel(
    Q, K, V, Cos, Sin, QO, KC, VC, Lens, QW, KW, ss,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    scb, sct, ssb, sst,
    sob, soh, sot,
    skcb, skch, skcl, svcb, svch, svcl,
    T, Hq, L, eps,
    NORM: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    bt = tl.program_id(0)
    h = tl.program_id(1)
    b = (bt // T).to(tl.int64)
    t = (bt % T).to(tl.int64)
    c = tl.arange(0, BLOCK).to(tl.int64)
    m = c < HALF
    is_q = h < Hq
    kh = (h - Hq).to(tl.int64)
    hq = h.to(tl.int64)
    if is_q:
        src = Q + b * sqb + t * sqt + hq * sqh
    else:
        src = K + b * skb + t * skt + kh * skh
    x1 = _load_sum(src + c, m, ss, SPLITS)
    x2 = _load_sum(src + HALF + c, m, ss, SPLITS)
    dt = x1.dtype
    if NORM:  # Qwen3: RMSNorm over each head (module weight, model dtype) before RoPE
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        var = (tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF)
        r = 1.0 / tl.sqrt(var + eps)
        if is_q:
            w1 = tl.load(QW + c, mask=m, other=0.0).to(tl.float32)
            w2 = tl.load(QW + HALF + c, mask=m, other=0.0).to(tl.float32)
        else:
            w1 = tl.load(KW + c, mask=m, other=0.0).to(tl.float32)
            w2 = tl.load(KW + HALF + c, mask=m, other=0.0).to(tl.float32)
        x1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt)
        x2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt)
    cb = Cos + b * scb + t * sct
    sb = Sin + b * ssb + t * sst
    c1 = tl.load(cb + c, mask=m, other=0.0).to(tl.float32)
    c2 = tl.load(cb + HALF + c, mask=m, other=0.0).to(tl.float32)
    s1 = tl.load(sb + c, mask=m, other=0.0).to(tl.float32)
    s2 = tl.load(sb + HALF + c, mask=m, other=0.0).to(tl.float32)
    f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
    # torch: q*cos + rotate_half(q)*sin, each product and the sum rounded to the model dtype
    o1 = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
    o2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
    if is_q:
        dst = QO + b * sob + hq * soh + t * sot
        tl.store(dst + c, o1, mask=m)
        tl.store(dst + HALF + c, o2, mask=m)
    else:
        pos = tl.load(Lens + b).to(tl.int64) + t + c * 0  # (BLOCK,): a vector mask (the interpreter
        ok = m & (pos >= 0) & (pos < L)  # refuses a scalar one)
        kd = KC + b * skcb + kh * skch + pos * skcl
        tl.store(kd + c, o1.to(KC.dtype.element_ty), mask=ok)
        tl.store(kd + HALF + c, o2.to(KC.dtype.element_ty), mask=ok)
        vs = V + b * svb + t * svt + kh * svh
        vd = VC + b * svcb + kh * svch + pos * svcl
        tl.store(vd + c, _load_sum(vs + c, ok, ss, SPLITS).to(VC.dtype.element_ty), mask=ok)
        tl.store(vd + HALF + c, _load_sum(vs + HALF + c, ok, ss, SPLITS).to(VC.dtype.element_ty), mask=ok)


def rope_qkv_write(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                   q_norm: tuple[torch.Tensor, float] | None = None,
                   k_norm: tuple[torch.Tensor, float] | None = None, splits: int = 1,
                   split_stride: int = 0) -> torch.Tensor:
    """RoPE of q and k, and ``k_cache[b, h, lengths[b] + t] = rope(k)[b, t, h]`` (V alike), in one launch.

    Args:
        q: ``(B, T, H, D)`` queries before RoPE (any strides with unit stride along ``D``, e.g. a
            slice of the fused QKV projection's output).
        k: ``(B, T, H_kv, D)`` keys before RoPE.
        v: ``(B, T, H_kv, D)`` values.
        cos: ``(B, T, D)`` the rotary embedding's cosines the decoder layer passes (model dtype).
        sin: ``(B, T, D)`` its sines.
        k_cache: ``(B, H_kv, L, D)`` one layer of the key cache (any strides, unit along ``D``).
        v_cache: ``(B, H_kv, L, D)`` the same layer of the value cache.
        lengths: ``(B,)`` integer tokens cached before this write (read on the device); rows whose
            position falls outside ``[0, L)`` are not written (callers check the capacity first).
        q_norm: ``(weight (D,), eps)`` of Qwen3's per-head query RMSNorm, applied before RoPE.
        k_norm: ``(weight (D,), eps)`` of its key RMSNorm (same ``eps``).
        splits: with ``splits > 1``, ``q``/``k``/``v`` are views into the first of ``splits`` partial
            sums of a split QKV GEMM (:func:`split_linear`), the others ``split_stride`` elements
            apart; their sum (rounded to the model dtype, as the unsplit GEMM's output) is used.
        split_stride: elements between two partials (``parts.stride(0)``).

    Returns:
        ``(B, H, T, D)`` the rotated queries (contiguous), as the attention function expects them.
    """
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    if D % 2:
        raise ValueError(f"rope_qkv_write: head dim {D} is odd")
    if tuple(k.shape) != (B, T, Hkv, D) or tuple(v.shape) != (B, T, Hkv, D):
        raise ValueError(f"rope_qkv_write: key/value shapes {tuple(k.shape)}/{tuple(v.shape)} do not match q {tuple(q.shape)}")
    if k_cache.shape[:2] != (B, Hkv) or k_cache.shape[3] != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_qkv_write: cache shape {tuple(k_cache.shape)} does not hold keys of shape {tuple(k.shape)}")
    if tuple(cos.shape) != (B, T, D) or tuple(sin.shape) != (B, T, D):
        raise ValueError(f"rope_qkv_write: cos/sin shapes {tuple(cos.shape)}/{tuple(sin.shape)} are not {(B, T, D)}")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("rope_qkv_write: pass both q_norm and k_norm or neither")
    if splits < 1 or (splits > 1 and split_stride <= 0):
        raise ValueError(f"rope_qkv_write: {splits} splits need a positive split_stride, got {split_stride}")
    for name, x in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"rope_qkv_write: {name} needs unit stride along the head dim")
    qo = torch.empty((B, H, T, D), dtype=q.dtype, device=q.device)
    if B == 0 or T == 0:
        return qo
    qw, eps = q_norm if q_norm is not None else (q, 0.0)
    kw = k_norm[0] if k_norm is not None else q
    if k_norm is not None and float(k_norm[1]) != float(eps):
        raise ValueError(f"rope_qkv_write: q_norm eps {eps} and k_norm eps {k_norm[1]} differ")
    half = D // 2
    _rope_qkv_kernel[(B * T, H + Hkv)](
        q, k, v, cos, sin, qo, k_cache, v_cache, lengths, qw, kw, split_stride,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        qo.stride(0), qo.stride(1), qo.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        T, H, k_cache.shape[2], float(eps),
        NORM=q_norm is not None, HALF=half, BLOCK=triton.next_power_of_2(half), SPLITS=splits, num_warps=1,
        **pdl_args(q.device),
    )
    return qo


# -- rotary cos/sin tables -------------------------------------------------------------------------
@triton.jit
def _rotary_kernel(P, F, C, S, scale, HALF: tl.constexpr, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr,
                   PDL: tl.constexpr = False):
    if PDL:  # programmatic dependent launch (specdec.cuda.triton_pdl): wait before any load or store
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < HALF
    # torch: ``position_ids[..., None].float() * inv_freq``, ``cos() * attention_scaling`` in float32;
    # libdevice's cos/sin are the ones torch's CUDA kernels call (accurate range reduction: positions
    # reach 1e5 radians), not the approximate hardware instructions
    f = tl.load(P + row).to(tl.float32) * tl.load(F + c, mask=m, other=0.0)
    if LIBDEVICE:
        co = (libdevice.cos(f) * scale).to(C.dtype.element_ty)
        si = (libdevice.sin(f) * scale).to(S.dtype.element_ty)
    else:  # Triton's interpreter has no libdevice: numpy's float32 cos/sin
        co = (tl.cos(f) * scale).to(C.dtype.element_ty)
        si = (tl.sin(f) * scale).to(S.dtype.element_ty)
    base = row * 2 * HALF
    tl.store(C + base + c, co, mask=m)
    tl.store(C + base + HALF + c, co, mask=m)
    tl.store(S + base + c, si, mask=m)
    tl.store(S + base + HALF + c, si, mask=m)


def rotary_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor, scaling: float,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The Llama-family rotary embedding's ``(cos, sin)`` in one launch (Hugging Face's takes ~9).

    Args:
        position_ids: ``(B, T)`` integer positions.
        inv_freq: ``(D/2,)`` float32 inverse frequencies (the module's ``inv_freq`` buffer).
        scaling: the module's ``attention_scaling``.
        dtype: the output dtype (the hidden states').

    Returns:
        ``cos, sin``: ``(B, T, D)`` each, ``cat([c, c], -1)`` of ``cos(position · inv_freq) · scaling``.
    """
    if position_ids.dim() != 2 or position_ids.is_floating_point():
        raise ValueError(f"rotary_cos_sin: position_ids must be (B, T) integers, got {tuple(position_ids.shape)} "
                         f"{position_ids.dtype}")
    if inv_freq.dim() != 1 or inv_freq.dtype != torch.float32:
        raise ValueError(f"rotary_cos_sin: inv_freq must be a float32 vector, got {tuple(inv_freq.shape)} {inv_freq.dtype}")
    B, T = position_ids.shape
    half = inv_freq.shape[0]
    cos = torch.empty((B, T, 2 * half), dtype=dtype, device=position_ids.device)
    sin = torch.empty_like(cos)
    if B * T:
        _rotary_kernel[(B * T,)](position_ids.contiguous(), inv_freq, cos, sin, float(scaling), HALF=half,
                                 BLOCK=triton.next_power_of_2(half), LIBDEVICE=not _interpreted(), num_warps=1,
                                 **pdl_args(position_ids.device))
    return cos, sin


def _interpreted() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
