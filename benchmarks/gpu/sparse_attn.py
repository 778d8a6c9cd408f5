"""The sparse-attention kernel of one layer on the H200: old launch vs the table, % of copy bandwidth, sweep.

    python3 benchmarks/gpu/sparse_attn.py --out $OUT --budget-s 110
    python3 benchmarks/gpu/sparse_attn.py --smoke --out /tmp/sparse_attn      # CPU, interpreter, < 1 min

Why this script: issue14.py's per-layer number ("one layer's sparse attention at 18 % of copy
bandwidth", 2026-12-01) timed ONE eager call between two CUDA events. At the Llama-3.1-8B shape that
call's kernels take ~36 µs, but the Python side of ``attend`` plus two Triton launches take ~100 µs on
the host, and the events measured the host: 140 µs. The same kernel inside the CUDA-graphed step ran
at 34 µs + 2 µs combine per layer (kernel table of that run), i.e. ~70 % of copy bandwidth. Here
every timing is of a CUDA graph that calls the kernel once on each of ``copies`` independent KV
buffers (working set >= 400 MB, beyond the L2), replayed ``reps`` times, median per call; the eager
one-call number is kept next to it ("eager_us") to show the difference.

Per shape (bf16, random data; 5 % plan = ``0.05 * ctx`` random positions below ``ctx - 16`` per
(sequence, KV head), plus the new row as the dense tail -- the plan of issue14.py's draft step):

* rel. error of the table launch against an fp32 gather-and-softmax reference (two sequences);
* every launch in ``SWEEP`` (the previous default ``legacy`` first, then the table row, then
  neighbours): µs, GB/s, share of the bandwidth of a torch ``copy_`` of the same number of bytes
  measured in the same run (read + write counted, also rotated over buffers);
* gather (sorted and unsorted random positions) vs a contiguous window of the same size, for the
  legacy and the table launch;
* the best launch per shape and the ``LAUNCH_TABLE`` rows it suggests.

Bytes counted: K and V rows of every visited position (plan + tail) and the plan's int64 indices.
Everything is written to ``<out>/sparse_attn.json`` and ``.md`` after each shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from specdec.cuda.triton_attention import SPARSE_LEGACY, LaunchConfig, splitk_attention, table_entry  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

T0 = time.perf_counter()
SHAPES = [  # name, H, H_kv, D, B, context
    ("llama-3.1-8b B=16x32k", 32, 8, 128, 16, 32768),
    ("llama-3.1-8b B=1x128k", 32, 8, 128, 1, 131072),
    ("smollm2-135m B=64x8k", 9, 3, 64, 64, 8000),
]
SMOKE_SHAPES = [("tiny 8b-geometry", 8, 2, 128, 2, 700), ("tiny smollm2-geometry", 9, 3, 64, 3, 500)]


def mk(bn, w, s, c, e, m, single=1.0) -> LaunchConfig:
    # fused_combine pinned off (the library's None lets the table turn it on at head dim 128 over >= 32k):
    # each row names its own combine, "_fc" below
    return LaunchConfig(block_n=bn, num_warps=w, num_stages=s, ctas_per_sm=c, v_early=e, min_tiles=m,
                        sparse_single_split_at=single, fused_combine=False)


def name_of(c: LaunchConfig) -> str:
    one = "" if c.sparse_single_split_at == 1.0 else f"_one{c.sparse_single_split_at}"
    fc = "_fc" if c.fused_combine else ""
    return f"bn{c.block_n}w{c.num_warps}s{c.num_stages}c{c.ctas_per_sm}{'e' if c.v_early else 'l'}m{c.min_tiles}{one}{fc}"


def sweep_for(head_dim: int, smoke: bool) -> list[tuple[str, LaunchConfig]]:
    legacy = ("legacy", mk(*SPARSE_LEGACY))
    table = ("table", mk(*table_entry(True, head_dim)))
    if smoke:
        return [legacy, table, ("bn32w4s3c4em2", mk(32, 4, 3, 4, True, 2)),
            ("table_fused_combine", dataclasses.replace(mk(*table_entry(True, head_dim)), fused_combine=True))]
    # neighbours of the table row, most telling first (a shape's time share may cut the list short):
    # splits, V order, 2 stages, gathers two tiles ahead, tile sizes, warps
    rows = [(64, 4, 3, 8, True, 2), (64, 4, 3, 2, True, 2), (64, 4, 3, 4, False, 2), (64, 4, 2, 4, True, 1),
            (64, 4, 5, 4, True, 2), (32, 4, 3, 4, True, 2), (128, 4, 3, 4, True, 1), (32, 4, 5, 8, True, 2),
            (64, 8, 3, 4, True, 2)]
    t = table_entry(True, head_dim)
    out = [legacy, table,
           ("table_one_split_at_0.5", mk(*t, single=0.5)),  # one split already at half a program per SM
           ("table_never_one_split", mk(*t, single=None)),
           ("table_fused_combine", dataclasses.replace(mk(*t), fused_combine=True)),
           ("table_never_one_split_fused_combine", dataclasses.replace(mk(*t, single=None), fused_combine=True))]
    return out + [(name_of(mk(*r)), mk(*r)) for r in rows]


def elapsed() -> float:
    return time.perf_counter() - T0


def per_call_us(fns, dev, reps: int) -> float:
    """Median µs per call of ``fns`` (one per buffer copy): replays of one CUDA graph on a GPU, wall clock on the CPU."""
    for f in fns:  # compile + warm up at this shape
        f()
    if dev.type != "cuda":
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            for f in fns:
                f()
            ts.append((time.perf_counter() - t) / len(fns))
        return statistics.median(ts) * 1e6
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    del g
    return statistics.median(ts)


def eager_one_call_us(fn, dev) -> float:
    """The old measurement: one eager call between two CUDA events (host launch overhead included)."""
    for _ in range(3):
        fn()
    if dev.type != "cuda":
        return float("nan")
    torch.cuda.synchronize()
    ts = []
    for _ in range(9):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def reference(q, k, v, idx, ctx, scale):
    """fp32 attention of the new row (position ``ctx``) over the plan positions and itself."""
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    tail = torch.full((B, Hkv, 1), ctx, dtype=idx.dtype, device=idx.device)
    pos = torch.cat([idx, tail], dim=-1)  # (B, Hkv, K+1)
    gi = pos.unsqueeze(-1).expand(-1, -1, -1, D)
    kk = torch.gather(k, 2, gi).float().repeat_interleave(G, dim=1)
    vv = torch.gather(v, 2, gi).float().repeat_interleave(G, dim=1)
    p = torch.softmax(torch.einsum("bhtd,bhkd->bhtk", q.float(), kk) * scale, dim=-1)
    return torch.einsum("bhtk,bhkd->bhtd", p, vv)


def run_shape(name, H, Hkv, D, B, ctx, a, dev, bw_big, log) -> dict:
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    L = ctx + 8
    budget = max(16, int(0.05 * ctx))
    gen = torch.Generator(device=dev).manual_seed(0)
    rand = torch.stack([torch.randperm(ctx - 16, device=dev, generator=gen)[:budget] for _ in range(B * Hkv)])
    rand = rand.view(B, Hkv, budget)
    plans = {"gather_sorted": rand.sort(-1).values.contiguous(), "gather_unsorted": rand.contiguous(),
             "window": torch.arange(ctx - 16 - budget, ctx - 16, device=dev).expand(B, Hkv, budget).contiguous()}
    nbytes = B * Hkv * (budget + 1) * D * 2 * 2 + B * Hkv * budget * 8
    kv_bytes = B * Hkv * L * D * 2 * 2
    copies = 2 if a.smoke else max(2, min(16, math.ceil(a.working_set / nbytes)))
    copies = max(1, min(copies, int(a.max_kv_bytes // kv_bytes)))
    ks = [torch.empty(B, Hkv, L, D, device=dev, dtype=dt).normal_(generator=gen) for _ in range(copies)]
    vs = [torch.empty(B, Hkv, L, D, device=dev, dtype=dt).normal_(generator=gen) for _ in range(copies)]
    q = torch.randn(B, H, 1, D, device=dev, dtype=dt, generator=gen)
    lengths = torch.full((B,), ctx, dtype=torch.long, device=dev)
    scale = D ** -0.5
    metas = {k: AttentionMetadata(lengths, scale, plan_indices=p, dense_from=lengths) for k, p in plans.items()}
    res = dict(shape=name, H=H, Hkv=Hkv, D=D, B=B, context=ctx, budget=budget, bytes=nbytes, copies=copies, rows=[])
    log(f"== {name}: budget {budget}, {nbytes / 1e6:.1f} MB per call, {copies} KV copies")

    # copy of the same number of bytes (read nbytes + write nbytes), rotated over buffers like the kernel
    n_el = nbytes // 2
    srcs = [torch.empty(n_el, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    dsts = [torch.empty_like(x) for x in srcs]
    t_copy = per_call_us([lambda i=i: dsts[i].copy_(srcs[i]) for i in range(copies)], dev, a.reps)
    bw_same = 2 * nbytes / (t_copy * 1e-6)
    del srcs, dsts
    res.update(copy_same_bytes_us=t_copy, copy_same_bytes_GBps=bw_same / 1e9,
               copy_2GiB_GBps=bw_big / 1e9, kernel_at_copy_bw_us=nbytes / bw_same * 1e6)
    log(f"  copy of the same bytes: {t_copy:.1f} us per {nbytes / 1e6:.1f} MB read+written = {bw_same / 1e9:.0f} GB/s; "
        f"the sparse kernel at that bandwidth: {nbytes / bw_same * 1e6:.1f} us")

    # correctness of the table launch at this shape (two sequences)
    bb = min(B, 2)
    o = splitk_attention(q[:bb], ks[0][:bb], vs[0][:bb], AttentionMetadata(lengths[:bb], scale, plans["gather_unsorted"][:bb],
                                                                            lengths[:bb]))[0]
    ref = reference(q[:bb], ks[0][:bb], vs[0][:bb], plans["gather_unsorted"][:bb], ctx, scale)
    res["rel_err_table_vs_fp32"] = float((o.float() - ref).norm() / ref.norm())
    log(f"  rel. error of the table launch vs fp32 reference: {res['rel_err_table_vs_fp32']:.2e}")

    def fns_for(cfg, plan):
        m = metas[plan]
        return [lambda i=i: splitk_attention(q, ks[i], vs[i], m, cfg=cfg) for i in range(copies)]

    res["eager_one_call_us_table"] = eager_one_call_us(fns_for(LaunchConfig(), "gather_sorted")[0], dev)
    log(f"  eager single call (the 2026-12-01 measurement method): {res['eager_one_call_us_table']:.1f} us")

    for cname, cfg in sweep_for(D, a.smoke):
        for plan in (("gather_sorted", "gather_unsorted", "window") if cname in ("legacy", "table") else ("gather_sorted",)):
            if elapsed() > a.deadline:
                res["rows"].append(dict(config=cname, plan=plan, skipped="out of time"))
                continue
            try:
                us = per_call_us(fns_for(cfg, plan), dev, a.reps)
                row = dict(config=cname, launch=name_of(cfg.resolve(True, D)), plan=plan, us=us,
                           GBps=nbytes / (us * 1e-6) / 1e9, share_of_copy_bw=t_copy / us)
                log(f"  {cname:<26} {row['launch']:<28} {plan:<16} {us:8.1f} us {row['GBps']:7.0f} GB/s "
                    f"{100 * row['share_of_copy_bw']:5.1f} % of copy")
            except Exception:  # noqa: BLE001 - a benchmark records a failed launch (e.g. shared memory) and goes on
                row = dict(config=cname, plan=plan, error=traceback.format_exc(limit=3))
                log(f"  {cname} {plan}: FAILED {row['error'].splitlines()[-1]}")
            res["rows"].append(row)
    ok = [r for r in res["rows"] if "us" in r and r["plan"] == "gather_sorted"]
    by = {r["config"]: r for r in ok}
    if ok:
        best = min(ok, key=lambda r: r["us"])
        res["best"] = best
        if "legacy" in by and "table" in by:
            res["table_speedup_vs_legacy"] = by["legacy"]["us"] / by["table"]["us"]
        for c in ("legacy", "table"):
            g = [r for r in res["rows"] if r.get("config") == c and "us" in r]
            d = {r["plan"]: r["us"] for r in g}
            if "window" in d:
                res[f"gather_over_window_{c}"] = d.get("gather_sorted", float("nan")) / d["window"]
                res[f"unsorted_over_window_{c}"] = d.get("gather_unsorted", float("nan")) / d["window"]
        log(f"  best {best['config']} ({best['launch']}) {best['us']:.1f} us = {100 * best['share_of_copy_bw']:.1f} % of copy; "
            f"table/legacy speedup {res.get('table_speedup_vs_legacy', float('nan')):.2f}x; gather/window "
            f"{res.get('gather_over_window_table', float('nan')):.3f} (table) {res.get('gather_over_window_legacy', float('nan')):.3f} (legacy)")
    del ks, vs
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return res


def markdown(out: dict) -> str:
    lines = [f"# Sparse attention, one layer ({out['date']}, {out.get('gpu') or out['device']})", "",
             f"copy bandwidth (2 GiB copy_, read + write): {out['copy_2GiB_GBps']:.0f} GB/s; torch {out['torch']}, "
             f"triton {out['triton']}. Graph-replayed medians per call; share = time of a copy_ of the same bytes / kernel time.", "",
             "| shape | MB/call | copy same bytes µs | eager 1 call µs | legacy µs (% copy) | table µs (% copy) | best | best µs (% copy) "
             "| gather/window legacy | gather/window table | unsorted/window table |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in out["shapes"]:
        if "error" in s:
            lines.append(f"| {s['shape']} | error: {s['error'].splitlines()[-1][:80]} |")
            continue
        by = {r["config"]: r for r in s["rows"] if r.get("plan") == "gather_sorted" and "us" in r}
        cell = lambda c: f"{by[c]['us']:.1f} ({100 * by[c]['share_of_copy_bw']:.0f} %)" if c in by else "—"  # noqa: E731
        b = s.get("best", {})
        lines.append(f"| {s['shape']} | {s['bytes'] / 1e6:.1f} | {s['copy_same_bytes_us']:.1f} | {s['eager_one_call_us_table']:.1f} "
                     f"| {cell('legacy')} | {cell('table')} | {b.get('config', '—')} `{b.get('launch', '')}` "
                     f"| {cell(b['config']) if b else '—'} | {s.get('gather_over_window_legacy', float('nan')):.3f} "
                     f"| {s.get('gather_over_window_table', float('nan')):.3f} | {s.get('unsorted_over_window_table', float('nan')):.3f} |")
    lines += ["", "Suggested `LAUNCH_TABLE` sparse rows (fastest launch by geometric mean over the shapes of each head dim):", ""]
    for d, row in out.get("suggested_rows", {}).items():
        lines.append(f"- head dim {d}: `{row}`")
    lines += ["", "All launches per shape (gather, sorted plan):", ""]
    for s in out["shapes"]:
        lines.append(f"- {s['shape']}: " + ", ".join(f"{r['config']} {r['us']:.1f}" for r in s.get("rows", [])
                                                      if r.get("plan") == "gather_sorted" and "us" in r))
    return "\n".join(lines) + "\n"


def suggest(shapes: list[dict]) -> dict:
    """Per head dim: the launch with the best geometric-mean time over that head dim's shapes (timed on all)."""
    out = {}
    for d in sorted({s["D"] for s in shapes if "rows" in s}):
        per: dict[str, list[float]] = {}
        launch = {}
        group = [s for s in shapes if s.get("D") == d and "rows" in s]
        for s in group:
            for r in s["rows"]:
                if r.get("plan") == "gather_sorted" and "us" in r:
                    per.setdefault(r["config"], []).append(r["us"])
                    launch[r["config"]] = r["launch"]
        full = {c: v for c, v in per.items() if len(v) == len(group)}
        if full:
            c = min(full, key=lambda c: math.exp(sum(math.log(x) for x in full[c]) / len(full[c])))
            out[str(d)] = f"{c}: {launch[c]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--budget-s", type=float, default=110.0, help="no launch is timed after this many seconds")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--working-set", type=float, default=400e6, help="bytes visited per graph replay (beyond the L2)")
    ap.add_argument("--max-kv-bytes", type=float, default=24e9, help="most bytes of K/V buffer copies per shape")
    a = ap.parse_args()
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu" if a.smoke else "cuda")
    if a.smoke:
        a.reps = 2
    import triton

    def log(s: str) -> None:
        print(s, flush=True)
        with open(out_dir / "sparse_attn.log", "a") as f:
            f.write(s + "\n")

    if dev.type == "cuda":
        x = torch.empty(1 << 30, dtype=torch.bfloat16, device=dev)
        y = torch.empty_like(x)
        bw_big = 2 * x.numel() * 2 / (per_call_us([lambda: y.copy_(x)], dev, 7) * 1e-6)
        del x, y
        torch.cuda.empty_cache()
    else:
        bw_big = float("nan")
    out = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), device=str(dev),
               gpu=torch.cuda.get_device_name() if dev.type == "cuda" else None,
               sms=torch.cuda.get_device_properties(0).multi_processor_count if dev.type == "cuda" else None,
               torch=torch.__version__, triton=triton.__version__, copy_2GiB_GBps=bw_big / 1e9,
               command=" ".join(sys.argv), shapes=[])
    log(f"copy bandwidth (2 GiB): {bw_big / 1e9:.0f} GB/s")
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    for i, shape in enumerate(shapes):
        # each shape gets an equal share of the time left (legacy and table are timed first)
        a.deadline = elapsed() + (a.budget_s - elapsed()) / (len(shapes) - i)
        try:
            out["shapes"].append(run_shape(*shape, a=a, dev=dev, bw_big=bw_big, log=log))
        except Exception:  # noqa: BLE001 - recorded, the next shape still runs
            out["shapes"].append(dict(shape=shape[0], error=traceback.format_exc(limit=4)))
            log(f"  {shape[0]}: FAILED\n{out['shapes'][-1]['error']}")
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        out["suggested_rows"] = suggest(out["shapes"])
        (out_dir / "sparse_attn.json").write_text(json.dumps(out, indent=1, default=str))
        (out_dir / "sparse_attn.md").write_text(markdown(out))
    log(f"done in {elapsed():.0f} s; suggested rows: {out['suggested_rows']}")


if __name__ == "__main__":
    main()
