"""Cost of building a sparse plan on a GPU: eager vs CUDA-graph-captured, and torch.topk's share.

Workload: SmolLM2-135M geometry (30 layers, 3 KV heads, head dim 64), a cache of ``--context`` + 104
positions, every sequence at ``--context`` tokens, budget 5 % (sinks 4 + recent 16 + top-k), bf16 cache.
Selectors: ``sliding_window`` (MagicDec, one plan for all layers) and ``collect2`` (Vegas: a plan per
layer from the last verification's scores, random here). Per batch size it reports, median of
``--reps`` calls, host wall time with a synchronisation after each call (what an iteration waits for):

* ``plan eager``: ``selector.plan`` (the plan construction run kernel by kernel);
* ``plan captured``: ``planner_for(cache).plan(selector, lengths)`` (one CUDA-graph replay + loading
  the plan into the planner's buffers);
* ``topk``: ``torch.topk`` alone on the scores a plan ranks (the part a custom top-k kernel could speed up);
* ``on_verify``: Vegas' score bookkeeping after a verification (all layers as views of one tensor).

    python benchmarks/gpu/bench_select.py --out select.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def timed(fn, reps: int) -> float:
    """Median host seconds of ``fn()`` followed by a synchronisation."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batches", default="64,16,1")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from specdec.cache import KVCache
    from specdec.interfaces import ScoreRequest
    from specdec.registry import SELECTORS
    from specdec.planner import planner_for

    N, Hkv, D = 30, 3, 64
    out = {"args": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": []}
    for B in [int(b) for b in args.batches.split(",")]:
        cap = args.context + 104
        cache = KVCache(N, B, Hkv, cap, D, torch.bfloat16, "cuda")
        lengths = torch.full((B,), args.context, dtype=torch.long, device="cuda")
        for name in ("sliding_window", "collect2"):
            sel = SELECTORS.build(name, budget_ratio=0.05, sinks=4, recent=16)
            sel.reset(cache)
            sel.on_verify(None, lengths)
            row = {"B": B, "selector": name, "k_sel": sel.max_selected(cap)}
            if name == "collect2":
                g = torch.Generator(device="cuda").manual_seed(0)
                stacked = torch.rand(N, B, Hkv, cap, device="cuda", generator=g)
                req = ScoreRequest(rows=[0, 4], kind="softmax")
                req.scores = dict(zip(range(N), stacked.unbind(0)))
                sel.on_verify(req, lengths)
                row["on_verify_ms"] = 1e3 * timed(lambda: sel.on_verify(req, lengths), args.reps)
            planner = planner_for(cache)
            row["plan_eager_ms"] = 1e3 * timed(lambda: sel.plan(cache, lengths), args.reps)
            row["plan_captured_ms"] = 1e3 * timed(lambda: planner.plan(sel, lengths), args.reps)
            eager, captured = sel.plan(cache, lengths), planner.plan(sel, lengths)
            row["captured_equals_eager"] = bool(torch.equal(eager.indices, captured.indices))
            row["plan_shape"] = list(captured.indices.shape)
            s = sel.score(cache, lengths).float().contiguous()
            k = min(row["k_sel"], s.shape[-1])
            row["topk_ms"] = 1e3 * timed(lambda: torch.topk(s, k, dim=-1), args.reps)
            row["topk_rows"] = int(s.numel() // s.shape[-1])
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
        del cache
        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
