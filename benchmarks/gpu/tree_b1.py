"""Draft trees on the H200 at small batch: tokens/s of dense decoding, the EAGLE chain, the tree and the tree with a
lookup branch, all with dense (lossless) verification, side by side in one run (not yet measured on a GPU).

    python3 benchmarks/gpu/tree_b1.py --gguf /tmp/m/smol.gguf --out $OUT \\
        --file GPL3=.heldout/GPL-3.txt --file click=.heldout/click_core.py --contexts 1024,4096 --batch 1
    python3 benchmarks/gpu/tree_b1.py --smoke --out /tmp/smoke     # CPU, embedded model, tiny shapes

Engines (one model, ``--backend``, CUDA graphs and fused projections as loaded; a tree round runs eagerly — no graph
captures a tree yet — with the Triton kernel's tree mask where the rows fit one tile):

- ``dense``: plain greedy decoding;
- ``chain``: the shipped EAGLE head, γ = 4 fixed, ``FullVerifier`` (graphs for the draft and the verify);
- ``tree``: the same head drafting ``DraftTree.default()`` (16 nodes, depth 4);
- ``lookup+tree``: ``LookupDrafter`` over the head, the default tree plus a 4-node lookup branch.

Per document and context: each engine warmed up at the shape (two untimed calls), then ``--repeats`` rounds in which
every engine runs once in turn (dense, chain, tree, lookup+tree, dense, ...), so a drift of the machine falls on all.
Reported: median tokens/s (min–max), the ratio of medians to dense, τ, whether the tokens equal dense's, and the
median run's phase seconds (draft / verify / sample). Results: ``<out>/tree_b1.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENGINES = ("dense", "chain", "tree", "lookup+tree")


def build(m, head):
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.lookup import LookupDrafter
    from specdec.tree import DraftTree
    from specdec.verifiers import FullVerifier

    chain = EagleDrafter(m, head)  # each engine its own drafter: the head's buffers (and graphs) stay apart
    tree = EagleDrafter(m, head)
    look = LookupDrafter(EagleDrafter(m, head), 2, 4)
    return {
        "dense": SpeculativeEngine(m, method="dense", eos_token_id=-1),
        "chain": SpeculativeEngine(m, chain, FullVerifier(m), gamma=4, method="chain", eos_token_id=-1,
                                   adaptive=False),
        "tree": SpeculativeEngine(m, tree, FullVerifier(m), method="tree", eos_token_id=-1, tree=DraftTree.default()),
        "lookup+tree": SpeculativeEngine(m, look, FullVerifier(m), method="lookup+tree", eos_token_id=-1,
                                         tree=DraftTree.default(lookup=4)),
    }


def one_setting(m, engines, ids, batch, new, repeats):
    from specdec.engine import Prefilled

    one = engines["dense"].prefill([ids])
    pre = Prefilled(ids=[ids] * batch, k=one.k.expand(-1, batch, -1, -1, -1), v=one.v.expand(-1, batch, -1, -1, -1),
                    last_logits=one.last_logits.expand(batch, -1),
                    hidden=None if one.hidden is None else one.hidden.expand(batch, -1, -1))
    prompts = [ids] * batch
    for eng in engines.values():  # warm-up at this shape: graph captures, allocator, first-call costs
        for _ in range(2):
            eng.generate(prompts, new, prefilled=pre)
    runs = {k: [] for k in engines}
    for _ in range(repeats):
        for k, eng in engines.items():
            runs[k].append(eng.generate(prompts, new, prefilled=pre))
    dense_tokens = runs["dense"][0].tokens
    out = {}
    for k, rs in runs.items():
        tps = [r.stats.tokens_per_second for r in rs]
        med = sorted(rs, key=lambda r: r.stats.tokens_per_second)[(len(rs) - 1) // 2]
        out[k] = dict(tokens_per_second=statistics.median(tps), tps_min=min(tps), tps_max=max(tps),
                      tau=med.stats.mean_accepted_length, iterations=med.stats.iterations,
                      phase_seconds={p: round(s, 5) for p, s in med.stats.phase_seconds.items()},
                      equals_dense=all(r.tokens == dense_tokens for r in rs))
    for k in out:
        out[k]["x_dense"] = out[k]["tokens_per_second"] / out["dense"]["tokens_per_second"]
    return out


def markdown(res) -> str:
    meta = res["meta"]
    lines = [f"# Draft trees at small batch — {meta['date']}", "", f"`{meta['argv']}`", "",
             f"Machine: {', '.join(f'{k} {v}' for k, v in meta['machine'].items())}. B = {meta['batch']}, {meta['new']} new tokens, greedy, dense verification; "
             f"medians of {meta['repeats']} interleaved runs after two warm-up calls per engine.", "",
             "| document | context | engine | tok/s median (min–max) | × dense | τ | draft / verify / sample s | equals dense |",
             "|---|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        for k in ENGINES:
            r = row["engines"][k]
            ph = r["phase_seconds"]
            lines.append(f"| {row['document']} | {row['context']} | {k} | {r['tokens_per_second']:.1f} "
                         f"({r['tps_min']:.1f}–{r['tps_max']:.1f}) | {r['x_dense']:.2f}× | {r['tau']:.2f} "
                         f"| {ph.get('draft', 0):.3f} / {ph.get('verify', 0):.3f} / {ph.get('sample', 0):.3f} "
                         f"| {r['equals_dense']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", action="append", default=[], metavar="NAME=PATH", help="a document (repeatable)")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--no-fuse", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="CPU: embedded model, torch backend, context 96, 8 tokens")
    a = ap.parse_args()
    from specdec.bench import machine_info
    from specdec.data import context_ids, load_document
    from specdec.loading import load_model
    from specdec.train_draft import shipped_draft

    if a.smoke:
        torch.set_num_threads(1)
        m = load_model("smollm2-135m", "float32", "cpu", "torch")
        a.contexts, a.new, a.repeats = "96", 8, 2
        docs = [("pydoc", load_document("pydoc"))]
    else:
        m = load_model(a.gguf, a.dtype, "cuda", a.backend, cuda_graphs=not a.no_graphs, fuse=not a.no_fuse)
        docs = []
    for spec in a.file:
        name, _, path = spec.partition("=")
        docs.append((name, Path(path).read_text(encoding="utf-8", errors="replace")))
    if not docs:
        raise SystemExit("no documents: pass --file NAME=PATH (held-out texts, not in the repository)")
    engines = build(m, shipped_draft(m, "eagle"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), argv=" ".join(sys.argv),
                         machine=machine_info(str(m.device)), batch=a.batch, new=a.new, repeats=a.repeats,
                         backend=a.backend, dtype=str(m.dtype)), rows=[])
    t0 = time.perf_counter()
    for context in [int(c) for c in a.contexts.split(",")]:
        for name, text in docs:
            ids = context_ids(m.tokenizer, text, context, offset=a.new + 16)
            row = dict(document=name, context=context,
                       engines=one_setting(m, engines, ids, a.batch, a.new, a.repeats), seconds=time.perf_counter() - t0)
            res["rows"].append(row)
            print(json.dumps(dict(document=name, context=context, **{k: (round(v["tokens_per_second"], 1), round(
                v["tau"], 2), v["equals_dense"]) for k, v in row["engines"].items()})), flush=True)
            (out / "tree_b1.json").write_text(json.dumps(res, indent=1))
            (out / "tree_b1.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
