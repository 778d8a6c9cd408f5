"""Issue 18's last kernel target: our verify WITH Vegas' ``sink_softmax`` scores vs FlashInfer's verify WITHOUT.

    PYTHONPATH=.:$SITE python3 benchmarks/gpu/s18.py --out $OUT/s18 --budget-s 170   # via benchmarks/gpu/s18.sh
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu/s18.py --smoke --out /tmp/s18   # CPU, < 2 min

One run, the machinery of ``peers.py`` (:func:`peers.run_case`: every variant graph-replayed over
enough KV copies to leave the L2, median of ``--reps`` replays, % of the copy bandwidth measured at
the start of this run, max |Δ| of the output (and the scores' relative error) against the fp32
reference on the first two sequences). Per shape (8B first: the targets):

* ``verify`` (5 rows, no scores): ours at the table's launch (``triton``) and launch variants
  (``triton@...``: more splits, 3 stages, 64/128-position tiles), FlashInfer eager (``flashinfer``)
  and its CUDA-graph wrapper (``flashinfer_graph``), FA4, SDPA;
* ``verify_sink`` (the same with ``sink_softmax`` scores of rows {0, 4}, Vegas' default): ours at the
  table's launch (``sink_tile``), the bf16 score buffer, and the launch variants (the 2026-12-01 run also
  measured two other row reductions, ``tdot`` and ``rowmma``; both lost at every shape and were removed,
  see ``benchmarks/results/gpu_scores_2026-12-01d.md``);
* first every shape with the core variants and the peers, then the launch variants (ours only);
* then, if time is left, ``decode`` at the two 8B shapes (their capturable forms: ``flashinfer_graph``,
  ``sdpa_masked``; ``peers.sh`` cut those last time).

Writes ``results.json`` after every row, ``results.md`` (all rows, ``peers.write_md``) and ``s18.md``
(the target table: ours-with-scores / FlashInfer-without as FlashInfer µs / ours µs, ≥ 1.0 meets it;
score overhead over the same launch's plain verify, target ≤ 3 %) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

import peers as pb  # noqa: E402  (benchmarks/gpu/peers.py)

ORDER = [4, 3, 2, 1, 0]  # peers.CASES: 8B 1 x 128k, 8B 16 x 32k, SmolLM2 B 64 / 16 / 1 x 8k
#: launch variants per case index (TritonConfig fields), for the plain verify and the sink_softmax verify
LAUNCH = {
    4: {"c8": dict(ctas_per_sm=8), "s3": dict(num_stages=3), "bn64s3c4": dict(block_n=64, num_stages=3, ctas_per_sm=4)},
    3: {"s3": dict(num_stages=3), "c4": dict(ctas_per_sm=4), "bn128s3": dict(block_n=128, num_stages=3)},
    2: {"splits2": dict(num_splits=2)},
}
#: what to expect (FI / ours-with-scores per case index): the H200 run of 2026-12-01 17:42 UTC
#: (benchmarks/results/gpu_scores_2026-12-01d.md; the table's launch, the launch-table rows it added)
PREDICTED = {4: "measured 0.924 at the old launch, 0.942 at the 64-position 3-stage row (now the table's)",
             3: "measured 0.949 at the old launch, 0.989 at the 128-position 3-stage row (now the table's)",
             2: "measured 1.019", 1: "measured 1.063", 0: "measured 1.168"}


def ours_for(idx: int, smoke: bool, launch_pass: bool = False) -> dict[str, dict[str, dict]]:
    """Our variants per kind: the core ones (pass 1, with the peers), or the launch variants (pass 2)."""
    base = dict(block_n=16, num_splits=2) if smoke else {}
    if launch_pass:
        launch = {"s3": dict(num_splits=3)} if smoke and idx == 0 else LAUNCH.get(idx, {})
        plain, sink = {}, {}
        for lab, f in launch.items():
            plain[f"triton@{lab}"] = dict(base, **f)
            sink[f"sink_tile@{lab}"] = dict(base, **f)
        return {"verify": plain, "verify_sink": sink}
    return {"verify": {"triton": dict(base)},
            "verify_sink": {"sink_tile": dict(base), "sink_tile_bf16": dict(base, score_dtype="bfloat16")}}


def kl(L: int) -> str:
    return f"{L // 1024}k" if L >= 1024 else str(L)


def target_table(rows) -> list[str]:
    """Per case: each verify_sink variant vs FlashInfer (eager, graph) and over its own launch's plain verify."""
    lines = ["| shape | variant | µs | % copy bw | + % over plain (same launch) | FI eager / this | FI graph / this | "
             "FA4 / this | scores rel err | out |Δ| |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {}
    for r in rows:
        if "variant" in r and "us" in r:
            by.setdefault((r["case"], r["B"], r["L"]), {})[(r["kind"], r["variant"])] = r
    best = {}
    for (case, B, L), d in by.items():
        fi = d.get(("verify", "flashinfer"), {}).get("us")
        fig = d.get(("verify", "flashinfer_graph"), {}).get("us")
        fa4 = (d.get(("verify", "fa4")) or d.get(("verify", "fa4_nhd")) or {}).get("us")
        for (kind, var), r in sorted(d.items(), key=lambda kv: (kv[0][0], kv[1]["us"])):
            if kind not in ("verify", "verify_sink") or not var.startswith(("triton", "sink_")):
                continue
            launch = var.split("@")[1] if "@" in var else None
            plain = d.get(("verify", "triton" + (f"@{launch}" if launch else "")), {}).get("us")
            over = f"{100 * (r['us'] / plain - 1):+.1f} %" if plain and kind == "verify_sink" else ""
            f = lambda x: f"{x / r['us']:.3f}" if x else "–"  # noqa: E731
            lines.append(f"| {case} {B}×{kl(L)} | {var} | {r['us']:.1f} | {r['pct_copy_bw']:.1f} | {over} | "
                         f"{f(fi)} | {f(fig)} | {f(fa4)} | {r.get('max_rel_err_scores', float('nan')):.1e} | "
                         f"{r['max_abs_err']:.1e} |")
            if kind == "verify_sink" and fi and (best.get((case, B, L)) is None or r["us"] < best[(case, B, L)][1]):
                best[(case, B, L)] = (var, r["us"], fi / r["us"], d.get(("verify_sink", "sink_tile"), {}).get("us"))
    lines += ["", "Best score-emitting variant per shape (target FI eager / this >= 1.0):", ""]
    for (case, B, L), (var, us, ratio, tile) in best.items():
        lines.append(f"- {case} {B}×{kl(L)}: **{var}** {us:.1f} µs, FI / this **{ratio:.3f}** "
                     f"({'met' if ratio >= 1.0 else 'missed'}); today's default sink_tile "
                     f"{tile:.1f} µs" if tile else f"- {case} {B}×{kl(L)}: {var} {us:.1f} µs, {ratio:.3f}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no new variant starts after this many seconds (170; --smoke 100)")
    ap.add_argument("--smoke", action="store_true", help="CPU, Triton interpreter, one tiny shape")
    ap.add_argument("--reps", type=int, default=None, help="timed graph replays per variant (median)")
    ap.add_argument("--cases", default=None, help="indices into peers.CASES, in order (default 4,3,2,1,0)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not a.smoke
    if not cuda and not a.smoke:
        print("no CUDA device: run with --smoke on the CPU", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    a.budget_s = a.budget_s or (100.0 if a.smoke else 170.0)
    reps = a.reps or (1 if a.smoke else 15)
    order = [int(i) for i in a.cases.split(",")] if a.cases else ([0] if a.smoke else ORDER)
    cases = pb.SMOKE_CASES if a.smoke else pb.CASES
    logf = open(out / "log.txt", "a")

    def log(s):
        line = f"[{time.monotonic() - t0:6.1f}s] {s}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    imports = {}
    for p, mod in (("fa4", "flash_attn.cute"), ("flashinfer", "flashinfer")):
        try:
            __import__(mod)
            imports[p] = "ok"
        except Exception as exc:  # recorded; the rows of that peer then say "not importable"
            imports[p] = f"{type(exc).__name__}: {exc}"
        log(f"import {p}: {imports[p]}")
    res = dict(date=pb.now(), device=torch.cuda.get_device_name() if cuda else "cpu", torch=torch.__version__,
               smoke=a.smoke, imports=imports, command=" ".join(["python3"] + sys.argv), predicted=PREDICTED,
               rows=[])
    res["copy_bw"] = bw = pb.copy_bandwidth(cuda)
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s")

    def save():
        res["wall_s"] = time.monotonic() - t0
        (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
        try:
            pb.write_md(dict(res, picks={}, graph_picks={}), str(out))
            md = [f"# s18: verify with sink_softmax scores vs FlashInfer without ({res['date']}, {res['device']})", "",
                  f"command: `{res['command']}`; copy bandwidth {bw / 1e12:.3f} TB/s; imports {imports}; "
                  f"{res['wall_s']:.0f} s", "", "Expected (the previous run):", ""]
            md += [f"- case {k} ({cases[k][0]} B {cases[k][4]}): {v}" for k, v in PREDICTED.items() if k < len(cases)]
            md += [""] + target_table(res["rows"])
            (out / "s18.md").write_text("\n".join(md) + "\n")
        except Exception:
            (out / "md_FAILED.txt").write_text(traceback.format_exc())

    def record(row):
        res["rows"].append(row)
        save()

    budget_left = lambda: a.budget_s - (time.monotonic() - t0)  # noqa: E731
    # pass 1: every shape, the core variants and the peers; pass 2: the launch variants (ours only)
    for launch_pass in (False, True):
        for idx in order:
            case = cases[idx]
            ours = ours_for(idx, a.smoke, launch_pass)
            if not any(ours.values()):
                continue
            try:
                pb.run_case(case, ["verify", "verify_sink"], cuda, 256 << 20 if cuda else 1, reps, bw, log, record,
                            budget_left, ours=ours, only_ours=launch_pass)
            except Exception as exc:
                record(dict(case=case[0], B=case[4], L=case[5], error=f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()))
                log(f"case {case}: FAILED {exc}")
    if cuda:  # the 8B shapes' capturable decode forms, in the time left
        for idx in (3, 4):
            if budget_left() > 15:
                try:
                    pb.run_case(cases[idx], ["decode"], cuda, 256 << 20, reps, bw, log, record, budget_left)
                except Exception as exc:
                    record(dict(case=cases[idx][0], B=cases[idx][4], L=cases[idx][5], kind="decode",
                                error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()))
    save()
    bad = [r for r in res["rows"] if r.get("parity_ok") is False]
    errors = [r for r in res["rows"] if "error" in r and not r.get("import_failed")]
    log(f"done in {time.monotonic() - t0:.0f} s: {len(bad)} parity failures, {len(errors)} errors")
    print((out / "s18.md").read_text())
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
