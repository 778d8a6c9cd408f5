"""Does a Hugging Face ``generate`` baseline (``bench --hf-baseline``) or a Dustin run change how specdec's rows run
after it?

    python3 benchmarks/gpu/hf_state.py --model /tmp/m/smol.gguf --document DOC --out DIR [--between dustin]

Why: a sparse draft's τ on the same prose window at B 64 read 3.52 / 3.80 (MagicDec / Vegas) in runs without HF rows
and 3.34 / 3.43 in the one run where the previous setting had run both HF baselines, with dense's tokens in every
row. This script runs dense and MagicDec on one window, then both HF baselines (default and static cache, which
``torch.compile``s on CUDA), then dense and MagicDec again, and prints: torch's global numeric switches before / after,
each run's τ and whether its tokens equal the first dense run's. ``DIR/hf_state_<between>.json`` keeps it all.
On the H200 (2026-12-04) the HF baselines changed nothing (no switch, MagicDec τ 3.5185 before and after); a Dustin
run changed dense's greedy tokens and MagicDec's τ (3.52 → 3.88) with the model's tensors unchanged and eager = graphed
after it: the EAGLE drafter's recording hooks, left on for good (fixed since: engines scope what the target records).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def switches() -> dict:
    import torch

    b = torch.backends
    out = dict(
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        matmul_allow_tf32=b.cuda.matmul.allow_tf32,
        cudnn_allow_tf32=b.cudnn.allow_tf32,
        bf16_reduced_precision_reduction=b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        fp16_reduced_precision_reduction=b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        flash_sdp=b.cuda.flash_sdp_enabled(), mem_efficient_sdp=b.cuda.mem_efficient_sdp_enabled(),
        math_sdp=b.cuda.math_sdp_enabled(), deterministic=torch.are_deterministic_algorithms_enabled(),
        grad_enabled=torch.is_grad_enabled(), default_dtype=str(torch.get_default_dtype()),
    )
    try:
        out["preferred_blas"] = str(b.cuda.preferred_blas_library())
    except Exception as exc:  # older torch
        out["preferred_blas"] = type(exc).__name__
    return out


def main(argv=None) -> int:
    from specdec import PipelineConfig, build_engine
    from specdec.bench import _prefilled, hf_generate_tps
    from specdec.data import context_windows
    from specdec.loading import load_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--document", required=True)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, float32, reference backend (a check of the script)")
    ap.add_argument("--probe", action="store_true", help="also: which of the model's tensors changed, and dense with "
                    "CUDA graphs off after")
    ap.add_argument("--between", default="hf", choices=["hf", "dustin"],
                    help="what runs between the two passes: both HF baselines, or a Dustin engine (B, new tokens as above)")
    a = ap.parse_args(argv)
    if a.smoke:
        m = load_model(a.model, "float32", "cpu", "reference")
    else:
        m = load_model(a.model, "bfloat16", "cuda", "triton", cuda_graphs=True, compile=False, fuse=True)
    win = context_windows(m.tokenizer, Path(a.document).read_text(encoding="utf-8"), a.context, 1, a.new + 16, 1)
    res: dict = dict(argv=sys.argv, before=switches(), runs=[])
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1)
    spec = build_engine(m, PipelineConfig.make(method="magicdec", gamma=4, budget_ratio=0.05, adaptive=False),
                        eos_token_id=-1)
    from specdec.engine import cache_positions

    m.new_cache(a.batch, cache_positions(len(win[0]), a.new, 4), reuse=True)
    pre = _prefilled(dense, m, win, a.batch, random_cache=False)
    first = None
    last_dense = [None]  # the last pass's dense tokens (kept out of the JSON: B x new ids)

    def run(label: str) -> None:
        nonlocal first
        for name, eng in (("dense", dense), ("magicdec", spec)):
            eng.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)  # warm
            r = eng.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)
            if first is None:
                first = r.tokens
            if name == "dense":
                last_dense[0] = r.tokens
            row = dict(when=label, method=name, tau=r.stats.mean_accepted_length,
                       tokens_per_second=r.stats.tokens_per_second, same_as_first_dense=r.tokens == first)
            res["runs"].append(row)
            print(row, flush=True)

    def digest() -> dict:
        out = {}
        for name, t in list(m.hf.named_parameters()) + list(m.hf.named_buffers()):
            out[name] = (tuple(t.shape), float(t.detach().double().sum()), float(t.detach().double().abs().sum()))
        return out

    before_digest = digest() if a.probe else None
    run("before")
    if a.between == "hf":
        for impl in (None, "static"):
            t = hf_generate_tps(m, win, 4, 16, impl, repeats=1)
            print("hf", impl, t, flush=True)
    else:
        d = build_engine(m, PipelineConfig.make(method="dustin", gamma=4, budget_ratio=0.05), eos_token_id=-1)
        r = d.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)
        print("dustin", dict(tau=r.stats.mean_accepted_length, tokens_per_second=r.stats.tokens_per_second), flush=True)
        d = None
    res["after"] = switches()
    res["changed"] = {k: (v, res["after"][k]) for k, v in res["before"].items() if res["after"][k] != v}
    print(f"switches changed by {a.between}:", res["changed"], flush=True)
    m.new_cache(a.batch, cache_positions(len(win[0]), a.new, 4), reuse=True)
    if a.probe:
        after_digest = digest()
        res["tensors_changed"] = sorted(k for k in set(before_digest) | set(after_digest)
                                        if before_digest.get(k) != after_digest.get(k))
        print("model tensors changed:", res["tensors_changed"][:20], len(res["tensors_changed"]), flush=True)
    run(f"after {a.between}")
    if a.probe and not a.smoke:
        m.disable_cuda_graphs()
        r = dense.generate(pre.ids, max_new_tokens=a.new, prefilled=pre)
        row = dict(when=f"after {a.between}, CUDA graphs off", method="dense", same_as_first_dense=r.tokens == first,
                   same_as_graphed_dense_after=r.tokens == last_dense[0])
        res["runs"].append(row)
        print(row, flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"hf_state_{a.between}.json").write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
