"""Issue 14 item 5 (speculation that never loses), in one command: fixed γ vs adaptive, end to end.

    timeout 250 python3 benchmarks/gpu/a14.py --out $OUT/a14 --budget-s 215
    python3 benchmarks/gpu/a14.py --smoke --out /tmp/a14_smoke        # CPU, tiny shapes, ~1 minute

Embedded model (``/tmp/m/smol.gguf``, bf16, ``--backend triton``, CUDA graphs, fused projections +
kernels, the defaults of the merged tree for score emission and selection), 8000-token contexts of two
held-out documents: the interpreter's own ``ssl.py`` (code) and the docstrings of its ``email`` package
(prose, written to ``<out>/email_docstrings.txt``); neither is a built-in document. γ = 4, 5 % budget,
greedy, 64 new tokens; every row from :func:`specdec.bench.run_bench`: a warm-up call at the same shape
(the adaptive controller's probe happens there: it keeps its estimates between calls of one shape),
then the median of 3 timed calls, and ``same_tokens_as_dense``.

Parts, in this order; each is saved as it ends (``<out>/a14.json`` and ``<out>/a14.md``); a part that
would start after ``--budget-s`` is recorded as skipped; a failing part records its traceback and the
next one runs:

- ``<doc>_B<b>``: dense / magicdec / vegas with γ fixed, then the same with ``adaptive=True``
  (dense again: the run-to-run noise), for doc ``ssl`` then ``prose`` and B = 1, 16, 64.
- ``hf_static_B16`` (after ``ssl_B16``): Hugging Face ``generate`` with a static cache at B = 16 (on
  ``ssl``, 32 new tokens, detached: HF's own SDPA), for the "vegas >= 10x HF static" row.

The verdict ``adaptive_never_loses`` is the rule for flipping ``specdec.adaptive.ADAPTIVE_DEFAULT``:
at B = 1 adaptive >= 0.97x dense (the same call's dense) for every method; at B = 16 and 64 adaptive
within 2 % of fixed γ; and every row gives dense's tokens.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = time.perf_counter()
KEEP = ("batch", "method", "tau", "tokens_per_second", "tokens_per_second_min", "tokens_per_second_max",
        "speedup_vs_dense", "dense_steps", "gamma_mean", "iterations", "selection_overhead_share",
        "same_tokens_as_dense", "phase_seconds")


def email_docstrings(path: Path) -> str:
    """The docstrings of this interpreter's ``email`` package (~20k tokens of English), written to ``path``."""
    import email

    root = os.path.dirname(email.__file__)
    texts = []
    for f in sorted(glob.glob(root + "/*.py")) + sorted(glob.glob(root + "/mime/*.py")):
        for n in ast.walk(ast.parse(Path(f).read_text())):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                s = ast.get_docstring(n)
                if s:
                    texts.append(s)
    path.write_text("\n\n".join(texts))
    return str(path)


def bench(a, m, doc, B, adaptive):
    from specdec.bench import run_bench

    rows = run_bench(["dense", "magicdec", "vegas"], contexts=[a.context], batch_sizes=[B], documents=[doc],
                     max_new_tokens=a.new, budget=None, budget_ratio=a.ratio, gamma=a.gamma, model=m,
                     backend=a.backend, dtype=a.dtype, device=a.device, cuda_graphs=a.graphs, fuse=True,
                     warmup=True, repeats=a.repeats, hf_baseline=False, output_dir=Path(a.out) / "runs",
                     tag=f"a14_{Path(doc).stem}_B{B}_{'adaptive' if adaptive else 'fixed'}", adaptive=adaptive)
    return [{k: r.get(k) for k in KEEP if k in r} for r in rows]


def compare(fixed, adaptive):
    """Per method: adaptive / fixed, each × its own call's dense, and the verdict for its batch size."""
    f = {r["method"]: r for r in fixed}
    d_f = f["dense"]["tokens_per_second"]
    d_a = next(r["tokens_per_second"] for r in adaptive if r["method"] == "dense")
    out = []
    for r in adaptive:
        x = f[r["method"]]
        c = dict(batch=r["batch"], method=r["method"], fixed_over_dense=x["tokens_per_second"] / d_f,
                 adaptive_over_dense=r["tokens_per_second"] / d_a,
                 adaptive_over_fixed=r["tokens_per_second"] / x["tokens_per_second"],
                 tau_fixed=x["tau"], tau_adaptive=r["tau"], dense_steps=r.get("dense_steps"),
                 gamma_mean=r.get("gamma_mean"),
                 same_tokens=bool(r.get("same_tokens_as_dense", True)) and bool(x.get("same_tokens_as_dense", True)))
        if r["method"] == "dense":
            c["ok"] = c["same_tokens"]
        elif r["batch"] == 1:
            c["ok"] = c["adaptive_over_dense"] >= 0.97 and c["same_tokens"]
        else:
            c["ok"] = c["adaptive_over_fixed"] >= 0.98 and c["same_tokens"]
        out.append(c)
    return out


def part_pair(a, res, m, doc_label, doc, B):
    fixed = bench(a, m, doc, B, False)
    res.setdefault("rows", {})[f"{doc_label}_B{B}_fixed"] = fixed
    adaptive = bench(a, m, doc, B, True)
    res["rows"][f"{doc_label}_B{B}_adaptive"] = adaptive
    res.setdefault("compare", []).extend(dict(doc=doc_label, **c) for c in compare(fixed, adaptive))


def part_hf(a, res, m, doc, B):
    from specdec.bench import hf_generate_tps
    from specdec.data import context_ids, load_document

    ids = context_ids(m.tokenizer, load_document(doc), a.context, offset=a.hf_new + 16)
    r = hf_generate_tps(m, ids, B, a.hf_new, "static", a.repeats)
    res["hf_static"] = dict(batch=B, new_tokens=a.hf_new, **r)
    for kind in ("fixed", "adaptive"):
        rows = res.get("rows", {}).get(f"ssl_B{B}_{kind}", [])
        v = next((x["tokens_per_second"] for x in rows if x["method"] == "vegas"), None)
        if v is not None:
            res["hf_static"][f"vegas_{kind}_over_hf_static"] = v / r["median"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, not the numbers")
    ap.add_argument("--budget-s", type=float, default=215.0, help="no part starts after this many seconds")
    ap.add_argument("--batches", default=None, help="default: 1,16,64 (smoke: 1)")
    ap.add_argument("--docs", default="ssl,prose")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import ssl

    docs = {"ssl": ssl.__file__, "prose": email_docstrings(out / "email_docstrings.txt")}
    a.gamma, a.ratio = 4, 0.05
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.new, a.repeats, a.hf_new, a.hf_batch = 200, 6, 2, 4, 1
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context, a.new, a.repeats, a.hf_new, a.hf_batch = 8000, 64, 3, 32, 16
    batches = [int(b) for b in (a.batches or ("1" if a.smoke else "1,16,64")).split(",")]
    import transformers

    import specdec.adaptive
    from specdec.loading import load_model

    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               transformers=transformers.__version__, gpu=torch.cuda.get_device_name() if a.device == "cuda" else None,
               adaptive_default=specdec.adaptive.ADAPTIVE_DEFAULT, documents=docs,
               args={k: str(v) for k, v in vars(a).items()}, parts={})
    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    res["load_s"] = time.perf_counter() - T0
    parts = []
    for label in a.docs.split(","):
        for B in batches:
            parts.append((f"{label}_B{B}", lambda label=label, B=B: part_pair(a, res, m, label, docs[label], B)))
            if label == "ssl" and B == a.hf_batch:
                parts.append((f"hf_static_B{B}", lambda B=B: part_hf(a, res, m, docs["ssl"], B)))
    for name, fn in parts:
        if time.perf_counter() - T0 > a.budget_s:
            res["parts"][name] = "skipped: out of time"
            continue
        t = time.perf_counter()
        try:
            fn()
            res["parts"][name] = f"ok in {time.perf_counter() - t:.0f} s"
        except Exception:
            res["parts"][name] = "error: " + traceback.format_exc(limit=8)
        print(name, res["parts"][name][:3000], flush=True)
        verdict(res)
        (out / "a14.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "a14.md").write_text(summary(res))
        if a.device == "cuda":
            torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - T0
    (out / "a14.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "a14.md").write_text(summary(res))
    print(summary(res))


def verdict(res) -> None:
    cmp = res.get("compare", [])
    done = {c["batch"] for c in cmp}
    res["adaptive_never_loses"] = bool(cmp) and all(c["ok"] for c in cmp)
    res["verdict_covers_batches"] = sorted(done)


def summary(res) -> str:
    f = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [f"# a14: fixed γ vs adaptive ({res['date']}, {res.get('gpu') or 'cpu'})", "",
             f"ADAPTIVE_DEFAULT in this tree: {res['adaptive_default']}; documents: {json.dumps(res['documents'])}",
             "", "parts: " + json.dumps({k: v[:200] for k, v in res["parts"].items()}), "",
             "| doc | B | method | fixed × dense | adaptive × dense | adaptive / fixed | τ fixed | τ adaptive | "
             "dense steps | mean γ | same tokens | ok |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in res.get("compare", []):
        lines.append(f"| {c['doc']} | {c['batch']} | {c['method']} | {f(c['fixed_over_dense'])} | "
                     f"{f(c['adaptive_over_dense'])} | {f(c['adaptive_over_fixed'])} | {c['tau_fixed']:.2f} | "
                     f"{c['tau_adaptive']:.2f} | {c['dense_steps']} | {f(c['gamma_mean'])} | {c['same_tokens']} | "
                     f"{c['ok']} |")
    lines += ["", f"adaptive never loses (B=1 >= 0.97x dense, B>1 within 2 % of fixed γ, same tokens), over "
              f"B = {res.get('verdict_covers_batches')}: **{res.get('adaptive_never_loses')}**", ""]
    for key, rows in res.get("rows", {}).items():
        lines.append(f"- {key}: " + ", ".join(f"{r['method']} {r['tokens_per_second']:.1f} tok/s "
                                              f"({r['tokens_per_second_min']:.0f}–{r['tokens_per_second_max']:.0f})"
                                              for r in rows))
    h = res.get("hf_static")
    if h:
        lines.append(f"- HF static generate B={h['batch']}: {h['median']:.1f} tok/s ({h.get('attn_implementation')}); "
                     f"vegas fixed / HF static = {f(h.get('vegas_fixed_over_hf_static'))}, "
                     f"vegas adaptive / HF static = {f(h.get('vegas_adaptive_over_hf_static'))} (target >= 10)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
