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
    # never past the row's k_sel slots, nor past its L positions (the slots after them get -1)
    room = tl.minimum(tl.minimum(tl.load(ROOM + b), k_sel), L).to(tl.int32)
    base = OUT + row.to(tl.int64) * k_sel
    if room > 0:  # (a row without room -- a finished sequence's -- reads nothing: its slots are all -1)
        offs = tl.arange(0, BLOCK)
        inb = offs < L
        x = tl.load(S + row.to(tl.int64) * L + offs, mask=inb, other=float("-inf"))
        bits = x.to(tl.int32, bitcast=True)
        key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order (no NaN)
        key = tl.where(inb, key, -2147483647 - 1)  # padding: below every score, -inf included
        # largest t with count(key >= t) >= room (the room-th largest key), by bisection over the keys as uint32
        # (padding 0, -inf 0x007FFFFF, +inf 0xFF800000: +inf's is the largest, so mid never wraps)
        ukey = (key ^ (-2147483647 - 1)).to(tl.uint32, bitcast=True)
        lo = tl.full((), 0, tl.uint32)
        hi = tl.full((), 0xFF800000, tl.uint32)
        for _ in range(32):
            mid = lo + ((hi - lo) >> 1) + 1  # hi == lo: mid = hi + 1 fails and keeps lo
            cnt = tl.sum((ukey >= mid).to(tl.int32), axis=0)
            ok = cnt >= room
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        gt = ukey > lo
        eq = ukey == lo
        need = room - tl.sum(gt.to(tl.int32), axis=0)
        tie = tl.where(eq, tl.cumsum(eq.to(tl.int32), axis=0) <= need, False)
        take = tl.where(inb & (gt | tie), room > 0, False)
        slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
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
                                KBLOCK=triton.next_power_of_2(max(k_sel, 16)), num_warps=4)  # 4 or 8: equal (H100)
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
def _budget_room(LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel, USE_RATIO: tl.constexpr,
                 F: tl.constexpr, FBLOCK: tl.constexpr):
    """budget_for + fixed_positions of specdec.selectors.base for sequence ``b``: ``(length, fixed (FBLOCK,), room)``
    -- the fixed positions (-1: none) and how many top-k slots are left for the selection (at most ``k_sel``)."""
    length = tl.load(LENS + b).to(tl.int64)
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
    used = tl.sum(((fix >= 0) & (f < F)).to(tl.int64), axis=0)
    room = tl.minimum(tl.maximum(budget - used, 0), k_sel).to(tl.int32)
    return length, fix, room


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
        length, fix, room = _budget_room(LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel, USE_RATIO, F,
                                         FBLOCK)
        f = tl.arange(0, FBLOCK)
        obase = OUT + row.to(tl.int64) * W
        tl.store(obase + f, fix, mask=f < F)
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


# ---------------------------------------------------------------------------------------------------------------
# "radix16": the plan over 16-bit keys, each row split over several programs (4 short launches instead of one long).
# ---------------------------------------------------------------------------------------------------------------
#
# The fused plan above is latency-bound (H200, 30 layers x B 64 x 8k: 0.57 ms for a 0.044 ms read): one program per
# row runs 7 dependent histogram passes over 8,016 positions. Here a row's positions are split in chunks of
# ``block`` (one program each) and its key has 16 bits, the top half of the fp32 order key (sign, exponent and the
# 7 high mantissa bits: the bf16 of the score rounded toward -inf in magnitude order), so the threshold takes two
# 8-bit digits:
#
#   1. ``_r16_keys``    (row, chunk): head sum, mask, 16-bit keys into an int16 scratch; histogram of the high byte
#                       added into the row's 256 bins (integer atomics: the same totals in any order); chunk 0 writes
#                       the fixed positions and ``dense_from``.
#   2. ``_r16_low``     (row, chunk): the high digit d1 from the row's totals; per chunk, the histogram of the low
#                       byte among keys with high byte d1, and the count of keys with a higher high byte.
#   3. ``_r16_row``     (row): the low digit d2 (threshold key t = d1.d2), how many keys equal to t are taken, and per
#                       chunk the picks and ties before it (exclusive prefix sums); -1 into the slots past the room.
#   4. ``_r16_write``   (row, chunk): positions with key > t, and keys == t while the row's ties taken so far (lowest
#                       positions first) are below the need, written in position order at their prefix slots.
#
# Semantics (documented in select_plan16): the picked set equals the exact top-``room`` (torch.topk's) for every
# position whose 16-bit key differs from the threshold's; inside the boundary bucket (fp32 scores equal in their top
# 16 order bits) the lowest positions are taken. Deterministic: no float atomics, no order-dependent slot.

#: largest number of chunks a row is split into (the row kernel holds chunks x 256 counts)
R16_MAX_CHUNKS = 16
#: default positions per program
R16_BLOCK = 1024
#: largest block / top-k slot row one program holds (Triton's largest tensor, ``TRITON_MAX_TENSOR_NUMEL``)
R16_MAX_BLOCK = 1 << 20
_SENT16 = -32768  # blocked / padding key (every fp32 score but one NaN pattern maps above it)


@triton.jit
def _r16_keys(S, K16, H1, OUT, DENSE, LENS, RATIO, stride_n, stride_b, stride_h, L, k_sel, Hs, B, LP,
              sinks, recent, budget_abs, min_budget, USE_RATIO: tl.constexpr, HSUM: tl.constexpr, F: tl.constexpr,
              FBLOCK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    hs = row % Hs
    b = (row // Hs) % B
    n = row // (Hs * B)
    length, fix, room = _budget_room(LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel, USE_RATIO, F, FBLOCK)
    if c == 0:
        f = tl.arange(0, FBLOCK)
        tl.store(OUT + row.to(tl.int64) * (F + k_sel) + f, fix, mask=f < F)
        if (n == 0) & (hs == 0):
            tl.store(DENSE + b, length)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    sbase = n.to(tl.int64) * stride_n + b.to(tl.int64) * stride_b
    key = _keys(S, sbase, stride_h, hs * HSUM, HSUM, offs, L, length, sinks, recent)
    k16 = key >> 16  # arithmetic: the top 16 bits, same order; blocked INT_MIN -> -32768
    tl.store(K16 + row.to(tl.int64) * LP + offs, k16.to(tl.int16))
    valid = k16 != -32768
    hi = tl.where(valid, (k16 >> 8) + 128, 0)  # the high byte of the unsigned key, 0..255
    bins = tl.arange(0, 256)
    h = tl.histogram(hi, 256) - tl.where(bins == 0, BLOCK - tl.sum(valid.to(tl.int32), axis=0), 0)
    tl.atomic_add(H1 + row.to(tl.int64) * 256 + bins, h, mask=h != 0, sem="relaxed")  # a few binades: few bins


@triton.jit
def _r16_digit1(H1, row, LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel,
                USE_RATIO: tl.constexpr, F: tl.constexpr, FBLOCK: tl.constexpr):
    """(room, d1, need after d1) of a row from its high-byte totals."""
    bins = tl.arange(0, 256)
    h1 = tl.load(H1 + row.to(tl.int64) * 256 + bins)
    _, _, room = _budget_room(LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel, USE_RATIO, F, FBLOCK)
    room = tl.minimum(room, tl.sum(h1, axis=0))
    d1, need = _digit(h1, bins, room, tl.zeros((), tl.int32), 0)
    return room, d1, need


@triton.jit
def _r16_low(K16, H1, H2C, G1C, LENS, RATIO, k_sel, Hs, B, LP, NC, sinks, recent, budget_abs, min_budget,
             USE_RATIO: tl.constexpr, F: tl.constexpr, FBLOCK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    b = (row // Hs) % B
    room, d1, need = _r16_digit1(H1, row, LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel,
                                 USE_RATIO, F, FBLOCK)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    k16 = tl.load(K16 + row.to(tl.int64) * LP + offs).to(tl.int32)
    valid = k16 != -32768
    hi = (k16 >> 8) + 128
    m = valid & (hi == d1)
    bins = tl.arange(0, 256)
    h = tl.histogram(tl.where(m, k16 & 255, 0), 256) - tl.where(bins == 0, BLOCK - tl.sum(m.to(tl.int32), axis=0), 0)
    cell = row.to(tl.int64) * NC + c
    tl.store(H2C + cell * 256 + bins, h)
    tl.store(G1C + cell, tl.sum((valid & (hi > d1)).to(tl.int32), axis=0))


@triton.jit
def _r16_row(H1, H2C, G1C, META, OUT, LENS, RATIO, k_sel, Hs, B, NC, sinks, recent, budget_abs, min_budget,
             USE_RATIO: tl.constexpr, F: tl.constexpr, FBLOCK: tl.constexpr, NCB: tl.constexpr,
             KBLOCK: tl.constexpr):
    row = tl.program_id(0)
    b = (row // Hs) % B
    room, d1, need = _r16_digit1(H1, row, LENS, RATIO, b, sinks, recent, budget_abs, min_budget, k_sel,
                                 USE_RATIO, F, FBLOCK)
    cs = tl.arange(0, NCB)
    bins = tl.arange(0, 256)
    cok = cs < NC
    cell = row.to(tl.int64) * NC + cs
    h2c = tl.load(H2C + cell[:, None] * 256 + bins[None, :], mask=cok[:, None], other=0)  # (NCB, 256)
    d2, need = _digit(tl.sum(h2c, axis=0), bins, need, tl.zeros((), tl.int32), 0)  # need: ties at t to take
    gt = tl.load(G1C + cell, mask=cok, other=0) + tl.sum(tl.where(bins[None, :] > d2, h2c, 0), axis=1)
    eq = tl.sum(tl.where(bins[None, :] == d2, h2c, 0), axis=1)
    eq_before = tl.cumsum(eq, axis=0) - eq
    take = gt + tl.minimum(tl.maximum(need - eq_before, 0), eq)
    taken_before = tl.cumsum(take, axis=0) - take
    t = ((d1 - 128) << 8) | d2  # the threshold key (signed 16-bit value)
    tl.store(META + cell * 4, taken_before, mask=cok)
    tl.store(META + cell * 4 + 1, eq_before, mask=cok)
    tl.store(META + cell * 4 + 2, cs * 0 + t, mask=cok)
    tl.store(META + cell * 4 + 3, cs * 0 + tl.where(room > 0, need, -1), mask=cok)  # -1: nothing to take
    ks = tl.arange(0, KBLOCK)
    tl.store(OUT + row.to(tl.int64) * (F + k_sel) + F + ks, tl.full((KBLOCK,), -1, tl.int64),
             mask=(ks >= room) & (ks < k_sel))


@triton.jit
def _r16_write(K16, META, OUT, k_sel, LP, NC, F: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    cell = row.to(tl.int64) * NC + c
    taken_before = tl.load(META + cell * 4)
    eq_before = tl.load(META + cell * 4 + 1)
    t = tl.load(META + cell * 4 + 2)
    need = tl.load(META + cell * 4 + 3)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    k16 = tl.load(K16 + row.to(tl.int64) * LP + offs).to(tl.int32)
    valid = tl.where(k16 != -32768, need >= 0, False)  # (a where: the interpreter's bool & scalar is int32)
    eq = valid & (k16 == t)
    tie = eq & (eq_before + tl.cumsum(eq.to(tl.int32), axis=0) <= need)  # ties: the lowest positions first
    take = (valid & (k16 > t)) | tie
    slot = taken_before + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(OUT + row.to(tl.int64) * (F + k_sel) + F + slot, offs.to(tl.int64), mask=take)


def plan16_refusal(scores: torch.Tensor, k_sel: int | None = None) -> str | None:
    """Why :func:`select_plan16` refuses ``scores`` (and ``k_sel`` slots), or ``None`` when it plans them (the
    default block): a 4-d fp32 / bf16 / fp16 tensor, rows of at most ``R16_MAX_CHUNKS x R16_MAX_BLOCK`` positions,
    at most :data:`R16_MAX_BLOCK` slots."""
    if scores.dim() != 4 or scores.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"want (N, B, H, L) float scores, got {scores.dtype} {tuple(scores.shape)}"
    if scores.shape[-1] > R16_MAX_CHUNKS * R16_MAX_BLOCK:
        return f"rows of {scores.shape[-1]} positions; at most {R16_MAX_CHUNKS * R16_MAX_BLOCK}"
    if k_sel is not None and k_sel > R16_MAX_BLOCK:
        return f"{k_sel} top-k slots; at most {R16_MAX_BLOCK}"
    return None


def select_plan16(scores: torch.Tensor, lengths: torch.Tensor, k_sel: int, *, sinks: int, recent: int,
                  budget: int | None = None, budget_ratio: float | None = None, min_budget: int = 0,
                  sum_heads: bool = False, block: int | None = None,
                  num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`select_plan`'s plan over 16-bit keys, each row split over several programs (``TRITON_SELECT =
    "radix16"``): 4 launches of ``rows x chunks`` / ``rows`` programs (+ one memset), two 8-bit radix passes.

    **Semantics.** A score's key is the top 16 bits of its order-preserving fp32 key (sign, exponent, 7 mantissa
    bits). Let ``t`` be the ``room``-th largest key of the row. Picked: every position with key > ``t`` — exactly
    the positions ``torch.topk`` also picks with a score above the boundary bucket — and, among the positions with
    key == ``t`` (the boundary bucket: scores equal in their top 16 order bits), the lowest positions until
    ``room`` picks. Outside the boundary bucket the set is the exact top-``room``'s; inside it the choice may
    differ from ``torch.topk`` (which ranks by the full fp32 score) but is deterministic. Output: the fixed
    positions, then the picks in position order, -1 in the slots past the room (as :func:`select_plan`).

    Args: as :func:`select_plan`; ``block`` positions per program (a power of two >= 256; default
    :data:`R16_BLOCK`, raised so that a row has at most :data:`R16_MAX_CHUNKS` chunks).
    """
    why = plan16_refusal(scores, k_sel)
    if why is not None:
        raise ValueError(f"select_plan16: {why}")
    if (budget is None) == (budget_ratio is None):
        raise ValueError("select_plan16: pass exactly one of budget and budget_ratio")
    N, B, H, L = scores.shape
    if lengths.shape != (B,):
        raise ValueError(f"select_plan16: lengths of shape ({B},) wanted, got {tuple(lengths.shape)}")
    if block is not None and (block < 256 or block & (block - 1)):
        raise ValueError(f"select_plan16: block must be a power of two >= 256, got {block}")
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    Hs, hsum = (1, H) if sum_heads else (H, 1)
    F = sinks + recent
    dev = scores.device
    out = torch.empty((N, B, Hs, F + k_sel), dtype=torch.long, device=dev)
    dense = torch.empty_like(lengths)
    n_rows = N * B * Hs
    if n_rows == 0 or L == 0:
        out[..., F:] = -1
        return out, lengths.clone()
    blk = block or max(R16_BLOCK, triton.next_power_of_2(triton.cdiv(L, R16_MAX_CHUNKS)))
    nc = triton.cdiv(L, blk)
    if nc > R16_MAX_CHUNKS:
        raise ValueError(f"select_plan16: {nc} chunks of {blk} positions per row; at most {R16_MAX_CHUNKS} "
                         f"(pass a larger block)")
    lp = nc * blk
    k16 = torch.empty((n_rows, lp), dtype=torch.int16, device=dev)
    h1 = torch.zeros((n_rows, 256), dtype=torch.int32, device=dev)
    h2c = torch.empty((n_rows, nc, 256), dtype=torch.int32, device=dev)
    g1c = torch.empty((n_rows, nc), dtype=torch.int32, device=dev)
    meta = torch.empty((n_rows, nc, 4), dtype=torch.int32, device=dev)
    ratio = _ratio(budget_ratio if budget_ratio is not None else 0.0, dev)
    use_ratio = budget is None
    babs = 0 if budget is None else int(budget)
    fb = triton.next_power_of_2(max(F, 2))
    w = num_warps or (4 if blk <= 2048 else 8)
    common = dict(USE_RATIO=use_ratio, F=F, FBLOCK=fb)
    _r16_keys[(n_rows, nc)](scores, k16, h1, out, dense, lengths, ratio, scores.stride(0), scores.stride(1),
                            scores.stride(2), L, k_sel, Hs, B, lp, sinks, recent, babs, int(min_budget),
                            HSUM=hsum, BLOCK=blk, num_warps=w, **common)
    _r16_low[(n_rows, nc)](k16, h1, h2c, g1c, lengths, ratio, k_sel, Hs, B, lp, nc, sinks, recent, babs,
                           int(min_budget), BLOCK=blk, num_warps=w, **common)
    _r16_row[(n_rows,)](h1, h2c, g1c, meta, out, lengths, ratio, k_sel, Hs, B, nc, sinks, recent, babs,
                        int(min_budget), NCB=triton.next_power_of_2(max(nc, 2)),
                        KBLOCK=triton.next_power_of_2(max(k_sel, 16)), num_warps=4, **common)
    _r16_write[(n_rows, nc)](k16, meta, out, k_sel, lp, nc, F=F, BLOCK=blk, num_warps=w)
    return out, dense


# ---------------------------------------------------------------------------------------------------------------
# Vegas' ``spread``: the head sum and the forward max over positions in one pass (the plan then ranks its output).
# ---------------------------------------------------------------------------------------------------------------

#: positions per program of :func:`spread_scores`
SPREAD_BLOCK = 1024


@triton.jit
def _spread_kernel(S, OUT, L, HIN, N_SPREAD: tl.constexpr, HSUM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # output row: (layer, sequence) with HSUM, else (layer, sequence, head)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < L
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for d in tl.static_range(N_SPREAD + 1):  # out[i] = max over j in [i - n, i] of (the head sum at) j
        j = offs - d
        ok = inb & (j >= 0)
        if HSUM:
            base = S + row.to(tl.int64) * HIN * L
            v = tl.zeros([BLOCK], tl.float32)
            for h in range(HIN):  # in head order, in fp32: torch.sum(s, 2, dtype=float32)'s values
                v += tl.load(base + h * L + j, mask=ok, other=0.0).to(tl.float32)
            v = tl.where(ok, v, float("-inf"))
        else:
            v = tl.load(S + row.to(tl.int64) * L + j, mask=ok, other=float("-inf")).to(tl.float32)
        best = tl.maximum(best, v)
    tl.store(OUT + row.to(tl.int64) * L + offs, best, mask=inb)


@triton.jit
def _head_sum_kernel(S, OUT, L, HIN, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # (layer, sequence)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < L
    base = S + row.to(tl.int64) * HIN * L
    v = tl.zeros([BLOCK], tl.float32)
    for h in range(HIN):  # in head order, in fp32
        v += tl.load(base + h * L + offs, mask=inb, other=0.0).to(tl.float32)
    tl.store(OUT + row.to(tl.int64) * L + offs, v, mask=inb)


#: :func:`spread_scores` with ``passes=None`` takes two passes from this many (layer, sequence) x position elements
#: of head sums on: on the H200 (benchmarks/results/gpu_spread_2026-12-02.md) two passes took 0.146 vs 0.182 ms at
#: SmolLM2 B 64 x 8k (15.4M), 0.236 vs 0.441 ms at the 8B shape B 16 x 32k (16.8M), 0.060 vs 0.064 at B 16 x 8k
#: (3.8M) and 0.075 vs 0.029 ms at B 1 x 8k (0.24M: the second launch and the scratch buffer cost more than they save)
SPREAD_TWO_PASS_ELEMENTS = 4_000_000


def spread_scores(s: torch.Tensor, n: int, sum_heads: bool, out: torch.Tensor | None = None,
                  passes: int | None = None) -> torch.Tensor:
    """Vegas' spread scores in one or two launches: ``out[..., i] = max(t[..., i - n : i + 1])`` with ``t`` the fp32
    sum of ``s`` ``(N, B, H, L)`` over its heads (``sum_heads``: out ``(N, B, 1, L)``) or ``s`` itself (out ``(N, B, H, L)``).

    What ``spread_forward(s.sum(2, keepdim=True, dtype=torch.float32), n)`` computes, up to the rounding of the head
    sum (here in head order, in fp32; PyTorch's reduction may add in another order), without the intermediate sums,
    the padded copy and max-pool's index buffer. ``passes=2`` (with ``sum_heads`` and ``n > 0``): one launch writes
    the head sums to a scratch buffer, a second the forward max of those sums (each position re-reads the ``n + 1``
    sums of its window, one row, from the cache). ``passes=1``: one launch that re-reads the ``(n + 1) x H`` scores
    of each window (3x the memory floor at the large shapes). ``None``: two passes from
    :data:`SPREAD_TWO_PASS_ELEMENTS` head-sum elements on, else one. Both give the same values bitwise.
    """
    if s.dim() != 4 or s.dtype not in (torch.float32, torch.bfloat16, torch.float16) or n < 0:
        raise ValueError(f"spread_scores: want (N, B, H, L) float scores and n >= 0, got {s.dtype} "
                         f"{tuple(s.shape)}, n {n}")
    s = s.contiguous()
    N, B, H, L = s.shape
    shape = (N, B, 1 if sum_heads else H, L)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32, device=s.device)
    elif tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"spread_scores: out must be contiguous float32 {shape}, got {out.dtype} {tuple(out.shape)}")
    if passes not in (None, 1, 2):
        raise ValueError(f"spread_scores: passes must be 1, 2 or None, got {passes}")
    if passes is None:
        passes = 2 if N * B * L >= SPREAD_TWO_PASS_ELEMENTS else 1
    rows = N * B * shape[2]
    if rows and L:
        grid = (rows, triton.cdiv(L, SPREAD_BLOCK))
        if sum_heads and passes == 2:
            sums = out if n == 0 else torch.empty(shape, dtype=torch.float32, device=s.device)
            _head_sum_kernel[grid](s, sums, L, H, BLOCK=SPREAD_BLOCK, num_warps=4)
            if n:
                _spread_kernel[grid](sums, out, L, 1, N_SPREAD=n, HSUM=False, BLOCK=SPREAD_BLOCK, num_warps=4)
        else:
            _spread_kernel[grid](s, out, L, H, N_SPREAD=n, HSUM=sum_heads, BLOCK=SPREAD_BLOCK, num_warps=4)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Dustin's per-layer part (``HybridSRHConfig.layer_share``): the best pages of one layer, counted in new tokens.
# ---------------------------------------------------------------------------------------------------------------

#: most pages per row :func:`select_pages` holds in registers (131,072 positions at 16 per page)
PAGES_MAX = 8192
#: pages per tile of the token pass
PAGES_TILE = 64


@triton.jit
def _page_keys(S, CNT, row, b, offs, P):
    """Order-preserving int64 keys of the page scores at ``offs`` (INT32_MIN: no new token / padding) and their
    new-token counts."""
    inp = offs < P
    x = tl.load(S + row.to(tl.int64) * P + offs, mask=inp, other=0.0) + 0.0  # -0.0 → +0.0: equal zeros, one key
    c = tl.load(CNT + b.to(tl.int64) * P + offs, mask=inp, other=0)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # signed order == float order (no NaN)
    key = tl.where(inp & (c > 0), key, -2147483647 - 1)
    return key.to(tl.int64), tl.where(inp, c, 0)


@triton.jit
def _select_pages_kernel(S, CNT, NEW, ROOM, FIXED, OUT, P, W, F, k_sel, Hkv, PS: tl.constexpr, PSB: tl.constexpr,
                         PBLOCK: tl.constexpr, PTILE: tl.constexpr, FBLOCK: tl.constexpr, KBLOCK: tl.constexpr):
    row = tl.program_id(0)  # over (B, H_kv) rows
    b = row // Hkv
    room = tl.minimum(tl.load(ROOM + b), k_sel).to(tl.int32)
    obase = OUT + row.to(tl.int64) * (F + k_sel)
    fo = tl.arange(0, FBLOCK)  # the shared part first, as it is
    tl.store(obase + fo, tl.load(FIXED + b.to(tl.int64) * F + fo, mask=fo < F, other=-1), mask=fo < F)
    key, c = _page_keys(S, CNT, row, b, tl.arange(0, PBLOCK), P)
    lo = tl.full((), -2147483647 - 1, tl.int64)
    hi = tl.full((), 2147483647, tl.int64)
    for _ in range(32):  # largest t with (new tokens of the pages with key >= t) >= room
        mid = (lo + hi + 1) // 2
        cnt = tl.sum(tl.where(key >= mid, c, 0), axis=0)
        ok = cnt >= room
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    need = room - tl.sum(tl.where(key > lo, c, 0), axis=0)  # left for the pages at the threshold, lowest first
    done = tl.zeros((), tl.int32)  # slots written by the earlier tiles
    tied = tl.zeros((), tl.int32)  # new tokens of earlier tiles' pages at the threshold
    for p0 in range(0, P, PTILE):  # the token pass, tile by tile of pages in position order
        offs = p0 + tl.arange(0, PTILE)
        k, cc = _page_keys(S, CNT, row, b, offs, P)
        eq = tl.where((k == lo) & (cc > 0), cc, 0)
        before = tied + tl.cumsum(eq, axis=0) - eq
        take = tl.where(k > lo, cc, tl.minimum(tl.maximum(need - before, 0), eq))
        take = tl.where(room > 0, take, 0)
        off = done + tl.cumsum(take, axis=0) - take
        j = tl.arange(0, PSB)
        pos = offs[:, None] * PS + j[None, :]
        inb = (offs[:, None] < P) & (j[None, :] < PS) & (pos < W)
        new = tl.load(NEW + b.to(tl.int64) * W + pos, mask=inb, other=0).to(tl.int32)  # 1: a new token
        rank = tl.cumsum(new, axis=1) - 1  # its rank among its page's new tokens
        pick = (new > 0) & (rank < take[:, None])
        tl.store(obase + F + off[:, None] + rank, pos.to(tl.int64), mask=pick)
        done += tl.sum(take, axis=0)
        tied += tl.sum(eq, axis=0)
    ks = tl.arange(0, KBLOCK)
    tl.store(obase + F + ks, tl.full((KBLOCK,), -1, tl.int64), mask=(ks >= done) & (ks < k_sel))


def select_pages(page_scores: torch.Tensor, counts: torch.Tensor, new: torch.Tensor, room: torch.Tensor,
                 fixed: torch.Tensor, k_sel: int, page_size: int, num_warps: int = 4) -> torch.Tensor:
    """One layer's indices of a per-layer plan: the shared part, then per (sequence, KV head) the ``room[b]`` new
    tokens of the best pages, ``(B, H_kv, F + k_sel)`` int64.

    A *new* token is one the shared part and the blocked positions leave. Tokens are ranked by their page's score
    (``page_scores`` ``(B, H_kv, P)`` float32), ties by position: every new token of the pages above the threshold,
    then the pages at it in position order, the last one cut at ``room``. Picks in position order after the ``F``
    entries of ``fixed`` ``(B, F)``, -1 in the slots past them. The same set as a stable descending sort of the token
    scores (:func:`specdec.selectors.quest.select_pages_torch`).

    Args:
        counts: ``(B, P)`` int32 new tokens per page (:func:`specdec.selectors.quest.page_counts`).
        new: ``(B, W)`` bool, the new tokens; positions past ``W`` are not new.
        room: ``(B,)`` picks per sequence (at most ``k_sel``).
    """
    B, Hkv, P = page_scores.shape
    if page_scores.dtype != torch.float32 or not page_scores.is_contiguous() or P > PAGES_MAX:
        raise ValueError(f"select_pages: want contiguous float32 (B, H_kv, P <= {PAGES_MAX}) page scores, got "
                         f"{page_scores.dtype} {tuple(page_scores.shape)}")
    if counts.shape != (B, P) or counts.dtype != torch.int32 or new.dim() != 2 or new.shape[0] != B \
            or new.dtype != torch.bool or room.shape != (B,) or fixed.dim() != 2 or fixed.shape[0] != B:
        raise ValueError(f"select_pages: counts ({B}, {P}) int32, new ({B}, W) bool, room ({B},), fixed ({B}, F) "
                         f"wanted; got {tuple(counts.shape)} {counts.dtype}, {tuple(new.shape)} {new.dtype}, "
                         f"{tuple(room.shape)}, {tuple(fixed.shape)}")
    F = fixed.shape[1]
    out = torch.empty((B, Hkv, F + k_sel), dtype=torch.long, device=page_scores.device)
    if B * Hkv == 0:
        return out
    counts, new, fixed = counts.contiguous(), new.contiguous().view(torch.uint8), fixed.contiguous()
    psb = triton.next_power_of_2(page_size)
    _select_pages_kernel[(B * Hkv,)](
        page_scores, counts, new, room, fixed, out, P, new.shape[1], F, k_sel, Hkv, PS=page_size, PSB=psb,
        PBLOCK=triton.next_power_of_2(max(P, 16)), PTILE=max(1, min(PAGES_TILE, 1024 // psb)),
        FBLOCK=triton.next_power_of_2(max(F, 2)), KBLOCK=triton.next_power_of_2(max(k_sel, 16)), num_warps=num_warps)
    return out
