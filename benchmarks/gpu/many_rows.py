"""Verify-sized forwards past one packed tile (``T * G > max_packed_rows``): row-chunked split-K vs masked SDPA.

    timeout 200 python3 benchmarks/gpu/many_rows.py --out $OUT/many_rows      # H200, ~1 minute
    TRITON_INTERPRET=1 python3 benchmarks/gpu/many_rows.py --smoke --out /tmp/mr  # CPU: checks the script

At the Llama-3.1-8B shape (B 16 × 32k, 8 KV heads × 4 query heads, head dim 128, bf16) and SmolLM2's (B 64 × 8k,
3 × 3, 64) it times ``TritonBackend().attend`` for T rows (a verify of γ = T - 1) with the dense no-score path
switched between the two (``triton_backend.MANY_ROWS_SPLITK_MAX_T``: T or less → split-K in row chunks, else
SDPA with a mask), the one-tile verify at T = 9 / 17 for scale, and Vegas' ``sink_softmax`` score request at the
first T past one tile; eager, CUDA-event medians of ``--repeats`` calls after a warm-up, max |Δ| of the two paths.
Writes ``<out>/many_rows.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def timed(fn, repeats: int, dev) -> float:
    """Median ms of ``repeats`` synchronised calls after one warm-up (``issue14._replay_times``)."""
    from issue14 import _replay_times

    fn()
    return statistics.median(_replay_times(fn, dev, repeats))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args()
    from specdec.cuda import triton_backend as tb
    from specdec.interfaces import AttentionMetadata

    dev = torch.device("cpu" if a.smoke else "cuda")
    dtype = torch.float32 if a.smoke else torch.bfloat16
    shapes = ([("tiny", 2, 2, 4, 16, 96, [9, 17, 33])] if a.smoke else
              [("llama8b", 16, 8, 4, 128, 32768, [9, 17, 33, 65]), ("smollm2", 64, 3, 3, 64, 8192, [17, 22, 43, 64])])
    rows, default = [], tb.MANY_ROWS_SPLITK_MAX_T
    be = tb.TritonBackend()
    for name, B, Hkv, G, D, ctx, Ts in shapes:
        L = ctx + 80
        g = torch.Generator(device=dev).manual_seed(0)
        k = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g)
        v = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype, generator=g)
        for T in Ts:
            q = torch.randn(B, Hkv * G, T, D, device=dev, dtype=dtype, generator=g)
            lens = torch.full((B,), ctx - T, device=dev, dtype=torch.int32)
            meta = AttentionMetadata(lens, D ** -0.5)
            packed = T * G > be.config.max_packed_rows
            row = dict(shape=name, B=B, ctx=ctx, T=T, packed_rows=T * G, one_tile=not packed)
            outs = {}
            for path, cut in (("splitk_chunks", 10**6), ("sdpa_masked", 0)):
                if not packed and path == "sdpa_masked":
                    continue
                tb.MANY_ROWS_SPLITK_MAX_T = cut
                try:
                    row[f"{path}_ms"] = timed(lambda: be.attend(q, k, v, meta), a.repeats, dev)
                    outs[path] = be.attend(q, k, v, meta)[0].float()
                finally:
                    tb.MANY_ROWS_SPLITK_MAX_T = default
            if len(outs) == 2:
                row["max_abs_diff"] = float((outs["splitk_chunks"] - outs["sdpa_masked"]).abs().max())
            if packed and not any(r.get("scores_ms") for r in rows if r["shape"] == name):
                sm = AttentionMetadata(lens, D ** -0.5, score_rows=[0, T - 1], score_kind="sink_softmax")
                row["scores_ms"] = timed(lambda: be.attend(q, k, v, sm), a.repeats, dev)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q
        del k, v
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                device=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", torch=torch.__version__)
    (out / "many_rows.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    md = [f"# many rows: {meta}", "", "| shape | T | packed rows | one tile | split-K chunks ms | SDPA masked ms | "
          "sink_softmax scores ms | max abs diff |", "|---|---|---|---|---|---|---|---|"]
    f = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
    for r in rows:
        md.append(f"| {r['shape']} | {r['T']} | {r['packed_rows']} | {r['one_tile']} | {f(r.get('splitk_chunks_ms'))} | "
                  f"{f(r.get('sdpa_masked_ms'))} | {f(r.get('scores_ms'))} | {f(r.get('max_abs_diff'))} |")
    (out / "many_rows.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
