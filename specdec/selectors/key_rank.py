"""Per-layer verification sets ranked by the verify rows' own queries against low-rank keys (``layer_scores="keys"``).

Beyond the Dustin paper, after Loki (Singhania et al., 2024): the per-layer part of
:class:`~specdec.selectors.hybrid_srh.HybridSRHSelector` (``layer_share`` of the free slots) ranks every cached token
by the attention the verify rows' queries would give it, computed in a rank-``key_rank`` projection of the keys: per
layer and KV head the softmax over the verified positions of ``(q P)·(k P)ᵀ / √D`` (``P`` the ``key_rank`` leading
principal directions of that layer's and head's prompt keys), summed over the KV group's query heads and the rows.
The default, ``"pages"``, ranks Quest pages by their key bounds instead.

:class:`KeyRankIndex` keeps the basis (taken once per generation from the prompt's keys: at the prefill, by
:meth:`~specdec.selectors.hybrid_srh.HybridSRHSelector.prepare`) and the projected keys ``(N, B, H_kv, capacity,
key_rank)``, brought up to date eagerly before each plan over a span the engine knows from its host token lists (no
device read); the plan itself is then replayed as a CUDA graph like the page plan's. The ranking itself runs inside
each layer's attention call (captured with the verify step): plain torch on the reference path, or two Triton kernels
(``HybridSRHConfig.page_kernels``; by default on CUDA): :func:`specdec.cuda.triton_keyrank.lowrank_mass` (the mass, two
reads of the projected keys) and :func:`specdec.cuda.triton_select.select_top` (the ``room`` best per row, in position
order). Per pass a layer reads ``key_rank / (2 D)`` of a dense pass's K+V bytes for the ranking (twice in the kernel),
on top of the entries it attends to (:func:`specdec.verifiers.plan_reads`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import SparsePlan
from specdec.planner import planner_for


def _triton_keyrank():
    from specdec.cuda import triton_keyrank

    return triton_keyrank


def _triton_select():
    from specdec.cuda import triton_select

    return triton_select


def top_directions(gram: torch.Tensor) -> torch.Tensor:
    """The eigenvectors of each symmetric ``(..., D, D)`` matrix of ``gram`` (float32), by ascending eigenvalue, on
    ``gram``'s device.

    Always LAPACK on the host: for ``D`` > 32 PyTorch's CUDA ``eigh`` runs one solver call per matrix (its batched
    Jacobi is for ``D`` <= 32), seconds for the 5,760 Gram matrices of a 30-layer model at B = 64 — the host does
    about 0.2 ms per 64 × 64 matrix and core (1.2 s on one core of a 2-core CI machine, 0.8 s on two), in chunks on
    the threads torch may use, each single-threaded (torch's intra-op thread count is 1 while they run, then restored:
    a process-wide setting). The same code on every device also gives the same basis on the CPU and the GPU."""
    host = gram.detach().to("cpu", torch.float32)
    flat = host.reshape(-1, *host.shape[-2:])
    n_torch = torch.get_num_threads()
    n = max(1, min(n_torch, flat.shape[0] // 64))
    if n == 1:
        vecs = torch.linalg.eigh(flat)[1]
    else:
        from concurrent.futures import ThreadPoolExecutor

        torch.set_num_threads(1)  # one chunk per thread, each single-threaded (nested threads slow it down)
        try:
            with ThreadPoolExecutor(n) as pool:
                vecs = torch.cat([v for _, v in pool.map(torch.linalg.eigh, flat.chunk(n))])
        finally:
            torch.set_num_threads(n_torch)
    return vecs.view(host.shape).to(gram.device)


class KeyRankIndex:
    """The low-rank key basis and projected keys of one cache (per global layer, sequence and KV head)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.basis: torch.Tensor | None = None  # (N, B, H_kv, D, r) float32
        self.keys: torch.Tensor | None = None  # (N, B, H_kv, capacity, r), the cache's dtype
        self.done: torch.Tensor | None = None  # (B,) positions projected so far
        self.done_host: list[int] | None = None  # the host's copy of the last update's lengths (when given)

    def update(self, cache: KVCache, lengths: torch.Tensor, host_lengths: list[int] | None = None) -> None:
        """Take the basis from the cached keys ``[0, lengths)`` on the first call, then project the positions
        verified since the last call.

        ``host_lengths``: the host's copy of ``lengths`` (a value per sequence, each at least its ``lengths`` entry),
        which the engine has without waiting for the device; without it the span to project is read from the device
        (a wait for the queued work)."""
        N, B, H, C, D = cache.k.shape
        if self.rank > D:
            raise SpecdecError(f"key_rank {self.rank} exceeds the head dimension {D}; use key_rank <= {D}.")
        if host_lengths is not None and len(host_lengths) != B:
            raise SpecdecError(f"host_lengths has {len(host_lengths)} values for a batch of {B}; give one per "
                               "sequence (or None).")
        first = self.basis is None or self.basis.shape[1] != B or self.keys.shape[3] != C
        if first:
            pos = torch.arange(C, device=lengths.device)
            mask = (pos.view(1, C) < lengths.view(B, 1)).to(torch.float32)  # (B, C)
            gram = torch.empty((N, B, H, D, D), dtype=torch.float32, device=cache.k.device)
            for n in range(N):  # a layer at a time: one float32 copy of a layer's keys, not of the cache's
                k = cache.k[n].float() * mask.view(B, 1, C, 1)
                gram[n] = torch.einsum("bhcd,bhce->bhde", k, k)
            vecs = top_directions(gram)  # ascending eigenvalues: the last r columns are the top directions
            # the planner's buffers: a plan points at them and is not copied (Quest's page bounds do the same);
            # named by rank, so engines of two ranks on one cache never share (and reallocate) one
            planner = planner_for(cache)
            self.basis = planner.buffer(f"key_rank.basis.r{self.rank}", (N, B, H, D, self.rank), torch.float32)
            self.basis.copy_(vecs[..., D - self.rank:].flip(-1))
            self.keys = planner.buffer(f"key_rank.keys.r{self.rank}", (N, B, H, C, self.rank), cache.k.dtype)
            self.done = torch.zeros_like(lengths)  # every verified position is projected at the first update
            self.done_host = None
        if host_lengths is not None:  # no device read: the previous call's host lengths bound what is projected
            lo = 0 if first else min(self.done_host) if self.done_host is not None else int(self.done.min())
            hi = min(max(host_lengths), C)
        else:
            lo, hi = int(self.done.min()), int(lengths.max())
        if 0 < hi - lo <= 64:  # a plan's few new positions: every layer in one product (3 launches, not 3 N)
            k = cache.k[:, :, :, lo:hi].float()
            self.keys[:, :, :, lo:hi] = torch.einsum("nbhcd,nbhdr->nbhcr", k, self.basis).to(self.keys.dtype)
        elif hi - lo > 64:  # a layer at a time (the first update projects the whole prompt)
            for n in range(N):
                k = cache.k[n, :, :, lo:hi].float()
                self.keys[n, :, :, lo:hi] = torch.einsum("bhcd,bhdr->bhcr", k, self.basis[n]).to(self.keys.dtype)
        self.done = lengths.clone()
        self.done_host = None if host_lengths is None else [min(int(h), C) for h in host_lengths]


@dataclass
class KeyRankPlan(SparsePlan):
    """A verification plan whose per-layer part is ranked by low-rank attention (:mod:`specdec.selectors.key_rank`).

    ``indices`` ``(1, B, 1, F)`` is the shared part (sinks + recent + the hybrid set, ``-1`` padded); in each layer
    :meth:`indices_for` adds, per KV head, the ``room`` tokens of ``new`` with the most low-rank attention mass of
    this step's queries. ``new`` ``(B, capacity)`` marks the tokens the part may add (cached, outside sinks, recent
    and the shared part), so no position appears twice.
    """

    lengths: torch.Tensor = None  # type: ignore[assignment]
    room: torch.Tensor = None  # type: ignore[assignment]
    basis: torch.Tensor = None  # type: ignore[assignment]
    keys: torch.Tensor = None  # type: ignore[assignment]
    new: torch.Tensor = None  # type: ignore[assignment]
    k_sel: int = 0
    use_triton: bool = False

    def indices_for(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``(B, H_kv, F + k_sel)``: the shared part and this layer's best ``room`` new tokens per KV head."""
        shared = self.indices[0, :, 0]  # (B, F)
        keys = self.keys[layer]  # (B, H_kv, C, r)
        B, H, C, r = keys.shape
        out = shared.view(B, 1, -1).expand(B, H, -1)
        if self.k_sel == 0:
            return out
        Hq, T, D = q.shape[1], q.shape[2], q.shape[3]
        qr = torch.einsum("bhgtd,bhdr->bhgtr", q.float().view(B, H, Hq // H, T, D), self.basis[layer])
        if self.use_triton and C <= _triton_select().MAX_L:  # two launches: the mass, the top room per row
            qr = (qr * D ** -0.5).reshape(B, H, -1, r).contiguous()
            mass = _triton_keyrank().lowrank_mass(qr, keys, self.lengths, self.new)
            picked = _triton_select().select_top(mass.view(1, B, H, C), self.k_sel, self.room).view(B, H, -1)
            return torch.cat([out, picked], dim=-1)
        logits = torch.einsum("bhgtr,bhcr->bhgtc", qr, keys.float()) * D ** -0.5
        seen = torch.arange(C, device=q.device).view(1, C) < self.lengths.view(B, 1)  # the verified positions
        logits = logits.masked_fill(~seen.view(B, 1, 1, 1, C), float("-inf"))
        mass = torch.softmax(logits, -1).sum((2, 3)).masked_fill(~self.new.view(B, 1, C), float("-inf"))
        top, idx = mass.topk(min(self.k_sel, C), dim=-1)  # (B, H_kv, k_sel)
        slot = torch.arange(idx.shape[-1], device=q.device).view(1, 1, -1)
        ok = torch.isfinite(top) & (slot < self.room.view(B, 1, 1))
        return torch.cat([out, torch.where(ok, idx, torch.full_like(idx, -1))], dim=-1)

    def scoring_reads(self, lengths: torch.Tensor) -> torch.Tensor:
        """``(B,)`` K+V entries' worth of bytes one layer and KV head reads to rank: ``key_rank`` of ``2 D`` per
        verified token."""
        D = self.basis.shape[-2]
        return lengths.to(torch.float64) * (self.keys.shape[-1] / (2 * D))
