"""τ of the shipped trained drafts (EAGLE head; layer skipping + adapter) with DENSE verification, per held-out document.

    python benchmarks/draft_tau_cpu.py --out benchmarks/results/cpu_draft_tau_DATE [--contexts 512,2048 --new 96
        --gamma 4 --drafters eagle,skip --tree --tree-lookup 4 --no-adaptive]

Documents (never trained on, see specdec.train_draft): the held-out pydoc topics (prose) and the held-out
standard-library modules (code). Dense verification makes the run lossless: tokens equal dense greedy
(checked on every document here as well).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="1024", help="comma-separated context lengths")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--drafters", default="eagle", help="comma-separated: eagle, skip (the shipped ones); "
                    "KIND+lookup: prompt lookup (specdec.lookup) first, that draft where the context has no match")
    ap.add_argument("--lookup", default="2,4,2", help="prompt lookup MIN,MAX,TRUST n-gram lengths (specdec.lookup; "
                    "default 2,4,2, as the results recorded so far; Dustin uses 2,4,4 behind an EAGLE head), "
                    "optionally ,POLICY[,VETO[,PERIODIC[,CANDIDATES]]] (replace | chain; a veto in (0, 1] or - for none; 1 | 0: "
                    "a continuation running into the end goes on periodically or stops; candidates per sequence; 1 | 0: the head's probability ranks them); several settings separated "
                    "by ';' give one KIND+lookup(...) row each")
    ap.add_argument("--draft", default=None, help="an artifact instead of the shipped one of its kind")
    ap.add_argument("--documents", default=None, help="comma-separated held-out document names (default: all)")
    ap.add_argument("--file", action="append", default=[], metavar="NAME=KIND:PATH",
                    help="also (or, with --documents none, only) this text file as a document; KIND is prose or code "
                         "(for text from outside the training set: licenses, third-party package sources)")
    ap.add_argument("--early-exit", type=int, default=0, help="also run the untrained early exit at this depth")
    ap.add_argument("--eagle", action="append", default=[], metavar="LABEL=PATH",
                    help="another EAGLE head to compare (rows LABEL and, with an eagle+lookup drafter, LABEL+lookup; "
                         "the dense reference is shared)")
    ap.add_argument("--windows", type=int, default=1,
                    help="windows per document, their ends spread evenly over it (1: the window ending near its end)")
    ap.add_argument("--tree", action="store_true", help="also an eagle+tree row: the shipped head drafting the default "
                    "draft tree (specdec.tree.DEFAULT_PATHS, 16 nodes, depth 4; γ is then the tree's depth)")
    ap.add_argument("--tree-lookup", type=int, default=0, metavar="K",
                    help="also an eagle+lookup+tree row: the default tree plus a lookup branch of K nodes that prompt "
                    "lookup fills (specdec.lookup.LookupDrafter.draft_tree; the first --lookup's MIN,MAX)")
    ap.add_argument("--no-adaptive", action="store_true", help="fixed γ for every row (a tree's γ is always fixed)")
    a = ap.parse_args()
    if a.windows < 1:
        raise SystemExit(f"--windows must be at least 1 (got {a.windows})")
    more_heads = []
    for spec in a.eagle:
        label, _, path = spec.partition("=")
        if not label or not Path(path).is_file():
            raise SystemExit(f"--eagle {spec!r}: expected LABEL=PATH with an existing head file")
        more_heads.append((label, path))
    files = []  # checked before the model loads
    for spec in a.file:
        name, _, rest = spec.partition("=")
        kind, _, path = rest.partition(":")
        if not name or kind not in ("prose", "code") or not Path(path).is_file():
            print(f"--file {spec!r}: expected NAME=prose:PATH or NAME=code:PATH with an existing file", file=sys.stderr)
            raise SystemExit(2)
        files.append((name, Path(path).read_text(encoding="utf-8", errors="replace"), kind))
    torch.set_num_threads(1)
    from specdec import SpecdecModel
    from specdec.data import context_ids
    from specdec.drafters import EarlyExitDrafter
    from specdec.eagle import EagleDrafter, is_eagle
    from specdec.engine import SpeculativeEngine
    from specdec.sampling import SamplingConfig
    from specdec.skip_drafter import SkipLayerDrafter
    from specdec.train_draft import held_out_texts, shipped_draft
    from specdec.tree import DraftTree
    from specdec.verifiers import FullVerifier

    m = SpecdecModel.from_pretrained("smollm2-135m")
    paths = {}
    from specdec.lookup import LookupDrafter

    def lookup_setting(spec: str) -> tuple:
        f = spec.split(",")
        if len(f) < 3 or len(f) > 8:
            raise SystemExit(f"--lookup {spec!r}: expected MIN,MAX,TRUST[,POLICY[,VETO[,PERIODIC[,CANDIDATES[,BYHEAD]]]]]")
        veto = None if len(f) < 5 or f[4] == "-" else float(f[4])
        return (int(f[0]), int(f[1]), int(f[2]), f[3] if len(f) > 3 else "replace", veto,
                bool(int(f[5])) if len(f) > 5 else True, int(f[6]) if len(f) > 6 else 1,
                bool(int(f[7])) if len(f) > 7 else False)

    looks = [lookup_setting(c) for c in a.lookup.split(";")]
    for kind in {k.split("+")[0]: 0 for k in a.drafters.split(",")}:
        p = a.draft if (a.draft and (kind == "eagle") == is_eagle(a.draft)) else shipped_draft(m, kind)
        if p is None:
            raise SystemExit(f"no {kind} draft ships for this model; pass --draft PATH")
        paths[kind] = p
    # built before the prefill: an EAGLE drafter makes the target record the prompt's hidden states
    base = {k: (EagleDrafter(m, p) if k == "eagle" else SkipLayerDrafter(m, p)) for k, p in paths.items()}
    heads = [(k, k, d) for k, d in base.items()] + [(label, "eagle", EagleDrafter(m, p)) for label, p in more_heads]
    drafters = {}
    for name, kind, head in heads:  # (row label, draft kind, drafter)
        for k in a.drafters.split(","):
            if k == kind:
                drafters[name] = head
            elif k == kind + "+lookup":
                for lk in looks:
                    extra = "" if lk[3:] == ("replace", None, True, 1, False) else (
                        f",{lk[3]},v{lk[4]},p{int(lk[5])},k{lk[6]}" + (",h" if lk[7] else ""))
                    label = f"{name}+lookup" + ("" if len(looks) == 1 else f"({lk[0]}-{lk[1]},t{lk[2]}{extra})")
                    drafters[label] = LookupDrafter(head, *lk[:3], policy=lk[3], veto=lk[4], periodic=lk[5],
                                                    candidates=lk[6], by_head=lk[7])
    if a.early_exit:
        drafters[f"early-exit-{a.early_exit}"] = EarlyExitDrafter(m, a.early_exit)
    trees = {}
    if a.tree:
        if "eagle" not in base:
            raise SystemExit("--tree needs the eagle drafter in --drafters")
        drafters["eagle+tree"], trees["eagle+tree"] = base["eagle"], DraftTree.default()
    if a.tree_lookup:
        if "eagle" not in base:
            raise SystemExit("--tree-lookup needs the eagle drafter in --drafters")
        label = "eagle+lookup+tree"
        drafters[label] = LookupDrafter(base["eagle"], *looks[0][:2], periodic=looks[0][5])
        trees[label] = DraftTree.default(lookup=a.tree_lookup)
    dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)
    rows = []
    docs = [(n, t, "prose" if n.startswith("pydoc") else "code") for n, t in held_out_texts()
            if a.documents is None or n in a.documents.split(",")]
    docs += files
    windows = []
    for context, (name, text, kind) in [(int(c), doc) for c in a.contexts.split(",") for doc in docs]:
        n = len(m.tokenizer(text, add_special_tokens=False).input_ids)
        room = max(0, n - context - a.new - 16)
        for w in range(a.windows):  # window 0 ends a.new + 16 tokens before the end, as with one window
            windows.append((context, name, text, kind, w, a.new + 16 + room * w // a.windows))
    for context, name, text, kind, w, offset in windows:
        ids = context_ids(m.tokenizer, text, context, offset=offset)
        pre = dense.prefill([ids])
        ref = dense.generate([ids], a.new, prefilled=pre)
        for label, d in drafters.items():
            eng = SpeculativeEngine(m, d, FullVerifier(m), gamma=a.gamma, sampling=SamplingConfig(), method=label,
                                    eos_token_id=-1, tree=trees.get(label), adaptive=False if a.no_adaptive else None)
            t0 = time.perf_counter()
            res = eng.generate([ids], a.new, prefilled=pre)
            row = dict(document=name, context=context, kind=kind, drafter=label, window=w, offset=offset,
                       tau=res.stats.mean_accepted_length, acceptance_per_position=res.stats.acceptance_per_position,
                       equals_dense=res.tokens[0] == ref.tokens[0], seconds=time.perf_counter() - t0)
            if isinstance(d, LookupDrafter):
                row["lookup_matched_share"] = d.stats(reset=True)["matched_share"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), contexts=a.contexts,
                new_tokens=a.new, gamma=a.gamma, lookup=looks, files=a.file, windows=a.windows,
                tree=[list(p) for p in DraftTree.default().paths] if trees else None, tree_lookup=a.tree_lookup,
                adaptive=not a.no_adaptive,
                drafts={**{k: str(p) for k, p in paths.items()}, **dict(more_heads)},
                machine="2-core shared CPU, float32, 1 thread")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [f"# Trained draft, dense verification — {meta['date']}", "",
             f"contexts {a.contexts}, {a.new} new tokens, γ = {a.gamma}, greedy; {meta['machine']}", "",
             "| document | context | window | kind | drafter | τ | acceptance per draft position | equals dense |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        acc = " / ".join(f"{x:.2f}" for x in r["acceptance_per_position"])
        lines.append(f"| {r['document']} | {r['context']} | {r['window']} | {r['kind']} | {r['drafter']} | {r['tau']:.2f} | {acc} "
                     f"| {r['equals_dense']} |")
    for label in sorted({r["drafter"] for r in rows}):
        for context in sorted({r["context"] for r in rows}):
            for kind in ("prose", "code"):
                ts = [r["tau"] for r in rows if r["drafter"] == label and r["kind"] == kind and r["context"] == context]
                if ts:
                    lines.append(f"\nmean τ {label} {kind} at {context}: {sum(ts) / len(ts):.2f} "
                                 f"(min {min(ts):.2f}) over {len(ts)} window(s)")
            ts = [r["tau"] for r in rows if r["drafter"] == label and r["context"] == context]
            if ts:
                lines.append(f"\nmean τ {label} all at {context}: {sum(ts) / len(ts):.3f} over {len(ts)} window(s)")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
