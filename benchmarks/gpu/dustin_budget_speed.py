"""Dustin's speed against dense decoding per verification setting, in one run (``specdec.bench.run_bench``).

    python3 benchmarks/gpu/dustin_budget_speed.py --gguf /tmp/m/smol.gguf --out DIR \\
        --documents a.txt,b.py --settings '{"5%": [0.05, {}], "25%": [0.25, {}], "25% per-layer": [0.25, {"layer_share": 0.5}]}'

Every setting runs on the same documents, batch and context (default 8k, B = 64, 96 new tokens, γ 4, bf16, Triton,
CUDA graphs, fused projections, warm-up + median of 3); dense first. Writes ``DIR/budget_speed.{json,md}``.
``--smoke``: the embedded model on the CPU, context 128, B = 2, 8 tokens.
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
    lines = [f"# Dustin's speed per verification setting — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`{' '.join(sys.argv)}`", "",
             "| document | setting | τ | tok/s, median (min–max) | × dense | free-running agreement with dense |",
             "|---|---|---|---|---|---|"]
    out = []
    for r in rows:
        d = dense[r["document"]]
        match = sequence_match(r["tokens"], d["tokens"])
        row = dict(document=r["document"], setting=r["setting"], tau=r["tau"], tokens_per_second=r["tokens_per_second"],
                   speedup_vs_dense=r["tokens_per_second"] / d["tokens_per_second"],
                   tps_min_max=[r["tokens_per_second_min"], r["tokens_per_second_max"]],
                   same_tokens_as_dense=match["identical"],  # the first sequence's (rows keep one)
                   token_agreement=match["first_divergence"] / max(len(d["tokens"]), 1))  # free-running
        out.append(row)
        lo, hi = row["tps_min_max"]
        lines.append(f"| {row['document']} | {row['setting']} | {row['tau']:.2f} | {row['tokens_per_second']:.0f} "
                     f"({lo:.0f}–{hi:.0f}) | {row['speedup_vs_dense']:.2f}× | {row['token_agreement']:.1%} |")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, "budget_speed.json").write_text(json.dumps(out, indent=1))
    Path(a.out, "budget_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


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
