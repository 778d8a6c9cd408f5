"""Time the basis step of Dustin's ``layer_scores="keys"`` (``torch.linalg.eigh`` of the per-layer, sequence and KV-head
key Gram matrices, ``(N, B, H, D, D)``) on the GPU and on the host, at the SmolLM2-135M shape (30 layers, 3 KV heads,
D = 64) and ``--batch`` sequences. A diagnostic: prints one JSON line.

    python3 benchmarks/gpu/eigh_time.py --batch 64
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    a = ap.parse_args()
    n = a.layers * a.batch * a.kv_heads
    x = torch.randn(n, a.head_dim, 4 * a.head_dim, device="cuda")
    gram = x @ x.transpose(1, 2)
    out = dict(matrices=n, head_dim=a.head_dim)
    for label, g in {"cuda float32": gram, "cuda float64": gram.double()}.items():
        torch.linalg.eigh(g[:2])
        torch.cuda.synchronize()
        t = time.perf_counter()
        torch.linalg.eigh(g)
        torch.cuda.synchronize()
        out[label + " s"] = round(time.perf_counter() - t, 4)
    h = gram.cpu()
    t = time.perf_counter()
    torch.linalg.eigh(h)
    out[f"cpu float32 s ({torch.get_num_threads()} threads)"] = round(time.perf_counter() - t, 4)
    from concurrent.futures import ThreadPoolExecutor

    nt = min(16, torch.get_num_threads())
    t = time.perf_counter()
    with ThreadPoolExecutor(nt) as ex:
        list(ex.map(torch.linalg.eigh, h.chunk(nt)))
    out[f"cpu float32 s ({nt} Python threads, chunks)"] = round(time.perf_counter() - t, 4)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
