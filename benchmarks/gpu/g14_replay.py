"""Vegas vs MagicDec at the Llama-3.1-8B shape, each at its best γ: traces recorded on held-out documents, replayed.

    timeout 330 python3 benchmarks/gpu/g14_replay.py --out $OUT/g14 --docs code --gammas 8,12 \
        --methods magicdec,vegas,vegas-all    # every method after magicdec is compared with it

    timeout 280 python3 benchmarks/gpu/g14_replay.py --out $OUT/g14 --docs code --gammas 8,12   # H200, one document
    per process (a fourth 8B replay in one process runs out of memory); needs /tmp/m/smol.gguf
    python3 benchmarks/gpu/g14_replay.py --smoke --out /tmp/g14_smoke    # CPU, tiny shapes, ~1 minute

The replayed 8B rows of ``replay_8b.sh`` use γ = 4 only, where both methods accept almost every draft (τ 4.6 / 4.9 of
at most 5), so τ can differ by at most ~8 % while Vegas does strictly more work per iteration (scores, selection).
The target compares the methods *at equal budget*; γ is each method's own choice. This script:

1. ``traces``: the embedded model (bf16, triton, CUDA graphs, fused) records per-round accepted lengths
   (``engine.record_acceptance``, adaptive off so every round drafts γ) for each of ``--methods`` (default magicdec, vegas) at each ``--gammas``
   value, 5 % budget, on two documents that are not in the repository: this interpreter's ``ssl.py`` (code) and the
   docstrings of its ``email`` package (prose, ``a14.email_docstrings``), 8,000 tokens of context, B = 4, ``--new``
   tokens (greedy; every trace run's tokens are compared with dense greedy: ``same_tokens``); ``--windows K``
   makes the batch's sequences K different windows of the document (ends ``--stride`` tokens apart) instead of
   one window repeated.
2. ``replay``: :func:`specdec.bench.run_bench` at ``shape="llama-3.1-8b"``, B 16 × 32k, random weights: dense once,
   then per (document, γ) the methods replaying their traces (rows labelled replayed; warm-up + median of
   ``--repeats`` timed runs, min–max).
3. Per document: each method's best γ by tokens/s, and its best over magicdec's best.

Writes ``<out>/g14.json`` and ``<out>/g14.md`` after every step (a timeout keeps what finished), traces under
``<out>/traces/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


def documents(a, out: Path) -> dict[str, str]:
    import ssl

    from a14 import email_docstrings

    if a.smoke:
        return {"code": "stdlib:textwrap", "prose": "pydoc"}
    email_docstrings(out / "email_docstrings.txt")
    return {"code": ssl.__file__, "prose": str(out / "email_docstrings.txt")}


def windows(tokenizer, text: str, context: int, new: int, count: int, stride: int) -> list[list[int]]:
    """``count`` windows of ``context`` tokens of ``text`` whose ends lie ``stride`` tokens apart, the last ending
    ``new + 16`` tokens before the end (room for the continuation)."""
    from specdec.data import context_windows

    return context_windows(tokenizer, text, context, count, new + 16, stride)


def record(a, res, out: Path) -> None:
    from specdec import PipelineConfig, build_engine
    from specdec.adaptive import save_trace
    from specdec.data import load_document
    from specdec.loading import load_model

    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    tdir = out / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    for doc, path in documents(a, out).items():
        if doc not in a.docs:
            continue
        text = load_document(path)
        # a.windows distinct windows (ends a.stride tokens apart): the sequences of a trace continue different
        # places of the document; with --windows 1 every sequence is the same window (the 2026-12-01 runs, whose
        # Vegas lead did not hold on four windows: benchmarks/results/gpu_replay_8b_2026-12-02.md)
        batch = windows(m.tokenizer, text, a.context, a.new, a.windows, a.stride)
        batch = (batch * a.trace_batch)[: max(a.trace_batch, a.windows)]
        dense = build_engine(m, PipelineConfig.make(method="dense", adaptive=False))
        ref = dense.generate(batch, max_new_tokens=a.new).tokens
        for g in a.gammas:
            for method in a.methods:
                if elapsed() > a.trace_budget_s:
                    res["traces"][f"{doc}|{g}|{method}"] = dict(skipped="out of time")
                    continue
                cfg = PipelineConfig.make(method=method, gamma=g, budget_ratio=a.ratio, adaptive=False)
                eng = build_engine(m, cfg)
                eng.record_acceptance = True
                r = eng.generate(batch, max_new_tokens=a.new)
                p = tdir / f"{doc}_{method}_g{g}.json"
                save_trace(p, r.stats, model=str(a.model), budget_ratio=a.ratio, context_tokens=a.context, document=path)
                res["traces"][f"{doc}|{g}|{method}"] = dict(
                    file=str(p), tau=r.stats.mean_accepted_length, rounds=len(r.stats.acceptance_trace),
                    same_tokens=[list(map(int, t)) for t in r.tokens] == [list(map(int, t)) for t in ref])
                del eng
                save(res, out)
        del dense
    del m
    if a.device == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def replay(a, res, out: Path) -> None:
    from specdec.bench import run_bench

    shape, B, ctx = a.replay_shape
    common = dict(cuda_graphs=a.graphs, fuse=True, warmup=True, repeats=a.repeats, shape=shape)
    rows = run_bench(["dense"], [ctx], [B], ["random"], a.new, None, a.ratio, 4, "random", a.backend, a.dtype,
                     a.device, False, out, "g14_dense", **common)
    res["replay"].append(dict(doc=None, gamma=None, rows=rows))
    save(res, out)
    keys = sorted({(k.split("|")[0], int(k.split("|")[1])) for k, v in res["traces"].items() if "file" in v},
                  key=lambda dg: (a.gammas.index(dg[1]), dg[0]))
    for doc, g in keys:
        if elapsed() > a.budget_s:
            res["replay"].append(dict(doc=doc, gamma=g, skipped="out of time"))
            continue
        traces = {m: res["traces"][f"{doc}|{g}|{m}"]["file"] for m in a.methods
                  if "file" in res["traces"].get(f"{doc}|{g}|{m}", {})}
        try:
            rows = run_bench(list(traces), [ctx], [B], ["random"], a.new, None, a.ratio, g, "random", a.backend,
                             a.dtype, a.device, False, out, f"g14_{doc}_g{g}", acceptance_trace=traces, **common)
            res["replay"].append(dict(doc=doc, gamma=g, rows=rows))
        except Exception:
            res["replay"].append(dict(doc=doc, gamma=g, error=traceback.format_exc(limit=6)))
        save(res, out)
        if a.device == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()


def summary(res) -> dict:
    dense = next((r for e in res["replay"] if e.get("doc") is None for r in e.get("rows", [])
                  if r["method"] == "dense"), None)
    best: dict = {}
    for e in res["replay"]:
        for r in e.get("rows", []):
            if r["method"] == "dense" or e.get("doc") is None:
                continue
            k = (e["doc"], r["method"])
            if k not in best or r["tokens_per_second"] > best[k]["tokens_per_second"]:
                best[k] = dict(r, gamma=e["gamma"])
    out = {}
    for doc in sorted({d for d, _ in best}):
        mg = best.get((doc, "magicdec"))
        out[doc] = dict(magicdec_best_gamma=mg and mg["gamma"], magicdec_tok_s=mg and mg["tokens_per_second"])
        for m in sorted({m for d, m in best if d == doc and m != "magicdec"}):
            v, k = best[(doc, m)], m.replace("-", "_")
            out[doc].update({f"{k}_best_gamma": v["gamma"], f"{k}_tok_s": v["tokens_per_second"],
                             f"{k}_over_magicdec": (v["tokens_per_second"] / mg["tokens_per_second"]) if mg else None,
                             f"{k}_x_dense": (v["tokens_per_second"] / dense["tokens_per_second"]) if dense else None})
    return out


def report_md(res) -> str:
    out = [f"# g14: vegas vs magicdec at the 8B shape, each at its best γ ({res['date']}, {res.get('gpu')})", "",
           f"args: `{json.dumps(res['args'])}`", "", "## Traces (embedded model, held-out documents)", "",
           "| document | γ | method | τ | rounds | same tokens as dense |", "|---|---|---|---|---|---|"]
    for k, v in res["traces"].items():
        doc, g, m = k.split("|")
        out.append(f"| {doc} | {g} | {m} | {v.get('tau', float('nan')):.2f} | {v.get('rounds', '')} | "
                   f"{v.get('same_tokens', v.get('skipped', ''))} |")
    out += ["", "## Replayed at the 8B shape (tokens/s, median of the timed runs, min–max)", "",
            "| document | γ | method | τ | tok/s | min–max | × dense | select share |", "|---|---|---|---|---|---|---|---|"]
    dense = next((r["tokens_per_second"] for e in res["replay"] if e.get("doc") is None for r in e.get("rows", [])
                  if r["method"] == "dense"), None)
    for e in res["replay"]:
        if "rows" not in e:
            out.append(f"| {e.get('doc')} | {e.get('gamma')} | — | | {e.get('skipped') or 'error'} | | | |")
            continue
        for r in e["rows"]:
            sp = r["tokens_per_second"] / dense if dense else None  # the one dense row of this run
            out.append(f"| {e.get('doc') or '—'} | {e.get('gamma') or '—'} | {r['method']}"
                       f"{' (replayed)' if r.get('replayed') else ''} | {r.get('tau', 1.0):.2f} | "
                       f"{r['tokens_per_second']:,.1f} | {r.get('tokens_per_second_min', 0):,.1f}–"
                       f"{r.get('tokens_per_second_max', 0):,.1f} | {'' if sp is None else f'{sp:.2f}×'} | "
                       f"{100 * r.get('selection_overhead_share', 0.0):.1f} % |")
    s = summary(res)
    out += ["", "## Each method at its best γ (against MagicDec at its best γ)", "",
            "| document | method | γ | tok/s | / magicdec | × dense |", "|---|---|---|---|---|---|"]
    f = lambda x, p="{:.3f}": "—" if x is None else p.format(x)  # noqa: E731
    for doc, v in s.items():
        out.append(f"| {doc} | magicdec | {v['magicdec_best_gamma']} | {f(v['magicdec_tok_s'], '{:,.1f}')} | 1 | |")
        for k in sorted(x[: -len("_best_gamma")] for x in v if x.endswith("_best_gamma") and x != "magicdec_best_gamma"):
            out.append(f"| {doc} | {k.replace('_', '-')} | {v[k + '_best_gamma']} | {f(v[k + '_tok_s'], '{:,.1f}')} | "
                       f"{f(v[k + '_over_magicdec'])} | {f(v[k + '_x_dense'])} |")
    out += ["", "parts: " + json.dumps(res["parts"]), ""]
    return "\n".join(out)


def save(res, out: Path) -> None:
    res["summary"] = summary(res)
    (out / "g14.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "g14.md").write_text(report_md(res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--gammas", default="4,8,6", help="γ values, in the order they are replayed (time may run out)")
    ap.add_argument("--docs", default="code,prose", help="which held-out documents: code (ssl.py), prose (email docstrings)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=250.0, help="no new replay after this many seconds")
    ap.add_argument("--trace-budget-s", type=float, default=110.0, help="no new trace after this many seconds")
    ap.add_argument("--new", type=int, default=128, help="new tokens per trace sequence (and per replayed sequence)")
    ap.add_argument("--windows", type=int, default=4, help="distinct context windows in a trace's batch (ends "
                    "--stride tokens apart; the batch is max(4, windows) sequences, windows repeated; 1: one window "
                    "repeated, as the 2026-12-01 runs did)")
    ap.add_argument("--stride", type=int, default=1000, help="tokens between the ends of consecutive windows")
    ap.add_argument("--methods", default="magicdec,vegas", help="methods traced and replayed, comma separated "
                    "(magicdec first: every other one is compared with it)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, not the numbers")
    a = ap.parse_args()
    a.methods = [m for m in a.methods.split(",") if m]
    if not a.methods or a.methods[0] != "magicdec" or len(a.methods) < 2:
        ap.error(f"--methods starts with magicdec and names at least one more (e.g. magicdec,vegas); got {a.methods}")
    try:
        a.gammas = [int(g) for g in a.gammas.split(",") if g]
    except ValueError:
        ap.error(f"--gammas wants integers, comma separated (e.g. 4,8,6); got {a.gammas!r}")
    if not a.gammas or min(a.gammas) < 1:
        ap.error("--gammas needs at least one γ >= 1")
    a.docs = [d for d in a.docs.split(",") if d]
    if not a.docs or set(a.docs) - {"code", "prose"}:
        ap.error(f"--docs takes code and/or prose, comma separated; got {','.join(a.docs)!r}")
    a.ratio = 0.05
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.new, a.trace_batch, a.replay_shape = 300, min(a.new, 8), 2, ("tiny", 2, 256)
        a.stride = min(a.stride, 20)
        a.repeats = min(a.repeats, 2)
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context, a.trace_batch, a.replay_shape = 8000, 4, ("llama-3.1-8b", 16, 32768)
    if a.new < 1 or a.windows < 1 or a.stride < 1:
        ap.error("--new, --windows and --stride must be >= 1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args={k: str(v) for k, v in vars(a).items()},
               gpu=torch.cuda.get_device_name() if a.device == "cuda" else None, parts={}, traces={}, replay=[])
    for name, fn in (("traces", record), ("replay", replay)):
        t = time.perf_counter()
        try:
            fn(a, res, out)
            res["parts"][name] = f"ok in {time.perf_counter() - t:.0f} s"
        except Exception:
            res["parts"][name] = "error: " + traceback.format_exc(limit=8)
        print(name, res["parts"][name][:2000], f"(t = {elapsed():.0f} s)", flush=True)
        save(res, out)
    print(report_md(res))


if __name__ == "__main__":
    main()
