"""Sparse (and dense) attention per layer on the CPU: numba vs reference vs torch backend.

Random data at the embedded model's layer shape (SmolLM2: 9 query heads, 3 KV heads, head dim 64,
context 8000, budget 5 % = 400 entries + the dense tail) and one Llama-like shape (32/8 heads, head
dim 128, context 32k, budget 1600), T = 1 (draft step) and 5 (verify pass), B = 1 and 4, 1 and 2
threads. Medians of ``--runs`` timed calls after ``--warmup`` calls; numba's JIT compile (or its
on-disk cache load) is timed separately on the first call. The copy bandwidth of this CPU is
measured in the same run and turned into a prediction (bytes a call must read / bandwidth).

    nice -n 5 .venv/bin/python benchmarks/numba_cpu.py --out benchmarks/results/cpu_numba_2026-11-29
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

from specdec.attention.numba_backend import NumbaBackend
from specdec.attention.reference import ReferenceBackend
from specdec.attention.torch_backend import TorchBackend
from specdec.interfaces import AttentionMetadata

SHAPES = {
    "smollm2": dict(H=9, Hkv=3, D=64, ctx=8000, budget=400),
    "llama8b": dict(H=32, Hkv=8, D=128, ctx=32768, budget=1638),
}
TAIL = 3  # tokens drafted since the plan was built (visible through dense_from)


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def median_time(fn, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def copy_bandwidth(nbytes: int, runs: int = 10) -> float:
    """Bytes moved (read + written) per second by a tensor copy of ``nbytes``."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), runs, 2)
    return 2 * nbytes / t


def make_case(shape: dict, B: int, T: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    H, Hkv, D, ctx, K = shape["H"], shape["Hkv"], shape["D"], shape["ctx"], shape["budget"]
    L = ctx + 16
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.full((B,), ctx - T, dtype=torch.long)  # rows end at position ctx - 1
    dense_from = lengths - TAIL
    # K distinct positions per (sequence, KV head) below dense_from, the last few slots padded with -1
    idx = torch.stack([torch.stack([torch.randperm(int(dense_from[b]), generator=g)[:K] for _ in range(Hkv)])
                       for b in range(B)])
    idx[..., K - 8:] = -1
    return q, k, v, lengths, dense_from, idx


def sparse_bytes(shape, B, T, dtype) -> int:
    """K/V bytes a sparse call must read: (budget + tail + T) rows of K and V per (sequence, KV head)."""
    es = torch.finfo(dtype).bits // 8
    rows = shape["budget"] - 8 + TAIL + T
    return B * shape["Hkv"] * rows * shape["D"] * 2 * es


def dense_bytes(shape, B, T, dtype) -> int:
    es = torch.finfo(dtype).bits // 8
    return B * shape["Hkv"] * shape["ctx"] * shape["D"] * 2 * es


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--shapes", default="smollm2,llama8b")
    ap.add_argument("--out", required=True, help="path prefix: writes PREFIX.json")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    # a fresh numba cache so the first call below measures a real compile, not a cache load
    import tempfile

    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cache-")
    import numba

    load0 = os.getloadavg()
    ref, tb = ReferenceBackend(), TorchBackend()
    nb = NumbaBackend(NumbaBackend.Config(dense="on"))
    nb_threads = [int(x) for x in args.threads.split(",")]

    # numba's first call per entry point (serial = 1 thread, parallel = thread pool): the JIT compile
    from specdec.attention import _numba_kernels

    q, k, v, lengths, dense_from, idx = make_case(dict(H=2, Hkv=1, D=8, ctx=64, budget=16), 1, 1, dtype)
    compile_info = {}
    for threads, disp in ((1, _numba_kernels.attend_serial), (2, _numba_kernels.attend_parallel)):
        b = NumbaBackend(NumbaBackend.Config(threads=threads))
        t = time.perf_counter()
        b.numba_attend(q, k, v, lengths, 0.3, idx, dense_from)
        compile_info[f"{threads}_thread_first_call_s"] = time.perf_counter() - t
        compile_info[f"{threads}_thread_cache_hits"] = sum(disp.stats.cache_hits.values())
    overhead = {}
    for th in nb_threads:
        b = NumbaBackend(NumbaBackend.Config(threads=th))
        overhead[th] = median_time(lambda: b.numba_attend(q, k, v, lengths, 0.3, idx, dense_from), 200, 20)

    bw = {}
    torch.set_num_threads(1)
    bw["dram_1t"] = copy_bandwidth(512 << 20)
    bw["l3_1t"] = copy_bandwidth(8 << 20, runs=50)
    torch.set_num_threads(2)
    bw["dram_2t"] = copy_bandwidth(512 << 20)
    bw["l3_2t"] = copy_bandwidth(8 << 20, runs=50)

    rows = []
    for sname in args.shapes.split(","):
        shape = SHAPES[sname]
        for B in ([1, 4] if sname == "smollm2" else [1]):
            for T in (1, 5):
                q, k, v, lengths, dense_from, idx = make_case(shape, B, T, dtype, seed=B * 10 + T)
                scale = shape["D"] ** -0.5
                # same answer from all three first
                o_ref, _ = ref.attend(q, k, v, AttentionMetadata(lengths, scale, idx, dense_from))
                o_nb = nb.numba_attend(q, k, v, lengths, scale, idx, dense_from)
                o_tb, _ = tb.attend(q, k, v, AttentionMetadata(lengths, scale, idx, dense_from))
                err = max((o_nb.float() - o_ref.float()).abs().max().item(), (o_tb.float() - o_ref.float()).abs().max().item())
                for threads in nb_threads:
                    torch.set_num_threads(threads)
                    nb_t = NumbaBackend(NumbaBackend.Config(dense="on", threads=threads))
                    for mode in ("sparse", "dense"):
                        kw = dict(plan_indices=idx, dense_from=dense_from) if mode == "sparse" else {}
                        row = dict(shape=sname, B=B, T=T, mode=mode, threads=threads, dtype=args.dtype,
                                   max_abs_err_vs_reference=err if mode == "sparse" else None)
                        row["numba_s"] = median_time(lambda: nb_t.numba_attend(q, k, v, lengths, scale, kw.get("plan_indices"),
                                                                               kw.get("dense_from")), args.runs, args.warmup)
                        row["torch_s"] = median_time(lambda: tb.attend(q, k, v, AttentionMetadata(lengths, scale, **kw)), args.runs, args.warmup)
                        row["reference_s"] = median_time(lambda: ref.attend(q, k, v, AttentionMetadata(lengths, scale, **kw)),
                                                         args.runs, args.warmup)
                        nbytes = (sparse_bytes if mode == "sparse" else dense_bytes)(shape, B, T, dtype)
                        row["bytes"] = nbytes
                        # K/V read once; a cache that fits the L3 (32 MiB here) may be served from it when hot
                        cache_bytes = 2 * k.numel() * k.element_size()
                        where = "l3" if cache_bytes <= 24 << 20 else "dram"
                        row["kv_cache_bytes"] = cache_bytes
                        row["bw_used"] = f"{where}_{min(threads, 2)}t"
                        row["predicted_s"] = nbytes / (bw[row["bw_used"]] / 2)  # copy BW counts read + write
                        print(json.dumps(row), flush=True)
                        rows.append(row)

    load_at_start = load0
    meta = dict(load_average_at_start=load_at_start,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        command="nice -n 5 " + " ".join([".venv/bin/python"] + sys.argv),
        cpu=cpu_name(), cores=torch.get_num_threads(), python=platform.python_version(),
        torch=torch.__version__, numba=numba.__version__, numba_threading_layer=numba.threading_layer(),
        git=subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        copy_bandwidth_bytes_per_s=bw, numba_first_call=compile_info, numba_call_overhead_s=overhead,
        runs=args.runs, warmup=args.warmup, tail=TAIL, load_average_at_end=os.getloadavg(),
    )
    with open(args.out + ".json", "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
