"""Issue 18's last kernel target: our verify WITH Vegas' ``sink_softmax`` scores vs FlashInfer's verify WITHOUT.

    PYTHONPATH=.:$SITE python3 benchmarks/gpu/s18.py --out $OUT/s18 --budget-s 200   # via benchmarks/gpu/s18.sh
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu/s18.py --smoke --out /tmp/s18   # CPU, < 2 min

One run, the machinery of ``peers.py`` (:func:`peers.run_case`: every variant graph-replayed over
enough KV copies to leave the L2, median of ``--reps`` replays, % of the copy bandwidth measured at
the start of this run, max |Δ| of the output (and the scores' relative error) against the fp32
reference on the first two sequences). Per shape (8B first: the targets):

* ``verify`` (5 rows, no scores): ours at the table's launch with the tile loop of ``fast_loop`` (``triton``, the
  default since 2026-12-02) and with the masked loop before it (``triton_masked``, ``fast_loop=False``),
  FlashInfer eager (``flashinfer``) and its CUDA-graph wrapper (``flashinfer_graph``) (FA4 and SDPA left out:
  ``DROP``);
* ``verify_sink`` (the same with ``sink_softmax`` scores of rows {0, 4}, Vegas' default), ours at the
  table's launch: the table's pick (``sink_table``: ``tile`` + ``direct`` for the ``SINK_FEW_LONG`` class,
  i.e. 8B B 1 x 128k, ``tile`` + ``shared`` elsewhere), the same with the masked loop (``sink_table_masked``)
  and the store variants (``TritonConfig`` fields): ``sink_direct`` (``score_store="direct"``: PTX stores from
  the reduction's registers) and ``sink_lean`` (``score_store="lean"``: direct, with the per-row factor folded);
* then the ``INTERLEAVE`` variants of the shape once more, round-robin (``peers.interleaved``: one graph
  each, every round replays each once, the start rotating): the rows the ratios should be read from;
* then, unless ``--skip launch``, the launch variants (ours only, plain and with scores at the same launch:
  ``@...``);
* then, unless ``--skip decode``, ``decode`` (1 row) at every shape, ours with either loop, in the time left.

Writes ``results.json`` after every row, ``results.md`` (all rows, ``peers.write_md``) and ``s18.md``
(the target table: FlashInfer µs / ours µs and ours / FlashInfer, ours-with-scores >= FlashInfer-without
meets it; score overhead over the same launch's plain verify) under ``--out``; ``PREDICTED`` (below,
written before the run) goes into both.
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
#: the score-path variants (TritonConfig fields) timed at every shape (the table picks the path per shape class,
#: ``triton_attention.SCORE_PATHS``; ``sink_table`` is that pick, at the table's launch)
#: (sink_pre, sink_loop_direct and the bf16 buffer of the 20:42 UTC run are left out: known, and every variant is
#: one more compile in a 4-minute call; sink_table at 8B 1 x 128k is tile + direct = sink_direct there)
SINK_VARIANTS = {"sink_table": {}, "sink_table_masked": dict(fast_loop=False),
                 "sink_direct": dict(sink_anchors="tile", score_store="direct"),
                 # score_store "lean" (the sink factor folded, w and log2 e out of the loop; the dense store mask
                 # one compare shorter)
                 "sink_lean": dict(sink_anchors="tile", score_store="lean")}
#: ours without scores: the tile loop of ``fast_loop`` (the default since 2026-12-02) and the masked loop before it
PLAIN_VARIANTS = {"triton": {}, "triton_masked": dict(fast_loop=False)}
#: timed once more, round-robin after the others at each shape (``peers.interleaved``): what the ratios use
INTERLEAVE = [("verify", "triton"), ("verify", "triton_masked"), ("verify", "flashinfer"),
              ("verify", "flashinfer_graph"), ("verify_sink", "sink_table"), ("verify_sink", "sink_table_masked"),
              ("verify_sink", "sink_direct"), ("verify_sink", "sink_lean")]
#: peers left out (FA4's JIT and SDPA's masked verify cost time and are not this run's question; FA4 at these
#: shapes: gpu_scores_2026-12-01e.md)
DROP = ("fa4", "sdpa")
#: launch variants per case index (TritonConfig fields), each timed plain and with scores (best guesses)
LAUNCH = {
    # 8B 16 x 32k: the table's SINK_LONG / VERIFY_LONG is bn128 s3 (144 KB of shared memory: 1 program per SM, 384
    # programs, ~2.9 waves); with the shorter tile loop, bn64 s3 (76 KB, 2 per SM, 264 programs: one wave) might win
    # (it did not: 602 / 653 us plain / with scores vs ~497 / ~529 us, 2026-12-02 12:11 UTC)
    3: {"bn64s3c2": dict(block_n=64, num_stages=3, ctas_per_sm=2)},
}
LAUNCH_SINK = {"sink_table": {}}
#: the cost model behind the predictions (2026-12-01 ~23:00 UTC, sc18b), from the sm_90 SASS of the kernel
#: compiled on the CPU (benchmarks/sass_mix.py, triton 3.9 here, 3.6 on the GPU) and the 20:42 UTC run
#: (gpu_scores_2026-12-01e.md). Hot-loop instructions per 64-position tile at 8B bn64 s3 w4: plain 613; tile
#: (shared) 639 (+26, and 9 barriers instead of 7); direct 634 (+21); lean 626 (+13); pre+direct
#: 699 (+86: ~39 IMAD / 18 IADD3 / 9 PLOP3 more than tile+direct, the loaded anchors change the loop's
#: address code). Model fitted to the 20:42 UTC run at 1 x 128k, 2 programs/SM (2 warps per
#: scheduler, ~62 tiles per program): ~0.1 us per hot-loop instruction per tile, ~3 us per extra barrier, ~2 us
#: for the anchor prologue per wave of split programs (pre+direct@c2 +86 -> +8.4 us measured; tile@c2 +26 and
#: +2 BAR -> 11.9 measured vs 10.6 modelled; tile+direct@c4, 2 waves: +6.5 measured vs 6.1 modelled).
#: SmolLM2 d64 bn128 s3 w4: plain 486; tile 552 (+66, 9 BAR vs 7); direct 568; lean 565.
#: Refit to the in-place run of 22:53 UTC (gpu_scores_2026-12-01h.md, c2 table launch at 1 x 128k: plain 141.5,
#: tile+direct 148.2 = +21 instr + prologue, tile+shared 149.5 = +26 instr + 2 BAR + prologue, pre+direct 150.1 =
#: +86 instr + the pre launch): 0.05-0.1 us per hot-loop instruction, the tile anchor prologue 4.6-5.7 us per wave
#: (the larger part of the score cost there), a barrier ~0.5 us.
#: Predictions for this run (written 2026-12-02 ~12:40 UTC, before it), from the 23:12 UTC run of 2026-12-01
#: (gpu_scores_2026-12-01i.md, interleaved medians) and the sm_90 SASS of the new tile loop (benchmarks/sass_mix.py,
#: triton 3.9 on the CPU): hot-loop instructions per tile plain 1050 -> 596 and sink (tile) 1155 -> 698 at 8B bn128;
#: bn64 plain 613 -> 391, tile 639 -> 441; SmolLM2 d64 bn128 plain 486 -> 278, tile 552 -> 365. The old sink
#: overhead tracked the instruction ratio (8B 16x32k +8.6 % measured vs +10 % instructions; SmolLM2 +11.5 % vs
#: +13.6 %), i.e. the loop is issue-bound at one program (4 warps) per SM; with fewer instructions than today's
#: plain loop, the sink path should fall to the memory floor that the plain loop already sits near.
PREDICTED = {
    4: "8B 1x128k (bn64 s3 c2; plain 139.6, sink_direct 146.2, FI 149.4 on 12-01): triton 134-140, "
       "triton_masked 138-142; sink_table (= tile + direct) 137-142 (FI/ours 1.05-1.09), sink_table_masked 145-148",
    3: "8B 16x32k (bn128 s3; plain 488.4, sink_tile 531.6, FI 520.3 on 12-01): triton 478-492, triton_masked "
       "485-495; sink_table 488-505 (FI/ours 1.03-1.07, target met), sink_table_masked 527-540",
    2: "SmolLM2 64x8k (plain 105.1, sink 117.1, FI 116.5): triton 94-101, sink_table 97-105 (FI/ours 1.11-1.2), "
       "masked rows as before",
    1: "SmolLM2 16x8k (plain 36.9, sink 41.4, FI 46.1): triton 31-35, sink_table 33-37",
    0: "SmolLM2 1x8k (launch-bound; plain 9.7, sink 11.0): triton 9.0-9.7, sink_table 10.0-10.9",
}


def ours_for(idx: int, smoke: bool, launch_pass: bool = False) -> dict[str, dict[str, dict]]:
    """Our variants per kind: the core ones (pass 1, with the peers), or the launch variants (pass 2)."""
    base = dict(block_n=16, num_splits=2) if smoke else {}
    if launch_pass:
        launch = {"s3": dict(num_splits=3)} if smoke and idx == 0 else LAUNCH.get(idx, {})
        plain, sink = {}, {}
        for lab, f in launch.items():
            plain[f"triton@{lab}"] = dict(base, **f)
            sink.update({f"{k}@{lab}": dict(base, **f, **v) for k, v in LAUNCH_SINK.items()})
        return {"verify": plain, "verify_sink": sink}
    sink = {k: dict(base, **f) for k, f in SINK_VARIANTS.items()}
    return {"verify": {k: dict(base, **f) for k, f in PLAIN_VARIANTS.items()}, "verify_sink": sink}


def kl(L: int) -> str:
    return f"{L // 1024}k" if L >= 1024 else str(L)


def target_table(rows) -> list[str]:
    """Per case: each verify_sink variant vs FlashInfer (eager, graph) and over its own launch's plain verify."""
    lines = ["| shape | variant | µs | % copy bw | + % over plain (same launch) | FI eager / this | this / FI eager | "
             "FI graph / this | FA4 / this | scores rel err | out |Δ| |", "|" + "---|" * 11]
    by, iby = {}, {}
    for r in rows:
        if "variant" in r and "us" in r:
            (iby if r.get("timing") == "graph-interleaved" else by).setdefault(
                (r["case"], r["B"], r["L"]), {})[(r["kind"], r["variant"])] = r
    best = {}
    for (case, B, L), d in by.items():
        fi = d.get(("verify", "flashinfer"), {}).get("us")
        fig = d.get(("verify", "flashinfer_graph"), {}).get("us")
        fa4 = (d.get(("verify", "fa4")) or d.get(("verify", "fa4_nhd")) or {}).get("us")
        for (kind, var), r in sorted(d.items(), key=lambda kv: (kv[0][0], kv[1]["us"])):
            if kind not in ("verify", "verify_sink") or not var.startswith(("triton", "sink_")):
                continue
            launch = var.split("@")[1] if "@" in var else None
            plain = d.get(("verify", "triton" + ("_masked" if var.endswith("_masked") else "")
                           + (f"@{launch}" if launch else "")), {}).get("us")
            over = f"{100 * (r['us'] / plain - 1):+.1f} %" if plain and kind == "verify_sink" else ""
            f = lambda x: f"{x / r['us']:.3f}" if x else "–"  # noqa: E731
            inv = f"{r['us'] / fi:.3f}" if fi else "–"
            lines.append(f"| {case} {B}×{kl(L)} | {var} | {r['us']:.1f} | {r['pct_copy_bw']:.1f} | {over} | "
                         f"{f(fi)} | {inv} | {f(fig)} | {f(fa4)} | {r.get('max_rel_err_scores', float('nan')):.1e} | "
                         f"{r['max_abs_err']:.1e} |")
            if kind == "verify_sink" and fi and (best.get((case, B, L)) is None or r["us"] < best[(case, B, L)][1]):
                best[(case, B, L)] = (var, r["us"], fi / r["us"], d.get(("verify_sink", "sink_table_masked"), {}).get("us"))
    cols = ["triton", "triton_masked", "sink_table", "sink_table_masked", "sink_direct", "sink_lean"]
    lines += ["", "FlashInfer eager (verify, no scores) µs / ours µs at the table's launch (>= 1.0 meets the target; "
              "`triton` = ours without scores):", "", "| shape | FI µs | " + " | ".join(cols) + " |",
              "|---|---|" + "---|" * len(cols)]
    for (case, B, L), d in by.items():
        fi = d.get(("verify", "flashinfer"), {}).get("us")
        cell = lambda kind, v: (f"{fi / d[(kind, v)]['us']:.3f} ({d[(kind, v)]['us']:.1f})"  # noqa: E731
                                if fi and "us" in d.get((kind, v), {}) else "–")
        lines.append(f"| {case} {B}×{kl(L)} | {fi:.1f} | " if fi else f"| {case} {B}×{kl(L)} | – | ")
        lines[-1] += " | ".join(cell("verify" if c.startswith("triton") else "verify_sink", c) for c in cols) + " |"
    lines += ["", "Interleaved (every graph replayed once per round, the start rotating; medians of the rounds): "
              "FI eager / this (>= 1.0 meets the target), FI graph / this, + % over ours plain (<= 3 % meets "
              "the score-overhead target):", "", "| shape | variant | µs | FI eager / this | FI graph / this | "
              "+ % over plain |", "|---|---|---|---|---|---|"]
    for (case, B, L), d in iby.items():
        fi = d.get(("verify", "flashinfer"), {}).get("us")
        fig = d.get(("verify", "flashinfer_graph"), {}).get("us")
        for (kind, var), r in sorted(d.items(), key=lambda kv: kv[1]["us"]):
            plain = d.get(("verify", "triton_masked" if var.endswith("_masked") else "triton"), {}).get("us")
            f = lambda x: f"{x / r['us']:.3f}" if x else "–"  # noqa: E731
            over = f"{100 * (r['us'] / plain - 1):+.1f} %" if plain and kind == "verify_sink" else ""
            lines.append(f"| {case} {B}×{kl(L)} | {var} | {r['us']:.1f} | {f(fi)} | {f(fig)} | {over} |")
    lines += ["", "Best score-emitting variant per shape (target FI eager / this >= 1.0):", ""]
    for (case, B, L), (var, us, ratio, tile) in best.items():
        lines.append(f"- {case} {B}×{kl(L)}: **{var}** {us:.1f} µs, FI / this **{ratio:.3f}** "
                     f"({'met' if ratio >= 1.0 else 'missed'}); the masked loop sink_table_masked "
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
    ap.add_argument("--skip", default="", help="parts to leave out, comma-separated: launch (pass 2), decode")
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
                  f"{res['wall_s']:.0f} s", "", "Predicted (written before this run):", ""]
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
    skip = {x for x in a.skip.split(",") if x}
    if skip - {"launch", "decode"}:
        print(f"--skip takes launch and/or decode, not {sorted(skip - {'launch', 'decode'})}", file=sys.stderr)
        return 2
    for idx in order:  # per shape both passes, so the 8B 1 x 128k rows (first) are complete before the budget runs out
        for launch_pass in ((False,) if "launch" in skip else (False, True)):
            case = cases[idx]
            ours = ours_for(idx, a.smoke, launch_pass)
            if not any(ours.values()):
                continue
            try:
                pb.run_case(case, ["verify", "verify_sink"], cuda, 256 << 20 if cuda else 1, reps, bw, log, record,
                            budget_left, ours=ours, only_ours=launch_pass,
                            interleave=None if launch_pass else INTERLEAVE, drop=DROP)
            except Exception as exc:
                record(dict(case=case[0], B=case[4], L=case[5], error=f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc()))
                log(f"case {case}: FAILED {exc}")
    if cuda and "decode" not in skip:  # decode (1 row), the new tile loop vs the masked one, in the time left
        for idx in order:
            if budget_left() > 15:
                try:
                    pb.run_case(cases[idx], ["decode"], cuda, 256 << 20, reps, bw, log, record, budget_left,
                                ours={"decode": dict(PLAIN_VARIANTS)}, only_ours=True)
                except Exception as exc:
                    record(dict(case=cases[idx][0], B=cases[idx][4], L=cases[idx][5], kind="decode",
                                error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()))
    save()
    # the scores too: relative error against the reference's (fp32 buffer 1e-3, bf16 1e-2; measured on
    # 2026-12-01: <= 9.3e-7 / 2.4e-3)
    for r in res["rows"]:
        if r.get("kind") == "verify_sink" and "max_rel_err_scores" in r:
            tol = 1e-2 if (r.get("config") or {}).get("score_dtype") == "bfloat16" else 1e-3
            if not r["max_rel_err_scores"] <= tol:  # NaN fails too
                r["parity_ok"] = False
                r["scores_parity"] = f"relative error {r['max_rel_err_scores']:.2e} > {tol:g}"
    save()
    bad = [r for r in res["rows"] if r.get("parity_ok") is False]
    errors = [r for r in res["rows"] if "error" in r and not r.get("import_failed")]
    log(f"done in {time.monotonic() - t0:.0f} s: {len(bad)} parity failures, {len(errors)} errors")
    print((out / "s18.md").read_text())
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
