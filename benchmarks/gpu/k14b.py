"""Issue 14, helper k14b, in one command: adaptive on vs off, honest HF baselines, Vegas' own costs.

    python3 benchmarks/gpu/k14b.py --gguf /tmp/m/smol.gguf --out $OUT --budget-s 270
    python3 benchmarks/gpu/k14b.py --smoke --out /tmp/k14b_smoke     # CPU, tiny shapes, ~1 minute

Embedded model (bf16, ``--backend triton``, CUDA graphs, fused projections + kernels), 8000-token
context of a held-out document (the interpreter's own ``ssl.py``: not a built-in document), γ = 4,
5 % budget, greedy; every row from :func:`specdec.bench.run_bench` (warm-up at the same shape, medians
of 3 timed runs, min–max in the JSON). Parts, in this order (each saved as it ends to
``<out>/k14b.json``; a part that would start after ``--budget-s`` is recorded as skipped; a failing
part records its traceback and the next one runs):

1. ``fixed``    dense / magicdec / vegas, γ fixed (adaptive off), B = 64, 16, 1.
2. ``adaptive`` the same with the adaptive controller on (dense again: the run-to-run noise).
3. ``costs``    one layer's verify attention (γ+1 rows, CUDA graph replays, median of CUDA events)
                without scores, with Collect-2-Query softmax scores and with logits: the score
                emission share (target <= 3 %; also the unfused raw + reduce path of 2026-12-01), at the embedded shape (B = 64 and 16, 8k) and the
                Llama-3.1-8B attention shape (B = 16, 32k, 32/8 heads, d 128). Vegas' selection
                (``on_verify`` + the plan graph, 30 layers, B = 64, 8k) against a vegas iteration of
                part 1 (target <= 2 %).
4. ``hf``       dense, HF ``generate`` default and static cache (detached from specdec's route: SDPA),
                B = 1, 16, 64, 32 new tokens.
5. ``hf_attached`` HF static at B = 16 the old way (through specdec's attention route), to show the
                discrepancy of the 2026-12-01 run (417 vs 1.47k tok/s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = time.perf_counter()


def graph_time(fn, dev, n=20) -> float:
    """Median seconds of ``fn`` replayed as one CUDA graph (events), or wall clock on the CPU."""
    for _ in range(2):
        fn()
    if dev.type != "cuda":
        ts = []
        for _ in range(max(2, n // 5)):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del g
    return statistics.median(ts)


def wall_time(fn, dev, n=10) -> float:
    """Median wall seconds of ``fn`` (synchronised), after 3 warm-up calls."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _common(a, m):
    return dict(contexts=[a.context], documents=[a.document], budget=None, budget_ratio=a.ratio, gamma=a.gamma,
                model=m, backend=a.backend, dtype=a.dtype, device=a.device, output_dir=Path(a.out),
                cuda_graphs=a.graphs, fuse=True, warmup=True, repeats=a.repeats)


def _slim(rows):
    keep = ("batch", "method", "tau", "tokens_per_second", "tokens_per_second_min", "tokens_per_second_max",
            "speedup_vs_dense", "dense_steps", "gamma_mean", "iterations", "selection_overhead_share",
            "same_tokens_as_dense", "phase_seconds", "attn_implementation")
    return [{k: r.get(k) for k in keep if k in r} for r in rows]


def part_fixed(a, res, m):
    from specdec.bench import run_bench

    rows = run_bench(["dense", "magicdec", "vegas"], batch_sizes=a.batches, max_new_tokens=a.new, hf_baseline=False,
                     tag="k14b_fixed", adaptive=False, **_common(a, m))
    res["fixed"] = _slim(rows)


def part_adaptive(a, res, m):
    from specdec.bench import run_bench

    rows = run_bench(["dense", "magicdec", "vegas"], batch_sizes=a.batches, max_new_tokens=a.new, hf_baseline=False,
                     tag="k14b_adaptive", adaptive=True, **_common(a, m))
    res["adaptive"] = _slim(rows)
    # side by side: adaptive / fixed tokens/s per (B, method), and adaptive vs fixed dense
    fixed = {(r["batch"], r["method"]): r for r in res.get("fixed", [])}
    cmp = []
    for r in rows:
        f = fixed.get((r["batch"], r["method"]))
        if f is None:
            continue
        d_f = fixed.get((r["batch"], "dense"))
        cmp.append(dict(batch=r["batch"], method=r["method"], adaptive_over_fixed=r["tokens_per_second"] / f["tokens_per_second"],
                        adaptive_over_dense=r["tokens_per_second"] / d_f["tokens_per_second"] if d_f else None,
                        fixed_over_dense=f["tokens_per_second"] / d_f["tokens_per_second"] if d_f else None,
                        tau_fixed=f["tau"], tau_adaptive=r["tau"], dense_steps=r.get("dense_steps"),
                        gamma_mean=r.get("gamma_mean")))
    res["adaptive_vs_fixed"] = cmp
    # the proposed rule for flipping specdec.adaptive.ADAPTIVE_DEFAULT
    ok = []
    for c in cmp:
        if c["method"] == "dense":
            continue
        if c["batch"] == 1:
            ok.append(c["adaptive_over_dense"] is not None and c["adaptive_over_dense"] >= 0.97)
        else:
            ok.append(c["adaptive_over_fixed"] >= 0.98)
    res["adaptive_never_loses"] = bool(ok) and all(ok)


def _attention_costs(B, H, Hkv, D, L, gamma, dtype, dev, backend, unfused):
    from specdec.interfaces import AttentionMetadata

    g = torch.Generator(device=dev).manual_seed(0)
    T = gamma + 1
    q = torch.randn(B, H, T, D, device=dev, dtype=dtype, generator=g)
    k = torch.randn(B, Hkv, L + T, D, device=dev, dtype=dtype, generator=g)
    v = torch.randn(B, Hkv, L + T, D, device=dev, dtype=dtype, generator=g)
    lengths = torch.full((B,), L, dtype=torch.long, device=dev)
    base = AttentionMetadata(lengths=lengths, scale=D ** -0.5, static=True)
    out = {}
    soft = base.replace(score_rows=[0, gamma], score_kind="softmax")
    for label, meta, be in (("plain", base, backend),
                            ("softmax_collect2", soft, backend),
                            ("softmax_collect2_unfused", soft, unfused),  # the 2026-12-01 path: raw + reduce kernel
                            ("logits_collect2", base.replace(score_rows=[0, gamma], score_kind="logits"), backend)):
        out[label + "_us"] = graph_time(lambda: be.attend(q, k, v, meta), dev) * 1e6
    kv_bytes = 2 * B * Hkv * (L + T) * D * k.element_size()
    out["plain_share_of_copy_bw"] = None  # filled by the caller (needs the copy bandwidth)
    out["kv_bytes"] = kv_bytes
    for label in ("softmax_collect2", "softmax_collect2_unfused", "logits_collect2"):
        out[label + "_emission_share"] = out[label + "_us"] / out["plain_us"] - 1.0
    del q, k, v
    return out


def _selection_cost(a, dev, N, B, Hkv, L):
    """Vegas' selection per iteration: on_verify (head sum into its buffer) + the plan graph (top-k)."""
    from specdec import SELECTORS, KVCache
    from specdec.interfaces import ScoreRequest
    from specdec.planner import planner_for

    cache = KVCache(N, B, Hkv, L + 16, 8, torch.bfloat16, dev)  # head dim 8: the selection never reads K/V
    sel = SELECTORS.build("collect2", budget_ratio=a.ratio)
    sel.reset(cache)
    g = torch.Generator(device=dev).manual_seed(0)
    stacked = torch.rand(N, B, Hkv, L + 16, device=dev, generator=g)  # as a replayed verify graph hands them out
    req = ScoreRequest(rows=[0, a.gamma], kind="softmax", heads="group")
    req.scores = dict(zip(range(N), stacked.unbind(0)))
    lengths = torch.full((B,), L, dtype=torch.long, device=dev)
    planner = planner_for(cache)

    def step():
        sel.on_verify(req, lengths)
        planner.plan(sel, lengths)

    t = wall_time(step, dev)
    pg = planner.plan_graphs
    return dict(seconds=t, plan_graph_captures=None if pg is None else pg.captures,
                plan_graph_replays=None if pg is None else pg.replays,
                scores_read_in_place=None if pg is None else any(
                    s is sel._scores for v in pg.calls.graphs.values() for s in v[1]))


def part_costs(a, res, m, bw):
    dev = torch.device(a.device)
    out = {}
    dtype = getattr(torch, a.dtype)
    from specdec.registry import BACKENDS

    be = m.backend if not a.smoke else BACKENDS.build("triton")
    unfused = BACKENDS.build("triton", fused_softmax_scores=False)
    if a.smoke:  # the interpreter: one split, so the fused path runs
        be = BACKENDS.build("triton", num_splits=1)
        unfused = BACKENDS.build("triton", num_splits=1, fused_softmax_scores=False)
    for label, (B, H, Hkv, D, L) in a.attn_shapes.items():
        try:
            r = _attention_costs(B, H, Hkv, D, L, a.gamma, dtype, dev, be, unfused)
            r["plain_share_of_copy_bw"] = r["kv_bytes"] / (r["plain_us"] * 1e-6) / bw
            out[label] = r
        except Exception:
            out[label] = "error: " + traceback.format_exc(limit=4)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    d = m.dims
    B, L = a.select_shape
    sel = _selection_cost(a, dev, d.n_layers, B, d.n_kv_heads, L)
    it = next((r for r in res.get("fixed", []) if r["method"] == "vegas" and r["batch"] == B), None)
    if it is not None and it.get("iterations"):
        ph = it.get("phase_seconds") or {}
        per_it = sum(v for k, v in ph.items() if k != "prefill") / it["iterations"]
        sel["vegas_iteration_seconds"] = per_it
        sel["share_of_iteration"] = sel["seconds"] / per_it
        sel["e2e_select_phase_share"] = it.get("selection_overhead_share")
    out["selection"] = sel
    res["costs"] = out


def part_hf(a, res, m):
    from specdec.bench import run_bench

    rows = run_bench(["dense"], batch_sizes=a.hf_batches, max_new_tokens=a.hf_new, hf_baseline=True, tag="k14b_hf",
                     **_common(a, m))
    res["hf"] = _slim(rows)


def part_hf_attached(a, res, m):
    """The 2026-12-01 way (through specdec's route) at one batch size: the discrepancy's cause."""
    from specdec.bench import hf_generate_tps
    from specdec.data import context_ids, load_document

    ids = context_ids(m.tokenizer, load_document(a.document), a.context, offset=a.hf_new + 16)
    old = type(m).detached
    type(m).detached = lambda self: contextlib.nullcontext(self)  # the old behaviour: stay attached
    try:
        r = hf_generate_tps(m, ids, a.attached_batch, a.hf_new, "static", a.repeats)
    finally:
        type(m).detached = old
    res["hf_attached"] = dict(batch=a.attached_batch, **r)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, not the numbers")
    ap.add_argument("--parts", default="fixed,adaptive,costs,hf,hf_attached")
    ap.add_argument("--budget-s", type=float, default=270.0, help="no part starts after this many seconds")
    ap.add_argument("--document", default=None, help="held-out text (default: this interpreter's ssl.py)")
    a = ap.parse_args()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    import ssl

    a.document = a.document or ssl.__file__
    a.gamma, a.ratio = 4, 0.05
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.new, a.batches, a.repeats = 200, 6, [1], 2
        a.hf_batches, a.hf_new, a.attached_batch = [1], 4, 1
        a.attn_shapes = {"tiny_B2_256": (2, 4, 2, 16, 256)}
        a.select_shape = (2, 300)
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context, a.new, a.batches, a.repeats = 8000, 64, [64, 16, 1], 3
        a.hf_batches, a.hf_new, a.attached_batch = [1, 16, 64], 32, 16
        a.attn_shapes = {"smollm2_B64_8k": (64, 9, 3, 64, 8000), "smollm2_B16_8k": (16, 9, 3, 64, 8000),
                         "llama8b_B16_32k": (16, 32, 8, 128, 32768)}
        a.select_shape = (64, 8000)
    import transformers

    from specdec.loading import load_model

    if a.device == "cuda":
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from e2e_gpu import copy_bandwidth

        bw = copy_bandwidth()
    else:
        bw = 20e9
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               transformers=transformers.__version__, copy_GBps=bw / 1e9, document=a.document,
               gpu=torch.cuda.get_device_name() if a.device == "cuda" else None,
               args={k: str(v) for k, v in vars(a).items()}, parts={})
    path = Path(a.out) / "k14b.json"
    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    res["load_s"] = time.perf_counter() - T0
    parts = {"fixed": lambda: part_fixed(a, res, m), "adaptive": lambda: part_adaptive(a, res, m),
             "costs": lambda: part_costs(a, res, m, bw), "hf": lambda: part_hf(a, res, m),
             "hf_attached": lambda: part_hf_attached(a, res, m)}
    for part in a.parts.split(","):
        if time.perf_counter() - T0 > a.budget_s:
            res["parts"][part] = "skipped: out of time"
            continue
        t = time.perf_counter()
        try:
            parts[part]()
            res["parts"][part] = f"ok in {time.perf_counter() - t:.0f} s"
        except Exception:
            res["parts"][part] = "error: " + traceback.format_exc(limit=8)
        print(part, res["parts"][part][:3000], flush=True)
        path.write_text(json.dumps(res, indent=2, default=str))
        if a.device == "cuda":
            torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - T0
    path.write_text(json.dumps(res, indent=2, default=str))
    (Path(a.out) / "k14b.md").write_text(summary(res))
    print(summary(res))


def summary(res) -> str:
    lines = [f"# k14b ({res['date']}, {res.get('gpu') or 'cpu'}, copy {res['copy_GBps']:.0f} GB/s)", "",
             f"document: {res['document']}", "", "parts: " + json.dumps(res["parts"]), ""]
    if res.get("adaptive_vs_fixed"):
        lines += ["| B | method | fixed × dense | adaptive × dense | adaptive / fixed | τ fixed | τ adaptive | dense steps | mean γ |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in res["adaptive_vs_fixed"]:
            f = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
            lines.append(f"| {c['batch']} | {c['method']} | {f(c['fixed_over_dense'])} | {f(c['adaptive_over_dense'])} | "
                         f"{f(c['adaptive_over_fixed'])} | {c['tau_fixed']:.2f} | {c['tau_adaptive']:.2f} | "
                         f"{c['dense_steps']} | {f(c['gamma_mean'])} |")
        lines += ["", f"adaptive never loses (B>1 within 2 % of fixed, B=1 >= 0.97x dense): {res.get('adaptive_never_loses')}", ""]
    for r in res.get("hf", []):
        lines.append(f"- B={r['batch']} {r['method']}: {r['tokens_per_second']:.1f} tok/s "
                     f"({r.get('attn_implementation', 'specdec')})")
    if isinstance(res.get("hf_attached"), dict):
        h = res["hf_attached"]
        lines.append(f"- B={h['batch']} hf static through specdec's route (old): {h['median']:.1f} tok/s")
    c = res.get("costs") or {}
    for k, v in c.items():
        lines.append(f"- costs {k}: {json.dumps(v, default=str)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
