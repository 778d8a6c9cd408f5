"""Draw the static figures of the docs site (docs/assets/*.svg). Re-run after editing:

    python docs/hooks/make_figures.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "assets"
plt.rcParams.update({"font.size": 10, "svg.fonttype": "none", "font.family": "DejaVu Sans"})


def timeline() -> None:
    """Draft/verify timeline of two iterations (γ = 4) next to dense decoding."""
    fig, ax = plt.subplots(figsize=(10, 3.3))
    colors = {"draft": "#7986cb", "select": "#ffb74d", "verify": "#26a69a", "dense": "#bdbdbd"}
    t = 0.0
    y_spec, y_dense = 1.4, 0.2
    for it, accepted in enumerate([3, 4]):
        ax.add_patch(FancyBboxPatch((t, y_spec), 0.18, 0.7, boxstyle="round,pad=0.01", fc=colors["select"], ec="k", lw=0.5))
        ax.text(t + 0.09, y_spec + 0.35, "plan", ha="center", va="center", fontsize=7, rotation=90)
        t += 0.22
        for i in range(4):
            ok = i < accepted
            ax.add_patch(FancyBboxPatch((t, y_spec), 0.42, 0.7, boxstyle="round,pad=0.01", fc=colors["draft"], ec="k", lw=0.5,
                                        hatch=None if ok else "////"))
            ax.text(t + 0.21, y_spec + 0.35, f"x{i}", ha="center", va="center", fontsize=9, color="white" if ok else "k")
            t += 0.46
        ax.add_patch(FancyBboxPatch((t, y_spec), 1.05, 0.7, boxstyle="round,pad=0.01", fc=colors["verify"], ec="k", lw=0.5))
        ax.text(t + 0.525, y_spec + 0.35, "verify γ+1 rows", ha="center", va="center", fontsize=8, color="white")
        ax.annotate(f"iteration {it + 1}: {accepted} accepted + 1 → {accepted + 1} tokens",
                    xy=(t + 0.5, y_spec + 0.78), ha="right", fontsize=8)
        t += 1.12
    td = 0.0
    for k in range(9):
        ax.add_patch(FancyBboxPatch((td, y_dense), 0.95, 0.7, boxstyle="round,pad=0.01", fc=colors["dense"], ec="k", lw=0.5))
        ax.text(td + 0.475, y_dense + 0.35, f"t{k}", ha="center", va="center", fontsize=9)
        td += 1.0
    ax.text(-0.15, y_spec + 0.35, "speculative", ha="right", va="center")
    ax.text(-0.15, y_dense + 0.35, "dense", ha="right", va="center")
    ax.set_xlim(-1.6, max(t, td) + 0.2)
    ax.set_ylim(0, 2.5)
    ax.set_xlabel("time (a draft step reads a few % of the KV; a verify pass ≈ one dense step)")
    ax.set_yticks([])
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    handles = [plt.Rectangle((0, 0), 1, 1, fc=colors[k], ec="k", lw=0.5) for k in ("select", "draft", "verify", "dense")]
    handles.append(plt.Rectangle((0, 0), 1, 1, fc=colors["draft"], ec="k", lw=0.5, hatch="////"))
    ax.legend(handles, ["select (plan)", "sparse draft step", "verification", "dense step", "rejected draft"],
              loc="upper center", bbox_to_anchor=(0.5, 1.22), ncol=5, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(OUT / "timeline.svg")
    plt.close(fig)


def roofline() -> None:
    """Bytes read per step, weights vs KV, SmolLM2-135M in bf16, over context × batch."""
    W = 0.27e9
    kv_tok = 2 * 30 * 3 * 64 * 2
    ctx = np.array([1024, 2048, 4096, 8192, 16384, 32768])
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for B, c in zip([1, 8, 64], ["#9fa8da", "#5c6bc0", "#283593"]):
        ax.plot(ctx, (W + B * ctx * kv_tok) / 1e9, marker="o", color=c, label=f"dense step, batch {B}")
        ax.plot(ctx, (W + 0.05 * B * ctx * kv_tok) / 1e9, ls="--", marker=".", color=c, alpha=0.8,
                label=f"5 % sparse draft step, batch {B}")
    ax.axhline(W / 1e9, color="k", lw=0.8)
    ax.text(ctx[0], W / 1e9 * 1.15, "weights only (0.27 GB)", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="GB read per step",
           title="SmolLM2-135M, bf16: KV = 23 040 B/token; at 8k × 64 the KV is 45× the weights")
    ax.set_xticks(ctx, [f"{c // 1024}k" for c in ctx])
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "roofline.svg")
    plt.close(fig)


def masks() -> None:
    """Schematic KV selection masks of one draft step for the selector families."""
    L, budget, sinks, recent = 96, 24, 4, 8
    rng = np.random.default_rng(3)
    rows = {}
    m = np.zeros(L); m[:sinks] = 1; m[L - (budget - sinks):] = 1
    rows["sliding window\n(MagicDec, StreamingLLM)"] = m
    m = np.zeros(L); m[:sinks] = 1; m[L - recent:] = 1
    top = rng.choice(np.arange(sinks, L - recent), budget - sinks - recent, replace=False); m[top] = 1
    rows["top-k by score\n(Vegas; a BudgetSelector)"] = m
    m = np.zeros(L); m[:sinks] = 1; m[L - recent:] = 1
    for p in rng.choice(np.arange(1, (L - recent) // 4 - 1), 3, replace=False):
        m[p * 4:(p + 1) * 4] = 1
    rows["pages (Quest, page size 4 here)"] = m
    m = np.zeros(L); m[:sinks] = 1; m[L - recent:] = 1
    m[rng.choice(np.arange(sinks, L - recent), 5, replace=False)] = 2
    m[rng.choice(np.arange(sinks, L - recent), 7, replace=False)] = 3
    rows["hybrid (Dustin): draft top-m\n+ target-history top-k"] = m
    fig, ax = plt.subplots(figsize=(10, 2.9))
    img = np.stack(list(rows.values()))
    from matplotlib.colors import ListedColormap
    cmap = ListedColormap(["#f5f5f5", "#3f51b5", "#ef6c00", "#00897b"])
    ax.imshow(img, aspect="auto", cmap=cmap, vmin=0, vmax=3, interpolation="nearest")
    ax.set_yticks(range(len(rows)), list(rows), fontsize=8)
    ax.set_xlabel(f"cache position (0 … {L - 1}); budget {budget} = {sinks} sinks + recent window + selected")
    ax.set_xticks([0, sinks, L - recent, L - 1])
    for x in np.arange(-0.5, L, 1):
        ax.axvline(x, color="white", lw=0.3)
    ax.set_title("Which cached entries one sparse draft step sees (drafted tokens of this iteration are visible on top)", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "masks.svg")
    plt.close(fig)


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    timeline()
    roofline()
    masks()
    print("wrote", sorted(p.name for p in OUT.glob("*.svg")))
