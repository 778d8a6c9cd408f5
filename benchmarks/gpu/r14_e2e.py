"""Embedded model end to end at B 64 x 8k: dense and Vegas, GEMM splits 1 vs 2 vs 2 + down 2 vs 2 + Triton select.

    python3 benchmarks/gpu/r14_e2e.py --out $OUT --budget-s 80          # H200, /tmp/m/smol.gguf
    python3 benchmarks/gpu/r14_e2e.py --out /tmp/r14e2e --smoke         # CPU (embedded model, reference backend, torch code)

The two-slice GEMM default (``specdec.fusion.GEMM_SPLITS = 2``) was measured only at the 8B shape: here one
model per setting (``set_gemm_splits(hf, s, s, down=d)``; the last with ``TRITON_SELECT`` on, the plan's
top-k in one Triton launch), each round runs every setting once (dense, then
vegas: ``run_bench``, warm-up + 1 timed run each, bf16, triton, graphs, fused, gamma 4, 5 %, 64 new tokens,
8k of ``ssl.py``), rounds until the budget. Reported: median tok/s over rounds (min-max), vegas x dense of
the same setting, tau, Vegas' selection share of the iteration (``selection_overhead_share``), and whether
Vegas' tokens equal dense's of the same setting (lossless) and whether they equal splits1's dense tokens
(bf16 rounding of the partial sums may legitimately change a greedy token there). Writes ``<out>/r14_e2e.{json,md}`` after
every round.
"""

from __future__ import annotations

import argparse
import json
import ssl
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

T0 = time.perf_counter()
#: (label, o_proj/qkv splits, down splits, specdec.selectors.base.TRITON_SELECT); one model (and cache) each
SETTINGS = [("splits1", 1, 1, False), ("splits2", 2, 1, False), ("splits2_down2", 2, 2, False),
            ("splits2_triton_select", 2, 1, True)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--budget-s", type=float, default=80.0, help="no round starts after this many seconds")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from specdec.bench import run_bench
    from specdec.fusion import set_gemm_splits
    from specdec.loading import load_model
    from specdec.selectors import base

    smoke = a.smoke
    dev = "cpu" if smoke else "cuda"
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               gpu=torch.cuda.get_device_name() if dev == "cuda" else None, rows=[], errors=[])
    models = {}
    for name, s, d, _ in (SETTINGS[::2] if smoke else SETTINGS):
        # the smoke: the embedded model on the CPU, fused with the torch code (the splits act only with the
        # Triton kernels, so there it checks the script, not the splits)
        m = load_model("smollm2-135m" if smoke else a.gguf, "float32" if smoke else "bfloat16", dev,
                       "reference" if smoke else "triton", not smoke, False, True)
        set_gemm_splits(m.hf, s, s, down=d)
        models[name] = m
    common = dict(contexts=[160 if smoke else 8000], documents=[ssl.__file__], budget=None, budget_ratio=0.05,
                  gamma=4, backend="reference" if smoke else "triton", dtype="float32" if smoke else "bfloat16",
                  device=dev, output_dir=out, cuda_graphs=not smoke, fuse=True, warmup=True, repeats=1,
                  hf_baseline=False, adaptive=False, batch_sizes=[2 if smoke else 64],
                  max_new_tokens=4 if smoke else 64)
    ref = None  # the first setting's dense tokens
    settings = SETTINGS[::2] if smoke else SETTINGS  # the smoke: splits1 and splits2_down2 (time)
    for rnd in range(a.rounds):
        if time.perf_counter() - T0 > a.budget_s:
            res["errors"].append(f"round {rnd}: skipped, out of budget")
            break
        for name, _, _, tsel in settings:
            dense = None
            for method in ("dense", "vegas"):
                try:
                    base.TRITON_SELECT = tsel
                    try:
                        r = run_bench([method], tag="r14_e2e", model=models[name], **common)[-1]
                    finally:
                        base.TRITON_SELECT = False
                    ref = r.get("tokens") if ref is None else ref
                    dense = r.get("tokens") if method == "dense" else dense
                    res["rows"].append(dict(round=rnd, setting=name, method=method, tok_s=r.get("tokens_per_second"),
                                            tau=r.get("tau"), select_share=r.get("selection_overhead_share"),
                                            same_tokens=r.get("tokens") == dense, same_as_first=r.get("tokens") == ref))
                except Exception:
                    res["errors"].append(f"{name} {method} round {rnd}: {traceback.format_exc(limit=6)}")
                print(name, method, res["rows"][-1] if res["rows"] else res["errors"][-1], flush=True)
        (out / "r14_e2e.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "r14_e2e.md").write_text(markdown(res))
    (out / "r14_e2e.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "r14_e2e.md").write_text(markdown(res))


def markdown(res) -> str:
    lines = [f"# Embedded model, B 64 x 8k (ssl.py), GEMM splits interleaved ({res['date']}, {res['gpu']})", "",
             "| setting | method | rounds | tok/s median (min-max) | x dense (same setting) | tau | select share | "
             "same tokens as dense (same setting) | same as splits1 dense |", "|---|---|---|---|---|---|---|---|---|"]
    med = {}
    for name, *_ in SETTINGS:
        for method in ("dense", "vegas"):
            rs = [r for r in res["rows"] if r["setting"] == name and r["method"] == method and r["tok_s"]]
            if not rs:
                continue
            t = [r["tok_s"] for r in rs]
            med[name, method] = statistics.median(t)
            x = med[name, method] / med[name, "dense"] if (name, "dense") in med else float("nan")
            sh = [r["select_share"] for r in rs if r["select_share"] is not None]
            lines.append(f"| {name} | {method} | {len(rs)} | {med[name, method]:.0f} ({min(t):.0f}-{max(t):.0f}) | "
                         f"{x:.3f} | {(rs[0]['tau'] or 0):.2f} | {statistics.median(sh) * 100 if sh else float('nan'):.1f} % | "
                         f"{all(r['same_tokens'] for r in rs)} | {all(r['same_as_first'] for r in rs)} |")
    lines += ["", *[f"- error: {e}" for e in res["errors"]]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
