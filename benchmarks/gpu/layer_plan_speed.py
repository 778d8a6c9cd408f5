"""Dustin's verification step with one shared set vs per-layer sets (``layer_share``), at B = 64 × 8k (a diagnostic).

    python3 benchmarks/gpu/layer_plan_speed.py --out DIR            # GPU: random-weight SmolLM2-135M shape, bf16
    python3 benchmarks/gpu/layer_plan_speed.py --out DIR --smoke    # CPU: same shape, float32, tiny sizes

The model is ``specdec.shapes.random_model("smollm2-135m")`` (no model file: timing does not depend on the weights),
bf16, Triton backend, fused projections, CUDA graphs; a cache of random K/V at ``--context`` positions; random
draft / target signals. Per setting (budget 25 %: the shared hybrid set; ``layer_share`` 0.5; …): the plan
(``Planner.plan``: captured when the selector says so, else eager), the verify forward of γ + 1 = 5 rows with that
plan (graph-replayed by the backend), and both together; dense T = 5 is the reference. Medians of ``--reps`` CUDA-event
timings after warm-up. Then ``torch.profiler`` over the per-layer setting's plan + forward: the top kernels by device
time and the launch count (``DIR/layer_plan_speed.{json,md}``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from script_io import graphed, timed  # noqa: E402


def kernel_table(fn, calls: int, top: int = 15) -> dict:
    """Top device kernels of ``calls`` calls of ``fn`` (µs per call) and launches per call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    ev = [e for e in prof.key_averages() if getattr(e, "device_time_total", 0) > 0 and e.device_type.name == "CUDA"]
    ev.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in ev)
    return dict(device_us_per_call=round(total / calls, 1), launches_per_call=sum(e.count for e in ev) / calls,
                top=[dict(name=e.key[:90], us_per_call=round(e.device_time_total / calls, 1), count=e.count / calls)
                     for e in ev[:top]])


def kernels_alone(m, plan, reps: int) -> dict:
    """µs per call of layer 0's page scoring (bounds as stored, and in float32) and of ``select_pages`` per warp count."""
    from specdec.cuda import triton_quest, triton_select

    dev = m.device
    B = plan.lengths.shape[0]
    q = torch.randn(B, m.dims.n_heads, 5, m.dims.head_dim, device=dev, dtype=torch.bfloat16)
    kmin, kmax = plan.kmin[0], plan.kmax[0]
    out = {}
    for label, (a, b) in {f"page scores ({kmin.dtype})": (kmin, kmax),
                          "page scores (float32 bounds)": (kmin.float(), kmax.float())}.items():
        out[label] = 1e3 * timed(graphed(lambda a=a, b=b: triton_quest.quest_page_scores(q, a, b), dev), reps, dev, 3)
    page = triton_quest.quest_page_scores(q, kmin, kmax)
    fixed = plan.indices[0, :, 0]
    for w in (1, 2, 4, 8):
        fn = lambda w=w: triton_select.select_pages(page, plan.counts, plan.new, plan.room, fixed,  # noqa: E731
                                                   plan.k_sel, plan.page_size, w)
        out[f"select_pages, {w} warps"] = 1e3 * timed(graphed(fn, dev), reps, dev, 3)
    return out


def random_verify_step(gpu: bool, B: int, L: int, T: int = 5):
    """``(model, cache, lengths, ids, target_heads)`` of a verify step at B x L: the random-weight SmolLM2-135M shape
    (bf16, Triton backend, fused projections, CUDA graphs on a GPU; float32 reference on the CPU), a cache of random
    K/V at ``L`` positions per sequence, ``T`` random rows, and Dustin's default retrieval heads."""
    from specdec.dustin import default_heads
    from specdec.loading import load_model

    m = load_model("random", "bfloat16" if gpu else "float32", "cuda" if gpu else "cpu",
                   "triton" if gpu else "reference", gpu, False, gpu, shape="smollm2-135m")
    cache = m.new_cache(B, L + 128)
    torch.manual_seed(0)
    for t in (cache.k, cache.v):
        t.normal_()
    lengths = torch.full((B,), L, device=m.device, dtype=torch.long)
    ids = torch.randint(0, 1000, (B, T), device=m.device)
    t_heads, _ = default_heads(m.dims.n_global, m.dims.n_heads, 1)
    return m, cache, lengths, ids, t_heads


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--settings", default='{"25% shared": {}, "25% layer_share 0.5": {"layer_share": 0.5}}',
                    help="JSON {label: HybridSRHConfig fields} (budget_ratio 0.25 unless given)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    from specdec.planner import planner_for
    from specdec.selectors.hybrid_srh import HybridSRHConfig, HybridSRHSelector

    gpu = not a.smoke
    if a.smoke:
        a.context, a.batch, a.reps = 96, 2, 2
    m, cache, lengths, ids, t_heads = random_verify_step(gpu, a.batch, a.context)
    dev = m.device
    B, L, T = a.batch, a.context, ids.shape[1]
    planner = planner_for(cache)
    res: dict = dict(meta=dict(batch=B, context=L, rows=T, device=torch.cuda.get_device_name() if gpu else "cpu",
                               torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               command=" ".join(sys.argv)), rows={}, profiles={})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    def save():
        (out / "layer_plan_speed.json").write_text(json.dumps(res, indent=1))

    res["rows"]["dense T=5"] = dict(forward_ms=round(timed(lambda: m.forward(ids, cache, lengths), a.reps, dev, 3), 4))
    save()
    for label, fields in json.loads(a.settings).items():
        cfg = HybridSRHConfig(**{"budget_ratio": 0.25, "target_heads": [tuple(x) for x in t_heads], **fields})
        sel = HybridSRHSelector(cfg)
        sel.draft_signal = torch.rand(B, cache.capacity, device=dev)
        sel.target_signal = torch.rand(B, cache.capacity, device=dev)
        host = [L] * B

        def planned(sel=sel):
            """What the verifier does before a sparse pass: the selector's eager work (low-rank keys: project the
            last γ + 1 = 5 positions, as after a round), then the plan (captured where the selector allows)."""
            if sel._keys is not None and sel._keys.done_host is not None:
                sel._keys.done_host = [L - T] * B
            sel.prepare(cache, lengths, host)
            return planner.plan(sel, lengths)
        plan = planned()
        both = lambda planned=planned: m.forward(ids, cache, lengths, plan=planned())  # noqa: E731
        row = dict(plan_ms=timed(planned, a.reps, dev, 3),
                   forward_ms=timed(lambda plan=plan: m.forward(ids, cache, lengths, plan=plan), a.reps, dev, 3),
                   plan_and_forward_ms=timed(both, a.reps, dev, 3),
                   plan_captured=bool(getattr(sel, "capturable_plan", False)), plan_type=type(plan).__name__,
                   entries=plan.budget if hasattr(plan, "budget") else int(plan.indices.shape[-1]))
        g = getattr(m, "_graphs", None)  # did the verify forward replay a graph, or run eagerly (and why)
        if g is not None:
            row.update(graph_captures=g.captures, graph_replays=g.replays,
                       uncapturable=sorted({str(v) for v in g.uncapturable.values()}))
        res["rows"][label] = {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
        save()
        if gpu:
            res["profiles"][label] = kernel_table(both, 5)
            save()
        print(label, res["rows"][label], flush=True)
    if hasattr(plan, "counts") and (gpu or os.environ.get("TRITON_INTERPRET") == "1"):  # the last (per-layer) setting's kernels alone, each graph-replayed
        res["kernels"] = kernels_alone(m, plan, a.reps)
        save()
    d = res["rows"]["dense T=5"]["forward_ms"]
    lines = [f"# Dustin's verify step, shared vs per-layer sets — {res['meta']['date']}", "",
             f"`{res['meta']['command']}` on {res['meta']['device']} (torch {res['meta']['torch']}); B = {B}, "
             f"{L} positions, T = {T}, random-weight SmolLM2-135M shape.", "",
             "| setting | plan ms | forward ms | plan + forward ms | × dense forward | plan captured | entries |",
             "|---|---|---|---|---|---|---|", f"| dense T=5 | | {d:.3f} | {d:.3f} | 1.00 | | |"]
    for label, r in res["rows"].items():
        if label != "dense T=5":
            lines.append(f"| {label} | {r['plan_ms']:.3f} | {r['forward_ms']:.3f} | {r['plan_and_forward_ms']:.3f} | "
                         f"{r['plan_and_forward_ms'] / d:.2f} | {r['plan_captured']} | {r['entries']} |")
    for label, p in res["profiles"].items():
        lines += ["", f"## {label}: kernels per plan + forward ({p['device_us_per_call']} µs, "
                  f"{p['launches_per_call']:.0f} launches)", "", "| kernel | µs | launches |", "|---|---|---|"]
        lines += [f"| `{k['name']}` | {k['us_per_call']} | {k['count']:.0f} |" for k in p["top"]]
    if res.get("kernels"):
        lines += ["", "## One layer's per-layer part, kernels alone (graph-replayed, µs per call)", "",
                  "| kernel | µs |", "|---|---|"] + [f"| {k} | {v:.1f} |" for k, v in res["kernels"].items()]
    (out / "layer_plan_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
