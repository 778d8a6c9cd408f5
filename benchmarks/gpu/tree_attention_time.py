"""The split-K kernel alone at a verify's shape: a chain's 5 rows, a tree's 17 and 21 rows (with its mask), and the
21 rows as a causal chain (no mask): CUDA-event median per call. SmolLM2-135M's attention: 9 query heads, 3 KV heads,
head dim 64, bf16.

    python3 benchmarks/gpu/tree_attention_time.py [--batch 16] [--context 8000]
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=8000)
    a = ap.parse_args()
    import torch

    from specdec.cuda.triton_backend import TritonBackend
    from specdec.interfaces import AttentionMetadata
    from specdec.tree import DraftTree

    B, H, Hkv, D, L = a.batch, 9, 3, 64, a.context + 128
    dev = torch.device("cuda")
    k = torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((B,), a.context, dtype=torch.long, device=dev)
    be = TritonBackend()
    cases = [("chain 5 rows", 5, None), ("tree 17 rows (no branch)", 17, DraftTree.default(0)),
             ("tree 21 rows (4-node branch)", 21, DraftTree.default(4)), ("causal 21 rows", 21, None)]
    for name, T, tree in cases:
        q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
        mask = None if tree is None else tree.on(dev)[2]
        meta = AttentionMetadata(lens, D ** -0.5, tree=mask)
        for _ in range(5):
            be.attend(q, k, v, meta)
        times = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            be.attend(q, k, v, meta)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        print(f"B {B} x {a.context}: {name}: {statistics.median(times):.1f} us per call (median of 30)")


if __name__ == "__main__":
    main()
