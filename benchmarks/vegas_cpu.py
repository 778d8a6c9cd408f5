"""CPU benchmark of Vegas against MagicDec-Stream and MagicDec-Quest on real documents.

For each document and context length: one prefill shared by every method, a dense greedy run
(reference tokens and tokens/s), then every method × budget with the same γ. Also measures the
paper's observations on the dense continuation (top-k overlap vs distance, recall of the next γ
rows' attention by last / collect2 / all selections). Results are rewritten after every run, so a
partial run still leaves a usable JSON.

Example (the commands are recorded in benchmarks/results/cpu_vegas_*.md):

    nice -n 5 python benchmarks/vegas_cpu.py --out benchmarks/results/cpu_vegas_2026-11-29.raw
    python benchmarks/vegas_report.py benchmarks/results/cpu_vegas_2026-11-29.raw.json \
        benchmarks/results/cpu_vegas_2026-11-29
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from specdec.bench import machine_info
from specdec.data import context_ids, load_document
from specdec.models import SpecdecModel
from specdec.observations import overlap_vs_distance, recall_of_future_rows, row_scores
from specdec.presets import PipelineConfig, build_engine

#: label → (method, options)
VARIANTS = {
    "magicdec": ("magicdec", {}),
    "quest": ("quest", {}),
    "vegas": ("vegas", {}),
    "vegas-all": ("vegas-all", {}),
    "vegas-last": ("vegas-last", {}),
    "vegas-logits": ("vegas", {"score_kind": "logits"}),
    "vegas-sink": ("vegas", {"score_kind": "sink_softmax"}),
    "vegas-every2": ("vegas", {"score_every": 2}),
    "vegas-sink-every2": ("vegas", {"score_kind": "sink_softmax", "score_every": 2}),
    "vegas-all-logits": ("vegas-all", {"score_kind": "logits"}),
    "vegas-headwise": ("vegas", {"per_kv_head": True}),
}


class _Recorder:
    """Wraps a drafter to record, per sequence, accepted drafts and iterations (τ per document).

    An iteration counts when the sequence is active before and after it (the last iteration of a
    sequence, cut by ``max_new_tokens``, is left out: its length does not advance).
    """

    def __init__(self, inner) -> None:
        self.inner, self.acc, self.trials = inner, None, None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def draft(self, state, gamma):
        self._before = (state.active.clone(), state.lengths.clone())
        if self.acc is None:
            self.acc = torch.zeros_like(state.lengths)
            self.trials = torch.zeros_like(state.lengths)
        return self.inner.draft(state, gamma)

    def on_verify(self, state, scores):
        act, old = self._before
        ok = act & state.active
        self.acc += torch.where(ok, state.lengths - old - 1, torch.zeros_like(old))
        self.trials += ok.long()
        return self.inner.on_verify(state, scores)

    def tau(self) -> list[float]:
        return (1 + self.acc.double() / self.trials.clamp(min=1).double()).tolist()


def load_prefill(engine, ids, path: Path):
    """The prefill of ``ids``, cached on disk (a 4k-token prefill takes minutes on a busy CPU)."""
    from specdec.engine import Prefilled

    if path.is_file():
        d = torch.load(path)
        if d["ids"] == ids:
            return Prefilled(**d)
    pre = engine.prefill(ids)
    torch.save(dict(ids=pre.ids, k=pre.k, v=pre.v, last_logits=pre.last_logits), path)
    return pre


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", default="pydoc,stdlib:argparse,stdlib:inspect,stdlib:tarfile")
    ap.add_argument("--contexts", default="4096")
    ap.add_argument("--budget-ratios", default="0.05,0.1")
    ap.add_argument("--variants", default="magicdec,vegas,vegas-all,vegas-last,quest")
    ap.add_argument("--extra", default="0.05:vegas-logits", help="ratio:variant pairs run after the main grid ('' = none)")
    ap.add_argument("--no-dense", action="store_true", help="skip the dense reference run")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 = lossless rejection sampling")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (same for every method)")
    ap.add_argument("--gamma", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-budget", type=int, default=0)
    ap.add_argument("--observe-rows", type=int, default=48, help="rows of the continuation for the observations")
    ap.add_argument("--offset", type=int, default=None, help="context ends this many tokens before the document's end")
    ap.add_argument("--prefill-cache", default="/tmp/specdec_vegas_prefill")
    ap.add_argument("--out", default="benchmarks/results/cpu_vegas")
    a = ap.parse_args()

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    m = SpecdecModel.from_pretrained("smollm2-135m", dtype="float32", device="cpu")
    docs = a.documents.split(",")
    meta = dict(command="python " + " ".join(shlex.quote(x) for x in sys.argv), machine=machine_info("cpu"),
                model="smollm2-135m", dtype="float32", backend="reference", gamma=a.gamma, documents=docs,
                max_new_tokens=a.max_new_tokens, min_budget=a.min_budget, sinks=4, recent=16,
                note="all documents decode together as one batch (B = len(documents)); per-document τ = "
                     "1 + accepted drafts / iterations of that sequence (its last, truncated iteration left out)")
    rows, obs = [], []

    def save() -> None:
        out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows, observations=obs), indent=1))

    from specdec.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=a.temperature, seed=a.seed)
    meta["temperature"], meta["seed"] = a.temperature, a.seed
    grid = [(float(r), v) for r in a.budget_ratios.split(",") for v in a.variants.split(",")]
    grid += [(float(x.split(":")[0]), x.split(":")[1]) for x in a.extra.split(",") if x]
    for ctx in [int(x) for x in a.contexts.split(",")]:
        offset = a.offset if a.offset is not None else a.max_new_tokens + 64
        ids = [context_ids(m.tokenizer, load_document(d), ctx, offset=offset) for d in docs]
        dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1)
        t0 = time.perf_counter()
        pre = load_prefill(dense, ids, Path(f"{a.prefill_cache}_{ctx}_{len(docs)}.pt"))
        print(f"[ctx={ctx}] prefill {time.perf_counter() - t0:.1f}s", flush=True)
        ref_tokens = None
        for ratio, label in grid + ([] if a.no_dense else [(None, "dense")]):
            if label == "dense":
                eng = dense
            else:
                method, options = VARIANTS[label]
                cfg = PipelineConfig.make(method=method, gamma=a.gamma, budget_ratio=ratio,
                                          min_budget=a.min_budget, options=options, sampling=sampling)
                eng = build_engine(m, cfg, eos_token_id=-1)
                eng.drafter = _Recorder(eng.drafter)
            res = eng.generate(ids, max_new_tokens=a.max_new_tokens, prefilled=pre)
            st = res.stats
            if ref_tokens is None:
                ref_tokens = res.tokens
            taus = eng.drafter.tau() if label != "dense" else [1.0] * len(docs)
            per_doc = dict(zip(docs, taus))
            rows.append(dict(context=ctx, budget_ratio=ratio, method=label, tau=st.mean_accepted_length,
                             tau_per_document=per_doc, tokens_per_second=st.tokens_per_second,
                             iterations=st.iterations, acceptance_per_position=st.acceptance_per_position,
                             selection_overhead_share=st.selection_overhead_share if label != "dense" else 0.0,
                             phase_seconds=st.phase_seconds, decode_seconds=st.decode_seconds,
                             same_tokens=res.tokens == ref_tokens, tokens=res.tokens))
            print(f"  {ratio} {label:18s} tau={st.mean_accepted_length:.3f} "
                  + " ".join(f"{v:.2f}" for v in per_doc.values())
                  + f" {st.tokens_per_second:.2f} tok/s sel={rows[-1]['selection_overhead_share']:.1%} "
                  f"same={rows[-1]['same_tokens']} [{time.strftime('%H:%M:%S')}]", flush=True)
            save()
            if len(obs) == 0 and a.observe_rows > 0:  # the paper's observations on the (shared) greedy continuation
                for b, d in enumerate(docs):
                    one = type(pre)(ids=[ids[b]], k=pre.k[:, b : b + 1], v=pre.v[:, b : b + 1],
                                    last_logits=pre.last_logits[b : b + 1])
                    s = row_scores(m, one, res.tokens[b][: a.observe_rows], kind="softmax")
                    for r in sorted({x for x, _ in grid}):
                        k = max(1, int(ctx * r))
                        obs.append(dict(document=d, context=ctx, budget_ratio=r, k=k,
                                        overlap=overlap_vs_distance(s, k, 16),
                                        recall=recall_of_future_rows(s, k, a.gamma)))
                    del s
                print(f"  observations done [{time.strftime('%H:%M:%S')}]", flush=True)
                save()
    save()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
