"""Time one forward step (dense T=1, sparse T=1, verify T=γ+1) at SmolLM2-135M shape on a GPU.

Random weights (timing only), bf16, context ``--context``; modes: eager, CUDA graphs, compile + graphs,
autotune (compile with ``mode="max-autotune-no-cudagraphs"``) + graphs.
Reports medians of CUDA-event timings and the roofline (weights + KV bytes read) / copy bandwidth.

    python benchmarks/step_gpu.py --context 8000 --batches 1,64 --backend triton --out step.json

Kernel counts with and without the launch-count reductions (``--profile 1`` prints a summary table
per variant at the end; each variant builds the model afresh):

    python benchmarks/step_gpu.py --context 8000 --batches 64 --modes compile --profile 1 \
        --variants base,write,layout,fuse --out step_variants.json

Variants are cumulative: ``base`` = torch-indexing cache writes (``KVCache.write_impl = "torch"``),
attention output in (B, H, T, D) (``LaunchConfig.out_bthd = False``), separate projections;
``write`` = + one Triton launch per layer for the K/V cache write; ``layout`` = + the Triton kernels
write (B, T, H, D) (the defaults of the code); ``fuse`` = + fused q/k/v and gate/up projections.
Without ``--variants`` the code's defaults run (``--fuse 1`` adds fusion).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return statistics.median(ts)


CATEGORIES = [  # (category, substrings of the kernel name), first match wins
    ("kv_write", ("_kv_write_kernel",)),
    ("attention", ("_splitk_attn_kernel", "_combine_kernel", "_softmax_scores_kernel", "flash", "fmha")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "cublas", "sm90_")),
    ("index_put", ("index_elementwise", "index_put", "indexing_backward")),
    ("arange", ("arange",)),
    ("inductor", ("triton_",)),
    ("torch_elementwise", ("elementwise", "copy", "fill")),
]


def category(name: str) -> str:
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other"


VARIANTS = ["base", "write", "layout", "fuse"]


def apply_variant(variant: str, model, backend) -> None:
    """Switch the launch-count reductions up to ``variant`` (cumulative, see the module docstring)."""
    import dataclasses

    from specdec.cache import KVCache

    level = VARIANTS.index(variant)
    KVCache.write_impl = "torch" if level < 1 else "auto"
    if getattr(backend, "_launch", None) is not None:
        backend._launch = dataclasses.replace(backend._launch, out_bthd=level >= 2)
    if level >= 3:
        model.fuse_projections()


def kernel_table(fn, calls: int = 5, top: int = 12) -> dict:
    """GPU kernels of ``calls`` calls of ``fn`` (torch.profiler): count and µs per call, the top ones by time."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    agg: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        a = agg.setdefault(ev.name[:90], [0, 0.0])
        a[0] += 1
        a[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    total = sum(v[1] for v in agg.values()) / calls
    n = sum(v[0] for v in agg.values()) / calls
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]
    cats: dict[str, list[float]] = {}
    for k, v in agg.items():
        c = cats.setdefault(category(k), [0.0, 0.0])
        c[0] += v[0] / calls
        c[1] += v[1] / calls
    return dict(kernels_per_call=n, kernel_us_per_call=total,
                categories={k: dict(count=v[0], us=v[1]) for k, v in sorted(cats.items())},
                top=[dict(name=k, count=v[0] / calls, us=v[1] / calls) for k, v in rows])


def summary_table(rows: list[dict]) -> str:
    """Markdown: per step and variant, wall time, kernels per step and (count, µs) per kernel category."""
    cats = [c for c, _ in CATEGORIES] + ["other"]
    head = "| B | mode | step | variant | wall ms | kernels | kernel ms | " + " | ".join(cats) + " |"
    out = [head, "|" + "---|" * (7 + len(cats))]
    for r in rows:
        if "kernels" not in r:
            continue
        kt = r["kernels"]
        cells = []
        for c in cats:
            v = kt["categories"].get(c)
            cells.append("" if v is None else f"{v['count']:.0f} / {v['us']:.0f} µs")
        out.append(f"| {r['B']} | {r['mode']} | {r['step']} | {r.get('variant', '')} | {r['seconds'] * 1e3:.2f} | "
                   f"{kt['kernels_per_call']:.0f} | {kt['kernel_us_per_call'] / 1e3:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--modes", default="eager,graphs,compile")
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--profile", type=int, default=0, help="also profile each step's kernels (torch.profiler, 5 calls)")
    ap.add_argument("--fuse", type=int, default=0, help="fused q/k/v and gate/up projections (without --variants)")
    ap.add_argument("--variants", default="",
                    help="comma list of base,write,layout,fuse (cumulative launch-count reductions, see the docstring)")
    ap.add_argument("--backend-options", default="{}",
                    help='JSON config of the backend, e.g. \'{"num_splits": 1}\' for the triton backend')
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, LlamaConfig

    from specdec import BACKENDS, SpecdecModel
    from e2e_gpu import copy_bandwidth

    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, tie_word_embeddings=True)
    variants = [v for v in args.variants.split(",") if v] or ["default"]
    for v in variants:
        if v not in VARIANTS + ["default"]:
            raise SystemExit(f"unknown variant {v!r}; choose from {', '.join(VARIANTS)}")
    bw = copy_bandwidth()
    kvt = 2 * 30 * 3 * 64 * 2
    res = dict(args=vars(args), gpu=torch.cuda.get_device_name(), torch=torch.__version__, copy_GBps=bw / 1e9,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=[])
    for variant in variants:
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
        kw = {"static": True} if args.backend == "torch" else {}
        kw.update(json.loads(args.backend_options))
        be = BACKENDS.build(args.backend, **kw)
        model = SpecdecModel(hf, None, be)
        if variant == "default":
            if args.fuse:
                model.fuse_projections()
        else:
            apply_variant(variant, model, be)
        W = sum(p.numel() * p.element_size() for p in hf.parameters())
        run_variant(args, model, variant, W, bw, kvt, res)
        del model, hf
        torch.cuda.empty_cache()
    if args.profile:
        res["summary"] = summary_table(res["rows"])
        print(res["summary"], flush=True)
    Path(args.out).write_text(json.dumps(res, indent=2))


def run_variant(args, model, variant, W, bw, kvt, res):
    from specdec import SparsePlan

    for B in [int(b) for b in args.batches.split(",")]:
        cache = model.new_cache(B, args.context + 128)
        cache.k.normal_()
        cache.v.normal_()
        L = torch.full((B,), args.context, device="cuda")
        idx = torch.stack([torch.randperm(args.context - 16, device="cuda")[: args.budget] for _ in range(B)])
        plan = SparsePlan(indices=idx.view(1, B, 1, -1), dense_from=L.clone())
        x1 = torch.randint(0, 49152, (B, 1), device="cuda")
        x5 = torch.randint(0, 49152, (B, args.gamma + 1), device="cuda")
        steps = {
            "dense_T1": (lambda: model.forward(x1, cache, L), W + B * args.context * kvt),
            "sparse_T1": (lambda: model.forward(x1, cache, L, plan=plan), W + B * args.budget * kvt),
            f"verify_T{args.gamma + 1}": (lambda: model.forward(x5, cache, L), W + B * args.context * kvt),
        }
        for mode in args.modes.split(","):
            model.disable_cuda_graphs()
            model._compiled = None
            try:
                if mode == "compile":
                    model.enable_compile()
                if mode == "autotune":  # inductor benchmarks GEMM templates and may fuse epilogues into them
                    model.enable_compile(mode="max-autotune-no-cudagraphs")
                if mode in ("graphs", "compile", "autotune"):
                    model.enable_cuda_graphs()
                for name, (fn, nbytes) in steps.items():
                    t = timed(fn)
                    row = dict(B=B, mode=mode, step=name, variant=variant, seconds=t, roofline=nbytes / bw,
                               over_roofline=t / (nbytes / bw))
                    if model._graphs is not None:
                        row["uncapturable"] = len(model._graphs.uncapturable)
                    if args.profile:
                        row["kernels"] = kernel_table(fn)
                    res["rows"].append(row)
                    print(json.dumps(row), flush=True)
            except Exception as exc:
                res["rows"].append(dict(B=B, mode=mode, variant=variant, error=repr(exc)[:500]))
                print("ERROR", mode, variant, repr(exc)[:300], flush=True)
            Path(args.out).write_text(json.dumps(res, indent=2))
        del cache
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
