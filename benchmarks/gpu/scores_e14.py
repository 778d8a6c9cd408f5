"""Vegas' score emission and selection on the H200 (issue 14 item 4, issue 18's "verify + scores >= FlashInfer").

    python3 benchmarks/gpu/scores_e14.py --out $OUT --budget-s 150
    python3 benchmarks/gpu/scores_e14.py --smoke --out /tmp/scores_e14     # CPU, interpreter, < 2 min

One layer's verify (γ + 1 = 5 rows, Collect-2-Query score rows {0, 4}, bf16, random data) through
``TritonBackend.attend``, timed as one CUDA graph that calls it once on each of ``copies`` KV buffers
(working set >= 400 MB, beyond the L2), replayed ``reps`` times, median per call (the timing of
``sparse_attn.py``). Variants, each against the same run's verify without scores:

* ``logits_mma``        logits, suffix-sum MMA + in-warp pick (``SCORE_MODE`` 1, the default before 2026-12-01c)
* ``logits_colsum``     logits, row-weighted column sum of the logit tile (``SCORE_MODE`` 4)
* ``logits_colsum_bf16``  the same into a bf16 buffer
* ``softmax``           exact softmax weights: raw logits per (head, row) + the reduce kernel (Vegas' default before 2026-12-01c)
* ``softmax_bf16_raw``  the same with bf16 raw logits (half their writes and reads)
* ``sink_softmax``      one-pass softmax ``exp(logit - logit at position 0)`` (``SCORE_MODE`` 4 + exp)
* ``sink_softmax_bf16`` the same into a bf16 buffer
* ``flashinfer``        FlashInfer's paged verify without scores, when it is installed (``peers.sh install1``)

Shapes: SmolLM2 (9 q / 3 KV heads, d 64) B = 1, 16, 64 x 8k; Llama-3.1-8B (32 / 8, d 128) B 16 x 32k
and B 1 x 128k. At B 1 x 128k also a few launch variants (split count, tile) of the plain verify and
of ``sink_softmax``. Then end to end on the embedded model (``--gguf``, 8k of ``ssl.py``, B = 64, γ 4, 5 %, graphs):
dense and Vegas with each score variant (τ, tok/s, same tokens as dense). Then Vegas' selection per iteration (``on_verify`` head sum + plan graph,
30 layers, B = 64 x 8k), with float32 and bfloat16 score buffers. Everything goes to
``<out>/scores_e14.json`` and ``.md`` after each part; a failing part records its traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

T0 = time.perf_counter()
GAMMA = 4
SHAPES = [  # name, H, H_kv, D, B, context
    ("smollm2 B=64x8k", 9, 3, 64, 64, 8192),
    ("llama-3.1-8b B=1x128k", 32, 8, 128, 1, 131072),
    ("llama-3.1-8b B=16x32k", 32, 8, 128, 16, 32768),
    ("smollm2 B=16x8k", 9, 3, 64, 16, 8192),
    ("smollm2 B=1x8k", 9, 3, 64, 1, 8192),
]
SMOKE_SHAPES = [("tiny smollm2-geometry", 9, 3, 64, 2, 48), ("tiny 8b-geometry", 8, 2, 128, 1, 40)]
# FlashInfer's verify without scores, 2026-12-01 (benchmarks/results/gpu_peers_2026-12-01.md): used
# for the ratio when FlashInfer is not installed in this run
FLASHINFER_0112 = {"smollm2 B=64x8k": 115.7, "smollm2 B=16x8k": 45.0, "smollm2 B=1x8k": 13.0,
                   "llama-3.1-8b B=16x32k": 523.4, "llama-3.1-8b B=1x128k": 150.8}


def variants(smoke: bool) -> list[tuple[str, str | None, dict]]:
    """(label, score kind or None, TritonConfig fields)."""
    base = dict(peers="off", flash_attn="off")
    if smoke:
        base.update(block_n=16, num_splits=2)
    return [("plain", None, base),
            ("logits_mma", "logits", dict(base, score_reduce="mma")),
            ("logits_colsum", "logits", dict(base, score_reduce="colsum")),
            ("logits_colsum_bf16", "logits", dict(base, score_reduce="colsum", score_dtype="bfloat16")),
            ("softmax", "softmax", base),
            ("softmax_bf16_raw", "softmax", dict(base, score_dtype="bfloat16")),
            ("sink_softmax", "sink_softmax", base),
            ("sink_softmax_bf16", "sink_softmax", dict(base, score_dtype="bfloat16"))]


def launch_sweep(name: str, smoke: bool) -> list[tuple[str, dict]]:
    """Launch variants tried per shape, each for the plain verify and for ``sink_softmax``: at B 1 x 128k
    (head dim 128: the table's dense row was 64-position tiles, 2 stages, 2/SM, FlashInfer 10 % faster; since
    2026-12-01c the table picks ``bn128w4s2c4`` there, so ``plain`` is that launch)
    the split count and tiles; at SmolLM2 B 64 (one split per (sequence, KV head): ~1.5 programs per SM)
    more warps, stages or two splits to hide the score work."""
    if smoke:
        return [("splits3", dict(num_splits=3))] if "8b" in name else []
    if "B=1x128k" in name:
        return [("ctas4", dict(ctas_per_sm=4)), ("ctas8", dict(ctas_per_sm=8)),
                ("bn128w4s2c4", dict(block_n=128, num_stages=2, ctas_per_sm=4)), ("splits264", dict(num_splits=264))]
    if "B=64x8k" in name:
        return [("w8", dict(num_warps=8)), ("splits2", dict(num_splits=2))]
    if "B=16x32k" in name:
        return [("bn128s2", dict(block_n=128, num_stages=2))]
    return []


def elapsed() -> float:
    return time.perf_counter() - T0


def per_call_us(fns, dev, reps: int) -> float:
    """Median µs per call of ``fns`` (one per buffer copy): replays of one CUDA graph; wall clock on the CPU."""
    for f in fns:
        f()
    if dev.type != "cuda":
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            for f in fns:
                f()
            ts.append((time.perf_counter() - t) / len(fns))
        return statistics.median(ts) * 1e6
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / len(fns))
    del g
    return statistics.median(ts)


def run_shape(name, H, Hkv, D, B, ctx, a, dev, log) -> dict:
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    T = GAMMA + 1
    L = ctx
    kv_bytes = 2 * B * Hkv * L * D * (2 if dtype == torch.bfloat16 else 4)
    copies = 1 if a.smoke else max(2, min(8, math.ceil(400e6 / kv_bytes)))
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=gen) for _ in range(copies)]
    vs = [torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=gen) for _ in range(copies)]
    q = torch.randn(B, H, T, D, device=dev, dtype=dtype, generator=gen)
    lengths = torch.full((B,), L - T, dtype=torch.long, device=dev)
    scale = D ** -0.5
    base = AttentionMetadata(lengths, scale, static=True)
    out = dict(name=name, H=H, Hkv=Hkv, D=D, B=B, L=L, copies=copies, kv_bytes=kv_bytes, rows={})
    nref = min(B, 2)
    ref_be = ReferenceBackend()

    def ref_scores(kind):
        m = AttentionMetadata(lengths[:nref], scale, score_rows=[0, GAMMA], score_kind=kind)
        return ref_be.attend(q[:nref].float(), ks[0][:nref].float(), vs[0][:nref].float(), m)[1]

    def time_variant(label, kind, fields):
        be = TritonBackend(TritonConfig(**fields))
        meta = base if kind is None else base.replace(score_rows=[0, GAMMA], score_kind=kind)
        row = dict(kind=kind, config={k: v for k, v in fields.items() if k not in ("peers", "flash_attn")})
        try:
            o, s = be.attend(q, ks[0], vs[0], meta)
            if kind is not None and not a.no_check:
                r = ref_scores(kind)
                got = s[:nref].float()
                row["max_rel_err_scores"] = ((got - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            us = per_call_us([(lambda i: lambda: be.attend(q, ks[i], vs[i], meta))(i) for i in range(copies)],
                             dev, a.reps)
            row["us"] = us
            log(f"{name:24s} {label:22s} {us:9.1f} us")
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()
            log(f"{name} {label}: FAILED {row['error'][:300]}")
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return row

    for label, kind, fields in variants(a.smoke):
        if elapsed() > a.budget_s:
            out["rows"][label] = dict(skipped="budget")
            continue
        out["rows"][label] = time_variant(label, kind, fields)
    if dev.type == "cuda":
        try:
            from specdec.cuda import peers

            if peers.flashinfer_installed():
                run = peers.FlashInferRunner().plan_dense(q, ks[0], lengths, scale)
                us = per_call_us([(lambda i: lambda: run(q, ks[i], vs[i]))(i) for i in range(copies)], dev, a.reps)
                out["rows"]["flashinfer"] = dict(kind=None, us=us)
                log(f"{name:24s} {'flashinfer':22s} {us:9.1f} us")
            else:
                out["rows"]["flashinfer"] = dict(skipped="flashinfer not installed in this run")
        except Exception as exc:
            out["rows"]["flashinfer"] = dict(error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    for label, extra in launch_sweep(name, a.smoke):
        for kind in (None, "sink_softmax"):
            lab = f"{'plain' if kind is None else kind}@{label}"
            if elapsed() > a.budget_s:
                out["rows"][lab] = dict(skipped="budget")
                continue
            out["rows"][lab] = time_variant(lab, kind, dict(variants(a.smoke)[0][2], **extra))
    plain = out["rows"].get("plain", {}).get("us")
    fi = out["rows"].get("flashinfer", {}).get("us") or FLASHINFER_0112.get(name)
    out["flashinfer_us_used"] = fi
    out["flashinfer_measured_here"] = out["rows"].get("flashinfer", {}).get("us") is not None
    for label, row in out["rows"].items():
        if plain and row.get("us"):
            row["over_plain"] = row["us"] / plain - 1.0
            if fi:
                row["flashinfer_over_this"] = fi / row["us"]
    del ks, vs, q
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


def selection(a, dev, log) -> dict:
    """Vegas' selection per iteration (``on_verify`` head sum + the plan graph), fp32 vs bf16 score buffers."""
    from specdec import SELECTORS, KVCache
    from specdec.interfaces import ScoreRequest
    from specdec.planner import planner_for

    N, B, Hkv, L = (30, 64, 3, 8000) if not a.smoke else (3, 2, 3, 300)
    res = {}
    for dt in (torch.float32, torch.bfloat16):
        cache = KVCache(N, B, Hkv, L + 16, 8, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev)
        sel = SELECTORS.build("collect2", budget_ratio=0.05)
        sel.reset(cache)
        g = torch.Generator(device=dev).manual_seed(0)
        stacked = torch.rand(N, B, Hkv, L + 16, device=dev, generator=g).to(dt)
        req = ScoreRequest(rows=[0, GAMMA], kind="sink_softmax", heads="group")
        req.scores = dict(zip(range(N), stacked.unbind(0)))
        lengths = torch.full((B,), L, dtype=torch.long, device=dev)
        planner = planner_for(cache)

        def step():
            sel.on_verify(req, lengths)
            planner.plan(sel, lengths)

        sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

        def med(fn):
            for _ in range(3):
                fn()
            sync()
            ts = []
            for _ in range(a.reps):
                t = time.perf_counter()
                fn()
                sync()
                ts.append(time.perf_counter() - t)
            return statistics.median(ts) * 1e3

        # the whole step, then its parts: the head sum into the selector's buffer, the plan graph (top-k)
        res[str(dt).replace("torch.", "")] = dict(ms=med(step), on_verify_ms=med(lambda: sel.on_verify(req, lengths)),
                                                  plan_ms=med(lambda: planner.plan(sel, lengths)),
                                                  N=N, B=B, Hkv=Hkv, L=L)
        log(f"selection {dt}: {res[str(dt).replace('torch.', '')]['ms']:.3f} ms")
    return res


# explicit score kinds: the default changed to sink_softmax after the run of 2026-12-01
# (benchmarks/results/gpu_scores_2026-12-01c.md, where "vegas" was exact softmax)
E2E_VARIANTS = [("vegas softmax", {"score_kind": "softmax"}), ("vegas sink_softmax", {"score_kind": "sink_softmax"}),
                ("vegas softmax + score_every=2", {"score_kind": "softmax", "score_every": 2}),
                ("vegas sink_softmax + score_every=2", {"score_kind": "sink_softmax", "score_every": 2})]


def e2e(a, dev, log) -> list[dict]:
    """Embedded model end to end (bf16, triton, graphs, fused), dense and each Vegas score variant."""
    import ssl

    from specdec.bench import run_bench
    from specdec.loading import load_model

    smoke = a.smoke
    m = load_model("smollm2-135m" if smoke else a.gguf, "float32" if smoke else "bfloat16", dev.type,
                   "reference" if smoke else "triton", not smoke, False, True)
    common = dict(contexts=[200 if smoke else 8000], documents=[ssl.__file__], budget=None, budget_ratio=0.05,
                  gamma=GAMMA, model=m, backend="reference" if smoke else "triton",
                  dtype="float32" if smoke else "bfloat16", device=dev.type, output_dir=Path(a.out),
                  cuda_graphs=not smoke, fuse=True, warmup=True, repeats=2 if smoke else 3, hf_baseline=False,
                  adaptive=False, batch_sizes=[1 if smoke else a.e2e_batch], max_new_tokens=6 if smoke else 64)
    keep = ("batch", "method", "tau", "tokens_per_second", "tokens_per_second_min", "tokens_per_second_max",
            "iterations", "selection_overhead_share", "same_tokens_as_dense", "phase_seconds")
    rows = []
    dense_tokens = None
    for label, opts in [("dense", {})] + (E2E_VARIANTS[-1:] if smoke else E2E_VARIANTS):
        if elapsed() > a.budget_s:
            rows.append(dict(label=label, skipped="budget"))
            continue
        try:
            r = run_bench(["dense" if label == "dense" else "vegas"], tag="scores_e14_e2e", options=opts or None,
                          **common)[-1]
            if label == "dense":
                dense_tokens = r.get("tokens")
            row = dict(label=label, options=opts, **{k: r.get(k) for k in keep if k in r})
            if dense_tokens is not None and r.get("tokens") is not None:
                row["same_tokens_as_dense"] = r["tokens"] == dense_tokens
            rows.append(row)
            log(f"e2e {label}: {r.get('tokens_per_second'):.0f} tok/s, tau {r.get('tau')}")
        except Exception:
            rows.append(dict(label=label, error=traceback.format_exc()))
            log(f"e2e {label} FAILED")
    dense = next((r.get("tokens_per_second") for r in rows if r["label"] == "dense"), None)
    for r in rows:
        if dense and r.get("tokens_per_second"):
            r["x_dense"] = r["tokens_per_second"] / dense
    del m
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def markdown(res) -> str:
    lines = [f"# Vegas score emission and selection ({res['date']}, {res.get('gpu') or 'cpu'})", "",
             f"command: `{res['command']}`; torch {res['torch']}; {res['total_s']:.0f} s", "",
             "One layer's verify (5 rows, score rows {0, 4}), µs per call (graph replays over KV copies beyond the L2); "
             "`+%` over the same run's verify without scores; `FI / this` = FlashInfer's verify without scores "
             "(measured here when installed, else 2026-12-01's number) over this variant's time (target >= 1.0).", ""]
    for sh in res["shapes"]:
        if isinstance(sh, str):
            lines += [f"shape failed: {sh[:500]}", ""]
            continue
        fi = sh.get("flashinfer_us_used")
        src = "here" if sh.get("flashinfer_measured_here") else "2026-12-01"
        lines += [f"## {sh['name']} (copies {sh['copies']}; FlashInfer {fi if fi is None else round(fi, 1)} µs, {src})", "",
                  "| variant | µs | + % over plain | FI / this | max rel err scores |", "|---|---|---|---|---|"]
        for label, r in sh["rows"].items():
            if "us" not in r:
                lines.append(f"| {label} | {r.get('skipped') or r.get('error', '')[:120]} | | | |")
                continue
            op = r.get("over_plain")
            fo = r.get("flashinfer_over_this")
            err = r.get("max_rel_err_scores")
            lines.append(f"| {label} | {r['us']:.1f} | {'' if op is None else f'{100 * op:+.1f} %'} | "
                         f"{'' if fo is None else f'{fo:.2f}×'} | {'' if err is None else f'{err:.1e}'} |")
        lines.append("")
    if res.get("e2e"):
        lines += ["## End to end (embedded model, 8k of ssl.py, bf16, graphs, γ 4, 5 %)", "",
                  "| variant | tok/s (min–max) | × dense | τ | select share | same tokens as dense |", "|---|---|---|---|---|---|"]
        for r in res["e2e"]:
            if "tokens_per_second" not in r:
                lines.append(f"| {r['label']} | {r.get('skipped') or r.get('error', '')[-200:]} | | | | |")
                continue
            x = r.get("x_dense")
            tau = r.get("tau")
            sel = r.get("selection_overhead_share")
            lines.append(f"| {r['label']} | {r['tokens_per_second']:.0f} ({r.get('tokens_per_second_min') or 0:.0f}–"
                         f"{r.get('tokens_per_second_max') or 0:.0f}) | {'' if x is None else f'{x:.3f}'} | "
                         f"{'' if tau is None else f'{tau:.2f}'} | {'' if sel is None else f'{100 * sel:.1f} %'} | "
                         f"{r.get('same_tokens_as_dense')} |")
        lines.append("")
    if res.get("selection"):
        lines += ["## Selection per iteration (on_verify + plan graph)", "", "```", json.dumps(res["selection"], indent=1),
                  "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter, tiny shapes: checks the script")
    ap.add_argument("--budget-s", type=float, default=150.0, help="no new variant starts after this many seconds")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-check", action="store_true", help="skip the score parity check against the reference")
    ap.add_argument("--parts", default="shape0,shape1,e2e,shape2,shape3,shape4,selection",
                    help="in this order: shapeN = SHAPES[N] (0 SmolLM2 B64, 1 8B B1x128k, 2 8B B16x32k, 3 SmolLM2 "
                         "B16, 4 SmolLM2 B1), e2e (embedded model end to end), selection")
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--e2e-batch", type=int, default=64)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu" if a.smoke else "cuda")
    a.reps = a.reps or (1 if a.smoke else 20)
    logf = open(out / "scores_e14.log", "a")

    def log(s):
        print(f"[{elapsed():6.1f}s] {s}", flush=True)
        logf.write(f"[{elapsed():6.1f}s] {s}\n")
        logf.flush()

    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               gpu=torch.cuda.get_device_name() if dev.type == "cuda" else None,
               command=" ".join(["python3"] + sys.argv), shapes=[], total_s=0.0)

    def save():
        res["total_s"] = elapsed()
        (out / "scores_e14.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "scores_e14.md").write_text(markdown(res))

    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    for part in a.parts.split(","):
        if part.startswith("shape"):
            sh = shapes[int(part[5:])] if int(part[5:]) < len(shapes) else None
            if sh is None:
                continue
            if elapsed() > a.budget_s:
                res["shapes"].append(f"{sh[0]}: skipped (budget)")
                continue
            try:
                res["shapes"].append(run_shape(*sh, a, dev, log))
            except Exception:
                res["shapes"].append(f"{sh[0]}: " + traceback.format_exc())
                log(f"{sh[0]} FAILED")
        elif part == "e2e":
            try:
                res["e2e"] = e2e(a, dev, log)
            except Exception:
                res["e2e"] = [dict(label="*", error=traceback.format_exc())]
        elif part == "selection":
            try:
                res["selection"] = selection(a, dev, log)
            except Exception:
                res["selection"] = {"error": traceback.format_exc()}
        else:
            raise SystemExit(f"unknown part {part!r}; use shape0..shape4, e2e, selection")
        save()
    print(markdown(res))


if __name__ == "__main__":
    main()
