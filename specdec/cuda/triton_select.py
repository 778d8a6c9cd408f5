"""Top-k selection of a budget plan in one Triton launch (opt-in: ``specdec.selectors.base.TRITON_SELECT``).

:meth:`~specdec.selectors.base.BudgetSelector.plan` picks, per (layer, sequence, head) row of scores, the
``room[b]`` best positions (``torch.topk`` of the plan's fixed ``k_sel`` slots, sorted, then the slots past
the sequence's ``room`` set to -1). At the embedded shape (30 layers x B 64 x 8k) that top-k is most of
Vegas' selection (0.56 of 0.65 ms per iteration, ``benchmarks/results/gpu_scores_2026-12-01c.md``).
Measured on the H200 (``benchmarks/results/gpu_select_2026-12-01d.md``): this kernel's plan takes 0.571 vs
0.585 ms with ``torch.topk`` (the same index sets) — no measurable gain, so it stays opt-in; that file lists
what would cut the time (fewer dependent passes per row, the head sum and the length mask fused in).

:func:`select_top` does it per row in one program: the row is loaded once, each score mapped to an int32
key ordered like the floats, the ``room``-th largest key found by bisection over the key range (32 counting
passes over registers, not over memory), then the positions with a larger key and, for ties at the
threshold, the lowest positions first (the documented tie-break; ``torch.topk`` leaves ties unspecified)
are written in position order into slots ``[0, room)``, and -1 into ``[room, k_sel)``. The same index SET as
the sorted top-k for distinct scores; the order within the slots is by position, not by score (the sparse
kernels read positions in any order). Rows of at most :data:`MAX_L` positions.

This module imports nothing from specdec.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: longest row one program holds in registers
MAX_L = 16384


@triton.jit
def _select_kernel(S, OUT, ROOM, L, k_sel, Hs, B, BLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    row = tl.program_id(0)  # over (N', B, Hs) rows
    b = (row // Hs) % B
    room = tl.minimum(tl.load(ROOM + b), k_sel).to(tl.int32)  # never past the row's k_sel slots
    offs = tl.arange(0, BLOCK)
    inb = offs < L
    x = tl.load(S + row.to(tl.int64) * L + offs, mask=inb, other=float("-inf"))
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order (no NaN)
    key = tl.where(inb, key, -2147483647 - 1)  # padding: below every score, -inf included
    lo = tl.full((), -2147483647 - 1, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    key64 = key.to(tl.int64)
    for _ in range(32):  # largest t with count(key >= t) >= room: the room-th largest key
        mid = (lo + hi + 1) // 2
        cnt = tl.sum((key64 >= mid).to(tl.int32), axis=0)
        ok = cnt >= room
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    gt = key64 > lo
    eq = key64 == lo
    need = room - tl.sum(gt.to(tl.int32), axis=0)
    tie = tl.where(eq, tl.cumsum(eq.to(tl.int32), axis=0) <= need, False)
    take = tl.where(inb & (gt | tie), room > 0, False)
    slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
    base = OUT + row.to(tl.int64) * k_sel
    tl.store(base + slot, offs.to(tl.int64), mask=take)
    ks = tl.arange(0, KBLOCK)
    tl.store(base + ks, tl.full((KBLOCK,), -1, tl.int64), mask=(ks >= room) & (ks < k_sel))


def select_top(s: torch.Tensor, k_sel: int, room: torch.Tensor) -> torch.Tensor:
    """Per row of ``s`` ``(N', B, Hs, L)`` the ``room[b]`` best positions (ascending), -1 after, ``(N', B, Hs, k_sel)``.

    Args:
        s: float32 scores, contiguous; blocked positions -inf (never picked while ``room[b]`` does not
            exceed the row's finite scores, which a budget plan guarantees).
        k_sel: slots per row (the plan's fixed size); ``room[b] <= k_sel``.
        room: ``(B,)`` picks per sequence.
    """
    if s.dim() != 4 or s.dtype != torch.float32 or not s.is_contiguous():
        raise ValueError(f"select_top: want contiguous float32 (N, B, Hs, L) scores, got {s.dtype} {tuple(s.shape)}")
    N, B, Hs, L = s.shape
    if L > MAX_L or room.shape != (B,):
        raise ValueError(f"select_top: rows of at most {MAX_L} positions and room of shape ({B},); "
                         f"got L {L}, room {tuple(room.shape)}")
    out = torch.empty((N, B, Hs, k_sel), dtype=torch.long, device=s.device)
    rows = N * B * Hs
    if rows and k_sel:
        block = triton.next_power_of_2(max(L, 16))
        _select_kernel[(rows,)](s, out, room, L, k_sel, Hs, B, BLOCK=block,
                                KBLOCK=triton.next_power_of_2(max(k_sel, 16)), num_warps=8 if block >= 4096 else 4)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The whole budget plan in one launch: head sum + length / sink / recent mask + radix select + the fixed positions.
# ---------------------------------------------------------------------------------------------------------------

#: positions one program holds in registers per chunk; longer rows go through a scratch buffer of int32 keys
CHUNK = 8192
#: bits resolved per radix pass (a histogram of 2**bits bins; 32 / bits passes). Triton's histogram costs about
#: log2(bins) ballots + bins / 32 popcounts per element, so 5 bits (32 bins, 7 passes) does ~1/4 of the work of 8
#: bits (256 bins, 4 passes) per element in all; benchmarks/gpu/r14_select.py sweeps it
RADIX_BITS = 5


@triton.jit
def _keys(S, sbase, stride_h, head0, HSUM: tl.constexpr, offs, L, length, sinks, recent):
    """int32 keys ordered like the fp32 head sums at ``offs``; blocked and padding positions get INT_MIN (below -inf)."""
    inb = offs < L
    x = tl.zeros(offs.shape, dtype=tl.float32)  # +0.0: the sum makes -0.0 +0.0 (equal zeros are one key)
    for h in tl.static_range(HSUM):  # the head sum in fp32, head by head (torch.sum(dim=2)'s order)
        x += tl.load(S + sbase + (head0 + h).to(tl.int64) * stride_h + offs, mask=inb, other=0.0).to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order (no NaN)
    ok = inb & (offs < length) & (offs >= sinks) & (offs < length - recent)
    return tl.where(ok, key, -2147483647 - 1)


@triton.jit
def _digit(h, bins, need, prefix, SHIFT: tl.constexpr):
    """The digit at SHIFT of the need-th largest key among the counted ones: (prefix with it, need left)."""
    ge = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h  # keys with digit >= bin
    d = tl.sum((ge >= need).to(tl.int32), axis=0) - 1
    above = tl.sum(tl.where(bins > d, h, 0), axis=0)
    return prefix | (d << SHIFT), need - above


@triton.jit
def _plan_kernel(S, OUT, DENSE, LENS, RATIO, SCRATCH, stride_n, stride_b, stride_h, L, k_sel, Hs, B, n_rows,
                 sinks, recent, budget_abs, min_budget,
                 USE_RATIO: tl.constexpr, HSUM: tl.constexpr, F: tl.constexpr, FBLOCK: tl.constexpr,
                 BLOCK: tl.constexpr, NCHUNK: tl.constexpr, KBLOCK: tl.constexpr, ROWS: tl.constexpr,
                 BITS: tl.constexpr, NB: tl.constexpr, PASSES: tl.constexpr, EXTRA: tl.constexpr):
    # radix passes of BITS bits from the top (histograms of NB = 2**BITS bins); the last pass resolves BITS - EXTRA
    bins = tl.arange(0, NB)
    offs0 = tl.arange(0, BLOCK)
    W = F + k_sel
    for r in range(ROWS):
        row = tl.minimum(tl.program_id(0) * ROWS + r, n_rows - 1)  # a last short program redoes the last row
        hs = row % Hs
        b = (row // Hs) % B
        n = row // (Hs * B)
        length = tl.load(LENS + b).to(tl.int64)
        # budget_for + fixed_positions of specdec.selectors.base, per sequence
        if USE_RATIO:
            q = length.to(tl.float64) * tl.load(RATIO)
            k = q.to(tl.int64)
            k = k + (k.to(tl.float64) < q).to(tl.int64)  # ceil
            k = tl.maximum(k, min_budget)
        else:
            k = length * 0 + budget_abs
        budget = tl.minimum(k, length)
        s_ = tl.minimum(budget * 0 + sinks, budget)
        r_ = tl.minimum(budget * 0 + recent, budget - s_)
        f = tl.arange(0, FBLOCK)
        i = f - sinks
        rec = length - recent + i
        fix = tl.where(f < sinks, tl.where(f < s_, f.to(tl.int64), -1),
                       tl.where((i >= recent - r_) & (rec >= s_), rec, -1))
        obase = OUT + row.to(tl.int64) * W
        tl.store(obase + f, fix, mask=f < F)
        used = tl.sum(((fix >= 0) & (f < F)).to(tl.int64), axis=0)
        room = tl.minimum(tl.maximum(budget - used, 0), k_sel).to(tl.int32)
        if (n == 0) & (hs == 0):
            tl.store(DENSE + b, length)
        sbase = n.to(tl.int64) * stride_n + b.to(tl.int64) * stride_b
        head0 = hs * HSUM
        if NCHUNK == 1:  # the row in registers
            key = _keys(S, sbase, stride_h, head0, HSUM, offs0, L, length, sinks, recent)
            valid = key != -2147483647 - 1
            room = tl.minimum(room, tl.sum(valid.to(tl.int32), axis=0))
            ukey = key ^ (-2147483647 - 1)  # unsigned order as bits
            prefix = tl.zeros((), tl.int32)
            need = room
            for p in tl.static_range(PASSES):  # radix select, BITS a pass from the top: the room-th largest key
                HI = 32 - BITS * p  # (constexpr) the bits above HI are fixed by the earlier passes
                WIDTH = BITS - (p == PASSES - 1) * EXTRA  # (constexpr) the digit's width
                m = valid
                if p > 0:
                    m = m & ((ukey & (-(1 << HI))) == prefix)
                dig = tl.where(m, (ukey >> (HI - WIDTH)) & ((1 << WIDTH) - 1), 0)
                h = tl.histogram(dig, NB) - tl.where(bins == 0, BLOCK - tl.sum(m.to(tl.int32), axis=0), 0)
                prefix, need = _digit(h, bins, need, prefix, HI - WIDTH)
            thr = prefix ^ (-2147483647 - 1)
            eq = valid & (key == thr)
            tie = eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need)  # ties at the threshold: lowest positions first
            take = tl.where((valid & (key > thr)) | tie, room > 0, False)  # (a where: the interpreter's bool & scalar is int32)
            slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(obase + F + slot, offs0.to(tl.int64), mask=take & (slot < room))  # (never past the room)
        else:  # longer rows: keys through SCRATCH (n_rows, NCHUNK * BLOCK) int32, one pass per digit
            kbase = SCRATCH + row.to(tl.int64) * (NCHUNK * BLOCK)
            h = tl.zeros((NB,), tl.int32)
            nvalid = tl.zeros((), tl.int32)
            for c in range(NCHUNK):
                offs = c * BLOCK + offs0
                key = _keys(S, sbase, stride_h, head0, HSUM, offs, L, length, sinks, recent)
                tl.store(kbase + offs, key)
                m = key != -2147483647 - 1
                nvalid += tl.sum(m.to(tl.int32), axis=0)
                dig = tl.where(m, ((key ^ (-2147483647 - 1)) >> (32 - BITS)) & (NB - 1), 0)
                h += tl.histogram(dig, NB) - tl.where(bins == 0, BLOCK - tl.sum(m.to(tl.int32), axis=0), 0)
            room = tl.minimum(room, nvalid)
            prefix, need = _digit(h, bins, room, tl.zeros((), tl.int32), 32 - BITS)
            for p in tl.static_range(1, PASSES):
                HI = 32 - BITS * p
                WIDTH = BITS - (p == PASSES - 1) * EXTRA
                h = tl.zeros((NB,), tl.int32)
                for c in range(NCHUNK):
                    ukey = tl.load(kbase + c * BLOCK + offs0) ^ (-2147483647 - 1)
                    m = (ukey != 0) & ((ukey & (-(1 << HI))) == prefix)
                    dig = tl.where(m, (ukey >> (HI - WIDTH)) & ((1 << WIDTH) - 1), 0)
                    h += tl.histogram(dig, NB) - tl.where(bins == 0, BLOCK - tl.sum(m.to(tl.int32), axis=0), 0)
                prefix, need = _digit(h, bins, need, prefix, HI - WIDTH)
            thr = prefix ^ (-2147483647 - 1)
            ties = tl.zeros((), tl.int32)
            taken = tl.zeros((), tl.int32)
            for c in range(NCHUNK):
                offs = c * BLOCK + offs0
                key = tl.load(kbase + offs)
                valid = key != -2147483647 - 1
                eq = valid & (key == thr)
                tie = eq & (ties + tl.cumsum(eq.to(tl.int32), axis=0) <= need)
                take = tl.where((valid & (key > thr)) | tie, room > 0, False)
                slot = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
                tl.store(obase + F + slot, offs.to(tl.int64), mask=take & (slot < room))
                ties += tl.sum(eq.to(tl.int32), axis=0)
                taken += tl.sum(take.to(tl.int32), axis=0)
        ks = tl.arange(0, KBLOCK)
        tl.store(obase + F + ks, tl.full((KBLOCK,), -1, tl.int64), mask=(ks >= room) & (ks < k_sel))


_RATIOS: dict = {}


def _ratio(r: float, device: torch.device) -> torch.Tensor:
    """The budget ratio as a float64 device scalar, made once (fp64 like ``BudgetConfig.budget_for``'s product)."""
    key = (float(r), str(device))
    t = _RATIOS.get(key)
    if t is None:
        t = _RATIOS[key] = torch.tensor([float(r)], dtype=torch.float64, device=device)
    return t


def select_plan(scores: torch.Tensor, lengths: torch.Tensor, k_sel: int, *, sinks: int, recent: int,
                budget: int | None = None, budget_ratio: float | None = None, min_budget: int = 0,
                sum_heads: bool = False, rows_per_program: int = 1, num_warps: int | None = None,
                chunk: int = CHUNK, radix_bits: int = RADIX_BITS) -> tuple[torch.Tensor, torch.Tensor]:
    """A budget plan's indices in one launch: what :meth:`~specdec.selectors.base.BudgetSelector.plan` builds.

    Per (layer, sequence, head) row: the head sum (``sum_heads``: the ``H`` heads of ``scores`` summed in fp32 into
    one row, Vegas' ``on_verify``), the budget of the sequence (``budget`` or ``max(min_budget,
    ceil(budget_ratio * length))``, at most the length), the sinks and the recent window as in
    :func:`~specdec.selectors.base.fixed_positions`, then the ``room`` best positions among
    ``[sinks, length - recent)`` by a radix select (passes of ``radix_bits`` bits from the top over int32 keys
    ordered like the floats; ties at the threshold: the lowest positions), written in position order, -1 in the
    slots past the room. Rows longer than ``chunk`` positions keep their keys in an int32 scratch buffer.

    Args:
        scores: ``(N', B, H, L)`` float32 / bfloat16 / float16, the last dimension contiguous (any other strides:
            the views of one emitted buffer are read in place).
        lengths: ``(B,)`` int64 cached positions per sequence (``<= L``).
        k_sel: top-k slots per row (the plan's fixed size).

    Returns:
        ``indices`` ``(N', B, 1 if sum_heads else H, sinks + recent + k_sel)`` int64 and ``dense_from`` ``(B,)``
        (a copy of ``lengths``).
    """
    if scores.dim() != 4 or scores.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"select_plan: want (N, B, H, L) float scores, got {scores.dtype} {tuple(scores.shape)}")
    if (budget is None) == (budget_ratio is None):
        raise ValueError("select_plan: pass exactly one of budget and budget_ratio")
    if not 4 <= int(radix_bits) <= 8:
        raise ValueError(f"select_plan: radix_bits must be 4..8 (histograms of 16..256 bins), got {radix_bits}")
    N, B, H, L = scores.shape
    if lengths.shape != (B,):
        raise ValueError(f"select_plan: lengths of shape ({B},) wanted, got {tuple(lengths.shape)}")
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    Hs, hsum = (1, H) if sum_heads else (H, 1)
    F = sinks + recent
    out = torch.empty((N, B, Hs, F + k_sel), dtype=torch.long, device=scores.device)
    dense = torch.empty_like(lengths)
    n_rows = N * B * Hs
    if n_rows == 0:
        return out, lengths.clone()
    block = min(triton.next_power_of_2(max(L, 16)), chunk)
    nchunk = triton.cdiv(L, block)
    scratch = (torch.empty((n_rows, nchunk * block), dtype=torch.int32, device=scores.device) if nchunk > 1
               else out)  # unused with one chunk
    ratio = _ratio(budget_ratio if budget_ratio is not None else 0.0, scores.device)
    rows = max(1, int(rows_per_program))
    bits = int(radix_bits)
    passes = -(-32 // bits)
    _plan_kernel[(triton.cdiv(n_rows, rows),)](
        scores, out, dense, lengths, ratio, scratch, scores.stride(0), scores.stride(1), scores.stride(2), L, k_sel,
        Hs, B, n_rows, sinks, recent, 0 if budget is None else int(budget), int(min_budget),
        USE_RATIO=budget is None, HSUM=hsum, F=F, FBLOCK=triton.next_power_of_2(max(F, 2)), BLOCK=block,
        NCHUNK=nchunk, KBLOCK=triton.next_power_of_2(max(k_sel, 16)), ROWS=rows, BITS=bits, NB=1 << bits,
        PASSES=passes, EXTRA=bits * passes - 32,
        num_warps=num_warps or (8 if block >= 4096 else 4))
    return out, dense
