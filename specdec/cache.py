"""One preallocated KV cache with a length per sequence (ragged batches, rollback by length).

Two kinds of layer live in it (DESIGN.md §6, "per-layer attention types"):

* **global** (full-context) layers keep every position: ``k``/``v`` ``(N_g, B, H_kv, L, D)``;
  slot ``s`` holds position ``s``. Selectors, plans and scores see only these layers: their index
  ``g`` (0-based among the global layers) is the "layer" of a plan or a score request.
* **local** (sliding-window) layers of window ``W`` keep a ring ``ring_k``/``ring_v``
  ``(N_l, B, H_kv, C, D)`` of ``C = W + slack`` slots: position ``p`` lives in slot ``p % C``. Memory
  and bytes read stay ``O(W)`` whatever the context. ``slack`` bounds how far writes may run past
  the verified length (a verify pass of γ+1 rows, γ drafts): rollback is still "lower the length",
  because a rolled-back entry only overwrote a position older than every row's window.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.errors import SpecdecError
from specdec.interfaces import per_forward


class KVCache:
    """Keys and values of every layer for ``B`` sequences, ``L`` positions each.

    ``k`` and ``v`` are ``(N, B, H_kv, L, D)``. The cache holds no lengths of its own: the engine
    owns ``lengths`` ``(B,)`` and rolling back rejected tokens is just lowering a length —
    entries past it are overwritten by the next forward.

    ``bounded``: the owner sized the cache for every write it will make (the engine does), so
    :meth:`check_capacity` skips its host read of ``lengths`` — one GPU synchronisation per forward
    (per layer when eager) less inside a decode iteration. Views made by :meth:`rows` inherit it.
    """

    bounded: bool = False
    #: ring slots beyond the window of a local layer (≥ rows of one forward − 1, ≥ γ + 1)
    RING_SLACK: int = 64
    #: how :meth:`write` writes: ``"auto"`` (one Triton launch for K and V on CUDA when triton is
    #: installed, torch indexing elsewhere), ``"triton"`` or ``"torch"``; set on the class or an instance
    write_impl: str = "auto"
    #: ``(B,)`` bool on the cache's device, or ``None``: the sequences still generating. The engine sets it (its
    #: ``state.active`` IS this tensor) on the caches it decodes into; a dense forward over this cache then reads only
    #: the first positions of the other, finished sequences (:data:`specdec.models.SKIP_FINISHED_READS`).
    live: torch.Tensor | None = None
    #: ``n > 0``: a dense forward over this cache has at most ``n`` live sequences (set by Dustin's confidence valve
    #: around its re-run of the sequences that fired, ``n`` a power of two): the attention gets their ids first
    #: (``AttentionMetadata.live_order``) and the Triton split kernel runs ``n`` program slots per KV head, split for
    #: ``n`` sequences; part of a captured graph's key. ``0``: off
    few_live: int = 0

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        windows: Sequence[int | None] | None = None,
        slack: int | None = None,
    ) -> None:
        """``n_layers`` model layers; ``windows[i]`` is layer ``i``'s sliding window (``None`` = global)."""
        windows = tuple(windows) if windows is not None else (None,) * n_layers
        if len(windows) != n_layers:
            raise SpecdecError(f"windows has {len(windows)} entries for {n_layers} layers; give one per layer.")
        n_local = sum(w is not None for w in windows)
        shape = (n_layers - n_local, batch, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.ring_k = self.ring_v = None
        if n_local:
            sizes = {w for w in windows if w is not None}
            if len(sizes) != 1:
                raise SpecdecError(f"local layers with different windows {sorted(sizes)} are not supported; "
                                   "give every sliding-window layer the same window.")
            W = sizes.pop()
            if W < 1:
                raise SpecdecError(f"sliding window must be >= 1 (got {W}).")
            ring = W + (self.RING_SLACK if slack is None else slack)
            rshape = (n_local, batch, n_kv_heads, ring, head_dim)
            self.ring_k = torch.zeros(rshape, dtype=dtype, device=device)
            self.ring_v = torch.zeros(rshape, dtype=dtype, device=device)
        self._set_layout(windows)

    def _set_layout(self, windows: tuple) -> None:
        self.windows = windows
        slots, g, l = [], 0, 0
        for w in windows:
            if w is None:
                slots.append((g, None))
                g += 1
            else:
                slots.append((l, w))
                l += 1
        self._slots = slots

    @classmethod
    def _from(cls, k: torch.Tensor, v: torch.Tensor, bounded: bool = False, ring_k=None, ring_v=None,
              windows: tuple | None = None) -> "KVCache":
        obj = cls.__new__(cls)
        obj.k, obj.v = k, v
        obj.ring_k, obj.ring_v = ring_k, ring_v
        obj.bounded = bounded
        obj._set_layout(windows if windows is not None else (None,) * k.shape[0])
        return obj

    @property
    def n_layers(self) -> int:
        """Global (full-context) layers: the layers plans and score requests index."""
        return self.k.shape[0]

    @property
    def n_model_layers(self) -> int:
        """All layers of the model, local ones included."""
        return len(self.windows)

    @property
    def ring_capacity(self) -> int:
        """Slots of a local layer's ring (0 without local layers)."""
        return 0 if self.ring_k is None else self.ring_k.shape[3]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, int | None, int | None]:
        """``(k, v, window, g)`` of model layer ``layer``: ``(B, H_kv, L or C, D)`` buffers, its window
        (``None`` for a global layer) and its global index ``g`` (``None`` for a local layer)."""
        i, w = self._slots[layer]
        if w is None:
            return self.k[i], self.v[i], None, i
        return self.ring_k[i], self.ring_v[i], w, None

    def first_layers(self, n: int) -> "KVCache":
        """A view of model layers ``0 .. n-1`` sharing storage (an early-exit drafter's cache)."""
        w = self.windows[:n]
        n_g = sum(x is None for x in w)
        n_l = n - n_g
        rk = self.ring_k[:n_l] if n_l else None
        rv = self.ring_v[:n_l] if n_l else None
        return KVCache._from(self.k[:n_g], self.v[:n_g], self.bounded, rk, rv, w)

    def nbytes(self) -> dict[str, int]:
        """Bytes held: ``{"global": …, "local": …, "total": …}`` (K and V together)."""
        g = self.k.numel() * self.k.element_size() * 2
        l = 0 if self.ring_k is None else self.ring_k.numel() * self.ring_k.element_size() * 2
        return {"global": g, "local": l, "total": g + l}

    def copy_prefix_from(self, k: torch.Tensor, v: torch.Tensor, ring_k=None, ring_v=None, rows: slice = slice(None)) -> None:
        """Load a prefilled cache's contents (``k``/``v`` ``(N_g, B', H_kv, L_p, D)``, rings alike) into
        sequences ``rows`` of this cache (positions ``0 .. L_p-1``; rings slot for slot)."""
        lp = k.shape[3]
        self.k[:, rows, :, :lp].copy_(k)
        self.v[:, rows, :, :lp].copy_(v)
        if self.ring_k is not None:
            if ring_k is None or ring_k.shape[3] != self.ring_capacity:
                raise SpecdecError("the prefilled cache's sliding-window rings do not match this cache's; "
                                   "prefill with the same model and ring size.")
            self.ring_k[:, rows].copy_(ring_k)
            self.ring_v[:, rows].copy_(ring_v)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def n_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def head_dim(self) -> int:
        return self.k.shape[4]

    def rows(self, start: int, stop: int) -> "KVCache":
        """A view of sequences ``start:stop`` sharing storage (used for per-sequence prefill)."""
        rk = None if self.ring_k is None else self.ring_k[:, start:stop]
        rv = None if self.ring_v is None else self.ring_v[:, start:stop]
        view = KVCache._from(self.k[:, start:stop], self.v[:, start:stop], self.bounded, rk, rv, self.windows)
        if "write_impl" in self.__dict__:
            view.write_impl = self.write_impl
        return view

    def check_capacity(self, lengths: torch.Tensor, T: int) -> None:
        """Refuse a write of ``T`` entries past the capacity (reads ``lengths`` on the host, unless ``bounded``)."""
        if self.bounded:
            return
        end = int(lengths.max()) + T
        if end > self.capacity:
            raise ValueError(
                f"KV cache overflow: writing up to position {end} but capacity is {self.capacity}; "
                "allocate a larger cache (max_new_tokens or gamma exceed the planned size)."
            )

    def keep_path(self, lengths: torch.Tensor, rows: torch.Tensor) -> None:
        """After a draft tree's verification (:mod:`specdec.tree`): the rows of the accepted path ``rows (B, D)``
        (row ``r`` of the verified pass was written at slot ``lengths + r``) move to slots ``lengths + 1 ..
        lengths + D``, where a chain's would be, in every global layer; the root (slot ``lengths``) stays. Rows past
        a sequence's accepted depth move too and are overwritten later (as rejected drafts are). Their keys were
        rotated at the position they are now at (``lengths + depth``)."""
        if self.ring_k is not None:
            raise SpecdecError("draft trees need a cache without sliding-window rings; use a chain draft.")
        N, B, H, _, D = self.k.shape
        src = (lengths.view(B, 1) + rows).view(1, B, 1, -1, 1).expand(N, B, H, -1, D)
        dst = (lengths.view(B, 1) + 1 + torch.arange(rows.shape[1], device=rows.device)).view(1, B, 1, -1, 1)
        dst = dst.expand(N, B, H, -1, D)
        for t in (self.k, self.v):  # gathered whole before the scatter: a source slot may be a later destination
            t.scatter_(3, dst, t.gather(3, src))

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, check: bool = True,
              impl: str | None = None) -> None:
        """Write ``T`` new entries per sequence at ``lengths[b] .. lengths[b] + T - 1``.

        ``layer`` is a model layer; a local layer's entries go to ring slots ``position % C`` (torch
        indexing; ``T`` must not exceed ``C - W + 1``, see :meth:`SpecdecModel` route, which splits longer
        forwards).

        Args:
            key: ``(B, H_kv, T, D)`` new keys (post-RoPE).
            value: ``(B, H_kv, T, D)`` new values.
            lengths: ``(B,)`` int64 tokens cached before this write.
            check: verify the capacity (one host read of ``lengths``; off inside CUDA-graph capture,
                where the caller checks before replaying).
            impl: ``"auto" | "triton" | "torch"`` (``None``: :attr:`write_impl`). The Triton kernel
                writes K and V of all rows in one launch with the positions read on the device
                (no host sync, capturable); the torch path is five kernels on a GPU. Both write
                bit-identical entries.
        """
        B, _, T, _ = key.shape
        kl, vl, window, _ = self.layer(layer)
        if window is not None:  # a ring: no capacity limit, slots wrap
            C = kl.shape[2]
            if T > C - window + 1:
                raise ValueError(f"writing {T} rows into a sliding-window ring of {C} slots (window {window}) "
                                 f"would overwrite entries the first rows still see; write at most {C - window + 1}.")
            bidx, pos = per_forward(lengths, ("ring_slots", T, C), lambda: (  # once per step, not per local layer
                torch.arange(B, device=lengths.device).view(B, 1),
                (lengths.view(B, 1) + torch.arange(T, device=lengths.device)) % C))
            kl[bidx, :, pos] = key.transpose(1, 2).to(kl.dtype)
            vl[bidx, :, pos] = value.transpose(1, 2).to(vl.dtype)
            return
        if check:
            self.check_capacity(lengths, T)
        impl = impl or self.write_impl
        if impl == "auto":
            impl = "triton" if key.is_cuda and _triton_kv_write() is not None else "torch"
        if impl == "triton":
            fn = _triton_kv_write()
            if fn is None:
                raise SpecdecError("KVCache.write_impl='triton' needs the 'triton' package; pip install 'specdec[triton]' "
                                   "or use write_impl='auto'.")
            fn(kl, vl, key, value, lengths)
            return
        if impl != "torch":
            raise SpecdecError(f"unknown KV-cache write implementation {impl!r}; use 'auto', 'triton' or 'torch'.")
        pos = lengths.view(B, 1) + torch.arange(T, device=lengths.device)  # (B, T)
        bidx = torch.arange(B, device=lengths.device).view(B, 1)
        kl[bidx, :, pos] = key.transpose(1, 2).to(kl.dtype)
        vl[bidx, :, pos] = value.transpose(1, 2).to(vl.dtype)


_KV_WRITE: list = []


def _triton_kv_write():
    """The Triton write kernel's launcher, or ``None`` when triton is not installed (imported once)."""
    if not _KV_WRITE:
        try:
            from specdec.cuda.triton_cache import kv_write
        except ImportError:  # triton is an optional extra
            kv_write = None
        _KV_WRITE.append(kv_write)
    return _KV_WRITE[0]
