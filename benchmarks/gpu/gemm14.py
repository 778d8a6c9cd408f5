"""The fused-GEMM decoder layer on the GPU (``specdec.fusion.FUSED_GEMM``): per step, then end to end.

    timeout 500 python3 benchmarks/gpu/gemm14.py --out $OUT/gemm14 --budget-s 450   # H200 (/tmp/m/smol.gguf)
    python3 benchmarks/gpu/gemm14.py --out /tmp/gemm14 --smoke                       # CPU, TRITON_INTERPRET=1

Parts (each saved as it finishes to ``<out>/gemm14.json`` + ``.md``; none starts after ``--budget-s``):

0. ``kernels``: the two fused kernels alone against the per-kernel chains they replace (norm + split QKV GEMM +
   RoPE/write; norm + gate/up GEMM + SiLU·mul) at SmolLM2's layer, 1 / 16 / 64 / 144 / 576 rows, per launch
   configuration (``CONFIGS``), 20 calls per CUDA graph; ``--apply-best`` runs the later parts with the fastest
   configuration at 64 rows and ``FUSED_GEMM_MAX_ROWS`` at the most rows up to which the fused pair was faster.
1. ``steps``: random-weight models (bf16, triton, fused projections + kernels, library defaults otherwise) at
   SmolLM2-135M B 64 / 16 / 1 x 8k and Llama-3.1-8B B 16 x 32k; a cache of random K/V, the three steps
   ``benchmarks/gpu/issue14.py`` times (dense T 1, sparse 5 % T 1 at random positions, verify T γ+1). Two arms,
   ``off`` (``FUSED_GEMM = False``: norm, GEMM, RoPE + write / SiLU·mul kernels) and ``on`` (``True``; at the 8B
   shape with ``FUSED_GEMM_MAX_HIDDEN`` raised so it applies), each step captured in a CUDA graph per arm, the arms'
   replays interleaved over ``--rounds`` rounds; medians with min-max, each against its roofline (weights + the KV
   the step reads at 4.2 TB/s... measured copy bandwidth), the kernels per step (torch.profiler), and parity: the
   largest |logit difference| on vs off and whether the argmax tokens agree.
``--switch loop`` makes the arms ``specdec.cuda.triton_attention.FAST_LOOP`` off / on instead (the split-K attention
kernel's tile loop: the masked loop in natural units vs the log2-unit loop with unmasked whole tiles) for the
``steps`` and ``e2e`` parts.

2. ``e2e``: the embedded model (bf16, triton, graphs, fused, no compile, adaptive off) through
   ``specdec.bench.run_bench`` at B 64 x 8k over 4 windows of each document, γ 8, 5 %, 128 new tokens, warm-up +
   median of 3: dense, magicdec, vegas per arm (``off`` / ``on``); each arm's tokens are checked against its dense.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "benchmarks"))

import script_io  # noqa: E402
from issue14 import _replay_times  # noqa: E402
import torch  # noqa: E402

T0 = time.perf_counter()
SHAPES = [("smollm2-135m", 64, 8000), ("smollm2-135m", 16, 8000), ("smollm2-135m", 1, 8000), ("llama-3.1-8b", 16, 32768)]
SMOKE_SHAPES = [("tiny", 3, 200)]
#: before measuring (2026-12-02), SmolLM2 B 64 x 8k: each layer loses 4 launches (input norm, RoPE + write, post
#: norm, SiLU·mul: ~2.5 us each + ~2 us of gap) and its qkv and gate/up GEMMs (cuBLAS, ~4 us) become Triton GEMMs of
#: unknown speed (taken at +1 us each): -(4 x 4.5 - 2) us x 30 layers = -0.48 ms on every step kind: sparse draft
#: 1.56 -> ~1.08 ms, dense 4.3 -> ~3.8 ms. Verify at 576 rows: each program re-reads its rows (2 passes, 3 loads)
#: from L2: 15 + 24 programs x 2 MB per layer: no gain predicted there (maybe a loss). The 8B shape: launches are
#: ~10 % of a sparse step there and the GEMMs are weight-bound; predicted within +-3 % (GEMM speed decides).
PREDICTED_MS = {("smollm2-135m", 64, "sparse5%_T1"): 1.08}


def elapsed() -> float:
    return time.perf_counter() - T0


class _Gemm:
    """``fusion.FUSED_GEMM`` (and the hidden-size limit) for a block, restored after."""

    def __init__(self, on, max_hidden=None):
        self.on, self.max_hidden = on, max_hidden

    def __enter__(self):
        from specdec import fusion

        self.saved = fusion.FUSED_GEMM, fusion.FUSED_GEMM_MAX_HIDDEN
        fusion.FUSED_GEMM = self.on
        if self.max_hidden is not None:
            fusion.FUSED_GEMM_MAX_HIDDEN = self.max_hidden

    def __exit__(self, *exc):
        from specdec import fusion

        fusion.FUSED_GEMM, fusion.FUSED_GEMM_MAX_HIDDEN = self.saved


class _Loop:
    """``triton_attention.FAST_LOOP`` (the split-K kernel's tile loop, ``--switch loop``) for a block, restored
    after; the ``max_hidden`` argument is ignored (the arms' signature of :class:`_Gemm`)."""

    def __init__(self, on, max_hidden=None):
        self.on = bool(on)

    def __enter__(self):
        from specdec.cuda import triton_attention

        self.saved = triton_attention.FAST_LOOP
        triton_attention.FAST_LOOP = self.on

    def __exit__(self, *exc):
        from specdec.cuda import triton_attention

        triton_attention.FAST_LOOP = self.saved


#: what the arms switch (``--switch``): the fused-GEMM layer, or the attention kernel's tile loop
SWITCHES = {"gemm": _Gemm, "loop": _Loop}
SWITCH = _Gemm


#: launch configurations the ``kernels`` part tries: (block_m, block_k, num_warps, num_stages, block_n)
CONFIGS = [(16, 64, 4, None, 64), (16, 128, 4, None, 64), (32, 64, 4, None, 64), (64, 64, 4, None, 64),
           (16, 64, 2, None, 64), (16, 128, 2, None, 64), (16, 64, 4, 2, 64), (16, 64, 4, 4, 64),
           (16, 256, 4, None, 64), (32, 128, 4, None, 64), (16, 64, 4, None, 32), (16, 128, 4, None, 128),
           (16, 128, 8, None, 128), (64, 128, 8, None, 64)]


def _graph_time(fn, dev, calls=20, reps=15) -> float:
    """µs per call of ``fn`` replayed ``calls`` times back to back in one CUDA graph (median of ``reps`` replays);
    on the CPU one eager call."""
    if dev.type != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return statistics.median(_replay_times(g.replay, dev, reps)) * 1e3 / calls


def kernels_part(a, dev, log) -> dict:
    """The two fused kernels alone against the per-kernel chains they replace, at SmolLM2's layer (hidden 576,
    9 + 3 + 3 heads of 64, intermediate 1536), input = 2 split partials + a residual, per row count and launch
    configuration (:data:`CONFIGS`); returns the rows and the configuration fastest at 64 rows."""
    import torch.nn.functional as F

    from specdec.cuda import triton_gemm as tg
    from specdec.cuda.triton_fused import rms_norm, rope_qkv_write, silu_mul, split_linear

    dtype = torch.float32 if a.smoke else torch.bfloat16
    K, Hq, Hkv, D, I, L = (64, 4, 2, 16, 128, 64) if a.smoke else (576, 9, 3, 64, 1536, 8192)
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *sh: torch.randn(*sh, generator=g, device=dev).to(dtype)  # noqa: E731
    wq, wgu, nw = rnd((Hq + 2 * Hkv) * D, K) / K ** 0.5, rnd(2 * I, K) / K ** 0.5, 1 + 0.1 * rnd(K)
    out = dict(rows=[], configs=[list(c) for c in CONFIGS])
    saved = dict(tg.TUNE)
    best = {}
    for M, T in ((1, 1), (18, 9)) if a.smoke else ((1, 1), (16, 1), (64, 1), (144, 9), (576, 9)):
        B = M // T
        parts, res = rnd(2, B, T, K), rnd(B, T, K)
        ang = torch.rand(B, T, D // 2, generator=g, device=dev) * 6
        cos, sin = (torch.cat([f(ang)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
        kc = torch.zeros(2, B, Hkv, L, D, device=dev, dtype=dtype)
        vc = torch.zeros_like(kc)
        lens = torch.full((B,), L // 2, device=dev)

        def ref_qkv():
            h, r = rms_norm(parts, nw, 1e-5, residual=res, splits=2)
            p = split_linear(h, wq, 2)
            q, k, v = p[0].split([Hq * D, Hkv * D, Hkv * D], -1)
            return rope_qkv_write(q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D), cos, sin, kc[0],
                                  vc[0], lens, splits=2, split_stride=p.stride(0))

        def ref_gu():
            h, r = rms_norm(parts, nw, 1e-5, residual=res, splits=2)
            return silu_mul(F.linear(h, wgu))

        row = dict(M=M, T=T, ref_qkv_us=_graph_time(ref_qkv, dev), ref_gu_us=_graph_time(ref_gu, dev), fused={})
        want_q, want_a = ref_qkv().float(), ref_gu().float()
        for cfg in CONFIGS:
            tg.TUNE.update(block_m=cfg[0], block_k=cfg[1], num_warps=cfg[2], num_stages=cfg[3], block_n=cfg[4])
            try:
                fq = lambda: tg.norm_qkv_rope_write(parts, nw, 1e-5, wq, None, cos, sin, kc[1], vc[1], lens, Hq,  # noqa: E731
                                                    residual=res, splits=2)
                fg = lambda: tg.norm_gate_up_silu(parts, nw, 1e-5, wgu, residual=res, splits=2)  # noqa: E731
                dq = float((fq()[0].float() - want_q).abs().max())
                da = float((fg()[0].float() - want_a).abs().max())
                row["fused"][str(cfg)] = dict(qkv_us=_graph_time(fq, dev), gu_us=_graph_time(fg, dev), dq=dq, da=da)
            except Exception:
                row["fused"][str(cfg)] = dict(error=traceback.format_exc(limit=3))
            if a.smoke:
                break
        ok = {c: v for c, v in row["fused"].items() if "qkv_us" in v}
        if ok:
            bq = min(ok, key=lambda c: ok[c]["qkv_us"])
            bg = min(ok, key=lambda c: ok[c]["gu_us"])
            bt = min(ok, key=lambda c: ok[c]["qkv_us"] + ok[c]["gu_us"])
            row.update(best_qkv=[bq, ok[bq]["qkv_us"]], best_gu=[bg, ok[bg]["gu_us"]], best_total=[bt, ok[bt]["qkv_us"] + ok[bt]["gu_us"]])
            if M == 64:
                chosen = next(c for c in CONFIGS if str(c) == bt)
                best = dict(zip(("block_m", "block_k", "num_warps", "num_stages", "block_n"), chosen))
            row["fused_pair_faster"] = ok[bt]["qkv_us"] + ok[bt]["gu_us"] < row["ref_qkv_us"] + row["ref_gu_us"]
        out["rows"].append(row)
        log(json.dumps({k: v for k, v in row.items() if k != "fused"}))
        if elapsed() > a.budget_s / 3:
            break
    tg.TUNE.clear()
    tg.TUNE.update(saved)
    out["best_at_64_rows"] = best
    rows_ok = 0  # the most rows up to which the best fused pair beat the chains at every measured row count
    for r in out["rows"]:
        if not r.get("fused_pair_faster"):
            break
        rows_ok = r["M"]
    out["max_rows_faster"] = rows_ok
    return out


def steps_shape(shape, B, ctx, a, dev, bw, log) -> list[dict]:
    from issue14 import _step_inputs

    from specdec import SpecdecModel
    from specdec.registry import BACKENDS
    from specdec.shapes import random_model

    dtype = torch.float32 if a.smoke else torch.bfloat16
    hf = random_model(shape, dev.type, dtype)
    model = SpecdecModel(hf, None, BACKENDS.build("reference" if a.smoke else "triton"))
    model.fuse_projections(kernels="triton" if a.smoke else "auto")
    cache, L, budget, kvt, steps = _step_inputs(model, B, ctx, a.gamma, dev)
    arms = {"off": SWITCH(False), "on": SWITCH("always" if a.smoke else True, max_hidden=1 << 16)}
    graphs, logits, kernels = {}, {}, {}
    for arm, flag in arms.items():
        with flag:
            model.disable_cuda_graphs()
            if not a.smoke:
                model.enable_cuda_graphs()
            for name, (fn, _) in steps.items():
                for _ in range(0 if a.smoke else 2):  # warm-up (the smoke's interpreter has nothing to warm)
                    fn()
                logits[arm, name] = fn().float().clone()
                if dev.type == "cuda":
                    from step_gpu import kernel_table

                    kernels[arm, name] = kernel_table(fn, top=8)
            graphs[arm] = model._graphs
    samples = {(arm, n): [] for arm in arms for n in steps}
    for r in range(a.rounds):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            model._graphs = graphs[arm]
            with arms[arm]:
                for name, (fn, _) in steps.items():
                    fn()
                    samples[arm, name] += _replay_times(fn, dev, a.per_round)
    rows = []
    for name, (fn, nbytes) in steps.items():
        row = dict(shape=shape, B=B, context=ctx, step=name, roofline_ms=nbytes / bw * 1e3,
                   predicted_on_ms=PREDICTED_MS.get((shape, B, name)))
        for arm in arms:
            ts = samples[arm, name]
            row[arm] = dict(ms=statistics.median(ts), min_ms=min(ts), max_ms=max(ts), n=len(ts))
            if (arm, name) in kernels:
                k = kernels[arm, name]
                row[arm].update(kernels=k["kernels_per_call"], kernel_us=k["kernel_us_per_call"], top=k["top"])
        a_, b_ = logits["off", name], logits["on", name]
        row.update(on_over_off=row["on"]["ms"] / row["off"]["ms"], max_abs_logit_diff=float((a_ - b_).abs().max()),
                   argmax_agree=float((a_.argmax(-1) == b_.argmax(-1)).float().mean()))
        rows.append(row)
        log(json.dumps({k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "top"})
                        for k, v in row.items()}))
    model.disable_cuda_graphs()
    graphs.clear()
    return rows


def e2e(a, dev, log) -> list[dict]:
    from specdec.bench import run_bench

    smoke = a.smoke
    _, common = script_io.e2e_settings(a.gguf, dev, smoke, batch=a.e2e_batch)
    rows = []
    for spec in a.docs.split(","):
        doc = script_io.document(spec, Path(a.out))
        arms = a.arms.split(",")
        for rnd, arm in [(r, x) for r in range(a.e2e_rounds) for x in (arms if r % 2 == 0 else arms[::-1])]:
            if elapsed() > a.budget_s:
                rows.append(dict(document=spec, arm=arm, round=rnd, skipped="budget"))
                continue
            try:
                script_io.fresh_graphs(common)
                with SWITCH(False if arm == "off" else ("always" if smoke else True)):
                    res = run_bench(["dense", "magicdec", "vegas"], documents=[doc], tag=f"gemm14_{len(rows)}",
                                    **common)
                for r in res:
                    ph = r.get("phase_seconds") or {}
                    it = r.get("iterations") or 1
                    rows.append(dict(document=spec, arm=arm, round=rnd, method=r.get("method"),
                                     tok_s=r.get("tokens_per_second"), tok_s_min=r.get("tokens_per_second_min"),
                                     tok_s_max=r.get("tokens_per_second_max"), tau=r.get("tau"), iterations=it,
                                     same_tokens=r.get("same_tokens_as_dense"),
                                     draft_ms_per_iter=1e3 * ph.get("draft", 0.0) / it,
                                     verify_ms_per_iter=1e3 * ph.get("verify", 0.0) / it))
                    log(f"e2e {rows[-1]}")
            except Exception:
                rows.append(dict(document=spec, arm=arm, round=rnd, error=traceback.format_exc()))
                log(rows[-1]["error"])
    return rows


def markdown(res) -> str:
    what = {"gemm": "The fused-GEMM decoder layer", "loop": "The split-K attention kernel's fast tile loop"}
    L = [f"# {what[res.get('switch', 'gemm')]}: off vs on ({res['date']}, {res['gpu']})", "",
         f"Command: `{res['argv']}`", ""]
    if res.get("kernels"):
        L += ["## The fused kernels alone (µs per call, 20 calls in one CUDA graph) vs the chains they replace", "",
              "| rows | chain norm+qkv+rope | best fused qkv (config) | chain norm+gate/up+silu | best fused gate/up "
              "(config) | best pair (config) |", "|---|---|---|---|---|---|"]
        for r in res["kernels"]["rows"]:
            b = lambda k: f"{r[k][1]:.2f} {r[k][0]}" if k in r else "-"  # noqa: E731
            L.append(f"| {r['M']} | {r['ref_qkv_us']:.2f} | {b('best_qkv')} | {r['ref_gu_us']:.2f} | {b('best_gu')} | "
                     f"{b('best_total')} |")
        L += ["", "Configurations: (block_m, block_k, num_warps, num_stages, block_n).", ""]
    if res.get("steps"):
        L += ["## Steps (CUDA graphs, arms interleaved; ms median (min–max); kernels per step)", "",
              "| shape | B × ctx | step | off | on | on / off | roofline | kernels off → on | max Δlogit | argmax agree |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["steps"]:
            if "step" not in r:
                L.append(f"| {r.get('shape')} | | {r.get('skipped') or 'error'} | | | | | | | |")
                continue
            f = lambda x: f"{x['ms']:.3f} ({x['min_ms']:.3f}–{x['max_ms']:.3f})"  # noqa: E731
            k = f"{r['off'].get('kernels', 0):.0f} → {r['on'].get('kernels', 0):.0f}"
            L.append(f"| {r['shape']} | {r['B']} × {r['context']} | {r['step']} | {f(r['off'])} | {f(r['on'])} | "
                     f"{r['on_over_off']:.3f} | {r['roofline_ms']:.3f} | {k} | {r['max_abs_logit_diff']:.3g} | "
                     f"{r['argmax_agree']:.3f} |")
        L.append("")
    if res.get("e2e"):
        L += ["## End to end, B × 8k, 4 windows, γ 8, 5 %", "",
              "| document | arm | method | τ | iterations | tok/s (min–max) | × dense (same arm) | on / off | "
              "draft ms/iter | verify ms/iter | same tokens |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        tok = {(r["document"], r.get("round", 0), r["arm"], r["method"]): r["tok_s"] for r in res["e2e"]
               if "method" in r}
        for r in res["e2e"]:
            if "method" not in r:
                L.append(f"| {r['document']} | {r['arm']} | {r.get('skipped') or 'error'} | | | | | | | | |")
                continue
            d = tok.get((r["document"], r.get("round", 0), r["arm"], "dense"))
            o = tok.get((r["document"], r.get("round", 0), "off", r["method"]))
            L.append(f"| {r['document']} | {r['arm']} | {r['method']} | {r['tau']:.2f} | {r['iterations']} | "
                     f"{r['tok_s']:.0f} ({r['tok_s_min']:.0f}–{r['tok_s_max']:.0f}) | "
                     f"{r['tok_s'] / d:.3f} | {r['tok_s'] / o if o else float('nan'):.3f} | {r['draft_ms_per_iter']:.3f} | "
                     f"{r['verify_ms_per_iter']:.3f} | {r['same_tokens']} |")
        paired = {}
        for r in res["e2e"]:
            if "method" in r and r["arm"] == "on":
                off = [x for x in res["e2e"] if x.get("method") == r["method"] and x["document"] == r["document"]
                       and x.get("round") == r.get("round") and x["arm"] == "off"]
                if off:
                    paired.setdefault((r["document"], r["method"]), []).append(r["tok_s"] / off[0]["tok_s"])
        if paired:
            L += ["", "Paired on / off per round (the arms alternate their order round by round):", "",
                  "| document | method | on / off per round | median |", "|---|---|---|---|"]
            for (doc, meth), v in paired.items():
                L.append(f"| {doc} | {meth} | {', '.join(f'{x:.3f}' for x in v)} | {statistics.median(v):.3f} |")
    return "\n".join(L) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--budget-s", type=float, default=450)
    ap.add_argument("--parts", default="kernels,steps,e2e")
    ap.add_argument("--shapes", default=None, help="comma-separated indices into the step shapes (default: all)")
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--docs", default="stdlib:ssl,stdlib:inspect",
                    help="documents of the e2e part: built-in names, paths, or prose:<package> (its docstrings)")
    ap.add_argument("--arms", default="off,on", help="arms of the e2e part")
    ap.add_argument("--e2e-batch", type=int, default=64)
    ap.add_argument("--e2e-rounds", type=int, default=1, help="rounds of the e2e arms, their order alternating")
    ap.add_argument("--max-rows", type=int, default=None, help="fusion.FUSED_GEMM_MAX_ROWS for the on arms")
    ap.add_argument("--apply-best", action="store_true",
                    help="run the steps and e2e parts with the kernels part's fastest configuration at 64 rows")
    ap.add_argument("--switch", choices=sorted(SWITCHES), default="gemm",
                    help="what the off / on arms switch: gemm (specdec.fusion.FUSED_GEMM) or loop "
                         "(specdec.cuda.triton_attention.FAST_LOOP, the attention kernel's tile loop)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    global SWITCH
    SWITCH = SWITCHES[a.switch]
    dev = torch.device("cpu" if a.smoke else "cuda")
    if a.smoke:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
        a.rounds, a.per_round, a.docs = 1, 1, "stdlib:ssl"
        torch.set_num_threads(1)
    out = Path(a.out)
    res, log, save = script_io.record(out, "gemm14", a, dev, markdown, T0)
    res["switch"] = a.switch

    parts = a.parts.split(",")
    if a.max_rows is not None:
        from specdec import fusion

        fusion.FUSED_GEMM_MAX_ROWS = a.max_rows
    if "kernels" in parts:
        res["kernels"] = kernels_part(a, dev, log)
        save()
        if a.apply_best and res["kernels"]["best_at_64_rows"]:
            from specdec.cuda import triton_gemm

            from specdec import fusion

            triton_gemm.TUNE.update(res["kernels"]["best_at_64_rows"])
            fusion.FUSED_GEMM_MAX_ROWS = max(1, res["kernels"]["max_rows_faster"])
            log(f"TUNE for the next parts: {triton_gemm.TUNE}, FUSED_GEMM_MAX_ROWS {fusion.FUSED_GEMM_MAX_ROWS}")
    if "steps" in parts:
        bw = 4.2e12
        if dev.type == "cuda":
            x = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
            y = torch.empty_like(x)
            y.copy_(x)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                y.copy_(x)
            e.record()
            torch.cuda.synchronize()
            bw = 2 * 10 * x.numel() / (s.elapsed_time(e) / 1e3)
            del x, y
        res["copy_GBps"] = bw / 1e9
        res["steps"] = []
        shapes = SMOKE_SHAPES if a.smoke else SHAPES
        if a.shapes and not a.smoke:
            shapes = [shapes[int(i)] for i in a.shapes.split(",")]
        for shape, B, ctx in shapes:
            if elapsed() > a.budget_s:
                res["steps"].append(dict(shape=shape, skipped="budget"))
                continue
            try:
                res["steps"] += steps_shape(shape, B, ctx, a, dev, bw, log)
            except Exception:
                res["steps"].append(dict(shape=shape, error=traceback.format_exc()))
                log(res["steps"][-1]["error"])
            if dev.type == "cuda":
                import gc

                gc.collect()
                torch.cuda.empty_cache()
            save()
    if "e2e" in parts:
        res["e2e"] = e2e(a, dev, log)
        save()
    save()
    print(markdown(res))


if __name__ == "__main__":
    main()
