"""What one tensor-parallel forward's all-reduces cost on this machine's GPUs (NCCL), alone.

Under torchrun (one process per GPU)::

    torchrun --nproc-per-node 2 benchmarks/gpu/tp_allreduce.py --out results.json

Every decoder layer of a sharded model all-reduces twice per forward (``o_proj`` and ``down_proj``, a
``(B, T, hidden)`` tensor each: :mod:`specdec.parallel`), so a forward of the Llama-3.1-8B shape runs 64 of them.
For each (B, T) this times 64 back-to-back all-reduces of ``(B, T, 4096)`` bf16 — eagerly, and captured in one CUDA
graph as the engine runs them — median of ``--repeats`` replays (CUDA events, rank 0's clock, after a barrier).
That is the collectives' cost with nothing to overlap; in a step they also wait for the slower rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist


def _time(fn, repeats: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` runs (each after a barrier)."""
    out = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--count", type=int, default=64, help="all-reduces per forward (2 per layer)")
    ap.add_argument("--shapes", default="16x1,16x9,32x1,32x9,64x1,64x5", help="BxT list")
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    rows = []
    for spec in a.shapes.split(","):
        B, T = (int(x) for x in spec.split("x"))
        bufs = [torch.full((B, T, a.hidden), float(rank + 1), device="cuda", dtype=torch.bfloat16) for _ in range(a.count)]

        def eager():
            for t in bufs:
                dist.all_reduce(t)

        eager()  # the communicator's first use, outside any capture
        torch.cuda.synchronize()
        ok = all(float(t.float().mean()) == float(sum(range(1, world + 1))) for t in bufs[:1])
        e_ms = _time(eager, a.repeats)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            eager()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            eager()
        g_ms = _time(g.replay, a.repeats)
        mb = B * T * a.hidden * 2 / 1e6
        rows.append(dict(batch=B, rows=T, count=a.count, message_mb=mb, eager_ms=e_ms, graph_ms=g_ms,
                         graph_us_each=1000 * g_ms / a.count, eager_us_each=1000 * e_ms / a.count, sum_ok=ok))
        if rank == 0:
            print(f"B {B} T {T}: {a.count} x {mb:.3f} MB: eager {e_ms:.3f} ms, graph {g_ms:.3f} ms "
                  f"({1000 * g_ms / a.count:.1f} us each), sum ok {ok}", flush=True)
    if rank == 0:
        info = dict(world=world, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    nccl=".".join(map(str, torch.cuda.nccl.version())),
                    nvls=os.environ.get("NCCL_NVLS_ENABLE"), hidden=a.hidden)
        with open(a.out, "w") as f:
            json.dump(dict(meta=info, rows=rows), f, indent=2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
