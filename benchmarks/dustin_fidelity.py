"""Dustin's sparse verification against dense decoding: agreement (teacher-forced and free-running), task
scores and tokens/s per verification budget — the fidelity/speed trade-off curve.

Per document (held-out: not the built-in ``specdec eval`` documents) and budget:

* **teacher-forced agreement**: Dustin runs on dense's greedy trajectory (:class:`specdec.evaluation.DenseTwin`
  with ``forced``); share of positions whose sparse-verification greedy token equals dense's given the same
  prefix, and the TV distance of the two verify distributions on those rows;
* **free-running**: Dustin on its own (no twin pass, so its tokens/s are its own), the share of equal positions
  of the two outputs and the first divergence, τ and the KV entries read relative to dense.

Retrieval tasks (``--tasks``): each sample's dense and Dustin answers, per budget.

Writes ``fidelity.json`` (after every part: a timeout keeps what finished), ``fidelity.md`` and ``curve.png``
under ``--out``. CPU::

    python benchmarks/dustin_fidelity.py --context 512 --budgets 0.125,0.25,0.5 --out /tmp/f

GPU (``--device cuda``) is the same command; ``--smoke`` runs tiny shapes in seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from specdec.evaluation import DenseTwin

#: held out from ``specdec eval``'s built-in documents and from ``train-draft``: code and prose
HELD_OUT = ("stdlib:dataclasses", "stdlib:calendar", "stdlib:textwrap", "pydoc:1/4", "pydoc:3/4")


def budget_kw(b: str, context: int) -> dict:
    v = float(b)
    return dict(budget_ratio=v) if v <= 1 else dict(budget=int(v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="reference", choices=("reference", "torch", "auto"),
                    help="attention backend (float32); auto: time dense decoding with both at --context after a "
                    "warm-up, check they emit the same tokens, keep the faster")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--budgets", default="0.25", help="comma-separated: ratios (<= 1) or entries (> 1)")
    ap.add_argument("--documents", default=",".join(HELD_OUT))
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--tasks", default="", help="specdec eval tasks, e.g. passkey,niah_single,niah_multikey "
                    "(run through specdec.evaluation.run_eval: paired sign test and bootstrap interval per variant)")
    ap.add_argument("--samples", type=int, default=2, help="samples per task")
    ap.add_argument("--task-context", type=int, default=None, help="prompt length of the tasks (default: --context)")
    ap.add_argument("--task-budget", default=None, help="budget of the task runs (default: the first of --budgets)")
    ap.add_argument("--options", default="{}", help="dustin options as JSON, e.g. '{\"dense_layers\": 2}'")
    ap.add_argument("--variants", default=None, help="JSON {label: options}: the free-running runs and the tasks run "
                    "each (merged over --options); default {\"dustin\": {}}")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new work this many seconds after the "
                    "model is loaded")
    ap.add_argument("--tf-budget-s", type=float, default=1e9, help="seconds for the teacher-forced part (from its start)")
    ap.add_argument("--free-budget-s", type=float, default=1e9, help="seconds for the free-running part (from its start)")
    ap.add_argument("--task-budget-s", type=float, default=1e9, help="seconds for the task part (from its start)")
    ap.add_argument("--tf-only", action="store_true", help="teacher-forced runs only (no free-running run)")
    ap.add_argument("--dense-kv", action="store_true", help="diagnosis: after each sparse pass of the teacher-forced "
                    "runs, a dense pass rewrites the rows' K/V (the agreement left when sparse K/V never accumulate)")
    ap.add_argument("--margins", default="", help="comma-separated logit margins: the confidence valve's curve, "
                    "computed from one run per budget that records every sparse pass's deciding-row margin")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, tiny shapes (CPU, seconds)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from specdec.data import context_ids, load_document
    from specdec.engine import SpeculativeEngine
    from specdec.evaluation import markdown as eval_markdown
    from specdec.evaluation import run_eval
    from specdec.evaluation import summarize as eval_summarize
    from specdec.presets import PipelineConfig, build_engine

    opts = json.loads(a.options)
    variants = json.loads(a.variants) if a.variants else {"dustin": {}}
    torch.manual_seed(0)
    backend_timing = None
    t_load = time.time()
    if a.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from conftest import make_tiny  # noqa: E402

        model = make_tiny("llama", seed=5, vocab_size=49152, num_hidden_layers=3)
        from transformers import AutoTokenizer

        from specdec.models import _cache_dir, embedded_model_path, load_hf

        g = embedded_model_path("smollm2-135m")  # the embedded model's tokenizer makes the documents' ids
        cached = _cache_dir() / f"{g.stem}-{g.stat().st_size}"
        if not (cached / "tokenizer_config.json").is_file():
            load_hf("smollm2-135m")
        model.tokenizer = AutoTokenizer.from_pretrained(str(cached), local_files_only=True)
        # absolute budgets keep their share of the context at the smoke's 256 tokens
        scale = lambda b, ctx: b if b is None or float(b) <= 1 else str(float(b) / ctx)  # noqa: E731
        a.budgets = ",".join(scale(b.strip(), a.context) for b in a.budgets.split(",") if b.strip())
        a.task_budget = scale(a.task_budget, a.task_context or a.context)
        a.context, a.new_tokens, a.samples = min(a.context, 256), min(a.new_tokens, 8), min(a.samples, 1)
        a.task_context = min(a.task_context or a.context, 256)
        opts = {**opts, "draft": "early-exit"}
        backend = "reference (tiny random model)"
    else:
        from specdec.loading import load_model

        if a.backend == "auto":
            model, backend, backend_timing = pick_backend(load_model, a.model, a.device, a.context)
        else:
            model, backend = load_model(a.model, "float32", a.device, a.backend), a.backend
    load_s = time.time() - t_load
    t_start = time.time()  # every budget starts after the model is loaded
    tok = model.tokenizer
    budgets = [b.strip() for b in a.budgets.split(",") if b.strip()]
    res = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         command="python " + " ".join(sys.argv), device=str(model.device), dtype="float32",
                         backend=backend, backend_timing=backend_timing, load_s=load_s,
                         torch=torch.__version__, context=a.context, budgets=budgets, gamma=a.gamma, options=opts,
                         variants=variants, new_tokens=a.new_tokens),
               documents=[], tasks=[], failures=[])
    dump = lambda: (out / "fidelity.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    dense = SpeculativeEngine(model, method="dense", eos_token_id=-1)

    margins = [float(x) for x in a.margins.split(",") if x.strip()]

    def report() -> None:  # after every part: a hard timeout keeps the tables of the parts that finished
        res["summary"] = summarize(res, budgets)
        dump()
        (out / "fidelity.md").write_text(markdown(res, budgets))
        if res["documents"]:
            plot(res, budgets, out / "curve.png")

    def dustin(b, forced=None, extra=None):
        o = {**opts, **(extra or {})}
        if forced is not None and margins:
            o.setdefault("margin", 0.0)  # record the margins, re-verify nothing
        eng = build_engine(model, PipelineConfig.make(method="dustin", gamma=a.gamma, options=o,
                                                      **budget_kw(b, a.context)), eos_token_id=-1)
        if forced is not None:
            eng.verifier = PassLog(eng.verifier, forced=forced, dense_kv=a.dense_kv)
        return eng

    def over(part_start: float, part_budget: float) -> bool:
        now = time.time()
        return now - t_start > a.budget_s or now - part_start > part_budget

    # part 1: teacher-forced agreement per document and budget (and the valve replayed at every margin)
    refs = {}
    p0 = time.time()
    for doc in [d.strip() for d in a.documents.split(",") if d.strip()]:
        if over(p0, a.tf_budget_s):
            res["failures"].append(dict(part=f"teacher-forced {doc}", error="skipped: time budget reached"))
            continue
        try:
            ids = context_ids(tok, load_document(doc), a.context, offset=a.new_tokens + 16)
            pre = dense.prefill([ids])
            dense.generate([ids], 4, prefilled=pre)  # warm-up at this shape
            t = time.perf_counter()
            ref = dense.generate([ids], a.new_tokens, prefilled=pre)
            row = dict(document=doc, dense_tokens_per_second=len(ref.tokens[0]) / (time.perf_counter() - t), budgets={},
                       free={})
            refs[doc] = (ids, pre, ref.tokens[0], row)
            for b in budgets:
                eng = dustin(b, forced=[list(ids) + list(ref.tokens[0])])
                got = eng.generate([ids], a.new_tokens, prefilled=pre).tokens[0]
                assert got == ref.tokens[0], "the teacher-forced run left dense's trajectory"
                s = eng.verifier.summary()
                valve = {str(x): eng.verifier.valve(x) for x in margins}
                row["budgets"][b] = dict(tf_agreement=s["tf_agreement"], tf_rows=s["tf_rows"], tf_tv_mean=s["tv_mean"],
                                         beyond_rows=eng.verifier.beyond_rows, beyond_wrong=eng.verifier.beyond_wrong,
                                         kv_read_vs_dense=eng.verifier.report().get("kv_read_vs_dense"), valve=valve,
                                         passes=eng.verifier.passes if margins else None,
                                         agreement_free=None, first_divergence=None, tau=None, tokens_per_second=None)
                print("teacher-forced", doc, b, json.dumps({k: v for k, v in row["budgets"][b].items() if k != "passes"}),
                      flush=True)
            res["documents"].append(row)
        except Exception:  # a benchmark part: record and go on (tests never do this)
            res["failures"].append(dict(part=f"teacher-forced {doc}", error=traceback.format_exc()))
            print(traceback.format_exc(), flush=True)
        dump()
    res["meta"]["tf_s"] = time.time() - p0
    free_memory()
    report()
    # part 2: free-running, every variant on its own (no twin pass, so its tokens/s are its own)
    p0 = time.time()
    for doc, (ids, pre, y, row) in ([] if a.tf_only else refs.items()):
        for b in budgets:
            for label, extra in variants.items():
                if over(p0, a.free_budget_s):
                    res["failures"].append(dict(part=f"free-running {doc} {b} {label}", error="skipped: time budget reached"))
                    continue
                try:
                    eng = dustin(b, extra=extra)
                    eng.generate([ids], 4, prefilled=pre)  # warm-up
                    r = eng.generate([ids], a.new_tokens, prefilled=pre)
                    x = r.tokens[0]
                    n = min(len(x), len(y))
                    f = dict(agreement_free=sum(p == q for p, q in zip(x, y)) / max(n, 1),
                             first_divergence=next((j for j in range(n) if x[j] != y[j]), n),
                             tau=r.stats.mean_accepted_length, tokens_per_second=r.stats.tokens_per_second,
                             kv_read_vs_dense=eng.verifier.report().get("kv_read_vs_dense"))
                    row["free"].setdefault(b, {})[label] = f
                    if label == next(iter(variants)):  # the first variant fills the per-budget row
                        row["budgets"][b].update({k: v for k, v in f.items() if k != "kv_read_vs_dense"})
                    print("free-running", doc, b, label, json.dumps(f), flush=True)
                except Exception:
                    res["failures"].append(dict(part=f"free-running {doc} {b} {label}", error=traceback.format_exc()))
                    print(traceback.format_exc(), flush=True)
                dump()
    res["meta"]["free_s"] = time.time() - p0
    free_memory()
    report()
    # part 3: specdec eval's tasks (run_eval, one sample of one task at a time so a time box keeps whole samples;
    # samples in the outer loop so every task gets some)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    p0 = time.time()
    if tasks:
        tb = a.task_budget or budgets[0]
        tctx = a.task_context or a.context
        kw = budget_kw(tb, tctx)
        methods = {label: ("dustin", {**opts, **extra}) for label, extra in variants.items()}
        rows = []
        for i in range(a.samples):
            for task in tasks:
                if over(p0, a.task_budget_s):
                    res["failures"].append(dict(part=f"{task}#{i}", error="skipped: time budget reached"))
                    continue
                try:
                    r = run_eval(model, methods, [task], tctx, 1, kw.get("budget"), kw.get("budget_ratio"), a.gamma,
                                 documents=(), seed=i, tokenizer=tok, log=lambda s: print(s, flush=True))
                    for t in r["tasks"]:
                        t["sample"] = i
                    rows += r["tasks"]
                except Exception:
                    res["failures"].append(dict(part=f"{task}#{i}", error=traceback.format_exc()))
                    print(traceback.format_exc(), flush=True)
                if rows:
                    ev = dict(tasks=rows, documents=[])
                    ev["summary"] = eval_summarize(ev, list(methods))
                    emeta = dict(date=res["meta"]["date"], command=res["meta"]["command"], model=a.model, context=tctx,
                                 samples=a.samples, budget=kw.get("budget"), budget_ratio=kw.get("budget_ratio"),
                                 gamma=a.gamma, backend=backend, methods={k: v[1] for k, v in methods.items()})
                    res["tasks"], res["task_summary"] = rows, ev["summary"]
                    (out / "tasks.json").write_text(json.dumps(dict(meta=emeta, **ev), indent=1))
                    (out / "tasks.md").write_text(eval_markdown(ev, emeta))
                dump()
    res["meta"]["task_s"] = time.time() - p0
    report()
    print((out / "fidelity.md").read_text())
    if (out / "tasks.md").is_file():
        print((out / "tasks.md").read_text())
    return 0


def free_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def pick_backend(load_model, name: str, device: str, context: int):
    """Load the model with the reference and the torch backend (float32), time dense greedy decoding of 32 tokens
    at ``context`` after a warm-up (median of 3), check both emit the same tokens, return the faster."""
    from specdec.engine import SpeculativeEngine

    timing, outs, models = {}, {}, {}
    ids = [(7 * i + 11) % 30000 + 100 for i in range(context)]
    for be in ("reference", "torch"):
        m = load_model(name, "float32", device, be)
        eng = SpeculativeEngine(m, method="dense", eos_token_id=-1)
        pre = eng.prefill([ids])
        eng.generate([ids], 4, prefilled=pre)
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            outs[be] = eng.generate([ids], 32, prefilled=pre).tokens[0]
            if m.device.type == "cuda":
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t)
        timing[be] = sorted(ts)[1]
        models[be] = m
    pick = min(timing, key=timing.get) if outs["reference"] == outs["torch"] else "reference"
    model = models.pop(pick)
    models.clear()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return model, pick, dict(seconds_per_32_tokens=timing, same_tokens=outs["reference"] == outs["torch"])


class PassLog(DenseTwin):
    """:class:`DenseTwin` that also logs, per verification pass and sequence, the deciding-row margin of the
    sparse pass (``SparseVerifier.last_margin``; ``None`` for a dense pass), the emitted rows, how many equal
    dense's, and the KV entries read by the pass and by a dense pass: enough to replay the confidence valve
    (``margin=x``) for every ``x`` from one run (:meth:`valve`)."""

    def __init__(self, inner, forced=None, dense_kv: bool = False) -> None:
        super().__init__(inner, forced=forced)
        self.passes: list[tuple] = []
        self.dense_kv = dense_kv

    def verify(self, state, tokens, scores):
        out = super().verify(state, tokens, scores)
        if self.dense_kv:  # the rows' K/V as a dense pass writes them (the logits stay the sparse pass's)
            self.model.forward(tokens, state.cache, state.lengths)
        return out

    beyond_rows = beyond_wrong = 0  # emitted rows past the valve's deciding rows (teacher forcing only), and wrong ones

    def on_verify(self, state) -> None:
        eq0, rows0 = self.tf_equal, self.tf_rows
        old, act, tv, mine, want = self._pending
        dec = getattr(self.inner, "last_deciding", None)
        if dec is not None and want is not None and self.inner.last_margin is not None and bool(act[0]):
            k = min(max(len(state.tokens[0]) - old[0], 1), tv.shape[1])
            d = int(dec[0])
            if k > d:
                self.beyond_rows += k - d
                self.beyond_wrong += int(((mine[0, d:k] != want[0, d:k]) & (want[0, d:k] >= 0)).sum())
        super().on_verify(state)
        m = self.inner.last_margin
        r, d = self.inner.last_read.tolist()
        self.passes.append((None if m is None else float(m[0]), self.tf_rows - rows0, self.tf_equal - eq0, r, d))

    def valve(self, x: float) -> dict:
        """Agreement and KV read had the passes with a margin below ``x`` been re-verified densely (the re-run
        adds a dense read; its rows then equal dense's)."""
        eq = rows = read = dense = redo = 0
        for m, n, e, r, d in self.passes:
            fire = m is not None and m < x
            eq += n if fire else e
            rows += n
            read += r + (d if fire else 0)
            dense += d
            redo += fire
        return dict(tf_agreement=eq / max(rows, 1), tf_rows=rows, kv_read_vs_dense=read / max(dense, 1),
                    redo_share=redo / max(len(self.passes), 1))


def summarize(res: dict, budgets: list[str]) -> dict:
    summ = {}
    for b in budgets:
        rows = [d["budgets"][b] for d in res["documents"] if b in d["budgets"]]
        if not rows:
            continue
        n = sum(r["tf_rows"] for r in rows)
        summ[b] = dict(documents=len(rows), tf_rows=n,
                       tf_agreement=sum(r["tf_agreement"] * r["tf_rows"] for r in rows) / max(n, 1),
                       tf_tv_mean=sum(r["tf_tv_mean"] for r in rows) / len(rows),
                       kv_read_vs_dense=sum(r["kv_read_vs_dense"] or 0 for r in rows) / len(rows))
        for k in ("agreement_free", "tokens_per_second", "tau"):
            vals = [r[k] for r in rows if r.get(k) is not None]
            summ[b][k] = sum(vals) / len(vals) if vals else None
        xs = rows[0].get("valve") or {}
        summ[b]["valve"] = {x: dict(tf_agreement=sum(r["valve"][x]["tf_agreement"] * r["valve"][x]["tf_rows"] for r in rows) / max(n, 1),
                                    kv_read_vs_dense=sum(r["valve"][x]["kv_read_vs_dense"] for r in rows) / len(rows),
                                    redo_share=sum(r["valve"][x]["redo_share"] for r in rows) / len(rows)) for x in xs}
    if res["documents"]:
        summ["dense_tokens_per_second"] = sum(d["dense_tokens_per_second"] for d in res["documents"]) / len(res["documents"])
    free = {}
    for d in res["documents"]:
        for b, per in d.get("free", {}).items():
            for label, f in per.items():
                free.setdefault(b, {}).setdefault(label, []).append(f)
    summ["free"] = {b: {label: dict(documents=len(fs), agreement_free=sum(f["agreement_free"] for f in fs) / len(fs),
                                    first_divergence_mean=sum(f["first_divergence"] for f in fs) / len(fs),
                                    identical=sum(f["first_divergence"] == res["meta"]["new_tokens"] for f in fs),
                                    tau=sum(f["tau"] for f in fs) / len(fs),
                                    kv_read_vs_dense=sum(f["kv_read_vs_dense"] or 0 for f in fs) / len(fs))
                        for label, fs in per.items()} for b, per in free.items()}
    return summ


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def markdown(res: dict, budgets: list[str]) -> str:
    m = res["meta"]
    lines = [f"# Dustin fidelity — {m['date']}", "", f"- command: `{m['command']}`",
             f"- device {m['device']}, {m.get('dtype', 'float32')}, backend {m.get('backend')}, torch {m['torch']}, context {m['context']}, γ {m['gamma']}, "
             f"options {json.dumps(m['options'])}, {m['new_tokens']} new tokens per document", "",
             "*Teacher-forced*: Dustin on dense's trajectory, share of positions whose greedy token equals dense's "
             "given the same prefix. *Free-running*: share of equal positions of the two outputs (Dustin on its own).", "",
             "| document | budget | agreement, teacher-forced (rows) | agreement, free-running | first divergence | TV | τ | "
             "KV read vs dense | tok/s (dense) |", "|---|---|---|---|---|---|---|---|---|"]
    for d in res["documents"]:
        for b, r in d["budgets"].items():
            lines.append(f"| {d['document']} | {b} | {r['tf_agreement']:.2%} ({r['tf_rows']}) | {_f(r['agreement_free'], '.2%')} | "
                         f"{_f(r['first_divergence'], 'd')} | {r['tf_tv_mean']:.4f} | {_f(r['tau'], '.2f')} | {r['kv_read_vs_dense'] or 0:.1%} | "
                         f"{_f(r['tokens_per_second'], '.1f')} ({d['dense_tokens_per_second']:.1f}) |")
    s = res.get("summary", {})
    lines += ["", "| budget | documents | agreement, teacher-forced (all rows) | agreement, free-running (mean) | TV | τ | "
              "KV read vs dense | tok/s |", "|---|---|---|---|---|---|---|---|"]
    for b in budgets:
        if b in s:
            r = s[b]
            lines.append(f"| {b} | {r['documents']} | {r['tf_agreement']:.2%} ({r['tf_rows']}) | {_f(r['agreement_free'], '.2%')} | "
                         f"{r['tf_tv_mean']:.4f} | {_f(r['tau'], '.2f')} | {r['kv_read_vs_dense']:.1%} | {_f(r['tokens_per_second'], '.1f')} |")
    if "dense_tokens_per_second" in s:
        lines.append(f"| dense | | 100 % | 100 % | 0 | 1 | 100 % | {s['dense_tokens_per_second']:.1f} |")
    if any(s.get(b, {}).get("valve") for b in budgets):
        lines += ["", "*Confidence valve* (`margin=x`): a sparse pass whose deciding rows have a top-1/top-2 logit margin "
                  "below x is re-verified densely (replayed from the logged margins of the run above). The replay is "
                  "optimistic: it counts a re-verified pass's rows as dense's and keeps every later pass as logged; "
                  "measured with the valve on, agreement came out 0.6–2.8 points lower (run with `--options "
                  "'{\"margin\": x}'` to measure).", "",
                  "| budget | margin | agreement, teacher-forced | KV read vs dense | passes re-verified |", "|---|---|---|---|---|"]
        for b in budgets:
            for x, r in (s.get(b, {}).get("valve") or {}).items():
                lines.append(f"| {b} | {x} | {r['tf_agreement']:.2%} | {r['kv_read_vs_dense']:.1%} | {r['redo_share']:.1%} |")
    if s.get("free"):
        lines += ["", "*Free-running* per variant (each on its own; options merged over the base options).", "",
                  "| budget | variant | options | documents | agreement, free-running (mean) | first divergence (mean) | "
                  "identical to dense | τ | KV read vs dense |", "|---|---|---|---|---|---|---|---|---|"]
        for b, per in s["free"].items():
            for label, r in per.items():
                lines.append(f"| {b} | {label} | `{json.dumps(m['variants'].get(label, {}))}` | {r['documents']} | "
                             f"{r['agreement_free']:.2%} | {r['first_divergence_mean']:.1f} | {r['identical']} | "
                             f"{r['tau']:.2f} | {r['kv_read_vs_dense']:.1%} |")
    if res["tasks"]:
        lines += ["", "Tasks: see `tasks.md` (specdec eval's table: per task and variant, dense vs variant, sign test, "
                  "bootstrap interval)."]
    if res["failures"]:
        lines += ["", "Failures / skipped parts:", ""] + [f"- {f['part']}: {f['error'].strip().splitlines()[-1]}" for f in res["failures"]]
    return "\n".join(lines) + "\n"


def plot(res: dict, budgets: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = res["summary"]
    bs = [b for b in budgets if b in s]
    x = [float(b) * (100 if float(b) <= 1 else 100 / res["meta"]["context"]) for b in bs]
    fig, ax = plt.subplots(figsize=(6, 3.4))
    ax.plot(x, [100 * s[b]["tf_agreement"] for b in bs], "o-", label="agreement, teacher-forced")
    if all(s[b]["agreement_free"] is not None for b in bs):
        ax.plot(x, [100 * s[b]["agreement_free"] for b in bs], "s--", label="agreement, free-running")
    ax.set_xlabel("verification budget (% of the context)")
    ax.set_ylabel("agreement with dense (%)")
    ax.set_title(f"context {res['meta']['context']}, {res['meta']['device']}", fontsize=8)
    ax2 = ax.twinx()
    if all(s[b]["tokens_per_second"] is not None for b in bs):
        ax2.plot(x, [s[b]["tokens_per_second"] for b in bs], "^:", color="gray", label=f"tokens/s ({res['meta']['device']})")
    ax2.set_ylabel("tokens/s")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
