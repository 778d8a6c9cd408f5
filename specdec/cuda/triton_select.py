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
