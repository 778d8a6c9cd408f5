"""Programmatic dependent launch (PDL) for specdec's per-layer Triton kernels: one switch, off by default.

Under CUDA-graph replay each kernel launch of a decode step leaves a gap of ~2 µs on an H200 (at the
Llama-3.1-8B shape, B 16 x 32k, a sparse draft step had 0.67 ms of gaps between 305 launches;
benchmarks/results/gpu_8b_steps_2026-12-01e.md). With PDL (Hopper and later) a kernel launched with the
``launch_pdl`` attribute may be scheduled before its predecessor in the stream has finished: its launch and
block scheduling overlap the predecessor's tail, and it waits for the predecessor's completion (and the
visibility of its writes) in ``griddepcontrol.wait``. CUDA-graph capture keeps the programmatic edge.

Kernels that take it (``PDL`` constexpr): RMSNorm (+ residual, + split-GEMM partials), SiLU·mul, RoPE + KV
write, the rotary cos/sin table (:mod:`specdec.cuda.triton_fused`), the split-K attention and its combine
(:mod:`specdec.cuda.triton_attention`). Each calls ``gdc_wait()`` as its FIRST statement, before any load or
store, so it reads nothing its predecessor has not finished writing and writes nothing its predecessor may
still read (the caching allocator may hand it a buffer the predecessor read); then ``gdc_launch_dependents()``,
which lets the next PDL kernel get scheduled (it waits in its own ``gdc_wait``). Because every PDL kernel
waits for its predecessor's completion before doing anything, completion is transitive along the stream:
results are bit-identical with PDL on or off. The predecessor need not cooperate (a cuBLAS GEMM: the
trigger is then its completion).

The switch: :func:`set_pdl` (``True`` / ``False``; ``None`` = the environment), else the environment variable
``SPECDEC_PDL`` (``1`` on, ``0`` or unset off). It applies to kernels launched (or captured into a graph)
after it is set; a graph captured before keeps what it captured. Even when on, PDL is used only for CUDA
tensors on a GPU of compute capability >= 9 and never under Triton's CPU interpreter
(``TRITON_INTERPRET=1``), which runs no ``griddepcontrol``.

Measured on an H200 (2026-12-01, Llama-3.1-8B shape, B 16 x 32k, benchmarks/results/gpu_8b_steps_2026-12-01h.md):
no gain on the sparse step (5.636 ms off, 5.662 ms on), the dense step 11 % slower with PDL on; so it stays off.

This module imports nothing from specdec but :mod:`specdec.errors` (a leaf: the one exception type). A bad
``SPECDEC_PDL`` value is a :class:`~specdec.errors.SpecdecError`; :func:`specdec.loading.load_model` checks it
before loading anything, so the CLI ends with one ``error:`` line instead of failing at the first kernel launch.
"""

from __future__ import annotations

import os

import torch

from specdec.errors import SpecdecError

ENV = "SPECDEC_PDL"
_OVERRIDE: list = [None]
_CAPABLE: dict[int, bool] = {}


def set_pdl(on: bool | None) -> None:
    """Turn PDL on (``True``) or off (``False``) for launches from now on; ``None``: follow ``SPECDEC_PDL``."""
    if on is not None and not isinstance(on, bool):
        raise ValueError(f"set_pdl takes True, False or None, not {on!r}.")
    _OVERRIDE[0] = on


def pdl_requested() -> bool:
    """Whether PDL is asked for (:func:`set_pdl`, else ``SPECDEC_PDL``), whatever the device."""
    if _OVERRIDE[0] is not None:
        return _OVERRIDE[0]
    raw = os.environ.get(ENV, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise SpecdecError(f"{ENV}={raw!r} is not a valid setting; use 1 (programmatic dependent launch on) or 0 (off).")


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pdl_launch(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with PDL now: asked for, a CUDA device of compute capability
    >= 9 (Hopper), and not Triton's interpreter."""
    if device.type != "cuda" or _interpreted() or not pdl_requested():
        return False
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _CAPABLE:
        _CAPABLE[idx] = torch.cuda.get_device_capability(idx)[0] >= 9
    return _CAPABLE[idx]


def pdl_args(device: torch.device) -> dict:
    """Extra launch keywords for a kernel with a ``PDL`` constexpr: ``{"PDL": True, "launch_pdl": True}`` when
    :func:`pdl_launch` says so, else ``{}`` (the kernel's default ``PDL=False`` and a plain launch)."""
    return {"PDL": True, "launch_pdl": True} if pdl_launch(device) else {}
