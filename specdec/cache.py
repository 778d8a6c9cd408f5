"""One preallocated KV cache with a length per sequence (ragged batches, rollback by length)."""

from __future__ import annotations

import torch

from specdec.errors import SpecdecError


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
    #: how :meth:`write` writes: ``"auto"`` (one Triton launch for K and V on CUDA when triton is
    #: installed, torch indexing elsewhere), ``"triton"`` or ``"torch"``; set on the class or an instance
    write_impl: str = "auto"

    def __init__(
        self,
        n_layers: int,
        batch: int,
        n_kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (n_layers, batch, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @classmethod
    def _from(cls, k: torch.Tensor, v: torch.Tensor, bounded: bool = False) -> "KVCache":
        obj = cls.__new__(cls)
        obj.k, obj.v = k, v
        obj.bounded = bounded
        return obj

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

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
        view = KVCache._from(self.k[:, start:stop], self.v[:, start:stop], self.bounded)
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

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, check: bool = True,
              impl: str | None = None) -> None:
        """Write ``T`` new entries per sequence at ``lengths[b] .. lengths[b] + T - 1``.

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
            fn(self.k[layer], self.v[layer], key, value, lengths)
            return
        if impl != "torch":
            raise SpecdecError(f"unknown KV-cache write implementation {impl!r}; use 'auto', 'triton' or 'torch'.")
        pos = lengths.view(B, 1) + torch.arange(T, device=lengths.device)  # (B, T)
        bidx = torch.arange(B, device=lengths.device).view(B, 1)
        self.k[layer][bidx, :, pos] = key.transpose(1, 2).to(self.k.dtype)
        self.v[layer][bidx, :, pos] = value.transpose(1, 2).to(self.v.dtype)


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
