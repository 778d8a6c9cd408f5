"""The target's confidence on its own greedy continuation at the end of a document, by context length: the mean top-1
probability over the tokens it writes and the share of them written with top-1 >= 0.9 (a draft is accepted where it
guesses the target's greedy token; where the target itself is unsure, the head's guess is harder).

    python benchmarks/target_confidence_cpu.py --out OUT.json --contexts 1024,4096,8000 --new 96 \\
        --file gfdl_mpl_apache=.heldout/licenses_gfdl_mpl2_apache.txt --file click=.heldout/click_core.py

Same windows as ``benchmarks/draft_tau_cpu.py`` (one window ending ``new + 16`` tokens before the document's end);
float32, one thread, the reference backend as loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="1024,4096,8000")
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--file", action="append", default=[], metavar="NAME=PATH")
    a = ap.parse_args()
    if not a.file:
        raise SystemExit("pass at least one --file NAME=PATH")
    torch.set_num_threads(1)
    from specdec import SpecdecModel
    from specdec.data import context_ids
    from specdec.engine import SpeculativeEngine

    m = SpecdecModel.from_pretrained("smollm2-135m")
    dense = SpeculativeEngine(m, method="dense", eos_token_id=-1)
    rows = []
    for spec in a.file:
        name, _, path = spec.partition("=")
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for ctx in [int(c) for c in a.contexts.split(",")]:
            ids = context_ids(m.tokenizer, text, ctx, offset=a.new + 16)
            gen = dense.generate([ids], a.new).tokens[0]
            cache = m.new_cache(1, len(ids) + len(gen) + 8)
            with torch.no_grad():  # the logits of the prompt's last row and of every written token but the last
                logits = m.forward(torch.tensor([ids + gen]), cache, torch.zeros(1, dtype=torch.long))
            top = logits[0, len(ids) - 1 : -1].float().softmax(-1).max(-1).values
            row = dict(doc=name, context=ctx, mean_top1=round(top.mean().item(), 3),
                       share_ge_09=round((top >= 0.9).float().mean().item(), 3))
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
