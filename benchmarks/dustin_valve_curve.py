"""Agreement vs KV read of Dustin's verification variants: one curve per ``dustin_fidelity.py --margins`` run.

Each run (one ``fidelity.json``, one set of options) gives one curve: the plain run (no valve) and every
replayed ``margin`` of the confidence valve. Writes a Markdown table and a plot (``--out`` stem)::

    python benchmarks/dustin_valve_curve.py --out docs/assets/dustin_valve_cpu_512 \\
        "shared set=/tmp/f/s000/fidelity.json" "per layer=/tmp/f/s100/fidelity.json"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def curve(res: dict, budget: str) -> list[tuple[str, float, float, float]]:
    """``[(margin or '', tf_agreement, kv_read_vs_dense, redo_share)]`` of one run and budget, over all documents."""
    s = res["summary"][budget]
    out = [("", s["tf_agreement"], s["kv_read_vs_dense"], 0.0)]
    for x, v in sorted((s.get("valve") or {}).items(), key=lambda kv: float(kv[0])):
        out.append((x, v["tf_agreement"], v["kv_read_vs_dense"], v["redo_share"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=path/to/fidelity.json")
    ap.add_argument("--budget", default="0.25")
    ap.add_argument("--out", required=True, help="output stem: STEM.md and STEM.png")
    a = ap.parse_args(argv)
    runs = []
    for r in a.runs:
        label, _, path = r.partition("=")
        if not path:
            print(f"run {r!r} must look like LABEL=path/to/fidelity.json", file=sys.stderr)
            return 2
        runs.append((label, json.loads(Path(path).read_text())))
    lines = ["| verification | options | margin | documents × positions | agreement, teacher-forced | KV read vs dense | "
             "passes re-verified densely |", "|---|---|---|---|---|---|---|"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for label, res in runs:
        s = res["summary"][a.budget]
        pts = curve(res, a.budget)
        for x, agr, kv, redo in pts:
            lines.append(f"| {label} | `{json.dumps(res['meta']['options'])}` | {x or 'off'} | {s['documents']} × "
                         f"{s['tf_rows'] // max(s['documents'], 1)} | {agr:.2%} | {kv:.1%} | {redo:.1%} |")
        ax.plot([100 * p[2] for p in pts], [100 * p[1] for p in pts], "o-", label=label)
        for x, agr, kv, _ in pts[1:]:
            ax.annotate(x, (100 * kv, 100 * agr), fontsize=6, xytext=(2, -8), textcoords="offset points")
    ax.axhline(99, color="gray", ls=":", lw=1)
    ax.set_xlabel("KV entries read vs dense verification (%)")
    ax.set_ylabel("agreement with dense, teacher-forced (%)")
    m = runs[0][1]["meta"]
    ax.set_title(f"Dustin verification at budget {a.budget}, context {m['context']}, {m['device']} "
                 "(labels: valve margin)", fontsize=8)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
