"""How many CPU threads a command uses: the cores this process may run on, not the machine's.

torch's default is the machine's core count, which oversubscribes a container or a shared box limited by
CPU affinity (a demo went from 19 s to 117 s on a busy 2-core machine). Precedence: an explicit
``--threads N``, then ``OMP_NUM_THREADS`` when set, then ``len(os.sched_getaffinity(0))``; without
``--threads`` the count is never raised above torch's own default.
"""

from __future__ import annotations

import os

__all__ = ["available_cpus", "choose_threads", "apply_threads"]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def choose_threads(requested: int | None) -> int:
    """The thread count for ``requested`` (``None`` = choose; see the module docstring)."""
    if requested is not None:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env)
    return available_cpus()


def apply_threads(requested: int | None) -> int:
    """Set torch's intra-op threads (and ``OMP_NUM_THREADS`` for libraries loaded later); returns the count."""
    import torch

    n = choose_threads(requested)
    if requested is None:
        n = min(n, torch.get_num_threads())
    os.environ["OMP_NUM_THREADS"] = str(n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n
