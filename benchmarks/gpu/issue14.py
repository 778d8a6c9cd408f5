"""Issue 14 on the H200 in one command: fused kernels, honest end-to-end table, replayed 8B rows, Vegas' costs.

    python benchmarks/gpu/issue14.py --gguf /tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT
    python benchmarks/gpu/issue14.py --smoke --out /tmp/smoke      # CPU, tiny shapes, a minute or two
    bash benchmarks/gpu/issue14_8b.sh                              # the 8B step table + replayed rows, <= 5 min

Parts, run in the order traces, steps, replay, e2e (each saved as it finishes to ``<out>/issue14.json``;
``--parts`` picks some; a part that would
start after ``--budget-s`` seconds is recorded as skipped):

1. ``traces`` — acceptance traces of magicdec and vegas on the embedded model (8k context of pydoc,
   γ = 4, 5 % budget, adaptive off so every round drafts γ), for the replayed rows of part 4.
2. ``e2e`` — ``specdec.bench.run_bench`` on the embedded model (bf16, triton, CUDA graphs, fused
   projections + fused kernels): dense / magicdec / vegas at 8k, B = 1, 16, 64, medians of 3 runs,
   HF ``generate`` default and static-cache, each warmed up. Then B = 1 again with ``adaptive`` off,
   to show what the dense fall-back saves.
3. ``steps`` — one dense / 5 % sparse / verify (γ+1 rows) step, CUDA graphs, at the Llama-3.1-8B
   shape (B = 16, 32k) and the embedded shape (B = 64, 8k), three variants: unfused, fused
   projections (torch element-wise code), fused projections + fused Triton kernels; medians of CUDA
   events, roofline ``(weights + KV read) / copy bandwidth``, kernel counts and a per-category kernel
   table (torch.profiler). Vegas' own costs (item 4) at each shape: score emission share of a
   verify step, one layer's sparse attention against copy bandwidth, random-position gather vs a
   contiguous window of the same size. ``torch.compile`` at the 8B shape is skipped (it did not
   finish in 4 minutes on 2026-12-01; with the fused kernels it is optional).
4. ``replay`` — ``run_bench(shape="llama-3.1-8b")`` at 32k, B = 16: dense, and magicdec / vegas
   replaying part 1's traces (rows labelled replayed), graphs + fused kernels.

Step variants (``--variants``): ``unfused``, ``fused_projections``, ``fused_kernels`` (12
launches per Llama layer at the 8B shape, o_proj and qkv one GEMM each: splits set to 1), ``fused_kernels_r0`` (as of 2026-12-01b: the MLP's residual
add a kernel of its own, Hugging Face's rotary cos/sin), ``fused_kernels_split2`` / ``_split4`` (o_proj and
qkv as hand-split batched GEMMs, ``specdec.fusion.set_gemm_splits``; split 2 is the library's default since
2026-12-01c, ``fusion.GEMM_SPLITS``), ``fused_kernels_split2_down2`` / ``_down4`` (the same plus the MLP's
down GEMM in 2 / 4 slices whose partials the next layer's input norm adds, ``set_gemm_splits(hf, down=n)``),
``fused_kernels_fused_combine`` and
``fused_kernels_legacy_sparse`` (sparse step only: the attention combine inside the split kernel; the
pre-table sparse launch). Each row carries the prediction made before measuring (``PREDICTED_MS``, 8B
shape), launches per layer and a kernel table; ``issue14.md`` sums it up after every part.
``bash benchmarks/gpu/issue14_8b.sh`` is the ≤ 5-minute run of traces, 8B steps and replay.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

T0 = time.perf_counter()
#: the fused-kernels step with the sparse launch of before LAUNCH_TABLE (sparse step only)
LEGACY_VARIANT = "fused_kernels_legacy_sparse"
#: fused kernels as of 2026-12-01b (13 launches per layer): the residual add after the MLP a kernel of
#: its own, HF's rotary cos/sin (~9 launches per forward)
BEFORE_VARIANT = "fused_kernels_r0"
#: o_proj and qkv split by hand into 2 / 4 partial GEMMs (specdec.fusion.set_gemm_splits)
SPLIT_VARIANTS = {"fused_kernels_split2": 2, "fused_kernels_split4": 4}
#: the sparse step with the attention combine inside the split kernel (LaunchConfig.fused_combine)
COMBINE_VARIANT = "fused_kernels_fused_combine"
#: both: o_proj / qkv in 2 slices and the combine inside the sparse kernel (sparse step only)
SPLIT_COMBINE_VARIANT = "fused_kernels_split2_fused_combine"
SPLIT_VARIANTS[SPLIT_COMBINE_VARIANT] = 2
#: o_proj / qkv in 2 slices and the MLP's down GEMM in 2 / 4, its partials added by the next layer's input norm
#: (specdec.fusion.set_gemm_splits(hf, 2, 2, down=n); r14, 2026-12-01)
DOWN_VARIANTS = {"fused_kernels_split2_down2": 2, "fused_kernels_split2_down4": 4}
SPLIT_VARIANTS.update({k: 2 for k in DOWN_VARIANTS})
#: l14 (2026-12-01): the down split (library default since l14) plus the sparse step's levers, sparse step only:
#: the combine inside the split kernel, and launch rows of the sparse kernel at head dim 128 (today SPARSE_LEGACY =
#: 128-position tiles, 4 warps, 2 stages, 4 programs per SM -> 5 splits at B 16 x 8 KV heads, V after the softmax):
#: (block_n, num_warps, num_stages, ctas_per_sm, v_early, min_tiles, fused_combine)
DOWN2_COMBINE_VARIANT = "fused_kernels_split2_down2_fused_combine"
SPARSE_LAUNCH_VARIANTS = {
    DOWN2_COMBINE_VARIANT: (128, 4, 2, 4, False, 1, True),
    "fused_kernels_split2_down2_sparse_c2": (128, 4, 2, 2, False, 1, False),  # 3 splits: fewer partials
    "fused_kernels_split2_down2_sparse_c8": (128, 4, 2, 8, False, 1, False),  # 9 splits: more programs
    "fused_kernels_split2_down2_sparse_s3": (128, 4, 3, 4, False, 1, False),  # one more stage in flight
    "fused_kernels_split2_down2_sparse_w8": (128, 8, 2, 4, False, 1, False),  # 8 warps per program
    "fused_kernels_split2_down2_sparse_c2_fc": (128, 4, 2, 2, False, 1, True),  # 3 splits, merged in-kernel
}
SPLIT_VARIANTS.update({k: 2 for k in SPARSE_LAUNCH_VARIANTS})
DOWN_VARIANTS.update({k: 2 for k in SPARSE_LAUNCH_VARIANTS})
VARIANTS = ("unfused", "fused_projections", "fused_kernels", LEGACY_VARIANT, BEFORE_VARIANT, *SPLIT_VARIANTS,
            COMBINE_VARIANT)
#: variants that only differ from ``fused_kernels`` (or its split) in the sparse step
SPARSE_ONLY = (LEGACY_VARIANT, COMBINE_VARIANT, SPLIT_COMBINE_VARIANT, *SPARSE_LAUNCH_VARIANTS)

#: predicted ms per step at the Llama-3.1-8B shape, B 16 x 32k, before measuring (DESIGN.md section 4):
#: the 2026-12-01b step (sparse 6.19 ms: 5.70 ms of kernels + 0.49 ms of gaps = 1.11 us per launch,
#: 441 launches) minus, per launch removed, its kernel time and one gap:
#: residual add -> down GEMM epilogue: 32 x (1.45 + 1.1) us = 0.08 ms; rotary cos/sin 9 -> 1 launch: ~8 x
#: (2 + 1.1) us = 0.025 ms; o_proj split by hand: its reduce, 32 x (1.8 + 1.1) us = 0.09 ms, if cuBLAS runs the
#: batched halves as fast as its own split-K (unknown); qkv split: 96 -> 192 CTAs, if it lifts the qkv GEMM from
#: 3.1 to ~3.9 TB/s: 32 x 3 us = 0.1 ms (unknown). Dense/verify drop the same launches (~0.1 ms).
PREDICTED_MS = {
    (BEFORE_VARIANT, "dense_T1"): 20.59, (BEFORE_VARIANT, "sparse5%_T1"): 6.19, (BEFORE_VARIANT, "verify_T5"): 22.27,
    ("fused_kernels", "dense_T1"): 20.49, ("fused_kernels", "sparse5%_T1"): 6.09, ("fused_kernels", "verify_T5"): 22.17,
    ("fused_kernels_split2", "sparse5%_T1"): 5.90, ("fused_kernels_split4", "sparse5%_T1"): 5.90,
    ("fused_kernels_split2", "dense_T1"): 20.30, ("fused_kernels_split2", "verify_T5"): 21.98,
    # 2026-12-01c: split2 measured 5.99 ms, fused_combine alone saved 0.14 ms (6.27 -> 6.13): 5.99 - 0.13
    (SPLIT_COMBINE_VARIANT, "sparse5%_T1"): 5.86,
    # r14: the down GEMM split, its reduce folded into the next norm: split2's 5.99 ms minus the 32 down
    # splitKreduce kernels (59 us per step, 1.85 us each) and ~6 us of gap per reduce removed (the o_proj split's
    # measured gap saving per launch, 0.19 ms / 32): 5.99 - 0.06 - 0.19 = 5.74 ms (1.22x of 4.70), if the
    # batched halves run as fast as cuBLAS' own split-K (the o_proj halves did: 377 -> 372 us). Dense the same
    # launches: 20.28 - 0.25 = 20.03; verify: cuBLAS splits the down GEMM at 80 rows? (unknown) -- no prediction.
    ("fused_kernels_split2_down2", "sparse5%_T1"): 5.74, ("fused_kernels_split2_down2", "dense_T1"): 20.03,
}
#: l14, before measuring: the gaps vary by machine (0.41-0.83 ms for the same code), so each lever is predicted
#: against split2 (down 1) of the same run, taken at 6.20 ms (the mean of its three machines, 5.91-6.41):
#: down2 -0.26 ms (measured twice: the 32 splitKreduce kernels and their gaps); the combine in the sparse kernel
#: -0.06 (its 32 launches: 70 us + ~2 us of gap each, minus the +70 us its kernel measured on 2026-12-01c);
#: launch rows: c2 (3 splits: fewer partials, 384 programs on 132 SMs) 0, c8 +0.02, s3 0, w8 +0.03 (the
#: isolated layer measured 38.9 us for today's row and 50-69 us for the others, 2026-12-01b); c2 + combine -0.08.
PREDICTED_MS.update({
    ("fused_kernels_split2", "sparse5%_T1"): 6.20, ("fused_kernels_split2_down2", "sparse5%_T1"): 5.94,
    ("fused_kernels_split2_down2", "dense_T1"): 20.17, (DOWN2_COMBINE_VARIANT, "sparse5%_T1"): 5.88,
    ("fused_kernels_split2_down2_sparse_c2", "sparse5%_T1"): 5.94,
    ("fused_kernels_split2_down2_sparse_c8", "sparse5%_T1"): 5.96,
    ("fused_kernels_split2_down2_sparse_s3", "sparse5%_T1"): 5.94,
    ("fused_kernels_split2_down2_sparse_w8", "sparse5%_T1"): 5.97,
    ("fused_kernels_split2_down2_sparse_c2_fc", "sparse5%_T1"): 5.86,
})


def _forward_add():
    from specdec.fusion import FusedMLP

    return FusedMLP.forward_add


_FORWARD_ADD = None


def elapsed() -> float:
    return time.perf_counter() - T0


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, n=15):
    """Median seconds of ``fn`` (CUDA events on a GPU, wall clock on the CPU), after 3 warm-up calls
    (on the CPU: 1 warm-up and at most 2 calls; the smoke checks the script, not the numbers)."""
    if dev.type != "cuda":
        n = min(n, 2)
    for _ in range(3 if dev.type == "cuda" else 1):
        fn()
    _sync(dev)
    return statistics.median(_replay_times(fn, dev, n)) / 1e3


def launch_table(fn) -> dict:
    """CPU stand-in for ``kernel_table``: the aten ops (views left out) and Triton launches of one call of
    ``fn`` (Triton's interpreter's own ops not counted), in the same layout, without times."""
    from specdec.testing.launches import count_launches

    ops = count_launches(fn)
    cats: dict = {}
    for k, n in ops.items():
        c = ("gemm" if any(g in k for g in ("mm", "linear")) else "other" if k.startswith("triton:")
             else "torch_elementwise")
        cats.setdefault(c, dict(count=0, us=0.0))["count"] += n
    return dict(kernels_per_call=float(sum(ops.values())), kernel_us_per_call=0.0, categories=cats,
                top=[dict(name=k, count=float(n), us=0.0) for k, n in ops.most_common()])


def part_traces(a, res):
    from specdec import PipelineConfig, build_engine
    from specdec.adaptive import save_trace
    from specdec.loading import load_model
    from specdec.data import context_ids, load_document

    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    ids = context_ids(m.tokenizer, load_document("pydoc"), a.context, offset=a.new + 16)
    out = {}
    for method in ("magicdec", "vegas"):
        cfg = PipelineConfig.make(method=method, gamma=a.gamma, budget_ratio=a.ratio, adaptive=False)
        eng = build_engine(m, cfg)
        eng.record_acceptance = True
        r = eng.generate([ids] * a.trace_batch, max_new_tokens=a.new)
        path = Path(a.out) / f"trace_{method}.json"
        save_trace(path, r.stats, model=a.model, budget_ratio=a.ratio, context_tokens=len(ids))
        out[method] = dict(file=str(path), tau=r.stats.mean_accepted_length, rounds=len(r.stats.acceptance_trace))
    res["traces"] = out
    del m
    return out


def part_e2e(a, res):
    from specdec.bench import run_bench

    common = dict(contexts=[a.context], documents=["pydoc"], max_new_tokens=a.new, budget=None, budget_ratio=a.ratio,
                  gamma=a.gamma, model=a.model, backend=a.backend, dtype=a.dtype, device=a.device,
                  output_dir=Path(a.out), cuda_graphs=a.graphs, fuse=True, warmup=True, repeats=a.repeats)
    rows = run_bench(["dense", "magicdec", "vegas"], batch_sizes=a.batches, hf_baseline=True, tag="e2e_embedded",
                     **common)
    res["e2e"] = rows
    res["e2e_no_adaptive_B1"] = run_bench(["dense", "magicdec", "vegas"], batch_sizes=[1], hf_baseline=False,
                                          tag="e2e_embedded_b1_no_adaptive", adaptive=False, **common)


def _vegas_costs(model, cache, L, B, budget, gamma, bw, dev):
    """Item 4: score emission share of verify; one layer's sparse attention vs copy bandwidth; gather vs window."""
    from specdec import ScoreRequest

    d = model.dims
    x5 = torch.randint(0, d.vocab_size, (B, gamma + 1), device=dev)
    model.disable_cuda_graphs()
    t_plain = timed(lambda: model.forward(x5, cache, L), dev, n=5)
    req = lambda: ScoreRequest(rows=[0, gamma], kind="softmax", heads="group")  # noqa: E731 - Collect-2-Query
    t_scores = timed(lambda: model.forward(x5, cache, L, scores=req()), dev, n=5)
    out = _sparse_layer_costs(model, cache, L, B, budget, bw, dev)
    return dict(verify_plain_ms=t_plain * 1e3, verify_with_scores_ms=t_scores * 1e3,
                score_emission_share=(t_scores - t_plain) / t_plain, sparse_attention_one_layer=out,
                gather_over_window=out["gather"]["us"] / out["window"]["us"])


def _sparse_layer_costs(model, cache, L, B, budget, bw, dev):
    """One layer's sparse attention (the backend's ``attend``) against copy bandwidth; gather vs window.

    Graph-replayed: one CUDA graph calls ``attend`` once on each layer's cache (working set beyond the
    L2), median per call. Until 2026-12-01 this timed ONE eager call between CUDA events, which measured
    the host (Python + two launches, ~100 µs) instead of the ~36 µs kernels: "18 % of copy bandwidth".
    That number is kept as ``eager_one_call_us``.
    """
    from specdec.interfaces import AttentionMetadata

    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    from sparse_attn import eager_one_call_us, per_call_us

    d = model.dims
    be = model.backend
    q = torch.randn(B, d.n_heads, 1, d.head_dim, device=dev, dtype=model.dtype)
    ctx = int(L[0])
    rand = torch.stack([torch.randperm(ctx - 16, device=dev)[:budget] for _ in range(B)]).sort(-1).values
    window = torch.arange(ctx - 16 - budget, ctx - 16, device=dev).expand(B, budget)
    n_layers = cache.k.shape[0]
    out = {}
    for name, idx in (("gather", rand), ("window", window)):
        idx4 = idx.view(B, 1, budget).expand(B, d.n_kv_heads, budget).contiguous()
        meta = AttentionMetadata(lengths=L, scale=d.head_dim ** -0.5, plan_indices=idx4, dense_from=L)
        fns = [lambda i=i: be.attend(q, cache.k[i], cache.v[i], meta) for i in range(n_layers)]
        us = per_call_us(fns, dev, 7)
        nbytes = B * d.n_kv_heads * ((budget + 1) * d.head_dim * 2 * cache.k.element_size() + budget * 8)
        out[name] = dict(us=us, GBps=nbytes / us / 1e3, share_of_copy_bw=nbytes / (us * 1e-6) / bw,
                         eager_one_call_us=eager_one_call_us(fns[0], dev), bytes=nbytes)
    return out


def _fused_variant(model, variant: str) -> None:
    """Set a fused model to ``variant``: today's fused kernels, with GEMM splits, or as of 2026-12-01b."""
    from specdec import fusion

    fusion.set_gemm_splits(model.hf, *(2 * (SPLIT_VARIANTS.get(variant, 1),)), down=DOWN_VARIANTS.get(variant, 1))
    rotary = getattr(model.hf.model, "rotary_emb", None)
    before = variant == BEFORE_VARIANT
    if rotary is not None and getattr(type(rotary), "_specdec_fused", False):
        rotary._specdec_kernels = "torch" if before else getattr(model.hf.model.norm, "_specdec_kernels", "auto")
    if before:  # the residual add after the MLP as its own kernel again
        fusion.FusedMLP.forward_add = lambda self, x, residual: residual + self.forward(x)
    else:
        fusion.FusedMLP.forward_add = _FORWARD_ADD


def _step_inputs(model, B: int, ctx: int, gamma: int, dev):
    """A cache of ``B`` x ``ctx`` random K/V and the three steps at that shape: ``(cache, lengths, budget, KV bytes
    per token, {"dense_T1" | "sparse5%_T1" | "verify_T<gamma+1>": (fn, bytes read)})``; the sparse plan keeps 5 %
    of the context at random positions per sequence."""
    from specdec import SparsePlan

    d = model.dims
    kvt = 2 * d.n_layers * d.n_kv_heads * d.head_dim * model.hf.dtype.itemsize
    W = sum(p.numel() * p.element_size() for p in model.hf.parameters())
    cache = model.new_cache(B, ctx + 64)
    cache.k.normal_()
    cache.v.normal_()
    L = torch.full((B,), ctx, device=dev)
    budget = max(16, int(0.05 * ctx))
    idx = torch.stack([torch.randperm(ctx - 16, device=dev)[:budget] for _ in range(B)])
    plan = SparsePlan(indices=idx.view(1, B, 1, -1).expand(1, B, d.n_kv_heads, -1).contiguous(), dense_from=L.clone())
    x1 = torch.randint(0, d.vocab_size, (B, 1), device=dev)
    x5 = torch.randint(0, d.vocab_size, (B, gamma + 1), device=dev)
    steps = {"dense_T1": (lambda: model.forward(x1, cache, L), W + B * ctx * kvt),
             "sparse5%_T1": (lambda: model.forward(x1, cache, L, plan=plan), W + B * budget * kvt),
             f"verify_T{gamma + 1}": (lambda: model.forward(x5, cache, L), W + B * ctx * kvt)}
    return cache, L, budget, kvt, steps


def part_steps(a, res, bw):
    from specdec import SpecdecModel
    from specdec.registry import BACKENDS
    from specdec.shapes import random_model
    from step_gpu import kernel_table

    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    res["steps"] = rows = []
    for shape, B, ctx in a.step_shapes:
        hf = random_model(shape, a.device, dtype)
        model = SpecdecModel(hf, None, BACKENDS.build(a.backend))
        d = model.dims
        cache, L, budget, kvt, steps = _step_inputs(model, B, ctx, a.gamma, dev)
        launch = getattr(model.backend, "_launch", None)
        kernels_fused = False
        for variant in a.variants:
            if elapsed() > a.budget_s:
                rows.append(dict(shape=shape, variant=variant, skipped="out of time"))
                continue
            model.disable_cuda_graphs()
            if variant in ("fused_projections", "fused_kernels") or (variant != "unfused" and not kernels_fused):
                model.fuse_projections(kernels="torch" if variant == "fused_projections" else a.kernels)
                kernels_fused = variant != "fused_projections"
            if kernels_fused:
                _fused_variant(model, variant)
            if launch is not None:  # the backend's launch; the legacy variant swaps in the pre-table sparse one
                model.backend._launch = launch
                if variant == LEGACY_VARIANT:
                    from specdec.cuda.triton_attention import SPARSE_LEGACY

                    bn, w, st, c, e, m = SPARSE_LEGACY
                    model.backend._launch = dataclasses.replace(launch, block_n=bn, num_warps=w, num_stages=st,
                                                                ctas_per_sm=c, v_early=e, min_tiles=m,
                                                                fused_combine=False)
                elif variant in (COMBINE_VARIANT, SPLIT_COMBINE_VARIANT):
                    model.backend._launch = dataclasses.replace(launch, fused_combine=True)
                elif variant in SPARSE_LAUNCH_VARIANTS:
                    bn, w, st, c, e, m, fc = SPARSE_LAUNCH_VARIANTS[variant]
                    model.backend._launch = dataclasses.replace(launch, block_n=bn, num_warps=w, num_stages=st,
                                                                ctas_per_sm=c, v_early=e, min_tiles=m,
                                                                fused_combine=fc)
            if a.graphs:
                model.enable_cuda_graphs()
            for name, (fn, nbytes) in steps.items():
                if variant in SPARSE_ONLY and not name.startswith("sparse"):
                    continue  # the launch only differs for sparse plans
                try:
                    t = timed(fn, dev)
                    row = dict(shape=shape, B=B, context=ctx, variant=variant, step=name, ms=t * 1e3,
                               roofline_ms=nbytes / bw * 1e3, over_roofline=t / (nbytes / bw),
                               predicted_ms=PREDICTED_MS.get((variant, name)) if shape == "llama-3.1-8b" else None,
                               layers=d.n_layers)
                    row["kernels"] = kernel_table(fn, top=24) if dev.type == "cuda" else launch_table(fn)
                    if dev.type == "cuda" and name.startswith("sparse"):  # the attention kernels of the step against copy bandwidth
                        att = row["kernels"]["categories"].get("attention", {}).get("us", 0.0)
                        att_bytes = B * budget * kvt + B * d.n_layers * d.n_kv_heads * budget * 8
                        row["attention_us"] = att
                        row["attention_share_of_copy_bw"] = att_bytes / (att * 1e-6) / bw if att else None
                except Exception:
                    row = dict(shape=shape, variant=variant, step=name, error=traceback.format_exc(limit=4))
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        if launch is not None:
            model.backend._launch = launch
        if kernels_fused:
            _fused_variant(model, "fused_kernels")
        try:
            if a.vegas_costs:
                res.setdefault("vegas_costs", {})[shape] = _vegas_costs(model, cache, L, B, budget, a.gamma, bw, dev)
            else:  # only the graph-replayed sparse attention of one layer
                res.setdefault("vegas_costs", {})[shape] = dict(
                    sparse_attention_one_layer=_sparse_layer_costs(model, cache, L, B, budget, bw, dev))
            print(json.dumps(res["vegas_costs"][shape]), flush=True)
        except Exception:
            res.setdefault("vegas_costs", {})[shape] = dict(error=traceback.format_exc(limit=4))
        if shape == "llama-3.1-8b":
            from specdec.shapes import compile_skip_reason

            # what `specdec bench --shape llama-3.1-8b` (compile on by default on CUDA) does at this shape
            res["compile_8b"] = compile_skip_reason(shape) or "torch.compile runs at this shape"
        del model, hf, cache, steps
        if dev.type == "cuda":
            import gc

            gc.collect()
            torch.cuda.empty_cache()


#: l14b, before measuring (2026-12-01, against the same run's PDL-off row): the sparse step's 305 launches have 162
#: Triton kernels (RMSNorm 65, RoPE + KV write 32, split-K attention 32, SiLU*mul 32, rotary 1), which launch with
#: PDL: 129 of them follow a cuBLAS GEMM that does not trigger early (gain: the launch processed during the GEMM's
#: tail, ~1.0 of the ~2.2 us gap), 32 (the attention) follow RoPE, which triggers at its start (~1.5 us each). The
#: 129 GEMMs after our kernels keep plain launches (cuBLAS' own). Predicted: -0.18 ms on each step kind (the same
#: kernels): sparse 6.05 -> 5.87 ms (1.265x of 4.64 ms), dense and verify -0.18 ms (-0.9 %, -0.8 %).
#: The launch chains (``_pdl_micro``), predicted: GEMM -> RMSNorm saves ~1.0 us per link, RMSNorm -> RMSNorm ~1.5 us.
PDL_PREDICTED_DELTA_MS = {"sparse5%_T1": -0.18, "dense_T1": -0.18, "verify_T5": -0.18}


def _replay_times(fn, dev, n: int) -> list[float]:
    """``n`` timed calls of ``fn`` (ms; CUDA events on a GPU, one synchronised call each; wall clock on the CPU)."""
    out = []
    for _ in range(n):
        if dev.type == "cuda":
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def _pdl_micro(dev, dtype, n: int, reps: int) -> dict:
    """Per-link cost of two chains of ``n`` dependent launches in one CUDA graph, PDL off vs on: ``gemm_rms`` (a cuBLAS
    GEMM of 16 rows by a 4096 x 4096 weight, then the RMSNorm kernel: does a PDL kernel after a GEMM that does not
    trigger early gain?) and ``rms_rms`` (RMSNorm after RMSNorm: both sides cooperate). Median of ``reps`` replays, in
    µs per link (one GEMM + one norm, or one norm). On the CPU: eager calls, tiny sizes (the smoke)."""
    from specdec.cuda.triton_fused import rms_norm
    from specdec.cuda.triton_pdl import set_pdl

    h = 4096 if dev.type == "cuda" else 64
    x = torch.randn(16, h, device=dev, dtype=dtype)
    w = torch.randn(h, h, device=dev, dtype=dtype) / h ** 0.5
    nw = torch.ones(h, device=dev, dtype=dtype)

    def gemm_rms():
        y = x
        for _ in range(n):
            y = rms_norm(y @ w.T, nw, 1e-5)
        return y

    def rms_rms():
        y = x
        for _ in range(n):
            y = rms_norm(y, nw, 1e-5)
        return y

    out = {}
    for name, fn in (("gemm_rms", gemm_rms), ("rms_rms", rms_rms)):
        res = {}
        for on in (False, True, False, True):  # each twice, interleaved: the second pair is the one kept
            set_pdl(on)
            try:
                fn()  # compile this variant outside the capture
                run = fn
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        last = fn()
                    run = g.replay
                ts = _replay_times(run, dev, reps)
                res["on" if on else "off"] = statistics.median(ts) * 1e3 / n
                if dev.type == "cuda":
                    res[f"equal_{'on' if on else 'off'}"] = bool(torch.equal(last, fn()))
            finally:
                set_pdl(None)
        res["saved_us_per_link"] = res["off"] - res["on"]
        out[name] = res
    return out


def part_pdl(a, res, bw):
    """l14b: programmatic dependent launch (``specdec.cuda.triton_pdl``) off vs on, the library's defaults otherwise.

    One model of the first step shape; each variant's three steps are captured in a CUDA-graph cache of their own
    (PDL is fixed at capture), then replayed interleaved: ``a.pdl_rounds`` rounds, each variant ``a.pdl_per_round``
    timed replays per step per round, the variants' order alternating. Median and min-max of all replays; the
    kernel count per step (torch.profiler); and whether each step's logits and KV cache are identical with PDL on
    and off (they must be: every PDL kernel waits for its predecessor before any load or store).
    """
    from specdec import SpecdecModel
    from specdec.cuda.triton_pdl import pdl_launch, set_pdl
    from specdec.registry import BACKENDS
    from specdec.shapes import random_model
    from step_gpu import kernel_table

    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    try:
        res["pdl_micro"] = _pdl_micro(dev, dtype, n=64 if dev.type == "cuda" else 2, reps=20 if dev.type == "cuda" else 1)
    except Exception:
        res["pdl_micro"] = dict(error=traceback.format_exc(limit=6))
    print("pdl micro:", json.dumps(res["pdl_micro"]), flush=True)
    shape, B, ctx = a.step_shapes[0]
    hf = random_model(shape, a.device, dtype)
    model = SpecdecModel(hf, None, BACKENDS.build(a.backend))
    model.fuse_projections(kernels=a.kernels)  # library defaults: GEMM splits, launch table, fused combine
    cache, L, budget, kvt, steps = _step_inputs(model, B, ctx, a.gamma, dev)
    out = res["pdl"] = dict(shape=shape, B=B, context=ctx, rows=[], parity={}, predicted_delta_ms=PDL_PREDICTED_DELTA_MS)
    variants = ("pdl_off", "pdl_on")
    graphs, logits, caches = {}, {}, {}
    for v in variants:
        try:
            set_pdl(v == "pdl_on")
            out[f"{v}_active"] = pdl_launch(dev)
            model.disable_cuda_graphs()
            if a.graphs:
                model.enable_cuda_graphs()
            for name, (fn, _) in steps.items():
                fn()  # warm-up (and capture, with graphs)
                fn()
                logits[v, name] = fn().float().clone()
                at, T = int(L[0]), a.gamma + 1 if name.startswith("verify") else 1  # the positions the step wrote
                caches[v, name] = torch.stack([c[i][:, :, at:at + T].float() for c in (cache.k, cache.v)
                                               for i in (0, -1)]).clone()  # keys and values, first and last layer
            graphs[v] = model._graphs
        except Exception:  # recorded; the other variant still runs
            out.setdefault("errors", {})[v] = traceback.format_exc(limit=6)
            print(f"pdl: {v} failed:", out["errors"][v], flush=True)
        finally:
            set_pdl(None)
    variants = tuple(v for v in variants if v in graphs)
    for name in (steps if len(variants) == 2 else ()):
        out["parity"][name] = dict(logits_equal=bool(torch.equal(logits["pdl_off", name], logits["pdl_on", name])),
                                   max_abs_diff=float((logits["pdl_off", name] - logits["pdl_on", name]).abs().max()),
                                   cache_equal=bool(torch.equal(caches["pdl_off", name], caches["pdl_on", name])))
    print(json.dumps(out["parity"]), flush=True)
    samples = {(v, n): [] for v in variants for n in steps}
    for r in range(a.pdl_rounds):
        if elapsed() > a.budget_s:
            out["stopped"] = f"out of time after {r} rounds"
            break
        for v in (variants if r % 2 == 0 else variants[::-1]):
            model._graphs = graphs[v]
            set_pdl(v == "pdl_on")  # (for eager runs: the graphs keep what they captured)
            for name, (fn, _) in steps.items():
                fn()  # one untimed replay after the switch
                samples[v, name] += _replay_times(fn, dev, a.pdl_per_round)
    set_pdl(None)
    for v in variants:
        model._graphs = graphs[v]
        set_pdl(v == "pdl_on")
        for name, (fn, nbytes) in steps.items():
            ts = samples[v, name]
            if not ts:
                continue
            row = dict(variant=v, step=name, ms=statistics.median(ts), min_ms=min(ts), max_ms=max(ts), n=len(ts),
                       roofline_ms=nbytes / bw * 1e3, over_roofline=statistics.median(ts) / (nbytes / bw * 1e3),
                       layers=model.dims.n_layers)
            try:
                row["kernels"] = kernel_table(fn, top=16) if dev.type == "cuda" else launch_table(fn)
            except Exception:
                row["kernels_error"] = traceback.format_exc(limit=3)
            out["rows"].append(row)
            print(json.dumps({k: x for k, x in row.items() if k != "kernels"}), flush=True)
    set_pdl(None)
    model.disable_cuda_graphs()
    graphs.clear()
    del model, hf, cache, steps
    if dev.type == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()


def pdl_md(p: dict) -> list[str]:
    """The ``pdl`` part's section of ``issue14.md``."""
    errs = [f"- {v} failed: {e.strip().splitlines()[-1]}" for v, e in p.get("errors", {}).items()]
    out = ["## Programmatic dependent launch off vs on (interleaved graph replays)", "", *errs, "",
           f"{p['shape']}, B {p['B']} × {p['context']}; PDL active: off-run {p.get('pdl_off_active')}, "
           f"on-run {p.get('pdl_on_active')}. {p.get('stopped', '')}", "",
           "| step | PDL | ms (median) | min–max | n | × roofline | Δ vs off ms | predicted Δ ms | kernels | kernel ms | "
           "gaps ms | logits / cache equal |", "|" + "---|" * 12]
    off = {r["step"]: r["ms"] for r in p["rows"] if r["variant"] == "pdl_off"}
    for r in p["rows"]:
        kt = r.get("kernels") or {}
        n = kt.get("kernels_per_call")
        kms = kt.get("kernel_us_per_call", 0.0) / 1e3
        on = r["variant"] == "pdl_on"
        d = f"{r['ms'] - off[r['step']]:+.3f}" if on and r["step"] in off else ""
        pred = p["predicted_delta_ms"].get(r["step"]) if on else None
        par = p["parity"].get(r["step"], {})
        gaps = "" if n is None else f"{r['ms'] - kms:.2f}"
        out.append(f"| {r['step']} | {'on' if on else 'off'} | {r['ms']:.3f} | {r['min_ms']:.3f}–{r['max_ms']:.3f} | "
                   f"{r['n']} | {r['over_roofline']:.3f}× | {d} | {'' if pred is None else f'{pred:+.2f}'} | "
                   f"{'' if n is None else f'{n:.0f}'} | {kms:.2f} | {gaps} | "
                   f"{par.get('logits_equal')} / {par.get('cache_equal')} |")
    return out + [""]


def part_replay(a, res):
    from specdec.bench import run_bench

    if a.traces:  # recorded earlier (--traces): no embedded model needed
        from specdec.adaptive import AcceptanceReplay

        res["traces"] = {k: dict(file=v, tau=1.0 + AcceptanceReplay.load(v).mean_accepted,
                                 rounds=len(json.loads(Path(v).read_text())["rounds"])) for k, v in a.traces.items()}
    traces = {k: v["file"] for k, v in res.get("traces", {}).items() if "file" in v}
    if not traces:
        raise RuntimeError("no traces (part 'traces' did not run or failed; or pass --traces)")
    shape, B, ctx = a.replay_shape
    res["replay"] = run_bench(["dense", "magicdec", "vegas"], [ctx], [B], ["random"], a.replay_new, None, a.ratio,
                              a.gamma, "random", a.backend, a.dtype, a.device, False, Path(a.out), "replay_8b",
                              cuda_graphs=a.graphs, fuse=True, warmup=True, repeats=a.repeats, shape=shape,
                              acceptance_trace=traces)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/model/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: check the script, not the numbers")
    ap.add_argument("--parts", default="traces,steps,replay,e2e")
    ap.add_argument("--pdl-rounds", type=int, default=5, help="'pdl': interleaved rounds (off, on, on, off, ...)")
    ap.add_argument("--pdl-per-round", type=int, default=4, help="'pdl': timed replays per step, variant and round")
    ap.add_argument("--budget-s", type=float, default=500.0, help="no part starts after this many seconds")
    ap.add_argument("--step-shapes", dest="only_shapes", default=None,
                    help="comma list of the 'steps' part's shapes to run (default: all of the mode)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"'steps' variants, from {', '.join(VARIANTS)}")
    ap.add_argument("--no-vegas-costs", dest="vegas_costs", action="store_false",
                    help="'steps': skip the verify/score timings, keep the graph-replayed sparse layer")
    ap.add_argument("--traces", default=None,
                    help="'replay' from recorded traces instead of part 'traces': METHOD=FILE,METHOD=FILE "
                         "(e.g. benchmarks/results/traces/smollm2_8k_vegas_trace_2026-12-01.json)")
    a = ap.parse_args()
    if a.traces:
        pairs = [t.split("=", 1) for t in a.traces.split(",") if t]
        bad = [t for t in pairs if len(t) != 2 or not Path(t[1]).is_file()]
        if bad:
            ap.error(f"--traces wants METHOD=FILE pairs of existing files, comma separated; got {a.traces!r}")
        a.traces = dict(pairs)
    a.variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {bad}; choose from {', '.join(VARIANTS)}")
    Path(a.out).mkdir(parents=True, exist_ok=True)
    a.gamma, a.ratio = 4, 0.05
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.new, a.batches, a.repeats, a.trace_batch = 300, 8, [1, 2], 2, 2
        a.step_shapes = [("tiny", 2, 256)]
        # the fused Triton kernels under the interpreter when TRITON_INTERPRET=1 (else the torch code)
        a.kernels = "triton" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "auto"
        a.replay_shape, a.replay_new = ("tiny", 2, 256), 8
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context, a.new, a.batches, a.repeats, a.trace_batch = 8000, 64, [1, 16, 64], 3, 4
        a.step_shapes = [("llama-3.1-8b", 16, 32768), ("smollm2-135m", 64, 8000)]
        a.kernels = "auto"
        # 64 new tokens: the whole recorded traces (64 tokens each), so the replayed τ is the recorded one
        a.replay_shape, a.replay_new = ("llama-3.1-8b", 16, 32768), 64
    if a.only_shapes:
        keep = a.only_shapes.split(",")
        a.step_shapes = [s for s in a.step_shapes if s[0] in keep]
        if not a.step_shapes:
            ap.error(f"--step-shapes {a.only_shapes!r} matches none of this mode's shapes")
    from e2e_gpu import copy_bandwidth
    import transformers

    global _FORWARD_ADD
    _FORWARD_ADD = _forward_add()

    bw = copy_bandwidth() if a.device == "cuda" else 20e9
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               transformers=transformers.__version__, copy_GBps=bw / 1e9, args={k: str(v) for k, v in vars(a).items()},
               gpu=torch.cuda.get_device_name() if a.device == "cuda" else None, parts={})
    path = Path(a.out) / "issue14.json"
    for part in a.parts.split(","):
        if elapsed() > a.budget_s:
            res["parts"][part] = "skipped: out of time"
            continue
        t = time.perf_counter()
        try:
            {"traces": part_traces, "e2e": part_e2e, "steps": lambda a, r: part_steps(a, r, bw),
             "replay": part_replay, "pdl": lambda a, r: part_pdl(a, r, bw)}[part](a, res)
            res["parts"][part] = f"ok in {time.perf_counter() - t:.0f} s"
        except Exception:
            res["parts"][part] = "error: " + traceback.format_exc(limit=6)
        print(part, res["parts"][part][:2000], flush=True)
        path.write_text(json.dumps(res, indent=2, default=str))
        (Path(a.out) / "issue14.md").write_text(report_md(res))
        if a.device == "cuda":  # the 8B shape's model + cache (~85 GB) must be gone before the next part
            import gc

            gc.collect()
            torch.cuda.empty_cache()
    path.write_text(json.dumps(res, indent=2, default=str))
    (Path(a.out) / "issue14.md").write_text(report_md(res))


def report_md(res: dict) -> str:
    """``issue14.md``: the step table (time, roofline, prediction, launches per layer, kernel categories),
    the kernel table of each sparse step, the replayed rows, torch.compile and the parts' status."""
    out = [f"# Issue 14 on {res.get('gpu') or 'the CPU (smoke)'} ({res['date']})", "",
           f"torch {res['torch']}, transformers {res['transformers']}; copy bandwidth {res['copy_GBps']:.0f} GB/s "
           "(read + write of a 2 GiB copy_); step times: medians of 15 graph replays (CUDA events); kernels: "
           "torch.profiler, per call.", ""]
    steps = [r for r in res.get("steps", []) if "ms" in r]
    if steps:
        out += ["## One step", "",
                "| shape | B × ctx | variant | step | ms | × split2 (same run) | roofline ms | × roofline | predicted ms | "
                "kernels | per layer | kernel ms | gaps ms | gemm | attention | other | torch elementwise |",
                "|" + "---|" * 17]
        ref = {(r["shape"], r["step"]): r["ms"] for r in steps if r["variant"] == "fused_kernels_split2"}
        for r in steps:
            base = ref.get((r["shape"], r["step"]))
            rel = "" if base is None else f"{r['ms'] / base:.3f}"
            kt = r.get("kernels") or {}
            cats = kt.get("categories", {})
            cell = lambda c: (f"{cats[c]['count']:.0f} / {cats[c]['us'] / 1e3:.2f} ms" if c in cats else "")  # noqa: E731
            n = kt.get("kernels_per_call")
            kms = kt.get("kernel_us_per_call", 0) / 1e3
            pred = r.get("predicted_ms")
            pred_s = "" if pred is None else f"{pred:.2f}"
            n_s = "" if n is None else f"{n:.0f}"
            per_layer = "" if n is None else f"{n / r['layers']:.1f}"
            gaps = "" if n is None else f"{r['ms'] - kms:.2f}"
            out.append(f"| {r['shape']} | {r['B']} × {r['context']} | {r['variant']} | {r['step']} | {r['ms']:.2f} | "
                       f"{rel} | {r['roofline_ms']:.2f} | {r['over_roofline']:.3f}× | {pred_s} | {n_s} | {per_layer} | "
                       f"{kms:.2f} | {gaps} | {cell('gemm')} | {cell('attention')} | {cell('other')} | "
                       f"{cell('torch_elementwise')} |")
        out.append("")
        for r in steps:
            if not r["step"].startswith("sparse") or not r.get("kernels"):
                continue
            out += [f"### Kernels of the sparse step, {r['shape']}, {r['variant']} ({r['ms']:.2f} ms)", "",
                    "| kernel | per call | µs per call |", "|---|---|---|"]
            out += [f"| `{k['name']}` | {k['count']:.0f} | {k['us']:.1f} |" for k in r["kernels"]["top"]]
            out.append("")
    if res.get("pdl", {}).get("rows") or res.get("pdl", {}).get("errors"):
        out += pdl_md(res["pdl"])
    if res.get("pdl_micro"):
        mic = res["pdl_micro"]
        out += ["### Launch chains in one CUDA graph, µs per link (64 links, median of 20 replays)", ""]
        if "error" in mic:
            out += [f"- failed: {mic['error'].strip().splitlines()[-1]}"]
        else:
            out += ["| chain | PDL off | PDL on | saved per link | results equal (off / on vs eager) |",
                    "|---|---|---|---|---|"]
            out += [f"| {k} | {v['off']:.2f} | {v['on']:.2f} | {v['saved_us_per_link']:+.2f} | "
                    f"{v.get('equal_off')} / {v.get('equal_on')} |" for k, v in mic.items()]
        out.append("")
    errs = [r for r in res.get("steps", []) if "error" in r or "skipped" in r]
    for r in errs:
        out += [f"- {r.get('shape')} {r.get('variant')} {r.get('step', '')}: "
                f"{r.get('skipped') or r['error'].strip().splitlines()[-1]}"]
    if res.get("replay"):
        rows = res["replay"]
        out += ["", "## Replayed rows (random-weight model of the shape; acceptance replayed from the embedded "
                "model's recorded runs, part `traces`)", "",
                "| context | B | method | τ | tok/s (min–max) | × dense |", "|---|---|---|---|---|---|"]
        for r in rows:
            sp = r.get("speedup_vs_dense")
            label = r["method"] + (" (replayed)" if r.get("replayed") else "")
            sp_s = "" if sp is None else f"{sp:.2f}×"
            out.append(f"| {r['context']} | {r['batch']} | {label} | {r['tau']:.2f} | {r['tokens_per_second']:.1f} "
                       f"({r.get('tokens_per_second_min', 0):.1f}–{r.get('tokens_per_second_max', 0):.1f}) | {sp_s} |")
        tps = {r["method"]: r["tokens_per_second"] for r in rows}
        if "vegas" in tps and "magicdec" in tps:
            out.append(f"\nvegas / magicdec = {tps['vegas'] / tps['magicdec']:.3f}")
    if res.get("traces"):
        out += ["", "Traces: " + ", ".join(f"{k} τ {v['tau']:.2f} over {v['rounds']} rounds"
                                           for k, v in res["traces"].items())]
    if "compile_8b" in res:
        out += ["", f"torch.compile at the 8B shape: {res['compile_8b']}"]
    out += ["", "Parts: " + "; ".join(f"{k}: {v.splitlines()[0][:200]}" for k, v in res["parts"].items()), ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
