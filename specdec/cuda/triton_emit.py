"""Triton kernel: the device side of the engine's emission in one launch.

:meth:`specdec.engine.SpeculativeEngine._emit_launch` applies an iteration's emission to the device state: per
active sequence the accepted drafts + the next token are emitted up to the first EOS or the ``max_new_tokens``-th
token (which ends the sequence), the lengths of the sequences still active advance by ``1 + n_accepted``, the next
token becomes pending. Written with torch operations that is ~22 launches the host issues one by one (at B = 64 on
the H200's host ~0.3 ms per iteration, where Dustin's iteration is host-bound); here it is one program per sequence.
:func:`specdec.engine.emit_update_torch` is the same rule with torch operations (the CPU path, and the reference of
the parity test).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _emit_kernel(NAcc, Next, Drafts, Active, Produced, Lengths, Pending, Eos, n_eos, max_new, G,
                 ADVANCE: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_E: tl.constexpr):
    b = tl.program_id(0)
    n = tl.load(NAcc + b)
    nxt = tl.load(Next + b)
    act = tl.load(Active + b) != 0
    prod = tl.load(Produced + b)
    j = tl.arange(0, BLOCK_J)
    d = tl.load(Drafts + b * G + j, mask=j < G, other=0)
    tok = tl.where(j < n, d, nxt)  # emission order: drafts 0..n-1, then the next token at position n
    e = tl.arange(0, BLOCK_E)
    eos = tl.load(Eos + e, mask=e < n_eos, other=-1)
    is_eos = tl.sum(((tok[:, None] == eos[None, :]) & (e[None, :] < n_eos)).to(tl.int32), axis=1) > 0
    ends = (j <= n) & ((prod + j + 1 >= max_new) | is_eos)
    first = tl.min(tl.where(ends, j, BLOCK_J), axis=0)
    fin = act & (first < BLOCK_J)
    emitted = tl.where(fin, first + 1, tl.where(act, n + 1, 0))
    still = act & (first >= BLOCK_J)
    tl.store(Produced + b, prod + emitted)
    tl.store(Active + b, still.to(tl.int8))
    if ADVANCE:
        ln = tl.load(Lengths + b)
        tl.store(Lengths + b, ln + tl.where(still, n + 1, 0))
    pend = tl.load(Pending + b)
    tl.store(Pending + b, tl.where(still, nxt, pend))


def emit_update(n_accepted: torch.Tensor, next_token: torch.Tensor, drafts: torch.Tensor | None,
                active: torch.Tensor, produced: torch.Tensor, lengths: torch.Tensor, pending: torch.Tensor,
                eos: torch.Tensor, max_new_tokens: int, advance: bool) -> None:
    """The emission's device side in place (``active`` bool, ``produced``, ``lengths``, ``pending`` int64 ``(B,)``):
    one launch of ``B`` programs. ``drafts`` ``(B, g)`` int64 or ``None``; ``eos`` the EOS ids (int64, may be
    empty)."""
    B = next_token.shape[0]
    g = drafts.shape[1] if drafts is not None else 0
    if drafts is None:
        drafts = next_token  # never read (G = 0)
    eos_ids = eos if eos.numel() else next_token.new_full((1,), -1)
    act = active.view(torch.int8)  # bool storage is one byte
    _emit_kernel[(B,)](n_accepted, next_token, drafts.contiguous(), act, produced, lengths, pending, eos_ids,
                       eos.numel(), max_new_tokens, g, ADVANCE=advance,
                       BLOCK_J=triton.next_power_of_2(g + 1), BLOCK_E=triton.next_power_of_2(max(eos.numel(), 1)))

