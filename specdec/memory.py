"""Will a batch fit? A one-line refusal before allocating a KV cache that cannot fit in memory.

``specdec generate --batch-size 200000`` would otherwise ask the allocator for hundreds of GiB and end in a
traceback (or, with memory overcommit, push the machine into swap). No typer import here.
"""

from __future__ import annotations

import os

from specdec.errors import SpecdecError

__all__ = ["free_bytes", "needed_bytes", "check_fits", "oom_message"]


def free_bytes(device) -> int | None:  # noqa: ANN001 - torch.device
    """Memory available for new tensors on ``device`` (``MemAvailable`` on the CPU); ``None`` if unknown."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def needed_bytes(model, batch: int, context: int, max_new_tokens: int, gamma: int) -> int:  # noqa: ANN001
    """A lower bound of what a run allocates: the KV cache (K and V) plus one verify pass's logits."""
    d = model.dims
    itemsize = model.dtype.itemsize if hasattr(model, "dtype") else 4
    positions = context + max_new_tokens + gamma + 1
    kv = 2 * d.n_layers * batch * d.n_kv_heads * positions * d.head_dim * itemsize
    logits = batch * (gamma + 1) * d.vocab_size * 4
    return kv + logits


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def oom_message(batch: int | None, context: int | None, detail: str = "") -> str:
    """The one line for an allocation that did not fit."""
    what = []
    if batch is not None:
        what.append(f"batch {batch}")
    if context is not None:
        what.append(f"context {context}")
    shape = " × ".join(what) or "this run"
    return f"out of memory: {shape} did not fit{detail}; lower --batch-size or --context-tokens."


def check_fits(model, batch: int, context: int, max_new_tokens: int, gamma: int) -> None:  # noqa: ANN001
    """Refuse a run whose KV cache and logits alone exceed the free memory of the model's device."""
    need = needed_bytes(model, batch, context, max_new_tokens, gamma)
    free = free_bytes(model.device)
    if free is not None and need > free:
        raise SpecdecError(oom_message(batch, context, f" (needs at least {_gib(need)}, {_gib(free)} free on {model.device.type})"))
