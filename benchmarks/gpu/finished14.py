"""Finished sequences read nothing (``specdec.models.SKIP_FINISHED_READS``) vs read their whole context: an A/B.

B sequences continue ``--windows`` windows of ``--document`` (sequence ``b`` continues window ``b % windows``, as
``specdec bench --windows``), 8k context, bf16, Triton, fused projections, CUDA graphs, γ fixed, 5 % budget. Two
copies of the model, one per arm: arm ``skip`` captures its graphs with the switch on, arm ``read`` with it off (the
switch is also set before each of its runs, for anything eager). Two workloads per method:

* ``to the end``: no EOS, every sequence writes ``--new`` tokens — a speculative batch's sequences still end at
  different rounds (the batch runs until its slowest is done), dense's all at the same step;
* ``EOS``: the tokenizer's id of ``--eos-text`` stops a sequence (sequences end where their text has it).

Each (method, workload): both arms warmed up, then ``--repeats`` rounds of (skip, read) timed in turn (an untimed
run before each timed one). Tokens/s = tokens emitted / wall time of a ``generate`` call; per row the median of each
arm, the median of the per-round ratios skip / read, and whether both arms emitted the same tokens (they must: the
live sequences read the same bits). Writes ``--out`` (JSON) and prints a line per row.

    python benchmarks/gpu/finished14.py --model /tmp/m/smol.gguf --document .heldout/click_core.py --out $OUT/f.json
"""

from __future__ import annotations

import argparse
import json
import statistics
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
    ap.add_argument("--eos-text", default="\n\n")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eos-only", action="store_true", help="only the EOS workload")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="the embedded model on the CPU, small shapes (a check)")
    a = ap.parse_args()
    if a.smoke:
        a.batch, a.context, a.windows, a.stride, a.new, a.repeats = 4, 200, 2, 50, 8, 1
    dev = "cpu" if a.smoke else "cuda"
    sync = (lambda: None) if a.smoke else torch.cuda.synchronize

    import specdec.models as models
    from specdec.bench import _prefilled, machine_info
    from specdec.data import context_windows, load_document
    from specdec.loading import load_model, pipeline_config
    from specdec.presets import build_engine

    arms = {}
    for arm, flag in (("skip", True), ("read", False)):
        models.SKIP_FINISHED_READS = flag
        arms[arm] = (flag, load_model(a.model, "float32", "cpu", "reference") if a.smoke else
                     load_model(a.model, "bfloat16", "cuda", "triton", cuda_graphs=True, compile=False, fuse=True))
    tok = arms["skip"][1].tokenizer
    eos_ids = tok(a.eos_text, add_special_tokens=False).input_ids
    wins = context_windows(tok, load_document(a.document), a.context, a.windows, a.new + 16, a.stride)
    result = dict(machine=machine_info(dev), args=vars(a), eos_ids=eos_ids, rows=[])
    for method in a.methods.split(","):
        cfg = pipeline_config(method, a.gamma, None, a.budget_ratio, 0.0, 1.0, 0, None)
        for workload, eos in (("to the end", -1), ("EOS", eos_ids))[1 if a.eos_only else 0:]:
            engines = {}
            for arm, (flag, m) in arms.items():
                models.SKIP_FINISHED_READS = flag
                eng = build_engine(m, cfg, adaptive=False, eos_token_id=eos)
                pre = _prefilled(eng, m, wins, a.batch, False)
                for _ in range(2):  # captures
                    eng.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)
                engines[arm] = (flag, eng, pre)
            tps = {arm: [] for arm in engines}
            toks = {}
            iters = {}
            for _ in range(a.repeats):
                for arm, (flag, eng, pre) in engines.items():
                    models.SKIP_FINISHED_READS = flag
                    eng.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)  # untimed switch
                    sync()
                    t0 = time.perf_counter()
                    r = eng.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)
                    sync()
                    dt = time.perf_counter() - t0
                    n = sum(len(t) for t in r.tokens)
                    tps[arm].append(n / dt)
                    toks.setdefault(arm, set()).add(json.dumps(r.tokens))
                    iters[arm] = r.stats.iterations
                    result.setdefault("mean_new_tokens", {})[f"{method} {workload}"] = n / a.batch
            ratios = [s / r for s, r in zip(tps["skip"], tps["read"])]
            row = dict(method=method, workload=workload, iterations=iters,
                       tokens_per_s={arm: dict(median=statistics.median(v), min=min(v), max=max(v))
                                     for arm, v in tps.items()},
                       skip_over_read=statistics.median(ratios), ratios=ratios,
                       same_tokens=len(toks["skip"] | toks["read"]) == 1,
                       mean_new_tokens=result["mean_new_tokens"][f"{method} {workload}"])
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
