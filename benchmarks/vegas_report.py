"""Turn the raw JSON of ``benchmarks/vegas_cpu.py`` into the Markdown results page (+ a tidy JSON).

    python benchmarks/vegas_report.py RAW.json [RAW2.json ...] benchmarks/results/cpu_vegas_2026-11-29

writes ``<out>.md`` (tables: τ per document and mean, tokens/s, selection share, acceptance per
draft position, target checks, observations) and ``<out>.json`` (one row per document × method ×
budget, plus the raw runs and observations).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean


def fmt_pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def main(raw_paths: list[str], out: str) -> None:
    raws = [json.loads(Path(p).read_text()) for p in raw_paths]
    meta = raws[0]["meta"]
    runs = [r for raw in raws for r in raw["rows"]]
    obs = [o for raw in raws for o in raw["observations"]]
    commands = [raw["meta"]["command"] for raw in raws]
    raw_path = " ".join(raw_paths)
    docs = meta["documents"]
    spec = [r for r in runs if r["method"] != "dense"]
    dense = {r["context"]: r for r in runs if r["method"] == "dense"}
    for r in spec:  # reference tokens: dense when it ran, else the first run of that context
        dense.setdefault(r["context"], r)
    temp = meta.get("temperature", 0.0) or 0.0
    mode = f"sampling T={temp}, seed {meta.get('seed', 0)}" if temp else "greedy"
    L = [f"# Vegas vs MagicDec-Stream vs Quest — CPU, {meta['model']} float32, γ={meta['gamma']}, {mode}", ""]
    L += [f"- command{'s (run in parallel, same prefill)' if len(commands) > 1 else ''}: "
          + "; ".join(f"`nice -n 5 {c}`" for c in commands),
          f"- report: `python benchmarks/vegas_report.py {raw_path} {out}`",
          f"- machine: {json.dumps(meta['machine'])}",
          f"- budget = sinks ({meta['sinks']}) + recent ({meta['recent']}) + selected, the same for every method; "
          f"min_budget={meta['min_budget']}; {meta['max_new_tokens']} new tokens per document, {mode}.",
          f"- {meta['note']}.",
          "- tokens/s is for the whole batch on the CPU reference backend, where a sparse draft step costs as much "
          "as a dense one (full attention + mask): it measures overheads, not the speed a sparse kernel gives.", ""]
    tidy = []
    for ctx in sorted({r["context"] for r in spec}):
        L += [f"## Context {ctx} tokens", ""]
        for ratio in sorted({r["budget_ratio"] for r in spec if r["context"] == ctx}):
            rs = [r for r in spec if r["context"] == ctx and r["budget_ratio"] == ratio]
            L += [f"### Budget {ratio:.0%} of the context (≈ {int(ctx * ratio)} entries)", "",
                  "| method | " + " | ".join(docs) + " | mean τ | τ (engine) | tokens/s | selection share | same tokens as reference |",
                  "|---|" + "---|" * (len(docs) + 5)]
            for r in rs:
                per = [r["tau_per_document"][d] for d in docs]
                same = (r["tokens"] == dense[ctx]["tokens"]) if not temp else "n/a (sampling)"
                L.append(f"| {r['method']} | " + " | ".join(f"{x:.2f}" for x in per)
                         + f" | **{mean(per):.2f}** | {r['tau']:.2f} | {r['tokens_per_second']:.2f} | "
                           f"{fmt_pct(r['selection_overhead_share'])} | {same} |")
                for d, x in zip(docs, per):
                    tidy.append(dict(document=d, context=ctx, method=f"{r['method']}@{ratio:.0%}", tau=x,
                                     tokens_per_second=r["tokens_per_second"],
                                     selection_overhead_share=r["selection_overhead_share"]))
            L.append("")
            by = {r["method"]: r for r in rs}
            mt = {m: mean(by[m]["tau_per_document"][d] for d in docs) for m in by}
            checks = []
            if "vegas" in mt and "magicdec" in mt:
                per = [by["vegas"]["tau_per_document"][d] / by["magicdec"]["tau_per_document"][d] for d in docs]
                checks.append(f"τ(vegas)/τ(magicdec) = {mt['vegas'] / mt['magicdec']:.3f} on the mean "
                              f"(target ≥ 1.15; per document: {', '.join(f'{x:.2f}' for x in per)})")
            if "vegas" in mt and "vegas-all" in mt:
                checks.append(f"τ(vegas)/τ(vegas-all) = {mt['vegas'] / mt['vegas-all']:.3f} (target ≥ 0.97)")
            if "vegas-all" in mt and "vegas-last" in mt:
                checks.append(f"τ(vegas-all) − τ(vegas-last) = {mt['vegas-all'] - mt['vegas-last']:+.3f} (target > 0)")
            if "quest" in mt and "magicdec" in mt:
                checks.append(f"τ(quest)/τ(magicdec) = {mt['quest'] / mt['magicdec']:.3f}")
            L += [f"- {c}" for c in checks] + [""]
            L += ["Acceptance rate per draft position (share of iterations whose draft i was accepted):", "",
                  "| method | " + " | ".join(f"i={i + 1}" for i in range(meta["gamma"])) + " |",
                  "|---|" + "---|" * meta["gamma"]]
            for r in rs:
                L.append(f"| {r['method']} | " + " | ".join(f"{x:.2f}" for x in r["acceptance_per_position"]) + " |")
            L.append("")
        if ctx in dense and dense[ctx]["method"] == "dense":
            d = dense[ctx]
            L += [f"Dense decoding on the same engine: {d['tokens_per_second']:.2f} tokens/s (batch of {len(docs)}).", ""]
    if obs:
        L += ["## Observations (greedy continuation, softmax scores, per layer with heads summed)", "",
              "Top-k overlap $|S_t \\cap S_{t+d}|/k$ of the sets selected by rows $t$ and $t+d$:", ""]
        ds = [1, 2, 3, 4, 6, 8, 12, 16]
        L += ["| document | k | " + " | ".join(f"d={d}" for d in ds) + " |", "|---|---|" + "---|" * len(ds)]
        for o in obs:
            L.append(f"| {o['document']} | {o['k']} | " + " | ".join(f"{o['overlap'].get(str(d), float('nan')):.2f}" for d in ds) + " |")
        L += ["", f"Share of the attention mass of the next γ={meta['gamma']} rows captured by a top-k set chosen from "
              "past rows (last row / rows {t−γ, t} / rows t−γ..t / oracle = the future rows themselves):", "",
              "| document | k | last | collect2 | all | oracle |", "|---|---|---|---|---|---|"]
        for o in obs:
            rc = o["recall"]
            L.append(f"| {o['document']} | {o['k']} | {rc['last']:.3f} | {rc['collect2']:.3f} | {rc['all']:.3f} | {rc['oracle']:.3f} |")
        L.append("")
    Path(out).with_suffix(".md").write_text("\n".join(L) + "\n")
    Path(out).with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=tidy, runs=runs, observations=obs), indent=1))
    print("\n".join(L))


if __name__ == "__main__":
    main(sys.argv[1:-1], sys.argv[-1])
