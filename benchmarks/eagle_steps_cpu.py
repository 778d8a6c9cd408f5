"""Held-out top-1 agreement of the shipped EAGLE head per draft step, under the exact unrolling (what drafting
sees, recipe v2's training forward) and v1's approximation, split by position (< 256 vs 256..1023).

    python benchmarks/eagle_steps_cpu.py [HEAD.safetensors] > benchmarks/results/cpu_eagle_steps_DATE.jsonl

Three held-out documents (pydoc-held-out-1, stdlib:argparse, stdlib:tarfile), one 1024-token chunk each, float32.
"""
import sys

import torch, json
torch.set_num_threads(1)
from specdec import SpecdecModel
from specdec.eagle import build_head
from specdec.train_draft import held_out_texts, shipped_draft, _chunks
from specdec.train_eagle import features, head_forward
m = SpecdecModel.from_pretrained("smollm2-135m")
_, head = build_head(m, sys.argv[1] if len(sys.argv) > 1 else shipped_draft(m, "eagle"))  # [PATH]: another head
docs = held_out_texts()
rows = []
with torch.no_grad():
    for name, text in [docs[0], docs[2], docs[5]]:
        ids = _chunks(m.tokenizer, [(name, text)], 1024, 1024)
        f, top, idx = features(m.hf, ids, 4)
        tgt = idx[:, 1:, 0].long()
        for exact in (True, False):
            preds = head_forward(m.hf, head, ids, f, 4, exact)
            for j, p in enumerate(preds):
                hit = (m.hf.lm_head(p).argmax(-1) == tgt)[0]
                rows.append(dict(doc=name, exact=exact, step=j + 1, first256=hit[:255].float().mean().item(),
                                 after256=hit[255:].float().mean().item()))
                print(json.dumps(rows[-1]), flush=True)

