"""Triton kernel: write the new keys *and* values of one layer into the KV cache in one launch.

The torch path of :meth:`specdec.cache.KVCache.write` costs five kernels per layer on a GPU (two
``arange``, an ``add`` for the positions, one ``index_put`` each for K and V); at decode sizes each
is a ~2–4 µs launch. Here one program writes a tile of ``(KV head, row)`` pairs of one sequence for
K and V together, reading the position ``lengths[b] + t`` on the device: no host synchronisation,
no allocation, launch size a function of shapes only (CUDA-graph capturable).

Rows whose position falls outside ``[0, capacity)`` are not written (the caller's capacity check
refuses such writes before they get here, unless the cache is ``bounded`` or the forward is static).

This module imports nothing from specdec (like :mod:`specdec.cuda.triton_attention`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    K, V, KC, VC, Lens,
    skb, skh, skt, skd,
    svb, svh, svt, svd,
    scb, sch, scl, scd,
    swb, swh, swl, swd,
    L, T, HT,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # packed row r = h * T + t
    h = (r // T).to(tl.int64)
    t = r % T
    d = tl.arange(0, BLOCK_D).to(tl.int64)
    pos = tl.load(Lens + b).to(tl.int64) + t
    ok = (r < HT) & (pos >= 0) & (pos < L)
    m = ok[:, None] & (d < D)[None, :]
    t64 = t.to(tl.int64)
    k = tl.load(K + b * skb + h[:, None] * skh + t64[:, None] * skt + d[None, :] * skd, mask=m)
    v = tl.load(V + b * svb + h[:, None] * svh + t64[:, None] * svt + d[None, :] * svd, mask=m)
    tl.store(KC + b * scb + h[:, None] * sch + pos[:, None] * scl + d[None, :] * scd,
             k.to(KC.dtype.element_ty), mask=m)
    tl.store(VC + b * swb + h[:, None] * swh + pos[:, None] * swl + d[None, :] * swd,
             v.to(VC.dtype.element_ty), mask=m)


def kv_write(k_cache: torch.Tensor, v_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             lengths: torch.Tensor) -> None:
    """``k_cache[b, h, lengths[b] + t] = key[b, h, t]`` (and the same for V) in one launch.

    Args:
        k_cache: ``(B, H_kv, L, D)`` one layer of the cache's keys (any strides: a
            :meth:`~specdec.cache.KVCache.rows` view is a non-contiguous batch slice).
        v_cache: the same for the values.
        key: ``(B, H_kv, T, D)`` new keys (any strides, e.g. slices of a fused QKV projection).
        value: ``(B, H_kv, T, D)`` new values, likewise. Entries of another dtype than the cache are converted by ``Tensor.to``
            first (one more kernel; specdec's caches have the model's dtype, so it never happens
            there): the kernel itself only moves bits, so it is bit-identical to torch indexing
            on every device (Triton's CPU interpreter truncates fp32 -> bf16 instead of rounding).
        lengths: ``(B,)`` integer tokens cached before this write (read on the device).
    """
    B, Hkv, T, D = key.shape
    if tuple(value.shape) != (B, Hkv, T, D):
        raise ValueError(f"kv_write: value shape {tuple(value.shape)} differs from key shape {tuple(key.shape)}")
    if k_cache.shape[:2] != (B, Hkv) or k_cache.shape[3] != D or v_cache.shape != k_cache.shape:
        raise ValueError(f"kv_write: cache shape {tuple(k_cache.shape)} does not hold keys of shape {tuple(key.shape)}")
    if lengths.shape != (B,):
        raise ValueError(f"kv_write: lengths shape {tuple(lengths.shape)} is not ({B},)")
    if B == 0 or T == 0:
        return
    if key.dtype != k_cache.dtype:
        key = key.to(k_cache.dtype)
    if value.dtype != v_cache.dtype:
        value = value.to(v_cache.dtype)
    HT = Hkv * T
    block_r = min(32, max(2, triton.next_power_of_2(HT)))  # >= 2: no size-1 blocks
    block_d = triton.next_power_of_2(D)
    _kv_write_kernel[(B, triton.cdiv(HT, block_r))](
        key, value, k_cache, v_cache, lengths,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        k_cache.shape[2], T, HT,
        BLOCK_R=block_r, BLOCK_D=block_d, D=D,
        num_warps=1 if block_r * block_d <= 1024 else 4,
    )
