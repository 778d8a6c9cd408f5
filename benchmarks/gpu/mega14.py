"""The MLP half of a decoder layer in one launch (grid barrier) against today's launches, on a GPU.

A chain of ``--layers`` MLP halves of the SmolLM2-135M geometry (hidden 576, intermediate 1536, bf16; distinct
random weights per layer, so the chain reads ~160 MB of weights, more than the L2), each layer's down-GEMM
partials feeding the next layer's norm as in the fused model, captured in one CUDA graph per variant and
replayed; per-layer microseconds (median of ``--reps`` timings of ``--inner`` replays):

* ``kernels``: the fused layer's default MLP half — RMSNorm (+ residual + partials) kernel, cuBLAS gate/up GEMM,
  SiLU·mul kernel, split down GEMM (4 launches);
* ``fused_gemm``: :func:`specdec.cuda.triton_gemm.norm_gate_up_silu` + split down GEMM (2 launches);
* ``mega``: :func:`mega14_kernel.mlp_one_launch` (beside this script; 1 launch, grid barrier);
* ``mega2``: the same kernel as two launches (no barrier).

Also times a launch that only passes the barrier, and checks ``mega`` against ``mega2`` (bitwise) and
``kernels`` (max abs difference). Writes a JSON file to ``--out``.

    python benchmarks/gpu/mega14.py --out $OUT/mega14.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import mega14_kernel as tm  # beside this script (an experiment, not part of the package)
from mega14_kernel import _grid_barrier


@triton.jit
def _barrier_only(Ctr, P):
    _grid_barrier(Ctr, P)
    if tl.atomic_add(Ctr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:
        tl.atomic_xchg(Ctr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(Ctr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _empty(Ctr, P):
    pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--inter", type=int, default=1536)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--variants", default="kernels,fused_gemm,mega,mega2,mega_d1,mega_d4")
    ap.add_argument("--tune", default="{}", help="JSON overrides of mega14_kernel.TUNE")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from specdec.cuda import triton_fused as tf
    from specdec.cuda import triton_gemm as tg

    tm.TUNE.update(json.loads(a.tune))
    dev, dt = torch.device("cuda"), torch.bfloat16
    K, I, L = a.hidden, a.inter, a.layers
    g = torch.Generator(device=dev).manual_seed(0)
    layers = [dict(nw=(1 + 0.1 * torch.randn(K, device=dev, generator=g)).to(dt),
                   wgu=(torch.randn(2 * I, K, device=dev, generator=g) / K ** 0.5).to(dt),
                   wd=(torch.randn(K, I, device=dev, generator=g) / I ** 0.5).to(dt)) for _ in range(L)]
    eps = 1e-5

    def chain(variant, x, res):
        parts, r = x, res
        for w in layers:
            sp = parts.shape[0] if parts.dim() == 3 else 1
            if variant == "kernels":
                h, r = tf.rms_norm(parts, w["nw"], eps, residual=r, splits=sp)
                parts = tf.split_linear(tf.silu_mul(F.linear(h, w["wgu"])), w["wd"], 2)
            elif variant == "fused_gemm":
                act, r = tg.norm_gate_up_silu(parts, w["nw"], eps, w["wgu"], residual=r, splits=sp)
                parts = tf.split_linear(act, w["wd"], 2)
            elif variant in ("mega", "mega2", "mega_d4"):
                ds = 4 if variant == "mega_d4" else 2
                splits = parts.shape[0] if parts.dim() == 3 else 1
                parts, r = tm.mlp_one_launch(parts, w["nw"], eps, w["wgu"], w["wd"], r, splits=splits,
                                             down_splits=ds, one_launch=variant != "mega2")
            elif variant == "mega_d1":
                splits = parts.shape[0] if parts.dim() == 3 else 1
                out, _ = tm.mlp_one_launch(parts, w["nw"], eps, w["wgu"], w["wd"], r, splits=splits,
                                           down_splits=1)
                parts = out  # the next layer's input without partials (timing only)
            else:
                raise SystemExit(f"unknown variant {variant}")
        return parts, r

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    result = dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__, triton=triton.__version__,
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), tune=tm.TUNE, layers=L, hidden=K,
                  inter=I, rows={}, barrier={})

    def timed(fn, label):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(a.inner):
                graph.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1000 / a.inner)
        return statistics.median(times), min(times), max(times)

    # a launch that only passes the barrier, and an empty launch, 100 of each in a graph
    ctr = tm._counters(dev)
    for name, kern in (("barrier", _barrier_only), ("empty", _empty)):
        med, lo, hi = timed(lambda: [kern[(sms,)](ctr, sms) for _ in range(100)], name)
        result["barrier"][name] = dict(us_per_launch=med / 100, min=lo / 100, max=hi / 100)
        print(f"{name}: {med / 100:.2f} us per launch of {sms} programs", flush=True)

    for M in [int(m) for m in a.rows.split(",")]:
        x = torch.randn(M, K, device=dev, dtype=dt, generator=g)
        res = torch.randn(M, K, device=dev, dtype=dt, generator=g)
        row = result["rows"][M] = {}
        outs = {}
        for v in a.variants.split(","):
            outs[v] = chain(v, x, res)
            med, lo, hi = timed(lambda v=v: chain(v, x, res), v)
            row[v] = dict(us_per_layer=med / L, min=lo / L, max=hi / L)
            print(f"M={M} {v}: {med / L:.2f} us per layer ({lo / L:.2f}-{hi / L:.2f})", flush=True)
        if "mega" in outs and "mega2" in outs:
            row["mega_equals_mega2"] = bool(torch.equal(outs["mega"][0], outs["mega2"][0])
                                            and torch.equal(outs["mega"][1], outs["mega2"][1]))
        if "mega" in outs and "kernels" in outs:
            fin = lambda o: (o[0].float().sum(0) + o[1].float())  # noqa: E731
            row["mega_vs_kernels_max_abs"] = (fin(outs["mega"]) - fin(outs["kernels"])).abs().max().item()
            row["kernels_scale"] = fin(outs["kernels"]).abs().max().item()
        print(f"M={M} checks: { {k: v for k, v in row.items() if not isinstance(v, dict)} }", flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
