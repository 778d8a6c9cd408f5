"""Fidelity of sparse verification (Dustin is near-lossless): how far is it from dense verification?

* **Token agreement** (per verify pass, teacher-forced): every pass of a sparse run is repeated
  densely on the same cache and rows; a row *agrees* when both passes pick the same greedy token.
  ``emitted_agreement`` counts only the rows whose token was emitted (accepted drafts + the next
  token); ``row_agreement`` counts every row. ``sequence_match`` compares the whole generated
  text with plain dense decoding (first divergence and share of equal positions).
* **TV distance** between the sparse and dense verify distributions, ``½ Σ_v |p_s(v) − p_d(v)|``,
  averaged over the emitted rows.
* **ARR per layer** (the paper's complementarity claim): at each sparse pass, the share of the
  dense attention mass of every target layer kept by the set built from the draft signal only
  (``m = all``), the target signal only (``m = 0``) and the hybrid (the ``m`` actually used).
* **Passkey**: a random 5-digit pass key hidden at some depth of a long document; the model is
  asked to repeat it; accuracy of sparse vs dense.

``specdec fidelity`` runs all of it and writes JSON (+ a Markdown summary with ``--output-md``).
"""

from __future__ import annotations

import json
import random
import shlex
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from specdec.data import PASSKEY_INTRO, passkey_prompt  # noqa: F401 - the prompt lives in the library
from specdec.errors import SpecdecError
from specdec.interfaces import ScoreRequest, Verifier


class FidelityProbe(Verifier):
    """Wraps a :class:`~specdec.verifiers.SparseVerifier`: a dense twin pass before every sparse pass.

    The dense pass writes the rows' K/V first; the sparse pass then overwrites them, so the run
    itself is exactly the sparse run. Costs one extra dense pass per iteration (a measurement tool).
    """

    def __init__(self, inner) -> None:
        self.inner = inner
        self.lossless = inner.lossless
        self.model = inner.model
        n = self.model.dims.n_global  # scores are recorded on the global (full-context) layers
        self.n_layers = n
        self.acc = dict(rows=0, rows_agree=0, emitted=0, emitted_agree=0, tv_sum=0.0, tv_max=0.0, arr_passes=0)
        self.arr = {k: torch.zeros(n, dtype=torch.float64) for k in ("draft_only", "target_only", "hybrid", "used")}
        self._pending = None

    def prefill(self, state) -> None:
        self.inner.prefill(state)

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        from specdec.srh import attention_recall

        B, T = tokens.shape
        # every head's dense attention of the T rows over the context: (B, H, L) per layer
        rec = ScoreRequest(rows=list(range(T)), kind="softmax", heads="each", source="context")
        dense = self.model.forward(tokens, state.cache, state.lengths, scores=rec)  # (B, T, V)
        sparse = self.inner.verify(state, tokens, scores)
        sel = self.inner.selector
        plan = self.inner.last_plan
        if plan is not None and sel.target_signal is not None:
            H = self.model.dims.n_heads
            mass = torch.stack([rec.scores[l].sum(1) / (H * T) for l in range(self.n_layers)])  # (N, B, L)
            lengths = state.lengths
            _, room = _room(sel, lengths)
            act = state.active
            sets = dict(
                draft_only=sel.select(lengths, m=room, draft=sel.draft_signal, target=sel.target_signal),
                target_only=sel.select(lengths, m=torch.zeros_like(room), draft=sel.draft_signal, target=sel.target_signal),
                hybrid=sel.select(lengths, draft=sel.draft_signal, target=sel.target_signal),
                used=plan.indices[0, :, 0],
            )
            for k, idx in sets.items():
                self.arr[k] += attention_recall(idx, mass, lengths)[:, act].sum(1).double().cpu()
            self.acc["arr_passes"] += int(act.sum())
        p_d = torch.softmax(dense, -1)
        p_s = torch.softmax(sparse, -1)
        tv = 0.5 * (p_d - p_s).abs().sum(-1)  # (B, T)
        agree = dense.argmax(-1) == sparse.argmax(-1)  # (B, T)
        self._pending = (state.lengths.clone(), state.active.clone(), tv, agree)
        return sparse

    def on_verify(self, state) -> None:
        self.inner.on_verify(state)
        old, act, tv, agree = self._pending
        T = tv.shape[1]
        n_emit = (state.lengths - old).clamp(min=1, max=T)  # rows whose token was emitted
        for b in range(tv.shape[0]):
            if not bool(act[b]):
                continue
            k = int(n_emit[b])
            self.acc["rows"] += T
            self.acc["rows_agree"] += int(agree[b].sum())
            self.acc["emitted"] += k
            self.acc["emitted_agree"] += int(agree[b, :k].sum())
            self.acc["tv_sum"] += float(tv[b, :k].sum())
            self.acc["tv_max"] = max(self.acc["tv_max"], float(tv[b, :k].max()))

    def summary(self) -> dict[str, Any]:
        a = self.acc
        out = dict(
            emitted_agreement=a["emitted_agree"] / max(a["emitted"], 1),
            row_agreement=a["rows_agree"] / max(a["rows"], 1),
            tv_mean=a["tv_sum"] / max(a["emitted"], 1),
            tv_max=a["tv_max"],
            emitted_rows=a["emitted"],
        )
        if a["arr_passes"]:
            for k, v in self.arr.items():
                out[f"arr_{k}"] = (v / a["arr_passes"]).tolist()
        out["verifier"] = self.inner.report()
        return out


def _room(sel, lengths):
    from specdec.selectors.base import fixed_positions

    c = sel.config
    return fixed_positions(lengths, sel.budget_for(lengths), c.sinks, c.recent)


def sequence_match(a: Sequence[int], b: Sequence[int]) -> dict[str, Any]:
    """First divergence and share of equal positions of two token lists."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    return dict(identical=list(a) == list(b), first_divergence=first,
                position_agreement=sum(x == y for x, y in zip(a, b)) / max(n, 1))


# ---------------------------------------------------------------------------------------------------
# the whole study
# ---------------------------------------------------------------------------------------------------
def method_config(method: str, gamma: int, budget: int, options: dict[str, Any]):
    from specdec.presets import PipelineConfig

    return PipelineConfig.make(method=method, gamma=gamma, budget=budget, options=dict(options))


def run_fidelity(model, documents: Sequence[str], context: int, budgets: Sequence[int], variants: dict[str, tuple],
                 gamma: int = 4, max_new_tokens: int = 96, passkey_trials: int = 0, passkey_documents=("pydoc",),
                 seed: int = 0, log=print, on_row=None, prefills: dict | None = None,
                 passkey_context: int | None = None) -> dict[str, Any]:
    """Fidelity of each variant vs dense on each document and budget, then the passkey check.

    ``variants``: ``{label: (method, options)}``, e.g. ``{"static": ("dustin", {}), "adaptive": ("dustin-adaptive", {})}``.
    ``prefills``: ``{document: (ids, Prefilled)}`` to reuse prefills made by the caller.
    """
    from specdec.data import context_ids, load_document
    from specdec.engine import SpeculativeEngine
    from specdec.presets import build_engine
    from specdec.prompts import check_positions

    # before any prefill: the positions, every document (a short or unknown last one failed after the others ran)
    # and every variant's engine (a bad srh artifact failed after the dense run)
    check_positions(max(context, passkey_context or 0) if passkey_trials else context, max_new_tokens,
                    model.dims.max_positions, "--context-tokens")
    doc_ids = {doc: None if prefills and doc in prefills else
               context_ids(model.tokenizer, load_document(doc), context, offset=max_new_tokens + 16, name=doc)
               for doc in documents}
    for method, opts in variants.values():
        for budget in budgets:
            build_engine(model, method_config(method, gamma, budget, opts))
    dense_eng = SpeculativeEngine(model, method="dense")
    rows: list[dict[str, Any]] = []
    for doc in documents:
        if prefills and doc in prefills:
            ids, pre = prefills[doc]
        else:
            ids = doc_ids[doc]
            pre = dense_eng.prefill([ids])
        ref = dense_eng.generate([ids], max_new_tokens=max_new_tokens, prefilled=pre)
        log(f"{doc}: dense {ref.stats.tokens_per_second:.2f} tok/s")
        for budget in budgets:
            for label, (method, opts) in variants.items():
                eng = build_engine(model, method_config(method, gamma, budget, opts))
                probe = FidelityProbe(eng.verifier)
                eng.verifier = probe
                res = eng.generate([ids], max_new_tokens=max_new_tokens, prefilled=pre)
                row = dict(document=doc, context=context, budget=budget, variant=label, method=method, options=opts,
                           tau=res.stats.mean_accepted_length, lossless=res.stats.lossless,
                           **probe.summary(), **sequence_match(res.tokens[0], ref.tokens[0]))
                rows.append(row)
                if on_row:
                    on_row(row)
                log(f"  budget {budget} {label}: emitted agreement {row['emitted_agreement']:.3f}, "
                    f"TV {row['tv_mean']:.4f}, τ {row['tau']:.2f}, identical {row['identical']}")
    passkey: list[dict[str, Any]] = []
    rng = random.Random(seed)
    for i in range(passkey_trials):
        doc = passkey_documents[i % len(passkey_documents)]
        key = str(rng.randint(10000, 99999))
        depth = (i + 0.5) / max(passkey_trials, 1)
        ids = passkey_prompt(model.tokenizer, load_document(doc), passkey_context or context, depth, key)
        pre = dense_eng.prefill([ids])
        outs = {"dense": dense_eng.generate([ids], max_new_tokens=8, prefilled=pre).text[0]}
        for budget in budgets:
            for label, (method, opts) in variants.items():
                eng = build_engine(model, method_config(method, gamma, budget, opts))
                outs[f"{label}@{budget}"] = eng.generate([ids], max_new_tokens=8, prefilled=pre).text[0]
        trial = dict(document=doc, depth=depth, key=key, answers=outs, correct={k: key in v for k, v in outs.items()})
        passkey.append(trial)
        log(f"passkey {i + 1}/{passkey_trials} depth {depth:.2f}: " + ", ".join(f"{k}={'ok' if c else 'no'}" for k, c in trial["correct"].items()))
    acc = {}
    if passkey:
        for k in passkey[0]["correct"]:
            acc[k] = sum(t["correct"][k] for t in passkey) / len(passkey)
    return dict(rows=rows, passkey=passkey, passkey_accuracy=acc)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Averages per (budget, variant): agreement, TV, mean ARR of each signal, targets."""
    out: dict[str, Any] = {}
    for r in result["rows"]:
        key = f"{r['variant']}@{r['budget']}"
        out.setdefault(key, []).append(r)
    summ = {}
    for key, rs in out.items():
        n = len(rs)
        s = dict(documents=n,
                 emitted_agreement=sum(r["emitted_agreement"] for r in rs) / n,
                 row_agreement=sum(r["row_agreement"] for r in rs) / n,
                 tv_mean=sum(r["tv_mean"] for r in rs) / n,
                 identical=sum(r["identical"] for r in rs),
                 tau=sum(r["tau"] for r in rs) / n,
                 dense_share=sum(r["verifier"].get("dense_share", 0) for r in rs) / n,
                 kv_read_vs_dense=sum(r["verifier"].get("kv_read_vs_dense", 1) for r in rs) / n)
        for k in ("draft_only", "target_only", "hybrid", "used"):
            vals = [sum(r[f"arr_{k}"]) / len(r[f"arr_{k}"]) for r in rs if f"arr_{k}" in r]
            if vals:
                s[f"mean_arr_{k}"] = sum(vals) / len(vals)
        summ[key] = s
    return summ


def markdown(result: dict[str, Any], command: str, meta: dict[str, Any]) -> str:
    summ = summarize(result)
    lines = [f"# Dustin fidelity on the CPU — {meta.get('date', '')}", "", f"- command: `{command}`",
             f"- settings: {json.dumps({k: v for k, v in meta.items() if k != 'date'})}", "",
             "## Averages per budget and variant", "",
             "*Emitted agreement*: share of emitted tokens whose sparse verify pass picked the token a dense pass "
             "over the same cache and rows picks (each pass on its own, on the cache the sparse run wrote: a "
             "disagreement does not carry over). *Row agreement*: the same over every verify row. *Identical runs*: "
             "runs whose whole text equals plain dense decoding's; a run can agree on 100 % of its passes and still "
             "not be identical, as its cache holds the sparse run's own entries (and a near-tie flips with the "
             "smallest difference), after which the texts differ. *First divergence*: the first generated token "
             "that differs from dense decoding's (— : none).", "",
             "| variant@budget | docs | emitted agreement | row agreement | TV mean | identical runs | τ | dense passes | KV read vs dense | ARR draft-only | ARR target-only | ARR hybrid |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k, s in summ.items():
        lines.append(f"| {k} | {s['documents']} | {s['emitted_agreement']:.2%} | {s['row_agreement']:.2%} | {s['tv_mean']:.4f} | "
                     f"{s['identical']}/{s['documents']} | {s['tau']:.2f} | {s['dense_share']:.1%} | {s['kv_read_vs_dense']:.1%} | "
                     f"{s.get('mean_arr_draft_only', float('nan')):.3f} | {s.get('mean_arr_target_only', float('nan')):.3f} | "
                     f"{s.get('mean_arr_hybrid', float('nan')):.3f} |")
    lines += ["", "## Per document", "",
              "| document | budget | variant | emitted agreement | TV mean | first divergence | τ | ARR d/t/h (mean over layers) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        arr = "/".join(f"{sum(r[f'arr_{k}']) / len(r[f'arr_{k}']):.3f}" if f"arr_{k}" in r else "-"
                       for k in ("draft_only", "target_only", "hybrid"))
        lines.append(f"| {r['document']} | {r['budget']} | {r['variant']} | {r['emitted_agreement']:.2%} | {r['tv_mean']:.4f} | "
                     f"{'—' if r['identical'] else r['first_divergence']} | {r['tau']:.2f} | {arr} |")
    if result.get("passkey_accuracy"):
        lines += ["", "## Passkey accuracy", "", "| verifier | accuracy |", "|---|---|"]
        lines += [f"| {k} | {v:.0%} ({sum(t['correct'][k] for t in result['passkey'])}/{len(result['passkey'])}) |"
                  for k, v in result["passkey_accuracy"].items()]
    rows = result["rows"]
    if rows and "arr_hybrid" in rows[0]:
        n = len(rows[0]["arr_hybrid"])
        lines += ["", "## ARR per target layer (mean over documents, budgets and variants)", "",
                  "| layer | draft-only | target-only | hybrid |", "|---|---|---|---|"]
        have = [r for r in rows if "arr_hybrid" in r]
        for l in range(n):
            vals = [sum(r[f"arr_{k}"][l] for r in have) / len(have) for k in ("draft_only", "target_only", "hybrid")]
            lines.append(f"| {l} | {vals[0]:.3f} | {vals[1]:.3f} | {vals[2]:.3f} |")
    return "\n".join(lines) + "\n"


def register(app) -> None:
    """Add ``specdec fidelity``."""
    import typer

    from specdec.friendly import friendly
    from specdec.loading import load_model, parse_options

    @app.command("fidelity")
    @friendly
    def fidelity_cmd(
        output_json: Path = typer.Option(..., "--output-json", help="where to write the full results as JSON"),
        output_md: Optional[Path] = typer.Option(None, "--output-md", help="also write the Markdown summary here"),
        model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
        documents: str = typer.Option("pydoc,stdlib:argparse", "--documents", help="comma-separated: pydoc, stdlib:<module>"),
        context: int = typer.Option(2048, "--context-tokens", help="context length in tokens"),
        budgets: str = typer.Option("512,1024", "--budgets", help="comma-separated verification budgets (KV entries)"),
        gamma: int = typer.Option(4, "--gamma", help="draft length γ"),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="tokens generated per document"),
        srh: Optional[Path] = typer.Option(None, "--srh", help="SRH artifact from `specdec profile-srh`"),
        adaptive: bool = typer.Option(True, "--adaptive/--no-adaptive", help="also run dustin-adaptive"),
        option: list[str] = typer.Option([], "--option", help="extra dustin option key=value (repeatable)"),
        passkey_trials: int = typer.Option(0, "--passkey-trials", min=0,
                                           help="pass-key retrieval trials per budget (0 = none)"),
        device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
    ) -> None:
        """Agreement with dense verification, TV distance, ARR per layer and passkey accuracy of Dustin."""
        import datetime as dt

        from rich.console import Console

        from specdec.outputs import check_outputs, write_text

        check_outputs([(output_json, "--output-json"), (output_md, "--output-md")])
        opts = parse_options(option)
        if opts.get("verify") == "dense":  # it failed with AttributeError: FullVerifier has no selector
            raise SpecdecError("specdec fidelity measures Dustin's sparse verification against dense; --option "
                               "verify=dense verifies densely, so there is nothing to compare: drop it.")
        if "adaptive" in opts:  # the row labelled "static" ran the adaptive split
            raise SpecdecError("--option adaptive=... would change the 'static' row; fidelity runs the static split and, "
                               "with --adaptive (the default), dustin-adaptive beside it: use --adaptive/--no-adaptive.")
        if srh is not None:
            if "srh" in opts:
                raise SpecdecError(f"--srh {srh} and --option srh={opts['srh']} were both given; pass one.")
            opts["srh"] = str(srh)
        if context < 16:
            raise SpecdecError(f"--context-tokens must be >= 16 (got {context}).")
        if not 1 <= gamma <= 64:  # named as the user wrote it (it was "pipeline config: field 'gamma'" after the load)
            raise SpecdecError(f"--gamma must be between 1 and 64 (got {gamma}).")
        try:
            bl = [int(b) for b in budgets.split(",") if b.strip()]
        except ValueError:
            raise SpecdecError(f"--budgets must be comma-separated integers (got {budgets!r}).") from None
        if not bl:  # it said "(got )"
            raise SpecdecError(f"--budgets {budgets!r} names no budget; pass comma-separated integers, e.g. "
                               "--budgets 512,1024.")
        bad = next((b for b in bl if not 1 <= b <= context), None)
        if bad is not None:  # the value at fault, not the whole list
            raise SpecdecError(f"--budgets {bad} is outside 1 .. --context-tokens {context}; give budgets from 1 to "
                               f"{context} (or a longer --context-tokens).")
        if len(set(bl)) < len(bl):  # each would run (and report) twice
            twice = next(b for b in bl if bl.count(b) > 1)
            raise SpecdecError(f"--budgets names {twice} twice; give each budget once.")
        variants = {"static": ("dustin", opts)}
        if adaptive:
            variants["adaptive"] = ("dustin-adaptive", opts)
        docs = [d.strip() for d in documents.split(",") if d.strip()]
        if not docs:
            raise SpecdecError("--documents is empty; give at least one document (e.g. pydoc,stdlib:argparse).")
        from specdec.data import check_documents

        for line in check_documents(docs):  # a typo in the last document failed after the others had run
            typer.echo(f"note: {line}", err=True)
        m = load_model(model, "float32", device, "reference")
        console = Console()
        res = run_fidelity(m, docs, context, bl, variants, gamma, max_new_tokens, passkey_trials, log=console.print)
        meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), model=model, context=context,
                    budgets=bl, gamma=gamma, max_new_tokens=max_new_tokens, options=opts)
        cmd = " ".join(shlex.quote(a) for a in ["specdec", *sys.argv[1:]])
        write_text(output_json, json.dumps(dict(meta=meta, command=cmd, summary=summarize(res), **res), indent=1),
                   "--output-json")
        md = markdown(res, cmd, meta)
        if output_md is not None:
            write_text(output_md, md, "--output-md")
        console.print(md)
