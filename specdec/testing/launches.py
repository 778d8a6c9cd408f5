"""What one call launches, counted on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``).

Used by the launch-count tests and by the GPU benchmarks' CPU smoke modes (``benchmarks/gpu/issue14.py``).
"""

from __future__ import annotations

import collections
from typing import Callable

#: aten ops that launch no kernel on a GPU (views, metadata, host scalars, allocations)
NOT_LAUNCHES = ("view", "transpose", "split", "slice", "expand", "unsqueeze", "select", "t.default", "reshape", "alias",
                "as_strided", "detach", "permute", "_local_scalar_dense", "promote_types", "empty")


def count_launches(fn: Callable[[], object]) -> collections.Counter:
    """Aten ops (``NOT_LAUNCHES`` left out) and Triton launches (``"triton:<kernel>"``) of one call of ``fn``;
    the ops Triton's interpreter runs inside a launch are not counted."""
    import triton.runtime.interpreter as ti
    from torch.utils._python_dispatch import TorchDispatchMode

    ops: collections.Counter = collections.Counter()
    inside = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0] and not any(v in str(func) for v in NOT_LAUNCHES):
                ops[str(func).removeprefix("aten.")] += 1
            return func(*args, **(kwargs or {}))

    orig = ti.GridExecutor.__call__

    def call(self, *args, **kwargs):
        ops["triton:" + self.fn.__name__] += 1
        inside[0] += 1
        try:
            return orig(self, *args, **kwargs)
        finally:
            inside[0] -= 1

    ti.GridExecutor.__call__ = call
    try:
        with Count():
            fn()
    finally:
        ti.GridExecutor.__call__ = orig
    return ops
