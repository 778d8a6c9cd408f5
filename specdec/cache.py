"""One preallocated KV cache with a length per sequence (ragged batches, rollback by length)."""

from __future__ import annotations

import torch


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
        return KVCache._from(self.k[:, start:stop], self.v[:, start:stop], self.bounded)

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

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor, check: bool = True) -> None:
        """Write ``T`` new entries per sequence at ``lengths[b] .. lengths[b] + T - 1``.

        Args:
            key: ``(B, H_kv, T, D)`` new keys (post-RoPE).
            value: ``(B, H_kv, T, D)`` new values.
            lengths: ``(B,)`` int64 tokens cached before this write.
            check: verify the capacity (one host read of ``lengths``; off inside CUDA-graph capture,
                where the caller checks before replaying).
        """
        B, _, T, _ = key.shape
        if check:
            self.check_capacity(lengths, T)
        pos = lengths.view(B, 1) + torch.arange(T, device=lengths.device)  # (B, T)
        bidx = torch.arange(B, device=lengths.device).view(B, 1)
        self.k[layer][bidx, :, pos] = key.transpose(1, 2).to(self.k.dtype)
        self.v[layer][bidx, :, pos] = value.transpose(1, 2).to(self.v.dtype)
