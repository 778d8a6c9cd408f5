"""The MLP half of a decoder layer in ONE launch: a persistent kernel with a grid barrier (an experiment).

Measured slower than the launches it replaces (``benchmarks/results/gpu_mega_mlp_2026-12-04.md``), so it is not
part of the package: ``benchmarks/gpu/mega14.py`` times it.

At decode sizes a small model's step is hundreds of launches of a few microseconds each (SmolLM2-135M,
B 64 x 8k: a sparse draft step ran ~320 launches in 1.56 ms where its bytes take ~0.2 ms). The fused
layer of :mod:`specdec.fusion` runs its MLP half as ``residual add + RMSNorm -> gate/up GEMM -> SiLU·mul ->
down GEMM``: with :data:`specdec.fusion.FUSED_GEMM` two launches (:func:`specdec.cuda.triton_gemm.norm_gate_up_silu`
and the down GEMM). Here both run in one launch of one program per SM:

1. every program takes tiles ``(row block, column block)`` of ``act = silu(gate) * up`` of the normed rows
   (the prologue of :func:`~specdec.cuda.triton_gemm.norm_gate_up_silu`: ``r = residual + sum(partials)``, the
   norm's ``1 / rms`` applied to the GEMM's float32 sums) and stores them;
2. a **grid barrier** (an arrival counter in global memory, release / acquire at GPU scope: the programs are
   all resident at once, one per SM, so none waits for a program that cannot start);
3. every program takes tiles ``(split, row block, column block)`` of the down GEMM, split over its input dim
   into ``splits`` partial sums ``(splits, M, hidden)`` rounded to the model dtype — the handoff the next
   layer's input norm adds (:func:`specdec.fusion.set_gemm_splits` ``down=``) — or, with ``splits = 1``, the
   output ``r + down(act)`` itself.

The last program to leave resets the counters, so one buffer serves every launch on a stream, CUDA-graph
replays included. Under Triton's CPU interpreter the programs run one after another and a barrier would
wait forever, so there (and with ``one_launch=False``) the two phases are two launches of the same kernel.

This module imports nothing from specdec but :mod:`specdec.cuda.triton_gemm`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdec.cuda.triton_gemm import _block_m, _check, _dot, _inputs, _scaled_chunk

#: launch configuration (``block_n1``: act columns per tile; ``block_n2`` / ``block_k2``: the down GEMM's output
#: columns per tile and its K block; ``block_k1``: the gate/up GEMM's K block)
TUNE = dict(block_n1=32, block_k1=64, block_n2=32, block_k2=64, num_warps=4)

_COUNTERS: dict[str, torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """``(2,)`` int32 zeros per device: arrivals at the barrier, departures (each launch leaves them 0 again)."""
    key = str(device)
    buf = _COUNTERS.get(key)
    if buf is None:
        buf = _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _grid_barrier(Ctr, P):
    """Wait until all ``P`` programs arrived (every program calls it once per launch)."""
    tl.debug_barrier()  # this program's stores are done before it arrives
    tl.atomic_add(Ctr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(Ctr, 0, sem="acquire", scope="gpu")
    while seen < P:
        seen = tl.atomic_add(Ctr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _mlp_kernel(
    X, Res, RO, NW, WGU, WD, Act, Out, Ctr,
    sx, ss, sr, so, sos,
    M, K, I, eps, P,
    HAS_RES: tl.constexpr, SPLITS: tl.constexpr, DSPLITS: tl.constexpr, PHASES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr, BLOCK_K2: tl.constexpr, IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    dt = X.dtype.element_ty
    m_blocks = tl.cdiv(M, BLOCK_M)
    if PHASES != 2:  # phase 1: act = silu(gate) * up of rmsnorm(residual + sum(partials))
        n1 = tl.cdiv(I, BLOCK_N1)
        for t in range(pid, m_blocks * n1, P):
            pm = t // n1
            pn = t % n1
            rows = (pm * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            rmask = rows < M
            cols = (pn * BLOCK_N1 + tl.arange(0, BLOCK_N1)).to(tl.int64)
            nmask = cols < I
            acc_g = tl.zeros([BLOCK_M, BLOCK_N1], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_N1], dtype=tl.float32)
            ssq = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K1):
                kk = k0 + tl.arange(0, BLOCK_K1)
                h, sq = _scaled_chunk(X, Res, RO, NW, rows, kk, rmask, sx, ss, sr, so, K, pn == 0, HAS_RES, SPLITS)
                ssq += sq
                wm = (kk < K)[:, None] & nmask[None, :]
                wg = tl.load(WGU + cols[None, :] * K + kk[:, None], mask=wm, other=0.0)
                wu = tl.load(WGU + (cols + I)[None, :] * K + kk[:, None], mask=wm, other=0.0)
                acc_g = _dot(h, wg, acc_g, IEEE)
                acc_u = _dot(h, wu, acc_u, IEEE)
            rstd = 1.0 / tl.sqrt(ssq / K + eps)
            g = (acc_g * rstd[:, None]).to(dt).to(tl.float32)  # the projection's outputs, rounded as the GEMM's
            u = (acc_u * rstd[:, None]).to(dt)
            a = (g / (1.0 + tl.exp(-g))).to(dt)
            y = (a.to(tl.float32) * u.to(tl.float32)).to(dt)
            tl.store(Act + rows[:, None] * I + cols[None, :], y, mask=rmask[:, None] & nmask[None, :])
    if PHASES == 0:
        _grid_barrier(Ctr, P)
    if PHASES != 1:  # phase 2: the down GEMM, split over its input dim (partials) or + residual (one split)
        n2 = tl.cdiv(K, BLOCK_N2)
        per = I // DSPLITS
        for t in range(pid, DSPLITS * m_blocks * n2, P):
            s = t // (m_blocks * n2)
            r = t % (m_blocks * n2)
            pm = r // n2
            pn = r % n2
            rows = (pm * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            rmask = rows < M
            cols = (pn * BLOCK_N2 + tl.arange(0, BLOCK_N2)).to(tl.int64)
            nmask = cols < K
            acc = tl.zeros([BLOCK_M, BLOCK_N2], dtype=tl.float32)
            for k0 in range(0, per, BLOCK_K2):
                kk = (s * per + k0 + tl.arange(0, BLOCK_K2)).to(tl.int64)
                kmask = (k0 + tl.arange(0, BLOCK_K2)) < per
                a = tl.load(Act + rows[:, None] * I + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0,
                            cache_modifier=".cg")  # written by other programs before the barrier: not from L1
                w = tl.load(WD + cols[None, :] * I + kk[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0)
                acc = _dot(a, w, acc, IEEE)
            omask = rmask[:, None] & nmask[None, :]
            if DSPLITS == 1:  # out = r + down(act), r the new residual (recomputed here: rounded as phase 1 stored it)
                rr = tl.load(RO + rows[:, None] * so + cols[None, :], mask=omask, other=0.0,
                             cache_modifier=".cg").to(tl.float32)
                y = (rr + acc.to(dt).to(tl.float32)).to(dt)
                tl.store(Out + rows[:, None] * so + cols[None, :], y, mask=omask)
            else:
                tl.store(Out + s * sos + rows[:, None] * so + cols[None, :], acc.to(dt), mask=omask)
    if PHASES == 0:  # the last program out resets the counters for the next launch on the stream
        if tl.atomic_add(Ctr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:
            tl.atomic_xchg(Ctr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(Ctr + 1, 0, sem="relaxed", scope="gpu")


def _programs(device: torch.device, tiles: int) -> int:
    if device.type != "cuda":
        return max(1, min(tiles, 4))
    return max(1, min(tiles, torch.cuda.get_device_properties(device).multi_processor_count))


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def mlp_one_launch(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, w_gate_up: torch.Tensor,
                   w_down: torch.Tensor, residual: torch.Tensor, splits: int = 1, down_splits: int = 1,
                   one_launch: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``r = residual + sum(x)``; ``out = r + down(silu(gate(n)) * up(n))`` with ``n = rmsnorm(r)``.

    Args:
        x: ``(..., K)`` the attention's output (``splits > 1``: ``(splits, ..., K)`` partial sums of a split o_proj).
        norm_weight, eps: the post-attention RMSNorm.
        w_gate_up: ``(2I, K)`` ``cat([gate, up])``; w_down: ``(K, I)``; contiguous, no biases.
        residual: ``(..., K)`` the residual stream.
        down_splits: 1: ``out`` is the layer's output; ``S > 1``: ``out`` is ``(S, ..., K)``, the down GEMM's partial
            sums over S slices of ``I`` (each rounded to the model dtype), for the next layer's norm to add to ``r``.
        one_launch: ``None``: one launch with the grid barrier on a GPU, two launches under the interpreter.

    Returns:
        ``(out, r)``.
    """
    name = "mlp_one_launch"
    two_i, K = w_gate_up.shape
    _check(name, x, norm_weight, w_gate_up, w_down)
    I = two_i // 2
    if two_i % 2 or w_down.shape != (K, I) or norm_weight.shape != (K,):
        raise ValueError(f"{name}: weights gate_up {tuple(w_gate_up.shape)}, down {tuple(w_down.shape)} do not fit")
    if down_splits < 1 or I % down_splits:
        raise ValueError(f"{name}: down_splits={down_splits} must divide the intermediate size {I}")
    x2, split_stride, r2, ro, ro2, shape = _inputs(x, residual, splits, K, name)
    M = x2.shape[0]
    act = torch.empty((M, I), dtype=x.dtype, device=x.device)
    out_shape = shape if down_splits == 1 else (down_splits, *shape)
    out = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if not M:
        return out, ro
    cfg = TUNE
    bm = _block_m(M)
    mb = triton.cdiv(M, bm)
    tiles = max(mb * triton.cdiv(I, cfg["block_n1"]), down_splits * mb * triton.cdiv(K, cfg["block_n2"]))
    P = _programs(x.device, tiles)
    if one_launch is None:
        one_launch = x.device.type == "cuda" and not _interpreted()
    ctr = _counters(x.device)
    args = (x2, r2, ro2, norm_weight, w_gate_up, w_down, act, out, ctr,
            x2.stride(0), split_stride, r2.stride(0), ro2.stride(0), M * K, M, K, I, float(eps), P)
    meta = dict(HAS_RES=True, SPLITS=splits, DSPLITS=down_splits, BLOCK_M=bm, BLOCK_N1=cfg["block_n1"],
                BLOCK_K1=cfg["block_k1"], BLOCK_N2=cfg["block_n2"], BLOCK_K2=cfg["block_k2"],
                IEEE=x.dtype == torch.float32 or x.device.type != "cuda", num_warps=cfg["num_warps"])
    for phases in ((0,) if one_launch else (1, 2)):
        _mlp_kernel[(P,)](*args, PHASES=phases, **meta)
    return out, ro
