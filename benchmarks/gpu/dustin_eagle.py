"""Issue 15 item 1 on the H200 (≈ 5 minutes): train the EAGLE draft head on the GPU (recipe v2), then τ on
held-out documents for the new head alone and combined with prompt lookup.

    python3 benchmarks/gpu/dustin_eagle.py --gguf /tmp/m/smol.gguf --out $OUT --budget-s 290
    python3 benchmarks/gpu/dustin_eagle.py --smoke --out /tmp/smoke      # CPU, embedded model, tiny shapes

Parts (each saved as it finishes to ``<out>/dustin_eagle.json`` + ``.md``; a part that would start after
``--budget-s`` seconds is recorded as skipped; a failing part records its traceback and the next one runs):

1. ``train`` — ``specdec.train_eagle.train`` on the GPU, recipe ``v2`` (3 exact unrolled steps, 2048-token
   sequences, KL to the target's full next-token distribution + feature regression, warm-up + cosine
   schedule, up to 4 M tokens of the wide training text: every stdlib package, the test suite, docstrings
   and ``.txt`` documents, held-out modules and pydoc topics excluded), ``--train-minutes`` of wall time
   (collection included). Writes ``<out>/smollm2-135m-eagle-gpu.safetensors`` after every epoch.
2. ``tau`` — τ with dense verification (float32, γ = 4, 64 new tokens, lossless: ``equals_dense`` per row)
   on the 8 held-out documents (2 pydoc prose, 6 stdlib modules) at contexts 512 and 2048: the new head
   alone (``new``) and with prompt lookup (``new+lookup``, ``specdec.lookup``, Dustin's default policy);
   ``--tau-old`` adds the shipped head (``shipped``, ``shipped+lookup``). Documents outer, contexts inner,
   saved after each, stopped at the budget.

Ship ``<out>/smollm2-135m-eagle-gpu.safetensors`` as ``specdec/draft_weights/smollm2-135m-eagle.safetensors``
if ``new``'s mean τ beats the shipped head's (``benchmarks/results/gpu_dustin_eagle_2026-12-01.md``: 1.56 at
512, 1.33 at 2048, same settings).

Optional parts (``--parts train,tau,e2e,lossless``, not in the 5 minutes): ``e2e`` — ``specdec.bench.run_bench``
dense vs ``dustin`` at 8k, B = 64 (draft step / target step, agreement with dense); ``lossless`` — the head with
dense verification at the same shape (τ, tokens/s vs dense).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where two token lists agree (over the shorter length)."""
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])) / max(n, 1)


def step_ratio(row: dict, dense: dict, gamma: int) -> dict:
    """Draft step time vs a dense target step, from the phase seconds of one median run."""
    rounds = max(1, row["iterations"] - row.get("dense_steps", 0))
    draft_step = row["phase_seconds"]["draft"] / (rounds * gamma)
    target_step = dense["phase_seconds"]["verify"] / max(1, dense["iterations"])
    verify_step = row["phase_seconds"]["verify"] / rounds
    return dict(draft_step_ms=1e3 * draft_step, target_step_ms=1e3 * target_step, verify_step_ms=1e3 * verify_step,
                draft_over_target=draft_step / target_step)


def head_path(a):
    """The GPU-trained head of this run if the ``train`` part wrote one, else the shipped head."""
    p = Path(a.out) / "smollm2-135m-eagle-gpu.safetensors"
    return str(p) if p.is_file() else None


def part_train(a, res):
    from specdec.train_eagle import train

    out = Path(a.out) / "smollm2-135m-eagle-gpu.safetensors"
    r = train(a.gguf, tokens=a.train_tokens, minutes=a.train_minutes, device=a.device, batch=a.train_batch,
              recipe=a.recipe, seq=a.train_seq, eval_tokens=a.eval_tokens, out=out, log=lambda s: print(s, flush=True),
              selfgen=tuple(int(x) for x in a.selfgen.split(",")) if a.selfgen else None, init=a.init)
    res["train"] = {k: v for k, v in r.items() if k != "target"}


def part_tau(a, res):
    """τ with dense verification, per held-out document × context: this run's head alone and with prompt lookup
    (``specdec.lookup``, Dustin's default policy), optionally the shipped head too (``--tau-old``). Documents
    outer, contexts inner, saved after each: a budget cut still leaves both kinds and both contexts."""
    from specdec import SpecdecModel
    from specdec.data import context_ids
    from specdec.dustin import default_lookup
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.train_draft import held_out_texts, shipped_draft
    from specdec.verifiers import FullVerifier

    m = SpecdecModel.from_pretrained(a.gguf, dtype="float32", device=a.device)
    heads = {}
    if head_path(a):
        heads["new"] = EagleDrafter(m, head_path(a))
    if a.tau_old or not heads:
        heads["shipped"] = EagleDrafter(m, shipped_draft(m, "eagle"))
    drafters = {}
    for k, d in heads.items():
        drafters[k] = d
        drafters[f"{k}+lookup"] = default_lookup(d)
    dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)
    docs = held_out_texts()
    prose, code = [d for d in docs if d[0].startswith("pydoc")], [d for d in docs if not d[0].startswith("pydoc")]
    order = [d for pair in zip(prose + [None] * len(code), code) for d in pair if d is not None][: a.tau_docs]
    rows = res.setdefault("tau", [])
    for name, text in order:
        for ctx in a.tau_contexts:
            if elapsed() > a.budget_s - 10:
                res.setdefault("skipped", []).append(f"tau {name} @ {ctx}")
                continue
            ids = context_ids(m.tokenizer, text, ctx, offset=80)
            pre = dense.prefill([ids])
            ref = dense.generate([ids], a.tau_new, prefilled=pre)
            for k, d in drafters.items():
                r = SpeculativeEngine(m, d, FullVerifier(m), gamma=4, eos_token_id=-1).generate([ids], a.tau_new, prefilled=pre)
                row = dict(draft=k, context=ctx, document=name, kind="prose" if name.startswith("pydoc") else "code",
                           tau=r.stats.mean_accepted_length, equals_dense=r.tokens == ref.tokens)
                if isinstance(d, LookupDrafter):
                    row["lookup_share"] = d.stats(reset=True)["matched_share"]
                rows.append(row)
            a.save()


def part_e2e(a, res):
    from specdec.bench import run_bench

    kw = dict(contexts=[a.context], batch_sizes=[a.batch], documents=[a.document], max_new_tokens=a.new, budget=None,
              budget_ratio=0.05, gamma=4, model=a.gguf, backend=a.backend, dtype=a.dtype, device=a.device,
              hf_baseline=False, output_dir=Path(a.out), cuda_graphs=a.graphs, fuse=a.fuse, warmup=True,
              repeats=a.repeats)
    # options go to every method of a run_bench call: dense and dustin (with a draft option) run separately
    rows = run_bench(methods=["dense"], tag="dustin_eagle_e2e_dense", **kw)
    rows += run_bench(methods=["dustin"], tag="dustin_eagle_e2e_dustin",
                      options={"draft": head_path(a)} if head_path(a) else None, **kw)
    dense = next(r for r in rows if r["method"] == "dense")
    out = []
    for r in rows:
        row = {k: r[k] for k in ("method", "context", "batch", "tau", "tokens_per_second", "iterations", "phase_seconds")}
        row["speedup_vs_dense"] = r["tokens_per_second"] / dense["tokens_per_second"]
        if r["method"] != "dense":
            row.update(step_ratio(r, dense, 4), agreement_with_dense=agreement(r["tokens"], dense["tokens"]),
                       draft=head_path(a) or "shipped")
        out.append(row)
    res["e2e"] = out


def part_lossless(a, res):
    import statistics

    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.loading import load_model
    from specdec.data import context_ids, load_document
    from specdec.train_draft import shipped_draft
    from specdec.verifiers import FullVerifier

    m = load_model(a.gguf, a.dtype, a.device, a.backend, a.graphs, False, a.fuse)
    ids = context_ids(m.tokenizer, load_document(a.document), a.context, offset=a.new + 16)
    drafter = EagleDrafter(m, head_path(a) or shipped_draft(m, "eagle"))  # before the prefill: the prompt's hidden states are kept
    dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)
    spec = SpeculativeEngine(m, drafter, FullVerifier(m), gamma=4, method="eagle-dense-verify", eos_token_id=-1)
    one = dense.prefill([ids])
    from specdec.engine import Prefilled

    pre = Prefilled(ids=[ids] * a.batch, k=one.k.expand(-1, a.batch, -1, -1, -1), v=one.v.expand(-1, a.batch, -1, -1, -1),
                    last_logits=one.last_logits.expand(a.batch, -1), hidden=one.hidden.expand(a.batch, -1, -1))
    row = {}
    for name, eng in (("dense", dense), ("eagle-dense-verify", spec)):
        eng.generate([ids] * a.batch, a.new, prefilled=pre)  # warm-up: captures
        runs = [eng.generate([ids] * a.batch, a.new, prefilled=pre) for _ in range(a.repeats)]
        tps = [r.stats.tokens_per_second for r in runs]
        med = sorted(runs, key=lambda r: r.stats.tokens_per_second)[(len(runs) - 1) // 2]
        row[name] = dict(tokens_per_second=statistics.median(tps), tau=med.stats.mean_accepted_length,
                         iterations=med.stats.iterations, phase_seconds=med.stats.phase_seconds, tokens=med.tokens)
    d, s = row["dense"], row["eagle-dense-verify"]
    res["lossless"] = dict(
        dense_tokens_per_second=d["tokens_per_second"], eagle_tokens_per_second=s["tokens_per_second"],
        speedup_vs_dense=s["tokens_per_second"] / d["tokens_per_second"], tau=s["tau"],
        equals_dense=s["tokens"] == d["tokens"],
        **step_ratio(dict(s, dense_steps=0), d, 4))


def markdown(res) -> str:
    lines = [f"# Dustin with the EAGLE draft head — {res['meta']['date']}", "", f"`{res['meta']['argv']}`", ""]
    if "e2e" in res:
        lines += ["| method | context | B | τ | tok/s | × dense | draft step ms | target step ms | draft/target "
                  "| agreement with dense |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["e2e"]:
            f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "")  # noqa: E731
            lines.append(f"| {r['method']} | {r['context']} | {r['batch']} | {r['tau']:.2f} | {r['tokens_per_second']:.0f} "
                         f"| {f('speedup_vs_dense', '{:.2f}×')} | {f('draft_step_ms', '{:.3f}')} "
                         f"| {f('target_step_ms', '{:.3f}')} | {f('draft_over_target', '{:.1%}')} "
                         f"| {f('agreement_with_dense', '{:.1%}')} |")
    if "lossless" in res:
        r = res["lossless"]
        lines += ["", f"Lossless (dense verification): τ {r['tau']:.2f}, {r['eagle_tokens_per_second']:.0f} tok/s = "
                  f"{r['speedup_vs_dense']:.2f}× dense, draft step {r['draft_over_target']:.1%} of a target step, "
                  f"equals dense: {r['equals_dense']}"]
    if "train" in res:
        t = res["train"]
        lines += ["", f"GPU training: {t.get('tokens')} tokens, {t.get('epochs')} epochs, {t.get('optimizer_steps')} steps, "
                  f"held-out top-1 per step {t.get('heldout_top1')}"]
    if "tau" in res:
        lines += ["", "| draft | context | document | τ (dense verification) | equals dense | lookup share |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['draft']} | {r['context']} | {r['document']} | {r['tau']:.2f} | {r['equals_dense']} "
                  f"| {r.get('lookup_share', '')} |" for r in res["tau"]]
        lines += ["", "| draft | context | kind | mean τ | documents |", "|---|---|---|---|---|"]
        for k in dict.fromkeys(r["draft"] for r in res["tau"]):
            for ctx in dict.fromkeys(r["context"] for r in res["tau"]):
                for kind in ("prose", "code", "all"):
                    ts = [r["tau"] for r in res["tau"] if r["draft"] == k and r["context"] == ctx
                          and kind in (r["kind"], "all")]
                    if ts:
                        lines.append(f"| {k} | {ctx} | {kind} | {sum(ts) / len(ts):.2f} | {len(ts)} |")
    for k, v in res.get("errors", {}).items():
        lines += ["", f"**{k} failed**:", "```", v[-3000:], "```"]
    for k in res.get("skipped", []):
        lines += ["", f"{k}: skipped (budget)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=295)
    ap.add_argument("--smoke", action="store_true", help="CPU: embedded model, context 128, B = 2, 8 tokens")
    ap.add_argument("--parts", default="train,tau", help="train,tau (default, ~5 min) and optionally e2e,lossless")
    ap.add_argument("--train-minutes", type=float, default=2.0)
    ap.add_argument("--train-tokens", type=int, default=4_000_000)
    ap.add_argument("--train-batch", type=int, default=4)
    ap.add_argument("--train-seq", type=int, default=None, help="default: the recipe's (v2 on the GPU: 2048)")
    ap.add_argument("--recipe", default="v2")
    ap.add_argument("--init", default=None, help="an EAGLE artifact (or 'shipped') whose weights start the head")
    ap.add_argument("--selfgen", default=None, metavar="SEG,GEN", help="recipe v4: every SEG tokens end in GEN of the "
                    "target's greedy continuation (default: the recipe's)")
    ap.add_argument("--eval-tokens", type=int, default=16384)
    ap.add_argument("--document", default="stdlib:tarfile", help="e2e/lossless document: built-in name or a text file "
                    "(default stdlib:tarfile, held out of training)")
    ap.add_argument("--tau-old", action="store_true", help="also τ of the shipped head (alone and with lookup)")
    a = ap.parse_args()
    if a.smoke:
        a.gguf, a.device, a.dtype, a.backend, a.graphs, a.fuse = "smollm2-135m", "cpu", "float32", "reference", False, False
        a.context, a.batch, a.new, a.repeats = 128, 2, 8, 1
        a.train_minutes, a.train_tokens, a.train_batch = min(a.train_minutes, 0.3), min(a.train_tokens, 1024), 4
        a.train_seq, a.eval_tokens = a.train_seq or 64, min(a.eval_tokens, 128)
        a.tau_contexts, a.tau_docs, a.tau_new = (128,), 2, 8
        torch.set_num_threads(1)
    else:
        a.tau_contexts, a.tau_docs, a.tau_new = (512, 2048), 8, 64
        a.device, a.dtype, a.backend, a.graphs, a.fuse = "cuda", "bfloat16", "triton", True, True
        a.context, a.batch, a.new, a.repeats = 8000, 64, 96, 3
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import datetime as dt

    res = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), argv=" ".join(sys.argv),
                         device=torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                         context=a.context, batch=a.batch, new_tokens=a.new, document=a.document),
               errors={}, skipped=[])

    def save():
        (out / "dustin_eagle.json").write_text(json.dumps(res, indent=1, default=str))
        (out / "dustin_eagle.md").write_text(markdown(res))

    a.save = save

    for name in a.parts.split(","):
        if elapsed() > a.budget_s:
            res["skipped"].append(name)
            save()
            continue
        t = time.perf_counter()
        try:
            {"train": part_train, "tau": part_tau, "e2e": part_e2e, "lossless": part_lossless}[name](a, res)
        except Exception:
            res["errors"][name] = traceback.format_exc()
        res.setdefault("part_seconds", {})[name] = round(time.perf_counter() - t, 1)
        if a.device == "cuda":
            torch.cuda.empty_cache()
        save()
    print(markdown(res))


if __name__ == "__main__":
    main()
