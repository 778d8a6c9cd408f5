"""Two half-batches on two CUDA streams against one batch on one stream (a prototype measurement).

At SmolLM2-135M a sparse draft step is ~300 launches of a few microseconds each, latency-bound: the GPU is mostly
idle during it, while a verification (and a dense step) is bound by the KV bytes it reads. This runs a batch of B
sequences as two engines of B/2 sequences each — two copies of the model (separate CUDA-graph pools), each engine
driven from its own host thread on its own CUDA stream — so one half's latency-bound kernels can overlap the other
half's, and compares with one engine of B sequences on one stream. Same prompts (``--windows`` windows of
``--document``, sequence ``b`` continues window ``b % windows``), greedy, γ fixed (no adaptive controller), every
graph captured before timing. Tokens of every run are compared with one-stream dense's.

    python benchmarks/gpu/overlap14.py --model /tmp/m/smol.gguf --document .heldout/click_core.py --out $OUT/ov.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--document", required=True)
    ap.add_argument("--methods", default="dense,magicdec,vegas")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--stride", type=int, default=800)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget-ratio", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from specdec.bench import _prefilled, machine_info
    from specdec.data import context_windows, load_document
    from specdec.loading import load_model, pipeline_config
    from specdec.presets import build_engine

    half = a.batch // 2
    # three copies: one per half and one for the whole batch (a model reuses its cache, and with it its captured
    # graphs, only while the batch size stays the same: sharing a model between sizes re-captures every call)
    models = [load_model(a.model, "bfloat16", "cuda", "triton", cuda_graphs=True, compile=False, fuse=True)
              for _ in range(3)]
    tok = models[0].tokenizer
    wins = context_windows(tok, load_document(a.document), a.context, a.windows, a.new + 16, a.stride)
    result = dict(machine=machine_info("cuda"), args=vars(a), rows={})
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    dense_tokens = None
    for method in a.methods.split(","):
        cfg = pipeline_config(method, a.gamma, None, a.budget_ratio, 0.0, 1.0, 0, None)
        one = build_engine(models[2], cfg, adaptive=False)
        halves = [build_engine(m, cfg, adaptive=False) for m in models[:2]]
        pre_one = _prefilled(one, models[2], wins, a.batch, False)
        # half h continues sequences h*half .. (h+1)*half - 1 of the full batch (the same windows in the same order)
        pre_half = [_prefilled(e, m, wins, a.batch, False) for e, m in zip(halves, models[:2])]
        from specdec.engine import Prefilled

        def cut(p, h):
            sl = slice(h * half, (h + 1) * half)
            pick = lambda t, dim: None if t is None else t.narrow(dim, sl.start, half)  # noqa: E731
            return Prefilled(ids=p.ids[sl], k=pick(p.k, 1), v=pick(p.v, 1), last_logits=pick(p.last_logits, 0),
                             ring_k=pick(p.ring_k, 1), ring_v=pick(p.ring_v, 1), hidden=pick(p.hidden, 0))
        pre_half = [cut(p, h) for h, p in enumerate(pre_half)]
        torch.cuda.synchronize()

        def run_one():
            r = one.generate(pre_one.ids, max_new_tokens=a.new, prefilled=pre_one)
            return r, [r]

        def run_two():
            out = [None, None]

            def work(h):
                with torch.cuda.stream(streams[h]):
                    out[h] = halves[h].generate(pre_half[h].ids, max_new_tokens=a.new, prefilled=pre_half[h])
                    streams[h].synchronize()

            ts = [threading.Thread(target=work, args=(h,)) for h in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            return None, out

        # captures: each engine alone first (a capture must not run beside another stream's work)
        for _ in range(2):
            run_one()
            for h in range(2):
                with torch.cuda.stream(streams[h]):
                    halves[h].generate(pre_half[h].ids, max_new_tokens=a.new, prefilled=pre_half[h])
                torch.cuda.synchronize()
        times = {"one": [], "two": []}
        toks = {}
        for _ in range(a.repeats):
            for kind, fn in (("one", run_one), ("two", run_two)):
                fn()  # untimed switch
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                _, rs = fn()
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                times[kind].append(a.batch * a.new / dt)
                toks[kind] = [t for r in rs for t in r.tokens]
        if method == "dense":
            dense_tokens = toks["one"]
        row = result["rows"][method] = {}
        for kind in ("one", "two"):
            v = times[kind]
            row[kind] = dict(tokens_per_s=statistics.median(v), min=min(v), max=max(v),
                             same_tokens_as_dense=None if dense_tokens is None else toks[kind] == dense_tokens)
        row["two_over_one"] = statistics.median([t / o for t, o in zip(times["two"], times["one"])])
        print(method, json.dumps(row), flush=True)
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    for method, row in result["rows"].items():
        if "dense" in result["rows"]:
            d = result["rows"]["dense"]
            row["vs_dense_one"] = {k: row[k]["tokens_per_s"] / d["one"]["tokens_per_s"] for k in ("one", "two")}
            row["vs_dense_two"] = row["two"]["tokens_per_s"] / d["two"]["tokens_per_s"]
        print(method, {k: row.get(k) for k in ("two_over_one", "vs_dense_one", "vs_dense_two")}, flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
