"""Vegas' ``spread`` on the GPU: PyTorch (head sum, padded copy, max-pool, copy) vs one Triton launch
(``specdec.cuda.triton_select.spread_scores``, ``verification_guided.TRITON_SPREAD``), with the plan's top-k by
``torch.topk`` or ``TRITON_SELECT = "auto"``; then end to end at B 64 x 8k.

    timeout 400 python3 benchmarks/gpu/spread14.py --out $OUT/spread14 --budget-s 360   # H200 (/tmp/m/smol.gguf)
    python3 benchmarks/gpu/spread14.py --out /tmp/spread14 --smoke                      # CPU, TRITON_INTERPRET=1

Parts (each saved as it finishes to ``<out>/spread14.json`` + ``.md``; none starts after ``--budget-s``):

1. ``micro``: Collect-2-Query with its defaults (5 %, ``spread=8``), random fp32 scores as emitted (one buffer, per
   KV head), all lengths full, at SmolLM2 B 64 / 16 / 1 x 8k and Llama-3.1-8B B 16 x 32k. Per setting a cache (so
   a plan graph) of its own; ``on_verify`` + ``Planner.plan`` with a sync, the settings interleaved round-robin,
   medians of ``--reps``; ``on_verify`` alone; the spread launches alone (CUDA events; ``passes=2``: head sums then
   their forward max; ``passes=1``: one launch) against their memory floor (one read of the scores,
   one write of the spread sums at 4.2 TB/s). Parity: the kept scores of the launch equal PyTorch's (bitwise at 3 KV
   heads; at 8 the fp32 head sums may round differently), the plans of the two (same top-k path) likewise; the two
   launch variants agree bitwise.
2. ``e2e``: the embedded model, bf16, triton, graphs, fused, no compile, adaptive off, B 64 x 8k, 4 windows of each
   document (``run_bench(windows=4)``), γ 8, 5 %, 128 new tokens, warm-up + median of 3: ``dense``, ``magicdec``
   (the anchor of each arm), ``vegas`` and ``vegas-all`` per arm: ``pytorch`` (``TRITON_SPREAD = False``), ``launch``
   (the default), ``launch+auto`` (``TRITON_SELECT = "auto"`` too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import script_io  # noqa: E402
import torch  # noqa: E402

T0 = time.perf_counter()
BW = 4.2e12
SHAPES = [("smol B64 x 8k", 30, 64, 3, 8000), ("smol B16 x 8k", 30, 16, 3, 8000), ("smol B1 x 8k", 30, 1, 3, 8000),
          ("8b B16 x 32k", 32, 16, 8, 32768)]
SMOKE_SHAPES = [("smoke B3 x 300", 3, 3, 3, 300)]
#: (label, TRITON_SPREAD, TRITON_SELECT)
SETTINGS = [("pytorch", False, False), ("launch", True, False), ("launch+auto", True, "auto")]
SMOKE_SETTINGS = [("pytorch", False, False), ("launch", "always", False), ("launch+auto", "always", "auto")]


def elapsed() -> float:
    return time.perf_counter() - T0


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


class _Flags:
    """Set ``TRITON_SPREAD`` / ``TRITON_SELECT`` for a block, restored after."""

    def __init__(self, spread, select):
        self.want = (spread, select)

    def __enter__(self):
        from specdec.selectors import base, verification_guided as vg

        self.old = (vg.TRITON_SPREAD, base.TRITON_SELECT)
        vg.TRITON_SPREAD, base.TRITON_SELECT = self.want

    def __exit__(self, *exc):
        from specdec.selectors import base, verification_guided as vg

        vg.TRITON_SPREAD, base.TRITON_SELECT = self.old


def micro_shape(name, N, B, H, L, a, dev, log) -> dict:
    from specdec import SELECTORS, KVCache
    from specdec.cuda.triton_select import spread_scores
    from specdec.interfaces import ScoreRequest
    from specdec.planner import planner_for

    cap = L + 16
    g = torch.Generator(device=dev).manual_seed(0)
    stacked = torch.rand(N, B, H, cap, device=dev, generator=g)  # as emitted: one fp32 buffer, per KV head
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    req.scores = dict(zip(range(N), stacked.unbind(0)))
    lengths = torch.full((B,), L, dtype=torch.long, device=dev)
    settings = SMOKE_SETTINGS if a.smoke else SETTINGS
    arms = {}
    for label, spread, select in settings:
        cache = KVCache(N, B, H, cap, 8, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev)
        sel = SELECTORS.build("collect2", budget_ratio=0.05 if not a.smoke else 0.3)
        sel.reset(cache)
        arms[label] = (sel, cache, planner_for(cache), spread, select)
    row = dict(shape=name, N=N, B=B, H_kv=H, L=L, spread=arms["pytorch"][0].config.spread)
    kept, plans = {}, {}
    for label, (sel, cache, planner, spread, select) in arms.items():
        with _Flags(spread, select):
            sel.on_verify(req, lengths)
            kept[label] = sel.score(cache, lengths).clone()
            plans[label] = planner.plan(sel, lengths).indices.clone() if select is False else None
    row["kept_scores_equal"] = bool(torch.equal(kept["launch"], kept["pytorch"]))
    row["plans_equal"] = bool(torch.equal(plans["launch"], plans["pytorch"]))
    del kept, plans

    def step(label):
        sel, cache, planner, spread, select = arms[label]
        with _Flags(spread, select):
            sel.on_verify(req, lengths)
            planner.plan(sel, lengths)

    def on_verify(label):
        sel, cache, planner, spread, select = arms[label]
        with _Flags(spread, select):
            sel.on_verify(req, lengths)

    for fn in (step, on_verify):
        times = {label: [] for label in arms}
        for label in arms:  # warm-up: plan graph captures
            for _ in range(3):
                fn(label)
        _sync(dev)
        for _ in range(a.reps):
            for label in arms:
                t = time.perf_counter()
                fn(label)
                _sync(dev)
                times[label].append((time.perf_counter() - t) * 1e3)
        for label, ts in times.items():
            row.setdefault(label, {})["ms" if fn is step else "on_verify_ms"] = statistics.median(ts)
    out, out1 = torch.empty(N, B, 1, cap, device=dev), torch.empty(N, B, 1, cap, device=dev)
    row["passes_equal"] = bool(torch.equal(spread_scores(stacked, row["spread"], True, out=out, passes=2),
                                           spread_scores(stacked, row["spread"], True, out=out1, passes=1)))
    if dev.type == "cuda":
        from r14_select import gpu_med  # median ms by CUDA events after 3 warm-ups

        for key, passes in (("launch_alone_ms", 2), ("launch1_alone_ms", 1)):
            row[key] = gpu_med(lambda: spread_scores(stacked, row["spread"], True, out=out, passes=passes), a.reps, dev)
        row["launch_floor_ms"] = (stacked.numel() * 4 + out.numel() * 4) / BW * 1e3
    log(f"{name}: {row}")
    return row


def e2e(a, dev, log) -> list[dict]:
    from specdec.bench import run_bench

    smoke = a.smoke
    _, common = script_io.e2e_settings(a.gguf, dev, smoke, output_dir=Path(a.out))
    rows = []
    settings = [s for s in (SMOKE_SETTINGS if smoke else SETTINGS) if s[0] in a.arms.split(",")]
    for spec in a.docs.split(","):
        doc = script_io.document(spec, Path(a.out))
        for label, spread, select in settings:
            if elapsed() > a.budget_s:
                rows.append(dict(document=spec, setting=label, skipped="budget"))
                continue
            methods = ["dense", "magicdec", "vegas", "vegas-all"]  # dense: each arm's tokens are checked
            try:
                script_io.fresh_graphs(common)
                with _Flags(spread, select):
                    res = run_bench(methods, documents=[doc], tag=f"spread14_{len(rows)}", **common)
                for r in res:
                    ph = r.get("phase_seconds") or {}
                    it = r.get("iterations") or 1
                    rows.append(dict(document=spec, setting=label, method=r.get("method"),
                                     tok_s=r.get("tokens_per_second"), tok_s_min=r.get("tokens_per_second_min"),
                                     tok_s_max=r.get("tokens_per_second_max"), tau=r.get("tau"),
                                     same_tokens=r.get("same_tokens_as_dense"),
                                     select_ms_per_iter=1e3 * (ph.get("select", 0.0) + ph.get("select_in_draft", 0.0)) / it,
                                     verify_ms_per_iter=1e3 * ph.get("verify", 0.0) / it, iterations=it))
                    log(f"e2e {rows[-1]}")
            except Exception:
                rows.append(dict(document=spec, setting=label, error=traceback.format_exc()))
                log(rows[-1]["error"])
    return rows


def markdown(res) -> str:
    L = [f"# Vegas' spread: PyTorch vs one Triton launch ({res['date']}, {res['gpu']})", "",
         f"Command: `{res['argv']}`", ""]
    if res.get("micro"):
        L += ["## Selection per iteration (`on_verify` + plan), random fp32 scores, Collect-2-Query, 5 %, spread 8", "",
              "Medians of interleaved calls with a sync (ms); the launch alone by CUDA events against one read of the "
              "scores and one write of the sums at 4.2 TB/s.", "",
              "| shape | pytorch | launch | launch+auto | on_verify pytorch / launch | launch alone: 2 passes / "
              "1 pass (floor) | kept equal | plans equal |", "|---|---|---|---|---|---|---|---|"]
        for r in res["micro"]:
            if "error" in r or "skipped" in r:
                L.append(f"| {r['shape']} | {r.get('skipped') or 'error'} | | | | | | |")
                continue
            f = lambda k: f"{r[k]['ms']:.3f}" if k in r else "-"  # noqa: E731
            la = (f"{r['launch_alone_ms']:.3f} / {r['launch1_alone_ms']:.3f} ({r['launch_floor_ms']:.3f})"
                  if "launch_alone_ms" in r else "-")
            L.append(f"| {r['shape']} | {f('pytorch')} | {f('launch')} | {f('launch+auto')} | "
                     f"{r['pytorch']['on_verify_ms']:.3f} / {r['launch']['on_verify_ms']:.3f} | {la} | "
                     f"{r['kept_scores_equal']} | {r['plans_equal']} |")
        L.append("")
    if res.get("e2e"):
        L += ["## End to end, B 64 x 8k, 4 windows, γ 8, 5 %", "",
              "| document | setting | method | τ | tok/s (min–max) | × magicdec (same arm) | select ms/iter | "
              "verify ms/iter | same tokens |", "|---|---|---|---|---|---|---|---|---|"]
        anchor = {}
        for r in res["e2e"]:
            if r.get("method") == "magicdec":
                anchor[(r["document"], r["setting"])] = r["tok_s"]
        for r in res["e2e"]:
            if "method" not in r:
                L.append(f"| {r['document']} | {r['setting']} | {r.get('skipped') or 'error'} | | | | | | |")
                continue
            m = anchor.get((r["document"], r["setting"]))
            ratio = f"{r['tok_s'] / m:.3f}" if m and r["tok_s"] else "-"
            L.append(f"| {r['document']} | {r['setting']} | {r['method']} | {r['tau']:.2f} | {r['tok_s']:.0f} "
                     f"({r['tok_s_min']:.0f}–{r['tok_s_max']:.0f}) | {ratio} | {r['select_ms_per_iter']:.3f} | "
                     f"{r['verify_ms_per_iter']:.3f} | {r['same_tokens']} |")
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--budget-s", type=float, default=360)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--parts", default="micro,e2e")
    ap.add_argument("--docs", default="stdlib:ssl,stdlib:inspect",
                    help="documents of the e2e part: built-in names, paths, or prose:<package> (its docstrings)")
    ap.add_argument("--arms", default="pytorch,launch,launch+auto", help="settings of the e2e part")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cpu" if a.smoke else "cuda")
    if a.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        a.reps, a.docs = 2, a.docs if a.docs.startswith("prose:") else "stdlib:ssl"
        torch.set_num_threads(1)
    out = Path(a.out)
    res, log, save = script_io.record(out, "spread14", a, dev, markdown, T0)

    parts = a.parts.split(",")
    if "micro" in parts:
        res["micro"] = []
        for name, N, B, H, L in (SMOKE_SHAPES if a.smoke else SHAPES):
            if elapsed() > a.budget_s:
                res["micro"].append(dict(shape=name, skipped="budget"))
                continue
            try:
                res["micro"].append(micro_shape(name, N, B, H, L, a, dev, log))
            except Exception:
                res["micro"].append(dict(shape=name, error=traceback.format_exc()))
                log(res["micro"][-1]["error"])
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            save()
    if "e2e" in parts:
        res["e2e"] = e2e(a, dev, log)
        save()
    save()
    print(markdown(res))


if __name__ == "__main__":
    main()
