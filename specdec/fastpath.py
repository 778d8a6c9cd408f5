"""Device-dependent defaults of ``generate`` and ``bench``: the fast path on a CUDA GPU.

On CUDA, an option the user did not give takes its fast-path value (``--backend triton --dtype bfloat16
--cuda-graphs --compile --fuse``); every one has a ``--no-…`` form (or an explicit value) to turn it off.
When the user picks another ``--backend``, the other options keep the portable defaults (float32, no
capture, no compilation, no fusion), since the fast path is tuned for the Triton kernels. On the CPU the
portable defaults apply: ``reference``, float32, nothing captured, compiled or fused. No typer import here.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpeedOptions", "cuda_available", "speed_defaults", "PORTABLE", "FAST_CUDA"]


@dataclass(frozen=True)
class SpeedOptions:
    """The options that decide speed, not results (up to the dtype's rounding)."""

    backend: str
    dtype: str
    cuda_graphs: bool
    compile: bool
    fuse: bool


PORTABLE = SpeedOptions("reference", "float32", False, False, False)
FAST_CUDA = SpeedOptions("triton", "bfloat16", True, True, True)


def cuda_available() -> bool:
    """Is a CUDA GPU usable (the device detection tests replace)."""
    import torch

    return torch.cuda.is_available()


def speed_defaults(device_type: str, backend: str | None, dtype: str | None, cuda_graphs: bool | None,
                   compile: bool | None, fuse: bool | None) -> SpeedOptions:
    """Fill the options left ``None`` for ``device_type`` (``"cuda"`` or ``"cpu"``)."""
    fast = device_type == "cuda" and backend in (None, FAST_CUDA.backend)
    d = FAST_CUDA if fast else PORTABLE
    return SpeedOptions(
        backend=backend if backend is not None else d.backend,
        dtype=dtype if dtype is not None else d.dtype,
        cuda_graphs=cuda_graphs if cuda_graphs is not None else d.cuda_graphs,
        compile=compile if compile is not None else d.compile,
        fuse=fuse if fuse is not None else d.fuse,
    )
