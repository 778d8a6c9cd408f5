"""Gemma 3 270M on the CPU (float32): greedy output of every lossless method equals Hugging Face
``generate`` token for token, at a context longer than the sliding window (the rings wrap).

    python benchmarks/gemma_cpu_parity.py --context 4096 --new 32 --out results/gemma_cpu_4k.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdec import PipelineConfig, SpecdecModel, build_engine, method_names
from specdec.data import context_ids, load_document


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """Hugging Face greedy ``generate`` of exactly ``n`` tokens that treats EOS as an ordinary token, as
    the engine does with ``eos_token_id=-1`` (``min_new_tokens`` would instead *forbid* EOS: not greedy)."""
    gc = hf.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = None
    try:
        out = hf.generate(torch.tensor([ids], device=hf.device), max_new_tokens=n, do_sample=False, pad_token_id=0)
    finally:
        gc.eos_token_id = saved
    return out[0, len(ids):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--docs", default="long:prose,long:code")
    ap.add_argument("--methods", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--model", default="gemma3-270m", help="embedded name or a .gguf path")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="reference")
    a = ap.parse_args()
    from specdec.registry import BACKENDS

    m = SpecdecModel.from_pretrained(a.model, dtype="float32", device=a.device, backend=BACKENDS.build(a.backend))
    rows = []
    for doc in a.docs.split(","):
        ids = context_ids(m.tokenizer, load_document(doc), a.context)
        t0 = time.perf_counter()
        ref = hf_greedy(m.hf, ids, a.new)
        hf_s = time.perf_counter() - t0
        for method in (a.methods.split(",") if a.methods else method_names()):
            cfg = PipelineConfig.make(method=method, gamma=4, budget=max(64, a.context // 16))
            eng = build_engine(m, cfg, eos_token_id=-1)
            t0 = time.perf_counter()
            res = eng.generate([ids], max_new_tokens=a.new)
            row = dict(doc=doc, context=a.context, method=method, device=a.device, backend=a.backend, lossless=res.stats.lossless,
                       equal_hf=res.tokens[0] == ref, tau=res.stats.mean_accepted_length,
                       seconds=time.perf_counter() - t0, hf_seconds=hf_s)
            print(json.dumps(row), flush=True)
            rows.append(row)
    cache = m.new_cache(1, a.context + a.new + 8)
    import transformers

    summary = dict(kv_bytes=cache.nbytes(), transformers=transformers.__version__, torch=torch.__version__, windows=list(m.dims.windows), rows=rows,
                   lossless_all_equal=all(r["equal_hf"] for r in rows if r["lossless"]))
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
