"""Acceptance traces over several windows of a document, for ``specdec bench --acceptance-trace``.

    python3 benchmarks/gpu/window_traces.py --model /tmp/m/smol.gguf --document DOC --methods magicdec,vegas \
        --windows 4 --stride 1000 --context 8000 --new 64 --gamma 8 --budget-ratio 0.05 --out DIR

Why: the embedded model's greedy text falls into a loop within ~100 tokens on most documents (click's ``core.py``
at 8k: ``type_value_default_default_…`` from token ~60; GFDL + MPL + Apache: ``Apache-2.0-in-all-containers-with-…``).
A trace recorded over 256 tokens of one window is mostly that loop, where any recent window drafts well (MagicDec
recorded τ 7.37 at γ 8 on the licenses, Vegas 6.97). Here each method continues ``--windows`` windows of the document,
their ends ``--stride`` tokens apart, for ``--new`` tokens each (one process, one model), and the rounds of all windows
go into one trace (``DIR/<stem>_<method>.json``: the format of ``generate --record-acceptance``, plus ``windows``,
``stride``, ``new_tokens`` and each window's τ). The replay cycles through the rounds in that order.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from specdec.cli import speed_options
    from specdec.prompts import encode_text
    from specdec.loading import load_model, pipeline_config
    from specdec.presets import build_engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--document", required=True)
    ap.add_argument("--methods", default="magicdec,vegas")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--stride", type=int, default=1000)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--budget-ratio", type=float, default=0.05)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    so = speed_options(a.device, None, None, None, False, None)
    m = load_model(a.model, so.dtype, a.device, so.backend, so.cuda_graphs, so.compile, so.fuse)
    ids = encode_text(m.tokenizer, Path(a.document).read_text(encoding="utf-8"), False)
    need = a.context + (a.windows - 1) * a.stride
    if len(ids) < need:
        raise SystemExit(f"{a.document}: {len(ids)} tokens, {a.windows} windows of {a.context} tokens {a.stride} apart "
                         f"need {need}")
    wins = [ids[: len(ids) - k * a.stride][-a.context:] for k in range(a.windows)]
    a.out.mkdir(parents=True, exist_ok=True)
    for method in [x.strip() for x in a.methods.split(",") if x.strip()]:
        cfg = pipeline_config(method, a.gamma, None, a.budget_ratio, 0.0, 1.0, 0, None)
        cfg = cfg.model_copy(update={"adaptive": False})  # replayed at fixed γ: every recorded round drafted γ
        eng = build_engine(m, cfg)
        eng.record_acceptance = True
        rounds, taus, texts = [], [], []
        for w in wins:
            res = eng.generate([w], max_new_tokens=a.new)
            rounds += res.stats.acceptance_trace
            taus.append(res.stats.mean_accepted_length)
            texts.append(res.text[0][:200])
        n = sum(len(r) for r in rounds)
        tau = 1.0 + sum(sum(x for x in r if x >= 0) for r in rounds) / max(1, n)
        path = a.out / f"{Path(a.document).stem}_{method}.json"
        path.write_text(json.dumps(dict(model=a.model, method=method, gamma=a.gamma, budget=None,
                                        budget_ratio=a.budget_ratio, context_tokens=a.context, adaptive=False,
                                        windows=a.windows, stride=a.stride, new_tokens=a.new, tau=tau,
                                        window_tau=taus, window_text_starts=texts, rounds=rounds), indent=1))
        print(f"{method}: τ per window {[round(t, 2) for t in taus]}, all rounds {tau:.2f} ({len(rounds)} rounds) "
              f"-> {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
