"""Turn ``bench_kernels.py`` JSON into the Markdown tables of ``benchmarks/results/gpu_kernels_*.md``.

    python benchmarks/gpu/report.py RUN.json [SCORES.json] > table.md
"""

from __future__ import annotations

import json
import sys


def fmt(x, spec=".1f"):
    return "" if x is None else format(x, spec)


def main_table(d: dict, skip_scores: bool = False) -> list[str]:
    rows = d["rows"]
    out = []
    cases = []
    for r in rows:
        key = (r["model"], r["B"], r["ctx"], r["H"], r["Hkv"], r["D"])
        if key not in cases:
            cases.append(key)
    for key in cases:
        model, B, ctx, H, Hkv, D = key
        out += ["", f"### {model}: H={H}, H_kv={Hkv}, D={D}, B={B}, context {ctx}", "",
                "| variant | µs (graph, median) | µs (eager do_bench) | predicted µs | GB/s | % of copy BW | best config (µs) | rel. err vs fp32 ref |",
                "|---|---|---|---|---|---|---|---|"]
        sub = [r for r in rows if (r["model"], r["B"], r["ctx"], r["H"], r["Hkv"], r["D"]) == key]
        seen = set()
        for r in sub:
            v = r["variant"]
            if v.endswith("[best]") or v in seen or (skip_scores and " +" in v):
                continue
            seen.add(v)
            best = next((x for x in sub if x["variant"] == v + " [best]"), None)
            out.append(
                f"| {v} | {fmt(r['graph_us'])} | {fmt(r['eager_us'])} | {fmt(r['predicted_us'])} | "
                f"{fmt(r['gbps'], '.0f')} | {fmt((r['frac_copy'] or 0) * 100)} | "
                f"{'' if best is None else best['cfg'] + ' (' + fmt(best['graph_us']) + ')'} | "
                f"{'' if r.get('rel_err') is None else format(r['rel_err'], '.1e')} |"
            )
    return out


def scores_table(d: dict) -> list[str]:
    out = ["", "| case | variant | config | µs | vs no scores (same config) |", "|---|---|---|---|---|"]
    base = {}
    for r in d["rows"]:
        if r["variant"].endswith("[best]"):
            continue
        case = f"{r['model']} B={r['B']} ctx={r['ctx']}"
        if r["variant"] == "ours dense T=5":
            base[(case, r["cfg"])] = r["graph_us"]
    for r in d["rows"]:
        if r["variant"].endswith("[best]"):
            continue
        case = f"{r['model']} B={r['B']} ctx={r['ctx']}"
        b = base.get((case, r["cfg"]))
        rel = "" if (b is None or r["variant"] == "ours dense T=5") else f"+{(r['graph_us'] / b - 1) * 100:.1f}%"
        out.append(f"| {case} | {r['variant']} | {r['cfg']} | {fmt(r['graph_us'])} | {rel} |")
    return out


if __name__ == "__main__":
    d = json.load(open(sys.argv[1]))
    m = d["meta"]
    lines = [f"Run: {m['date']} on {m['gpu']} ({m['sms']} SMs), torch {m['torch']}, triton {m['triton']}, "
             f"CUDA {m['cuda']}, Python {m['python']}; copy bandwidth {m['copy_bw_Bps'] / 1e12:.3f} TB/s; "
             f"command `{m['command']}`"]
    lines += main_table(d, skip_scores=len(sys.argv) > 2)
    if len(sys.argv) > 2:
        s = json.load(open(sys.argv[2]))
        sm = s["meta"]
        lines += ["", "## Cost of emitting scores (verify, T=5, rows 0 and 4)", "",
                  f"Run: {sm['date']}, copy bandwidth {sm['copy_bw_Bps'] / 1e12:.3f} TB/s; command `{sm['command']}`"]
        lines += scores_table(s)
    print("\n".join(lines))
