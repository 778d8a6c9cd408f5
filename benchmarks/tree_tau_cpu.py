"""How much τ would a draft *tree* give the shipped EAGLE head, against today's chain? (CPU, teacher-forced on the
target's own greedy text.)

    python benchmarks/tree_tau_cpu.py --out benchmarks/results/cpu_tree_tau_DATE [--context 1024 --new 64]

Per window: the target greedily continues a ``--context``-token prefix of a document by ``--new`` tokens; over the
prefix + continuation the target's features are recorded (:func:`specdec.train_eagle.features`) and the head is run
with the exact unrolling drafting sees (:func:`specdec.train_eagle.head_forward`, ``--depth`` steps). For a draft
chain that would start at row ``s`` (the last verified position), step ``k`` predicts the token at ``s + k + 1``;
the script keeps the **rank** of the target's true token in that step's logits: the *rank path* ``(r_1 .. r_depth)``.

Along the target's own text the head's input at step ``k`` is exactly what a tree node on the true path sees (the
true token was drafted there, so every accepted node is fed what teacher forcing feeds). A prefix-closed tree of rank
paths (the root's top-``r_1`` children, each one's top-``r_2`` children, ...) accepts the longest prefix of the true
rank path it contains; a chain is the tree ``(0), (0, 0), ...``. The walk: a verification at row ``s`` emits
``1 + accepted`` tokens and the next starts there, as the engine does; τ = tokens / verifications.

Trees of ``N`` nodes are the ``N`` most frequent rank-path prefixes (a static tree, as SpecInfer / Sequoia choose
theirs) counted on **training** text (non-held-out ``pydoc`` topics and standard-library modules), then applied to
the held-out documents (``held_out_texts`` and any ``--file``). Nothing here runs a tree in the engine: the numbers
say what a tree verification would buy, not what it costs.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import time
from pathlib import Path

import torch


def rank_paths(m, head, ids: torch.Tensor, start: int, depth: int) -> list[tuple[int, ...]]:
    """Rank paths of chains starting at rows ``start-1 .. T-depth-2`` of ``ids (1, T)`` (the continuation)."""
    from specdec.train_eagle import features, head_forward

    f, _, _ = features(m.hf, ids, 4, half=False, layers=head.feature_layers or None)
    preds = head_forward(m.hf, head, ids, f, depth, exact=True)  # step k: (1, T-1, d), row i predicts ids[i + 2]
    T = ids.shape[1]
    ranks = []
    for k, p in enumerate(preds):
        logits = m.hf.lm_head(p[0]).float()  # (T-1, V)
        true = ids[0, 2:]  # row i -> ids[i + 2], rows 0 .. T-3
        tv = logits[: T - 2].gather(1, true.view(-1, 1))
        ranks.append((logits[: T - 2] > tv).sum(1).clamp(max=99))  # (T-2,) rank of the true token
    out = []
    for s in range(start - 1, T - depth - 1):  # chain from row s: step k (1-based) at row s + k - 1
        out.append(tuple(int(ranks[k][s + k]) for k in range(depth)))
    return out


def accepted(path: tuple[int, ...], tree: set) -> int:
    a = 0
    while a < len(path) and path[: a + 1] in tree:
        a += 1
    return a


def walk_tau(paths: list[tuple[int, ...]], tree: set) -> tuple[float, int]:
    """τ of verifications walking the continuation: at row ``s`` accept ``a``, emit ``a + 1``, next at ``s + a + 1``."""
    s, tokens, its = 0, 0, 0
    while s < len(paths):
        a = accepted(paths[s], tree)
        tokens += a + 1
        its += 1
        s += a + 1
    return tokens / max(its, 1), its


def best_tree(paths: list[tuple[int, ...]], n: int) -> set:
    count = collections.Counter(p[: k + 1] for p in paths for k in range(len(p)))
    ranked = sorted(count.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
    return {p for p, _ in ranked[:n]}


def windows(tok, text: str, context: int, new: int, n: int) -> list[torch.Tensor]:
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    L = ids.shape[1]
    if L < context + 1:
        return []
    ends = [context + (L - context) * (i + 1) // (n + 1) for i in range(n)] if n > 1 else [L]
    return [ids[:, e - context : e] for e in ends]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--windows", type=int, default=2, help="windows per held-out document")
    ap.add_argument("--train-docs", type=int, default=6, help="training documents per kind for the tree statistics")
    ap.add_argument("--sizes", default="4,8,16,32,64", help="tree sizes (nodes besides the root) to report")
    ap.add_argument("--file", action="append", default=[], metavar="NAME=KIND:PATH")
    a = ap.parse_args()
    torch.set_num_threads(2)
    from specdec import SpecdecModel
    from specdec.eagle import build_head
    from specdec.tree import DraftTree
    from specdec.train_draft import held_out_texts, held_out_topics, shipped_draft, training_texts
    from specdec.train_eagle import is_prose

    m = SpecdecModel.from_pretrained("smollm2-135m", dtype=torch.float32)
    _, head = build_head(m, shipped_draft(m, "eagle"))
    tok = m.tokenizer

    def run(name, kind, text, n):
        got = []
        for w in windows(tok, text, a.context, a.new, n):
            with torch.no_grad():
                gen = m.hf.generate(w, attention_mask=torch.ones_like(w), max_new_tokens=a.new, do_sample=False,
                                    pad_token_id=tok.eos_token_id)
                got += rank_paths(m, head, gen, w.shape[1], a.depth)
        print(f"{name} ({kind}): {len(got)} chain starts", flush=True)
        return got

    t0 = time.time()
    train = {"prose": [], "code": []}
    from pydoc_data.topics import topics

    kept = [k for k in sorted(topics) if k not in set(held_out_topics(topics))]
    per = len(kept) // a.train_docs  # the training topics joined into --train-docs long documents
    prose = [(f"pydoc-train-{i + 1}", "\n\n".join(topics[k] for k in kept[i * per : (i + 1) * per]))
             for i in range(a.train_docs)]
    code = [t for t in training_texts(10**8) if not is_prose(t[0]) and len(t[1]) > 6 * a.context][: a.train_docs]
    for kind, docs in (("prose", prose), ("code", code)):
        for name, text in docs:
            train[kind] += run(name, kind, text, 1)
    held = [(n, "prose" if n.startswith("pydoc") else "code", t) for n, t in held_out_texts()]
    for spec in a.file:
        name, _, rest = spec.partition("=")
        kind, _, path = rest.partition(":")
        held.append((name, kind, Path(path).read_text(encoding="utf-8", errors="replace")))
    evals = [(n, k, run(n, k, t, a.windows)) for n, k, t in held]
    sizes = [int(x) for x in a.sizes.split(",")]
    trees = {"chain": set(DraftTree.chain(a.depth).paths)}
    for kind in ("prose", "code", "both"):
        src = train["prose"] + train["code"] if kind == "both" else train[kind]
        for n in sizes:
            trees[f"{kind}-{n}"] = best_tree(src, n)
    rows = []
    for n, k, paths in evals:
        row = {"doc": n, "kind": k, "starts": len(paths)}
        for label, tree in trees.items():
            row[label] = round(walk_tau(paths, tree)[0], 3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "context": a.context, "new": a.new,
           "depth": a.depth, "windows": a.windows, "train_docs": [n for n, _ in prose + code],
           "trees": {k: sorted(v) for k, v in trees.items()}, "rows": rows, "seconds": round(time.time() - t0, 1)}
    Path(a.out + ".json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
