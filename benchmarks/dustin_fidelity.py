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
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--budgets", default="0.25", help="comma-separated: ratios (<= 1) or entries (> 1)")
    ap.add_argument("--documents", default=",".join(HELD_OUT))
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--tasks", default="", help="e.g. passkey,niah_single,niah_multikey")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--task-budget", default=None, help="budget of the task runs (default: the first of --budgets)")
    ap.add_argument("--options", default="{}", help="dustin options as JSON, e.g. '{\"dense_layers\": 2}'")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new parts after this many seconds")
    ap.add_argument("--tf-only", action="store_true", help="teacher-forced runs only (no free-running run)")
    ap.add_argument("--margins", default="", help="comma-separated logit margins: the confidence valve's curve, "
                    "computed from one run per budget that records every sparse pass's deciding-row margin")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="a tiny random model, tiny shapes (CPU, seconds)")
    a = ap.parse_args(argv)
    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from specdec.data import context_ids, load_document
    from specdec.engine import SpeculativeEngine
    from specdec.evaluation import make_sample, score
    from specdec.presets import PipelineConfig, build_engine

    torch.manual_seed(0)
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
        a.context, a.new_tokens, a.samples = min(a.context, 256), min(a.new_tokens, 8), 1
        a.options = json.dumps({**json.loads(a.options), "draft": "early-exit"})
    else:
        from specdec.loading import load_model

        model = load_model(a.model, "float32", a.device, "reference")
    tok = model.tokenizer
    opts = json.loads(a.options)
    budgets = [b.strip() for b in a.budgets.split(",") if b.strip()]
    res = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         command="python " + " ".join(sys.argv), device=str(model.device),
                         torch=torch.__version__, context=a.context, budgets=budgets, gamma=a.gamma, options=opts,
                         new_tokens=a.new_tokens),
               documents=[], tasks=[], failures=[])
    dump = lambda: (out / "fidelity.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    dense = SpeculativeEngine(model, method="dense", eos_token_id=-1)

    margins = [float(x) for x in a.margins.split(",") if x.strip()]

    def dustin(b, forced=None):
        o = dict(opts)
        if forced is not None and margins:
            o.setdefault("margin", 0.0)  # record the margins, re-verify nothing
        eng = build_engine(model, PipelineConfig.make(method="dustin", gamma=a.gamma, options=o,
                                                      **budget_kw(b, a.context)), eos_token_id=-1)
        if forced is not None:
            eng.verifier = PassLog(eng.verifier, forced=forced)
        return eng

    def over() -> bool:
        return time.time() - t_start > a.budget_s

    for doc in [d.strip() for d in a.documents.split(",") if d.strip()]:
        if over():
            res["failures"].append(dict(part=doc, error="skipped: --budget-s reached"))
            break
        try:
            ids = context_ids(tok, load_document(doc), a.context, offset=a.new_tokens + 16)
            pre = dense.prefill([ids])
            dense.generate([ids], 4, prefilled=pre)  # warm-up at this shape
            t = time.perf_counter()
            ref = dense.generate([ids], a.new_tokens, prefilled=pre)
            row = dict(document=doc, dense_tokens_per_second=len(ref.tokens[0]) / (time.perf_counter() - t), budgets={})
            for b in budgets:
                eng = dustin(b, forced=[list(ids) + list(ref.tokens[0])])
                got = eng.generate([ids], a.new_tokens, prefilled=pre).tokens[0]
                assert got == ref.tokens[0], "the teacher-forced run left dense's trajectory"
                s = eng.verifier.summary()
                s["beyond_rows"], s["beyond_wrong"] = eng.verifier.beyond_rows, eng.verifier.beyond_wrong
                valve = {str(x): eng.verifier.valve(x) for x in margins}
                passes = eng.verifier.passes if margins else None  # (margin, rows, equal, read, dense read) per pass
                if a.tf_only:
                    row["budgets"][b] = dict(tf_agreement=s["tf_agreement"], tf_rows=s["tf_rows"], tf_tv_mean=s["tv_mean"],
                                             beyond_rows=s["beyond_rows"], beyond_wrong=s["beyond_wrong"],
                                             kv_read_vs_dense=eng.verifier.report().get("kv_read_vs_dense"), valve=valve,
                                             passes=passes,
                                             agreement_free=None, first_divergence=None, tau=None, tokens_per_second=None)
                    print(doc, b, json.dumps({k: v for k, v in row["budgets"][b].items() if k != "passes"}), flush=True)
                    continue
                eng = dustin(b)
                eng.generate([ids], 4, prefilled=pre)  # warm-up
                r = eng.generate([ids], a.new_tokens, prefilled=pre)
                x, y = r.tokens[0], ref.tokens[0]
                n = min(len(x), len(y))
                rep = eng.verifier.report()
                row["budgets"][b] = dict(tf_agreement=s["tf_agreement"], tf_rows=s["tf_rows"], tf_tv_mean=s["tv_mean"],
                                         agreement_free=sum(p == q for p, q in zip(x, y)) / max(n, 1),
                                         first_divergence=next((j for j in range(n) if x[j] != y[j]), n),
                                         tau=r.stats.mean_accepted_length, tokens_per_second=r.stats.tokens_per_second,
                                         kv_read_vs_dense=rep.get("kv_read_vs_dense"), valve=valve, passes=passes)
                print(doc, b, json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row["budgets"][b].items()}),
                      flush=True)
            res["documents"].append(row)
        except Exception:  # a benchmark part: record and go on (tests never do this)
            res["failures"].append(dict(part=doc, error=traceback.format_exc()))
            print(traceback.format_exc(), flush=True)
        dump()
    tb = a.task_budget or budgets[0]
    for task in [t.strip() for t in a.tasks.split(",") if t.strip()]:
        for i in range(a.samples):
            if over():
                res["failures"].append(dict(part=f"{task}#{i}", error="skipped: --budget-s reached"))
                break
            try:
                smp = make_sample(task, tok, a.context, i)
                pre = dense.prefill([smp["prompt"]])
                ref = dense.generate([smp["prompt"]], smp["max_new_tokens"], prefilled=pre)
                got = dustin(tb).generate([smp["prompt"]], smp["max_new_tokens"], prefilled=pre)
                res["tasks"].append(dict(task=task, sample=i, budget=tb, answers=smp["answers"],
                                         dense=score(tok.decode(ref.tokens[0]), smp["answers"]),
                                         dustin=score(tok.decode(got.tokens[0]), smp["answers"]),
                                         identical=got.tokens[0] == ref.tokens[0]))
                print(json.dumps(res["tasks"][-1]), flush=True)
            except Exception:
                res["failures"].append(dict(part=f"{task}#{i}", error=traceback.format_exc()))
                print(traceback.format_exc(), flush=True)
            dump()
    res["summary"] = summarize(res, budgets)
    dump()
    (out / "fidelity.md").write_text(markdown(res, budgets))
    if res["documents"]:
        plot(res, budgets, out / "curve.png")
    print((out / "fidelity.md").read_text())
    return 0


class PassLog(DenseTwin):
    """:class:`DenseTwin` that also logs, per verification pass and sequence, the deciding-row margin of the
    sparse pass (``SparseVerifier.last_margin``; ``None`` for a dense pass), the emitted rows, how many equal
    dense's, and the KV entries read by the pass and by a dense pass: enough to replay the confidence valve
    (``margin=x``) for every ``x`` from one run (:meth:`valve`)."""

    def __init__(self, inner, forced=None) -> None:
        super().__init__(inner, forced=forced)
        self.passes: list[tuple] = []

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
    if res["tasks"]:
        summ["tasks"] = dict(n=len(res["tasks"]), dense=sum(t["dense"] for t in res["tasks"]),
                             dustin=sum(t["dustin"] for t in res["tasks"]), identical=sum(t["identical"] for t in res["tasks"]))
    return summ


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def markdown(res: dict, budgets: list[str]) -> str:
    m = res["meta"]
    lines = [f"# Dustin fidelity — {m['date']}", "", f"- command: `{m['command']}`",
             f"- device {m['device']}, torch {m['torch']}, context {m['context']}, γ {m['gamma']}, "
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
                  "below x is re-verified densely (replayed from the logged margins of the run above).", "",
                  "| budget | margin | agreement, teacher-forced | KV read vs dense | passes re-verified |", "|---|---|---|---|---|"]
        for b in budgets:
            for x, r in (s.get(b, {}).get("valve") or {}).items():
                lines.append(f"| {b} | {x} | {r['tf_agreement']:.2%} | {r['kv_read_vs_dense']:.1%} | {r['redo_share']:.1%} |")
    if res["tasks"]:
        lines += ["", "| task | sample | budget | dense | dustin | identical |", "|---|---|---|---|---|---|"]
        for t in res["tasks"]:
            lines.append(f"| {t['task']} | {t['sample']} | {t['budget']} | {t['dense']:.2f} | {t['dustin']:.2f} | {t['identical']} |")
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
