"""A numba CPU backend: sparse (and optionally dense) decode/verify attention without a dense mask.

For each (sequence, KV head) the kernel walks a *virtual index list*: the plan's entries (``-1``
padding, out-of-range entries and entries at or past ``dense_from`` dropped, duplicates counted
once as in the reference's set semantics) followed by the dense tail ``max(dense_from, 0) ..
lengths + T - 1``. The ``G`` query heads of the KV group times the ``T`` new rows are processed
together, so every K/V row is read once for all of them; row ``t`` sees position ``p`` iff
``p <= lengths[b] + t``. The list is cut into chunks (split-K) so that both the batch and the list
feed the threads; chunks are combined by log-sum-exp. Keys and values are read as float32, or as
bfloat16 bit patterns widened in the kernel (exact), so a bf16 cache is never copied.

Anything the kernel does not cover is delegated, so the backend is always complete:
score requests go to :class:`~specdec.attention.reference.ReferenceBackend` (the definition, as in
the torch backend), and non-CPU tensors, dtypes other than float32/bfloat16, prefill-sized
forwards (``T > max_rows``) and dense attention of more than one row (unless ``dense="on"``) go to
:class:`~specdec.attention.torch_backend.TorchBackend`.

numba is an optional extra (``pip install 'specdec[cpu]'``); it is imported when the backend is
built. Measured against the reference and torch backends in ``benchmarks/numba_cpu.py``
(results and verdict in ``docs/backends.md``). Checked against the reference backend in
``tests/test_numba_backend.py``.
"""

from __future__ import annotations

import importlib
import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from specdec.attention.reference import ReferenceBackend
from specdec.attention.torch_backend import TorchBackend
from specdec.errors import SpecdecError
from specdec.interfaces import AttentionBackend, AttentionMetadata
from specdec.registry import BACKENDS, ComponentConfig

_MISSING = "the numba backend needs the 'numba' package; pip install 'specdec[cpu]'."


class NumbaConfig(ComponentConfig):
    """Options of the numba backend.

    Attributes:
        dense: who computes dense attention (no plan): ``"auto"`` (default) the numba kernel for
            single-row decode steps (T = 1, where it beat SDPA at every measured shape) and the
            torch backend's SDPA for more rows (where it did not); ``"on"`` always the numba kernel;
            ``"off"`` always SDPA (see docs/backends.md for the measurement).
        threads: numba threads per call (``None``: ``torch.get_num_threads()``), capped at numba's
            pool size. 1 (default) runs the kernel in the calling thread without numba's thread pool:
            at these sizes a pool launch costs more than it saves, and far more on a loaded machine
            (see docs/backends.md).
        max_rows: forwards with more than this many new rows (prefill chunks) go to the torch
            backend.
        block: KV positions per block of the online softmax.
        min_chunk: fewest list entries one split-K chunk gets.
    """

    dense: Literal["auto", "on", "off"] = "auto"
    threads: int | None = Field(default=1, ge=1)
    max_rows: int = Field(default=16, ge=1)
    block: int = Field(default=64, ge=1, le=1024)
    min_chunk: int = Field(default=128, ge=1)


def _kernel():
    """Import numba and the kernel (compiled on first call, or loaded from numba's on-disk cache)."""
    import numba

    from specdec.attention._numba_kernels import attend_parallel, attend_serial

    return numba, attend_serial, attend_parallel


def _require_numba():
    try:
        importlib.import_module("numba")
    except ImportError:
        raise SpecdecError(_MISSING) from None


@BACKENDS.register("numba", NumbaConfig)
class NumbaBackend(AttentionBackend):
    """Sparse decode/verify attention on the CPU with numba; everything else delegated (see module doc)."""

    name = "numba"
    Config = NumbaConfig
    #: sliding-window and soft-capped calls are delegated to the torch backend (the kernel takes neither)
    supports_window = True
    supports_softcap = True

    def __init__(self, config: NumbaConfig | None = None) -> None:
        _require_numba()
        self.config = config or NumbaConfig()
        self._ref = ReferenceBackend()
        self._torch = TorchBackend()

    def validate(self, device: torch.device, dtype: torch.dtype) -> str | None:
        # every case the kernel does not take is delegated, so the backend runs anywhere torch does
        return None

    def handles(self, q: torch.Tensor, k_cache: torch.Tensor, plan_indices, score_rows) -> bool:
        """Whether the numba kernel (not a delegate) computes this call."""
        return (
            score_rows is None
            and (plan_indices is not None or self.config.dense == "on"
                 or (self.config.dense == "auto" and q.shape[2] == 1))
            and q.device.type == "cpu"
            and k_cache.device.type == "cpu"
            and q.dtype in (torch.float32, torch.bfloat16)
            and k_cache.dtype in (torch.float32, torch.bfloat16)
            and q.shape[2] <= self.config.max_rows
        )

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor | None]:
        if meta.wants_scores:  # scores need the full logits: the definition computes them
            return self._ref.attend(q, k_cache, v_cache, meta)
        if meta.window is not None or meta.softcap is not None:
            return self._torch.attend(q, k_cache, v_cache, meta)
        if not self.handles(q, k_cache, meta.plan_indices, meta.score_rows) or v_cache.dtype != k_cache.dtype:
            return self._torch.attend(q, k_cache, v_cache, meta)
        return self.numba_attend(q, k_cache, v_cache, meta.lengths, meta.scale, meta.plan_indices, meta.dense_from), None

    def numba_attend(self, q, k_cache, v_cache, lengths, scale, plan_indices=None, dense_from=None) -> torch.Tensor:
        """The kernel itself (CPU, float32/bfloat16, no scores); ``plan_indices=None`` is dense."""
        numba, serial, parallel = _kernel()
        B, H, T, D = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        if H % Hkv:
            raise SpecdecError(f"query heads ({H}) must be a multiple of KV heads ({Hkv}).")
        ln = lengths.detach().numpy().astype(np.int64, copy=False)
        if plan_indices is None:
            plan = _NO_PLAN
            df = np.zeros(B, dtype=np.int64)
        else:
            plan = np.ascontiguousarray(plan_indices.detach().numpy(), dtype=np.int64)
            # no dense_from: the plan's entries only (as in the reference)
            df = ln + T if dense_from is None else dense_from.detach().numpy().astype(np.int64, copy=False)
        bf16 = k_cache.dtype == torch.bfloat16
        q_np = q.detach().float().contiguous().numpy()
        out = np.empty((B, H, T, D), dtype=np.float32)
        threads = min(self.config.threads or torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
        splits = 1
        if threads > 1:
            numba.set_num_threads(threads)
            # enough (sequence, KV head, chunk) items to feed the threads, chunks of >= min_chunk entries
            n_max = int(np.minimum(ln + T, L).max() - max(int(df.min()), 0)) + plan.shape[-1]
            splits = max(1, min(math.ceil(2 * threads / (B * Hkv)), n_max // self.config.min_chunk))
        (parallel if threads > 1 else serial)(
            q_np, _as_numpy(k_cache, bf16), _as_numpy(v_cache, bf16), ln, df, plan, out,
            np.float32(scale), bf16, splits, self.config.block)
        return torch.from_numpy(out).to(q.dtype)


_NO_PLAN = np.empty((1, 1, 0), dtype=np.int64)


def _as_numpy(t: torch.Tensor, bf16: bool) -> np.ndarray:
    """A zero-copy numpy view (bfloat16 as its uint16 bit pattern)."""
    t = t.detach()
    if bf16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()
