"""Dustin at 4k on the five documents from outside the Python distribution: teacher-forced agreement with dense vs the
KV read of verification, per setting (the points of docs/dustin.md, "Per-layer sets ranked by low-rank keys").

Every point is 5 documents x 128 tokens (635 rows), budget 1024 of 4096 unless said, float32, reference backend. The
`layer_scores=keys` points come from ``benchmarks/dustin_fidelity.py --tf-only`` runs on the CPU
(``benchmarks/results/cpu_dustin_keys_4k_2026-12-05.md``); the others from the H200 runs of
``benchmarks/results/gpu_dustin_heldout_2026-12-03.md`` (same documents and settings; Dustin's default row is the
same 94.02 % on both machines).

    python benchmarks/plot_dustin_keys.py docs/assets/dustin_keys_4k.png
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (label, KV read %, agreement %, kind)
POINTS = [
    ("default (one shared set)", 26.1, 94.02, "paper"),
    ("layer_share=0.5, pages", 32.3, 96.38, "other"),
    ("budget 2048 (50 %)", 50.3, 96.22, "other"),
    ("valve margin=1.0", 73.4, 96.22, "other"),
    ("layer_share=0.5 + margin=0.5", 60.5, 97.95, "other"),
    ("keys, key_rank=8", 32.6, 94.49, "keys"),
    ("keys, key_rank=16", 38.7, 97.80, "keys"),
    ("keys, key_rank=32", 51.0, 98.90, "keys"),
]

fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=120)
colors = {"paper": "#444444", "other": "#888888", "keys": "#1f77b4"}
keys = sorted((x, y) for _, x, y, k in POINTS if k == "keys")
ax.plot([x for x, _ in keys], [y for _, y in keys], "-", color=colors["keys"], lw=1.2, zorder=1)
for label, x, y, kind in POINTS:
    ax.scatter([x], [y], color=colors[kind], s=36, zorder=2)
    ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -4 if kind == "keys" else 5), fontsize=8,
                color=colors[kind])
ax.axhline(99.0, color="#d62728", ls="--", lw=0.8)
ax.text(27, 99.08, "target 99 %", color="#d62728", fontsize=8)
ax.set_xlabel("KV read by verification, % of dense (ranking reads included)")
ax.set_ylabel("greedy agreement with dense, teacher-forced (%)")
ax.set_title("Dustin at 4k, 25 % budget, 5 outside documents x 128 tokens", fontsize=10)
ax.set_xlim(22, 80)
ax.set_ylim(93.5, 99.6)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(sys.argv[1])
print("wrote", sys.argv[1])
