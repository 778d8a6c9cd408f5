"""Turn the JSON of ``benchmarks/gpu/gemma_long.py`` into the results files, the τ-vs-context plot and
the docs sections that show them (one command after the GPU run):

    python benchmarks/gpu/gemma_long_report.py OUT/gemma_long.json            # writes into this checkout
    python benchmarks/gpu/gemma_long_report.py smoke/gemma_long.json --root /tmp/copy   # anywhere else

Writes ``benchmarks/results/gpu_gemma_long_<date>.{json,md}``, ``docs/assets/gemma_tau_vs_context.svg``
and replaces the text between ``<!-- gemma-long:NAME -->`` and ``<!-- /gemma-long:NAME -->`` in
docs/concepts/attention-layouts.md (``tau``), docs/components/models.md (``tested``) and
docs/benchmarks.md (``speed``). A ``--smoke`` JSON is refused unless ``--allow-smoke`` (tests).

A re-run of some parts (``gemma_long.sh run --rerun``) is merged with the first run's JSON:

    python benchmarks/gpu/gemma_long_report.py OUT/gemma_long.json --merge first/gemma_long.json

Rows of the new JSON replace the first run's rows of the same key (context, document, method, batch);
the first run's failed or skipped rows are dropped; everything else of the first run is kept, and the
merged JSON (with ``runs``: both dates) is what lands in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("dense", "magicdec", "vegas", "quest", "dustin")
SVG = "gemma_tau_vs_context.svg"


def k(n: int) -> str:
    """4096 → "4k"; a context just under a power of two keeps its count: 32640 → "32k (32,640)"."""
    if n % 1024 == 0:
        return f"{n // 1024}k"
    return f"{round(n / 1024)}k ({n:,})" if n >= 1024 else str(n)


#: the key of a row in each list of the JSON: a row of the re-run replaces the first run's row of that key
ROW_KEYS = dict(equality=("context", "doc", "method", "B"), tau=("context", "doc", "method", "B", "budget", "gamma"),
                speed=("context", "doc", "method", "B"))


def _failed(row: dict) -> bool:
    return "error" in row or "skipped" in row


def merge(first: dict, new: dict) -> dict:
    """``new`` (a re-run of some parts) over ``first``: per list, ``new``'s rows replace rows of the same
    key and the first run's failed/skipped rows are dropped (their re-run stands, or nothing); ``layout``,
    ``kv`` and ``profile`` are updated by ``new``; ``parts`` keep both runs' status; ``runs`` lists both."""
    if bool(first.get("smoke")) != bool(new.get("smoke")):
        sys.exit("gemma_long_report.py: --merge joins a GPU run with a GPU run (one of them is a --smoke run).")
    out = dict(first)
    for name in ("date", "args", "torch", "transformers", "device", "smoke", "elapsed_s"):
        if name in new:
            out[name] = new[name]
    for name, key in ROW_KEYS.items():
        fresh = new.get(name, [])
        have = {tuple(r.get(x) for x in key) for r in fresh if not _failed(r)}
        kept = [r for r in first.get(name, []) if not _failed(r) and tuple(r.get(x) for x in key) not in have]
        out[name] = kept + fresh
        # the first run's rows a re-run measured again: the "before" of a before/after
        out.setdefault("superseded", {})[name] = [r for r in first.get(name, [])
                                                  if not _failed(r) and tuple(r.get(x) for x in key) in have]
    for name in ("layout", "kv", "profile"):
        out[name] = {**first.get(name, {}), **new.get(name, {})}
    out["parts"] = {**{f"{n} (first run {first.get('date', '')})": v for n, v in first.get("parts", {}).items()},
                    **{f"{n} (re-run {new.get('date', '')})": v for n, v in new.get("parts", {}).items()}}
    out["failures"] = first.get("failures", []) + new.get("failures", [])
    out["runs"] = [dict(date=r.get("date"), elapsed_s=r.get("elapsed_s"), parts=list(r.get("parts", {})),
                        args=r.get("args", {})) for r in (*first.get("runs", [first]), new)]
    return out


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def fmt(x, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def tau_ratios(res: dict) -> list[dict]:
    """Per (context, doc): τ(magicdec), τ(vegas) and their ratio, where both ran."""
    by = {}
    for r in res.get("tau", []):
        if "tau" in r:
            by.setdefault((r["context"], r["doc"]), {})[r["method"]] = r["tau"]
    out = []
    for (ctx, doc), t in sorted(by.items()):
        if "vegas" in t and "magicdec" in t:
            out.append(dict(context=ctx, doc=doc, magicdec=t["magicdec"], vegas=t["vegas"], ratio=t["vegas"] / t["magicdec"]))
    return out


def plot(res: dict, path: Path) -> bool:
    """τ(vegas)/τ(magicdec) and both τ against the context, one line per document."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = tau_ratios(res)
    if not rows:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for doc, style in (("long:prose", "o"), ("long:code", "s")):
        pts = [r for r in rows if r["doc"] == doc]
        if not pts:
            continue
        xs = [r["context"] for r in pts]
        axes[0].plot(xs, [r["ratio"] for r in pts], marker=style, label=doc)
        axes[1].plot(xs, [r["vegas"] for r in pts], marker=style, label=f"vegas, {doc}")
        axes[1].plot(xs, [r["magicdec"] for r in pts], marker=style, alpha=0.5, linestyle="--", label=f"magicdec, {doc}")
    budget = sorted({r.get("budget") for r in res.get("tau", []) if r.get("budget")})
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["context"] for r in rows}), [k(c) for c in sorted({r["context"] for r in rows})])
        ax.set_xlabel("context (tokens)")
        ax.legend(fontsize=7)
    axes[0].axhline(1.0, color="grey", linewidth=0.8)
    axes[0].set_ylabel("τ(vegas) / τ(magicdec)")
    axes[1].set_ylabel("τ (mean accepted length)")
    gamma = res.get("args", {}).get("gamma")
    fig.suptitle(f"Gemma 3 270M, {res.get('device', '')}: same budget ({', '.join(map(str, budget))} tokens), γ = {gamma}, B = 1",
                 fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="svg")
    plt.close(fig)
    return True


def section_tau(res: dict, stem: str, have_plot: bool) -> str:
    rows = tau_ratios(res)
    lines = [f"Measured on {res['device']} ({res['date']}, bfloat16, `benchmarks/gpu/gemma_long.py`; "
             f"[report](../benchmark-runs.md), `benchmarks/results/{stem}.md`).", ""]
    if have_plot:
        lines += [f"![τ(vegas)/τ(magicdec) against the context](../assets/{SVG})", ""]
    if rows:
        lines += ["| context | document | τ magicdec | τ vegas | vegas / magicdec |", "|---|---|---|---|---|"]
        lines += [f"| {k(r['context'])} | {r['doc']} | {r['magicdec']:.2f} | {r['vegas']:.2f} | {r['ratio']:.2f} |" for r in rows]
        lines.append("")
        lines.append(trend(rows))
        lines.append("")
    kv = res.get("kv", {}).get("1")
    if kv:
        lines.append(f"KV held at {k(kv['context'])} (B = 1, bfloat16, `torch.cuda.memory_allocated` of the cache): "
                     f"{mb(kv['cuda_allocated_bytes'])} — {mb(kv['global_bytes'])} for the global layers and "
                     f"{mb(kv['ring_bytes'])} for the rings, against {mb(kv['all_layers_full_bytes'])} if every layer "
                     f"kept the whole context.")
    return "\n".join(lines)


def trend(rows: list[dict]) -> str:
    """One sentence per document: does Vegas' advantage grow with the context?"""
    out = []
    for doc in ("long:prose", "long:code"):
        pts = sorted((r["context"], r["ratio"]) for r in rows if r["doc"] == doc)
        if len(pts) < 2:
            continue
        (c0, r0), (c1, r1) = pts[0], pts[-1]
        verb = "grows" if r1 > r0 + 0.02 else "shrinks" if r1 < r0 - 0.02 else "stays flat"
        out.append(f"On {doc} the ratio {verb}: {r0:.2f} at {k(c0)}, {r1:.2f} at {k(c1)}.")
    return " ".join(out)


def section_tested(res: dict, stem: str) -> str:
    eq = [r for r in res.get("equality", []) if "method" in r]
    if not eq:
        return f"Gemma 3 270M on {res['device']} ({res['date'][:10]}): the equality part did not run (`benchmarks/results/{stem}.md`)."
    cells = []
    for ctx in sorted({r["context"] for r in eq}):
        rs = [r for r in eq if r["context"] == ctx]
        ok = [r["method"] for r in rs if r.get("equal_hf") and r.get("lossless")]
        bad = [r["method"] + (" (error)" if "error" in r else "") for r in rs if r.get("lossless", True) and not r.get("equal_hf")]
        lossy = [r["method"] for r in rs if r.get("lossless") is False]
        cell = f"{k(ctx)} `{rs[0]['doc']}`: " + (", ".join(ok) + " equal HF `generate`" if ok else "none equal HF `generate`")
        if bad:
            cell += f"; **differ: {', '.join(bad)}**"
        if lossy:
            cell += f" ({', '.join(lossy)}: near-lossless, not compared)"
        cells.append(cell)
    kv = res.get("kv", {}).get("1")
    kvs = f"; KV at {k(kv['context'])}: {mb(kv['global_bytes'])} global + {mb(kv['ring_bytes'])} rings (bf16)" if kv else ""
    return (f"Gemma 3 270M on {res['device']} in float32 (torch backend, B = 1, {eq[0]['new']} new tokens, "
            f"`bash benchmarks/gpu/gemma_long.sh run`, {res['date'][:10]}, transformers {res['transformers']}): "
            + "; ".join(cells) + f" (`benchmarks/results/{stem}.md`){kvs}.")


def speed_table(res: dict) -> list[str]:
    rows = [r for r in res.get("speed", []) if "tokens_per_second" in r]
    lines = []
    for ctx in sorted({r["context"] for r in rows}):
        lines += [f"**{k(ctx)} context** (`long:prose`, bfloat16, {rows[0]['backend']} backend, "
                  f"CUDA graphs {'on' if rows[0].get('graphs') else 'off'}, γ = {rows[0]['gamma']}, "
                  f"budget {rows[0]['budget_ratio']:g} × context; tokens/s median of {res['args'].get('reps', 3)} runs)", "",
                  "| B | " + " | ".join(METHODS) + " | dense step / roofline |", "|---|" + "---|" * (len(METHODS) + 1)]
        for B in sorted({r["B"] for r in rows if r["context"] == ctx}):
            cell = {}
            for m in METHODS:
                r = next((x for x in rows if x["context"] == ctx and x["B"] == B and x["method"] == m), None)
                if r is None:
                    cell[m] = "—"
                elif m == "dense":
                    cell[m] = f"{r['tokens_per_second']:,.0f}"
                else:
                    cell[m] = f"{r['tokens_per_second']:,.0f} (τ {r['tau']:.2f}, {fmt(r.get('speedup_vs_dense'))}×)"
            d = next((x for x in rows if x["context"] == ctx and x["B"] == B and x["method"] == "dense"), None)
            roof = (f"{d['step_seconds'] * 1e3:.3f} ms / {d['roofline_seconds'] * 1e3:.3f} ms = {d['step_over_roofline']:.2f}×"
                    if d and "step_seconds" in d else "—")
            lines.append(f"| {B} | " + " | ".join(cell[m] for m in METHODS) + f" | {roof} |")
        lines.append("")
    done = {(x["context"], x["B"], x["method"]) for x in rows}
    # a row skipped by the re-run but measured by the first run is not "not run"
    skipped = [r for r in res.get("speed", []) if "skipped" in r and (r["context"], r["B"], r["method"]) not in done]
    errors = [r for r in res.get("speed", []) if "error" in r and (r["context"], r["B"], r["method"]) not in done]
    def names(rs: list[dict]) -> str:
        return ", ".join(f"{k(r['context'])}/B={r['B']}/{r['method']}" for r in rs)

    refused = sorted({why for r in rows for why in r.get("graph_uncapturable", [])})
    if refused:
        lines.append(f"Steps refused by the CUDA-graph capture (they ran eagerly): {'; '.join(refused)}.")
    if skipped:
        lines.append(f"Not run for lack of time in the budget: {names(skipped)}.")
    if errors:
        lines.append(f"Failed (traceback in the JSON): {names(errors)}.")
    return lines


def profile_lines(res: dict) -> list[str]:
    """One dense and one sparse forward at B = 1: eager against CUDA-graph replay, kernels per step."""
    p = res.get("profile") or {}
    if not any(kind in p for kind in ("dense", "sparse")):
        return []
    lines = [f"One forward at B = 1, {k(p['context'])} context ({p['backend']} backend, bfloat16; median of the timed "
             f"calls; kernels: torch.profiler, one eager call; roofline of a dense step "
             f"{p['dense_roofline_seconds'] * 1e3:.3f} ms):", "",
             "| step | eager | CUDA graph | kernels per step | captures / replays | refused |", "|---|---|---|---|---|---|"]
    for kind in ("dense", "dense_per_layer", "sparse", "sparse_per_layer"):
        r = p.get(kind)
        if not r:
            continue
        graph = f"{r['graph_seconds'] * 1e3:.3f} ms" if "graph_seconds" in r else "—"
        cap = f"{r['graph_captures']} / {r['graph_replays']}" if "graph_captures" in r else "—"
        why = "; ".join(r.get("graph_uncapturable", [])) or "none"
        label = "dense" if kind.startswith("dense") else f"sparse ({p.get('sparse_budget')} entries)"
        if kind.endswith("_per_layer"):
            label += ", window mask per local layer (before)"
        lines.append(f"| {label} | {r['eager_seconds'] * 1e3:.3f} ms | {graph} | {r.get('kernels_per_step', '—')} | {cap} | {why} |")
    return lines + [""]


def section_speed(res: dict, stem: str) -> str:
    lay = res.get("layout", {})
    head = [f"Gemma 3 270M on {res['device']} ({res['date']}; `bash benchmarks/gpu/gemma_long.sh run`, "
            f"report `benchmarks/results/{stem}.md`). Cells: tokens/s (τ, × dense in the same run). The roofline is "
            f"(weights + the KV bytes a dense step actually reads) / copy bandwidth "
            f"({lay.get('copy_bandwidth_GBps', 0):,.0f} GB/s measured): global layers read the whole context, "
            f"local layers only their {lay.get('windows', [0])[0]}-token window.", ""]
    return "\n".join(head + speed_table(res) + [""] + profile_lines(res)).rstrip("\n")


def report_md(res: dict, stem: str, have_plot: bool) -> str:
    lay = res.get("layout", {})
    a = res.get("args", {})
    lines = [f"# Gemma 3 270M at 16k and 32k context on {res['device']} ({res['date']})", "",
             f"torch {res['torch']}, transformers {res['transformers']}; command: `bash benchmarks/gpu/gemma_long.sh run` "
             f"(`python3 benchmarks/gpu/gemma_long.py --budget-s {a.get('budget_s', '')}`), {res.get('elapsed_s', '')} s in all.",
             f"Layout: {lay.get('n_layers')} layers, {lay.get('n_global')} global, windows {sorted({w for w in lay.get('windows', []) if w})}; "
             f"{lay.get('n_kv_heads')} KV head × {lay.get('head_dim')}; weights {mb(lay.get('weight_bytes_bf16', 0))} in bfloat16.", "",
             "Parts: " + "; ".join(f"{n} {s}" for n, s in res.get("parts", {}).items()) + ".", ""]
    if res.get("smoke"):
        lines += ["**Smoke run** (CPU, tiny random Gemma 3, contexts / 32): numbers mean nothing.", ""]
    lines += ["## Greedy equality with Hugging Face `generate` (float32, torch backend, B = 1)", ""]
    eq = [r for r in res.get("equality", []) if "method" in r]
    if eq:
        lines += ["| context | document | method | lossless | equal HF | τ | new tokens |", "|---|---|---|---|---|---|---|"]
        for r in eq:
            same = "error" if "error" in r else ("yes" if r.get("equal_hf") else f"no (first difference at {r.get('first_difference')})")
            lines.append(f"| {k(r['context'])} | {r['doc']} | {r['method']} | {r.get('lossless', '—')} | {same} | "
                         f"{fmt(r.get('tau'))} | {r['new']} |")
    else:
        lines.append("Not run.")
    lines += ["", "## KV cache held (bfloat16)", ""]
    if res.get("kv"):
        lines += ["| B | context | CUDA allocated | global layers | rings | every layer full | a dense step reads |",
                  "|---|---|---|---|---|---|---|"]
        for B, kv in sorted(res["kv"].items(), key=lambda x: int(x[0])):
            lines.append(f"| {B} | {k(kv['context'])} | {mb(kv['cuda_allocated_bytes'])} | {mb(kv['global_bytes'])} | "
                         f"{mb(kv['ring_bytes'])} | {mb(kv['all_layers_full_bytes'])} | {mb(kv['step_reads_bytes'])} |")
    lines += ["", "## τ against the context, same budget (B = 1, bfloat16)", ""]
    rows = tau_ratios(res)
    if rows:
        lines += ["| context | document | τ magicdec | τ vegas | vegas / magicdec |", "|---|---|---|---|---|"]
        lines += [f"| {k(r['context'])} | {r['doc']} | {r['magicdec']:.2f} | {r['vegas']:.2f} | {r['ratio']:.2f} |" for r in rows]
        lines += ["", trend(rows)]
        if have_plot:
            lines += ["", f"Plot: `docs/assets/{SVG}` (shown on the attention-layouts page)."]
    else:
        lines.append("Not run.")
    lines += ["", "## Throughput, B = 1, 8, 32", ""] + speed_table(res)
    prof = profile_lines(res)
    if prof:
        lines += ["", "## One step, eager against CUDA graph", ""] + prof
        top = {kind: res["profile"][kind].get("kernels_top", [])[:12] for kind in ("dense", "sparse") if kind in res["profile"]}
        for kind, rows in top.items():
            if rows:
                lines.append(f"Most launched kernels, {kind}: " + ", ".join(f"`{n}` × {c}" for n, c in rows) + ".")
    again = [(old, new) for old in res.get("superseded", {}).get("speed", []) if "tokens_per_second" in old
             for new in res.get("speed", []) if "tokens_per_second" in new
             and all(new.get(x) == old.get(x) for x in ROW_KEYS["speed"])]
    if again:
        lines += ["", "Measured again in the re-run (tokens/s, first run → re-run): "
                  + "; ".join(f"{k(o['context'])}/B={o['B']}/{o['method']} {o['tokens_per_second']:,.0f} → "
                              f"{n['tokens_per_second']:,.0f}" for o, n in again) + "."]
    if len(res.get("runs", [])) > 1:
        lines += ["", "Runs merged: " + "; ".join(f"{r['date']} ({', '.join(r['parts'])})" for r in res["runs"]) + "."]
    fails = res.get("failures", [])
    if fails:
        lines += ["", "## Failures", ""] + [f"* part `{f['part']}`: `{f['traceback'].strip().splitlines()[-1][:200]}`" for f in fails]
    return "\n".join(lines).rstrip() + "\n"


def replace_block(path: Path, name: str, body: str) -> None:
    text = path.read_text(encoding="utf-8")
    pat = re.compile(rf"(<!-- gemma-long:{name} -->\n).*?(\n<!-- /gemma-long:{name} -->)", re.S)
    if not pat.search(text):
        sys.exit(f"gemma_long_report.py: {path} has no <!-- gemma-long:{name} --> block; restore it from git.")
    path.write_text(pat.sub(lambda m: m.group(1) + body.rstrip("\n") + m.group(2), text), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", type=Path, help="gemma_long.json written by the GPU run")
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout to write into (default: this one)")
    ap.add_argument("--allow-smoke", action="store_true", help="accept a --smoke JSON (tests only)")
    ap.add_argument("--merge", type=Path, metavar="FIRST_JSON",
                    help="an earlier run's gemma_long.json; rows of JSON (a re-run) replace its rows of the same key")
    a = ap.parse_args(argv)
    res = json.loads(a.json.read_text(encoding="utf-8"))
    if a.merge is not None:
        res = merge(json.loads(a.merge.read_text(encoding="utf-8")), res)
    if res.get("smoke") and not a.allow_smoke:
        sys.exit(f"gemma_long_report.py: {a.json} is a --smoke run (CPU, tiny model); pass the GPU run's JSON.")
    stem = f"gpu_gemma_long_{res['date'][:10]}"
    results = a.root / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)
    if a.merge is not None:
        (results / f"{stem}.json").write_text(json.dumps(res, indent=1), encoding="utf-8")
    else:
        shutil.copyfile(a.json, results / f"{stem}.json")
    have_plot = plot(res, a.root / "docs" / "assets" / SVG)
    (results / f"{stem}.md").write_text(report_md(res, stem, have_plot), encoding="utf-8")
    replace_block(a.root / "docs" / "concepts" / "attention-layouts.md", "tau", section_tau(res, stem, have_plot))
    replace_block(a.root / "docs" / "components" / "models.md", "tested", section_tested(res, stem))
    replace_block(a.root / "docs" / "benchmarks.md", "speed", section_speed(res, stem))
    print(f"wrote {results / (stem + '.md')}, {results / (stem + '.json')}"
          + (f", docs/assets/{SVG}" if have_plot else "") + "; docs sections tau, tested, speed")


if __name__ == "__main__":
    main()
