"""Stacked bars: where a B=64 decode step's time goes, per launch-count reduction (from step_gpu.py --profile).

    python benchmarks/gpu/plot_step_breakdown.py benchmarks/results/gpu_step_variants_2026-11-29.json \
        benchmarks/results/gpu_step_final_2026-11-29.json benchmarks/results/gpu_step_breakdown_2026-11-29.svg
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GROUPS = [("attention", ("attention",)), ("GEMMs", ("gemm",)),
          ("cache write (index_put + arange / one kernel)", ("index_put", "arange", "kv_write")),
          ("fused element-wise (inductor)", ("inductor",)), ("other kernels", ("torch_elementwise", "other"))]


def bars(rows, B, step):
    out = []
    for r in rows:
        if r.get("B") != B or r.get("step") != step or "kernels" not in r:
            continue
        cats = r["kernels"]["categories"]
        parts = [sum(cats.get(c, {}).get("us", 0.0) for c in cs) / 1e3 for _, cs in GROUPS]
        gaps = r["seconds"] * 1e3 - sum(parts)
        label = r.get("variant", "default")
        out.append((label, parts + [max(gaps, 0.0)], r["roofline"] * 1e3, r["kernels"]["kernels_per_call"]))
    return out


def main() -> None:
    variants, final, dest = sys.argv[1:4]
    rows = json.load(open(variants))["rows"]
    fin = [dict(r, variant="+ one split") for r in json.load(open(final))["rows"]]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=False)
    names = {"base": "start", "write": "+ one-launch\ncache write", "layout": "+ output\nlayout", "fuse": "+ fused\nprojections",
             "+ one split": "+ one-split\ndense"}
    for ax, step in zip(axes, ("dense_T1", "sparse_T1", "verify_T5")):
        bs = bars(rows, 64, step) + bars(fin, 64, step)
        bottom = [0.0] * len(bs)
        for i, (label, _) in enumerate(GROUPS + [("gaps between kernels", ())]):
            vals = [b[1][i] for b in bs]
            ax.bar(range(len(bs)), vals, bottom=bottom, label=label)
            bottom = [x + y for x, y in zip(bottom, vals)]
        for j, b in enumerate(bs):
            ax.text(j, bottom[j] + 0.05, f"{bottom[j]:.2f} ms\n{int(b[3])} kernels", ha="center", fontsize=7)
        ax.axhline(bs[0][2], color="k", ls="--", lw=1)
        ax.text(len(bs) - 0.5, bs[0][2], "roofline", fontsize=7, va="bottom", ha="right")
        ax.set_xticks(range(len(bs)), [names.get(b[0], b[0]) for b in bs], fontsize=7)
        ax.set_title(f"B = 64, 8k context: {step}", fontsize=9)
        ax.set_ylabel("ms per step", fontsize=8)
        ax.set_ylim(0, max(bottom) * 1.25)
    axes[0].legend(fontsize=6.5, loc="lower left")
    fig.suptitle("SmolLM2-135M decode step on an H200 (compile + CUDA graph, bf16): time per kernel category", fontsize=10)
    fig.tight_layout()
    fig.savefig(dest)
    if len(sys.argv) > 4:
        fig.savefig(sys.argv[4], dpi=80)
    print("wrote", dest)


if __name__ == "__main__":
    main()
