"""Triton kernel of Dustin's low-rank key ranking (``layer_scores="keys"``, :mod:`specdec.selectors.key_rank`).

:func:`lowrank_mass` gives, per (sequence, KV head) and cached position, the softmax attention mass the verify rows'
projected queries ``q P`` put on the projected keys ``k P``, summed over the KV group's query heads and rows; the
positions the per-layer part may not add are ``-inf``. One program per (sequence, KV head) reads its ``(C, r)`` row
of projected keys twice: once for each query row's maximum and normaliser (an online softmax), once for the mass.
The torch path (:meth:`~specdec.selectors.key_rank.KeyRankPlan.indices_for`) materialises the ``(B, H, G, T, C)``
logits and their softmax in float32; this reads ``2 · C · r`` key elements per row and writes ``C`` floats.
Its output feeds :func:`specdec.cuda.triton_select.select_top`.

This module imports nothing from specdec.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _lowrank_mass_kernel(QR, K, LENS, NEW, OUT, H, C, R, r, stride_kb, stride_kh, stride_kc,
                         BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)  # over (B, H) rows
    b = pid // H
    h = pid % H
    length = tl.load(LENS + b).to(tl.int32)
    rows = tl.arange(0, BLOCK_R)
    dims = tl.arange(0, BLOCK_D)
    rmask = rows < R
    dmask = dims < r
    qr = tl.load(QR + pid.to(tl.int64) * R * r + rows[:, None] * r + dims[None, :],
                 mask=rmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_R, BLOCK_D) float32, scaled
    kbase = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    z = tl.zeros((BLOCK_R,), tl.float32)
    for c0 in range(0, length, BLOCK_C):  # pass 1: each row's maximum and normaliser over the cached positions
        cs = c0 + tl.arange(0, BLOCK_C)
        seen = cs < length
        k = tl.load(kbase + cs[:, None].to(tl.int64) * stride_kc + dims[None, :],
                    mask=seen[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        s = tl.dot(qr, tl.trans(k), input_precision="ieee")  # (BLOCK_R, BLOCK_C)
        s = tl.where(seen[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), axis=1)
        m = m_new
    inv = tl.where(rmask & (z > 0), 1.0 / z, 0.0)  # padded rows weigh nothing
    m = tl.where(rmask & (z > 0), m, 0.0)
    obase = OUT + pid.to(tl.int64) * C
    for c0 in range(0, C, BLOCK_C):  # pass 2: the mass of every position (-inf where the part may not add it)
        cs = c0 + tl.arange(0, BLOCK_C)
        seen = cs < length
        k = tl.load(kbase + cs[:, None].to(tl.int64) * stride_kc + dims[None, :],
                    mask=seen[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        s = tl.dot(qr, tl.trans(k), input_precision="ieee")
        p = tl.exp(s - m[:, None]) * inv[:, None]
        mass = tl.sum(p, axis=0)  # (BLOCK_C,)
        ok = tl.load(NEW + b.to(tl.int64) * C + cs, mask=cs < C, other=0) != 0
        tl.store(obase + cs, tl.where(ok & seen, mass, float("-inf")), mask=cs < C)


def lowrank_mass(qr: torch.Tensor, keys: torch.Tensor, lengths: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``(B, H, C)`` float32: per (sequence, KV head) the softmax mass of the ``R`` query rows of ``qr`` over the
    projected keys of the first ``lengths[b]`` positions, summed over the rows; ``-inf`` where ``new`` is false or at
    ``lengths[b]`` and after.

    Args:
        qr: ``(B, H, R, r)`` float32, contiguous: the projected queries already multiplied by the softmax scale.
        keys: ``(B, H, C, r)`` projected keys in any float dtype, last dimension contiguous.
        lengths: ``(B,)`` cached positions per sequence.
        new: ``(B, C)`` bool, contiguous: the positions the per-layer part may add.
    """
    B, H, C, r = keys.shape
    R = qr.shape[2]
    if (qr.dtype != torch.float32 or not qr.is_contiguous() or qr.shape != (B, H, R, r) or keys.stride(-1) != 1
            or new.shape != (B, C) or not new.is_contiguous() or lengths.shape != (B,)):
        raise ValueError(f"lowrank_mass: want float32 contiguous qr (B, H, R, r), keys (B, H, C, r), new (B, C), "
                         f"lengths (B,); got qr {qr.dtype} {tuple(qr.shape)}, keys {tuple(keys.shape)}, "
                         f"new {tuple(new.shape)}, lengths {tuple(lengths.shape)}")
    out = torch.empty((B, H, C), dtype=torch.float32, device=keys.device)
    if B * H == 0 or C == 0:
        return out
    block_r = max(16, triton.next_power_of_2(R))
    block_d = max(16, triton.next_power_of_2(r))
    block_c = 64 if block_r <= 32 else 32
    _lowrank_mass_kernel[(B * H,)](qr, keys, lengths, new.view(torch.uint8), out, H, C, R, r,
                                   keys.stride(0), keys.stride(1), keys.stride(2),
                                   BLOCK_C=block_c, BLOCK_R=block_r, BLOCK_D=block_d, num_warps=4)
    return out
