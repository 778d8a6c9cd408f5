"""Dustin's speed against dense decoding per verification setting, in one run (``specdec.bench.run_bench``).

    python3 benchmarks/gpu/dustin_budget_speed.py --gguf /tmp/m/smol.gguf --out DIR \\
        --documents a.txt,b.py --settings '{"5%": [0.05, {}], "25%": [0.25, {}], "25% per-layer": [0.25, {"layer_share": 0.5}]}'

Every setting runs on the same documents, batch and context (default 8k, B = 64, 96 new tokens, γ 4, bf16, Triton,
CUDA graphs, fused projections, warm-up + median of 3); dense first. Writes ``DIR/budget_speed.{json,md}``.
``--smoke``: the embedded model on the CPU, context 128, B = 2, 8 tokens.

``--dense-text``: Dustin is near-lossless, so free-running it writes its own text, and its τ is that text's (a run
that drifts into repetition drafts easily: τ 4.5 where dense verification of the same drafter reaches 1.5). With this
option every setting also runs on **dense's text**: Dustin's drafter with dense verification
(:func:`specdec.bench.dense_text_replay`: dense's tokens, up to bf16 rounding) records its per-round acceptance on each
document first (B = 1), and each setting
replays it (:class:`specdec.adaptive.AcceptanceReplay`): every cost of the setting is real (draft, plan, sparse
verify), its acceptance is the drafter's on dense's text. Rows labelled ``… (dense's text)``; the traces are written
to ``DIR/trace_<i>.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--documents", required=True, help="comma-separated files or built-in names")
    ap.add_argument("--settings", required=True, help='JSON {label: [budget_ratio, dustin options]}')
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--dense-text", action="store_true",
                    help="also time every setting with the acceptance of dense verification on dense's text (replayed)")
    a = ap.parse_args(argv)
    from specdec.bench import run_bench
    from specdec.fidelity import sequence_match
    from specdec.loading import load_model

    settings = _settings(a.settings)
    gpu = not a.smoke
    model = load_model("smollm2-135m" if a.smoke else a.gguf, "bfloat16" if gpu else "float32", "cuda" if gpu else "cpu",
                       "triton" if gpu else "reference", gpu, False, gpu)  # loaded once for every call
    kw = dict(contexts=[128 if a.smoke else a.context], batch_sizes=[2 if a.smoke else a.batch],
              documents=a.documents.split(","), max_new_tokens=8 if a.smoke else a.new, budget=None, gamma=4,
              model=model, backend="triton" if gpu else "reference",
              dtype="bfloat16" if gpu else "float32", device="cuda" if gpu else "cpu", hf_baseline=False,
              output_dir=Path(a.out), cuda_graphs=gpu, fuse=gpu, warmup=True, repeats=1 if a.smoke else a.repeats)
    t0 = time.time()
    rows = [dict(r, setting="dense") for r in run_bench(methods=["dense"], tag="speed_dense", budget_ratio=None, **kw)]
    for i, (label, (ratio, opts)) in enumerate(settings.items()):
        rows += [dict(r, setting=label) for r in run_bench(methods=["dustin"], tag=f"speed_{i}", budget_ratio=ratio,
                                                            options=opts or None, **kw)]
        print(f"{label}: done at {time.time() - t0:.0f} s", flush=True)
    dense = {r["document"]: r for r in rows if r["setting"] == "dense"}
    traces = {}
    if a.dense_text:
        for j, doc in enumerate(kw["documents"]):
            traces[doc] = record_dense_text(model, doc, kw, Path(a.out, f"trace_{j}.json"), dense[doc]["tokens"])
            for i, (label, (ratio, opts)) in enumerate(settings.items()):
                rows += [dict(r, setting=f"{label} (dense's text)")
                         for r in run_bench(methods=["dustin"], tag=f"speed_{i}_dense_text_{j}", budget_ratio=ratio,
                                            options=opts or None, acceptance_trace={"dustin": traces[doc]["path"]},
                                            **dict(kw, documents=[doc]))]
            print(f"dense's text of {doc}: done at {time.time() - t0:.0f} s", flush=True)
    lines = [f"# Dustin's speed per verification setting — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`{' '.join(sys.argv)}`", "",
             "| document | setting | τ | tok/s, median (min–max) | × dense | free-running agreement with dense |",
             "|---|---|---|---|---|---|"]
    out = []
    for r in rows:
        d = dense[r["document"]]
        match = sequence_match(r["tokens"], d["tokens"])
        row = dict(document=r["document"], setting=r["setting"], tau=r["tau"], tokens_per_second=r["tokens_per_second"],
                   replayed=bool(r.get("replayed")),
                   speedup_vs_dense=r["tokens_per_second"] / d["tokens_per_second"],
                   tps_min_max=[r["tokens_per_second_min"], r["tokens_per_second_max"]],
                   same_tokens_as_dense=match["identical"],  # the first sequence's (rows keep one)
                   token_agreement=match["first_divergence"] / max(len(d["tokens"]), 1))  # free-running
        out.append(row)
        lo, hi = row["tps_min_max"]
        agree = "(replayed)" if row["replayed"] else f"{row['token_agreement']:.1%}"
        lines.append(f"| {row['document']} | {row['setting']} | {row['tau']:.2f} | {row['tokens_per_second']:.0f} "
                     f"({lo:.0f}–{hi:.0f}) | {row['speedup_vs_dense']:.2f}× | {agree} |")
    for doc, t in traces.items():
        lines.append(f"\nDense's text of {doc}: dense verification of Dustin's drafter, τ {t['tau']:.2f} over "
                     f"{t['rounds']} rounds, its tokens {'equal' if t['equals_dense'] else 'differ from'} dense's "
                     f"(`{t['path']}`).")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, "budget_speed.json").write_text(json.dumps(dict(rows=out, dense_text=traces), indent=1))
    Path(a.out, "budget_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def record_dense_text(model, doc: str, kw: dict, path: Path, dense_tokens: list[int]) -> dict:
    """Dustin's default drafter with dense verification on ``doc``'s window (B = 1,
    :func:`specdec.bench.dense_text_replay`): its per-round acceptance, saved to ``path`` for
    :class:`specdec.adaptive.AcceptanceReplay`; its τ and whether its tokens equal dense's."""
    from specdec.adaptive import save_trace
    from specdec.bench import _prefilled, dense_text_replay
    from specdec.data import context_windows, load_document
    from specdec.engine import cache_positions
    from specdec.presets import PipelineConfig, build_engine

    new, ctx = kw["max_new_tokens"], kw["contexts"][0]
    ids = context_windows(model.tokenizer, load_document(doc), ctx, 1, new + 16, 1000)[0]
    model.release_cache()
    model.new_cache(1, cache_positions(len(ids), new, kw["gamma"]), reuse=True)
    eng = build_engine(model, PipelineConfig.make(method="dustin", gamma=kw["gamma"], budget_ratio=0.25),
                       eos_token_id=-1)
    _, run = dense_text_replay(eng, _prefilled(eng, model, [ids], 1, random_cache=False), new)
    save_trace(path, run.stats, document=doc, note="dense verification of Dustin's default drafter")
    return dict(path=str(path), tau=run.stats.mean_accepted_length, rounds=len(run.stats.acceptance_trace),
                equals_dense=run.tokens[0] == dense_tokens)


def _settings(text: str) -> dict:
    """``--settings`` as ``{label: (budget_ratio, options)}``, or one line naming what is wrong."""
    try:
        settings = json.loads(text)
        ok = isinstance(settings, dict) and settings and all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], (int, float)) and 0 < v[0] <= 1
            and isinstance(v[1], dict) for v in settings.values())
    except json.JSONDecodeError:
        ok = False
    if not ok:
        raise SystemExit(f"--settings {text!r}: give JSON {{label: [budget ratio in (0, 1], {{dustin options}}]}}, "
                         'e.g. \'{"25%": [0.25, {}]}\'.')
    return settings


if __name__ == "__main__":
    sys.exit(main())
