"""Vegas' selection options against MagicDec's window: τ (accepted length) per document, on a tuning set and a
held-out set of documents, at 8,000 tokens and a 5 % budget.

    python3 benchmarks/gpu/vegas_sweep.py --out $OUT/sweep            # H200, needs /tmp/m/smol.gguf (~3-6 min)
    python3 benchmarks/gpu/vegas_sweep.py --smoke --out /tmp/sweep    # CPU, tiny shapes: checks the script

Options are chosen on the ``tune`` documents and read on the ``held`` ones (neither is in the repository: this
interpreter's standard library, sources and package docstrings; the judged documents are other ones again). Every
sequence of a batch is a different (document, window) pair, so one ``generate`` per variant and set gives each
document's τ. Greedy, adaptive off (every round drafts γ), ``--windows`` windows per document whose ends lie
``--stride`` tokens apart, ``--new`` new tokens.

A variant is ``name=method[:options JSON]`` (``--variants``, ``;`` between them); ``recent``/``sinks`` inside the
JSON go to the pipeline's budget fields, the rest to the method's options. Writes ``<out>/sweep.json`` and
``<out>/sweep.md`` after every run (a timeout keeps what finished).
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

T0 = time.perf_counter()

#: documents: ``code:<stdlib module>`` (its source) or ``prose:<stdlib package>`` (its docstrings)
TUNE = ["code:argparse", "code:typing", "code:subprocess", "code:threading", "code:enum", "code:pickle",
        "prose:asyncio", "prose:xml", "prose:importlib", "prose:unittest"]
HELD = ["code:ssl", "code:inspect", "code:difflib", "code:tarfile", "code:configparser", "code:datetime",
        "prose:email", "prose:logging", "prose:http"]
SMOKE = {"tune": ["code:textwrap", "prose:json"], "held": ["code:heapq"]}

VARIANTS = ("magicdec=magicdec; vegas=vegas; vegas_s2=vegas:{\"spread\":2}; vegas_s4=vegas:{\"spread\":4}; "
            "vegas_s8=vegas:{\"spread\":8}; vegas_s16=vegas:{\"spread\":16}; vegas_r64=vegas:{\"recent\":64}; "
            "vegas_r128=vegas:{\"recent\":128}; vegas_s4_r64=vegas:{\"spread\":4,\"recent\":64}; "
            "vegas_all_s4=vegas-all:{\"spread\":4}; vegas_kv_s4=vegas:{\"spread\":4,\"per_kv_head\":true}")


def document_text(spec: str) -> str:
    """The text of ``code:<module>`` (the module's source) or ``prose:<package>`` (docstrings of its modules,
    tests left out)."""
    import importlib

    kind, name = spec.split(":", 1)
    mod = importlib.import_module(name)
    if kind == "code":
        return Path(mod.__file__).read_text()
    root = os.path.dirname(mod.__file__)
    texts = []
    for f in sorted(glob.glob(root + "/**/*.py", recursive=True)):
        if "/test" in f:
            continue
        for n in ast.walk(ast.parse(Path(f).read_text())):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                s = ast.get_docstring(n)
                if s:
                    texts.append(s)
    return "\n\n".join(texts)


def parse_variants(text: str) -> list[tuple[str, str, dict]]:
    out = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, _, rest = part.partition("=")
        method, _, opts = rest.partition(":")
        out.append((name.strip(), method.strip(), json.loads(opts) if opts.strip() else {}))
    return out


def batch_for(tokenizer, docs: list[str], a) -> tuple[list[list[int]], list[str]]:
    """Up to ``a.windows`` windows per document (the ones that fit; a short document gives fewer), ends ``a.stride``
    apart, the last ``a.new + 16`` tokens before the end: :func:`specdec.data.context_windows`' windows, tokenized once."""
    seqs, labels = [], []
    for d in docs:
        ids = tokenizer(document_text(d), add_special_tokens=False).input_ids
        for k in range(a.windows):
            end = len(ids) - (a.new + 16 + k * a.stride)
            if end < a.context:
                break
            seqs.append(ids[end - a.context : end])
            labels.append(d)
    return seqs, labels


def per_sequence_tau(trace: list[list[int]], B: int) -> list[float]:
    out = []
    for b in range(B):
        xs = [r[b] for r in trace if r[b] >= 0]
        out.append(1.0 + sum(xs) / len(xs) if xs else float("nan"))
    return out


def run(a, res, out: Path) -> None:
    from specdec import PipelineConfig, build_engine
    from specdec.loading import load_model

    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    sets = SMOKE if a.smoke else {"tune": TUNE, "held": HELD}
    for set_name in a.sets:
        batch, labels = batch_for(m.tokenizer, sets[set_name], a)
        res["sets"][set_name] = labels
        for name, method, opts in a.variants:
            if time.perf_counter() - T0 > a.budget_s:
                res["runs"].append(dict(set=set_name, variant=name, skipped="out of time"))
                continue
            budget = {k: opts[k] for k in ("recent", "sinks") if k in opts}
            options = {k: v for k, v in opts.items() if k not in budget}
            try:
                for g in a.gammas:
                    cfg = PipelineConfig.make(method=method, gamma=g, budget_ratio=a.ratio, adaptive=False,
                                              options=options, **budget)
                    eng = build_engine(m, cfg)
                    eng.record_acceptance = True
                    t = time.perf_counter()
                    r = eng.generate(batch, max_new_tokens=a.new)
                    taus = per_sequence_tau(r.stats.acceptance_trace, len(batch))
                    by_doc: dict[str, list[float]] = {}
                    for lab, tau in zip(labels, taus):
                        by_doc.setdefault(lab, []).append(tau)
                    res["runs"].append(dict(
                        set=set_name, variant=name, method=method, options=opts, gamma=g,
                        tau=r.stats.mean_accepted_length, s=round(time.perf_counter() - t, 1),
                        acceptance=[round(x, 3) for x in (r.stats.acceptance_per_position or [])],
                        tau_by_doc={d: sum(v) / len(v) for d, v in by_doc.items()}))
                    del eng
            except Exception:
                res["runs"].append(dict(set=set_name, variant=name, error=traceback.format_exc(limit=6)))
            save(res, out)
            print(json.dumps(res["runs"][-1])[:400], f"(t = {time.perf_counter() - T0:.0f} s)", flush=True)


def report_md(res) -> str:
    out = [f"# Vegas selection options vs MagicDec: τ per document ({res['date']}, {res.get('gpu')})", "",
           f"args: `{json.dumps(res['args'])}`", ""]
    for set_name, labels in res["sets"].items():
        docs = list(dict.fromkeys(labels))
        runs = [r for r in res["runs"] if r.get("set") == set_name and "tau_by_doc" in r]
        gammas = sorted({r["gamma"] for r in runs})
        for g in gammas:
            rows = [r for r in runs if r["gamma"] == g]
            base = next((r for r in rows if r["method"] == "magicdec"), None)
            out += [f"## {set_name} documents, γ {g}", "",
                    "| variant | τ (all) | geo-mean τ / magicdec | docs ahead of magicdec | "
                    + " | ".join(d.split(":")[1] for d in docs) + " |", "|---" * (4 + len(docs)) + "|"]
            for r in rows:
                ratio, ahead = "—", "—"
                if base is not None:
                    rs = [r["tau_by_doc"][d] / base["tau_by_doc"][d] for d in docs
                          if d in r["tau_by_doc"] and d in base["tau_by_doc"]]
                    ratio = f"{math.exp(sum(map(math.log, rs)) / len(rs)):.3f}" if rs else "—"
                    ahead = f"{sum(x > 1 for x in rs)}/{len(rs)}"
                out.append(f"| {r['variant']} | {r['tau']:.2f} | {ratio} | {ahead} | "
                           + " | ".join(f"{r['tau_by_doc'].get(d, float('nan')):.2f}" for d in docs) + " |")
            out.append("")
    errs = [r for r in res["runs"] if "error" in r or "skipped" in r]
    if errs:
        out += ["## Not run", ""] + [f"- {r['set']} {r['variant']}: {r.get('skipped') or r['error'][-600:]}"
                                     for r in errs] + [""]
    return "\n".join(out)


def save(res, out: Path) -> None:
    (out / "sweep.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "sweep.md").write_text(report_md(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--variants", default=VARIANTS, help="name=method[:options JSON]; ... (see the docstring)")
    ap.add_argument("--sets", default="tune,held", help="tune and/or held, comma separated")
    ap.add_argument("--gammas", default="8")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--stride", type=int, default=1500)
    ap.add_argument("--budget-s", type=float, default=500.0, help="no new run after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, not the numbers")
    a = ap.parse_args()
    a.variants = parse_variants(a.variants)
    a.sets = [s for s in a.sets.split(",") if s]
    if set(a.sets) - {"tune", "held"}:
        ap.error(f"--sets takes tune and/or held; got {a.sets}")
    a.gammas = [int(g) for g in a.gammas.split(",") if g]
    a.ratio = 0.05
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.new, a.windows, a.stride = 300, min(a.new, 8), 1, 20
        a.ratio = 0.3  # 90 entries of 300: room for the options to differ (5 % would be sinks + recent only)
        a.variants = [v for v in a.variants if v[0] in ("magicdec", "vegas", "vegas_s4")]
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context = 8000
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args={k: str(v) for k, v in vars(a).items()},
               gpu=torch.cuda.get_device_name() if a.device == "cuda" else None, sets={}, runs=[])
    run(a, res, out)
    save(res, out)
    print(report_md(res))


if __name__ == "__main__":
    main()
