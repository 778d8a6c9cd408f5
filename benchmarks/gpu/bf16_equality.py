"""Where speculative greedy leaves dense greedy, per numerics setting: bf16 vs float32, triton vs torch, graphs or not.

    timeout 330 python3 benchmarks/gpu/bf16_equality.py --out $OUT/eq     # H200, needs /tmp/m/smol.gguf

For each configuration (``backend,dtype,graphs,fuse``; default: the fast path in bf16, PyTorch's backend in bf16, the
fast path in float32, the triton backend in bf16 without graphs) it decodes ``--new`` tokens greedily from
``--windows`` windows of ``ssl.py`` (``--context`` tokens each, ends ``--stride`` apart) with dense and with magicdec
and vegas at each ``--gammas`` value (5 % budget, adaptive off), and prints one JSON line per run: τ and, per window,
the first position where the tokens differ from that configuration's dense run (``null``: all equal). A verify
computes γ + 1 rows in one pass and dense decoding one; in bf16 they round differently and a near-tied argmax can
flip (``docs/guarantees.md``: token equality with a separate dense run is promised in float32).
Writes ``<out>/bf16_equality.jsonl`` line by line (a timeout keeps what finished).
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--stride", type=int, default=1000)
    ap.add_argument("--gammas", default="8,12,16")
    ap.add_argument("--configs", default="triton,bfloat16,1,1;torch,bfloat16,0,0;triton,float32,1,1;triton,bfloat16,0,1",
                    help="';'-separated backend,dtype,graphs(0|1),fuse(0|1)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from specdec import PipelineConfig, build_engine
    from g14_replay import windows
    from specdec.data import load_document
    from specdec.loading import load_model

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bf16_equality.jsonl"
    gammas = [int(g) for g in a.gammas.split(",") if g]
    t0 = time.time()
    for c in a.configs.split(";"):
        backend, dtype, graphs, fuse = c.split(",")
        m = load_model(a.gguf, dtype, a.device, backend, graphs == "1", False, fuse == "1")
        text = load_document(ssl.__file__)
        batch = windows(m.tokenizer, text, a.context, a.new, a.windows, a.stride)
        ref = build_engine(m, PipelineConfig.make(method="dense", adaptive=False)).generate(batch, max_new_tokens=a.new).tokens
        for g in gammas:
            for meth in ("magicdec", "vegas"):
                cfg = PipelineConfig.make(method=meth, gamma=g, budget_ratio=0.05, adaptive=False)
                r = build_engine(m, cfg).generate(batch, max_new_tokens=a.new)
                diff = [next((i for i, (x, y) in enumerate(zip(s, d)) if x != y), None) for s, d in zip(r.tokens, ref)]
                row = dict(config=c, gamma=g, method=meth, tau=r.stats.mean_accepted_length, first_diff=diff)
                print(json.dumps(row), f"t={time.time() - t0:.0f}", flush=True)
                with log.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        del m
        if a.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
