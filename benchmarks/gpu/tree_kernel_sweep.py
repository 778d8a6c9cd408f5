"""Where a draft tree's verify attention loses its time: the split-K kernel alone, each call replayed from a CUDA graph
(no host time in the number, unlike ``tree_attention_time.py``), at SmolLM2-135M's attention (9 query heads, 3 KV
heads, head dim 64, bf16) over a cache of ``--context`` positions.

Rows: causal chains of T = 5 / 6 / 11 / 21 rows (15 / 18 / 33 / 63 packed rows: tiles of 16 / 32 / 64 / 64 rows) and
the default tree with its 4-node lookup branch (21 rows, masked), at the launch table's config; the 21-row calls also in
row blocks of 16 / 32 packed rows (``LaunchConfig.row_block``) and the tree with its mask as bit words
(``LaunchConfig.tree_bits``); with ``--sweep`` also tile length x warps x stages. Median over ``--reps`` replays of a
graph of ``--calls`` calls.

    python3 benchmarks/gpu/tree_kernel_sweep.py [--batch 16] [--context 8000] [--sweep] [--json OUT.json]
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # specdec
sys.path.insert(0, str(Path(__file__).resolve().parent))  # script_io


def time_call(fn, calls: int, reps: int) -> tuple[float, bool]:
    """(median µs per call of ``fn`` run ``calls`` times in one CUDA graph replay, whether it ran eagerly instead)."""
    import torch

    from script_io import graphed, timed

    def many():
        for _ in range(calls):
            fn()

    run = graphed(many, torch.device("cuda"))
    return timed(run, reps, torch.device("cuda")) * 1e3 / calls, bool(getattr(many, "eager", False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch
    from triton.runtime.errors import OutOfResources

    from specdec.cuda.triton_attention import LaunchConfig, splitk_attention
    from specdec.interfaces import AttentionMetadata
    from specdec.tree import DraftTree

    B, H, Hkv, D, L = a.batch, 9, 3, 64, a.context + 128
    dev = torch.device("cuda")
    torch.manual_seed(0)
    k = torch.randn(B, Hkv, L, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    lens = torch.full((B,), a.context, dtype=torch.long, device=dev)
    tree = DraftTree.default(4)
    cases = [("causal T=5", 5, None), ("causal T=6", 6, None), ("causal T=11", 11, None),
             ("causal T=21", 21, None), ("tree T=21", tree.nodes + 1, tree.on(dev)[2])]
    configs = [("table", LaunchConfig()), ("tree bits", LaunchConfig(tree_bits=True)),
               ("row block 16", LaunchConfig(row_block=16)), ("row block 32", LaunchConfig(row_block=32)),
               ("row block 16 + bits", LaunchConfig(row_block=16, tree_bits=True)),
               ("row block 32 + bits", LaunchConfig(row_block=32, tree_bits=True))]
    if a.sweep:
        for bn in (32, 64, 128):
            for w in (4, 8):
                for st in (2, 3):
                    configs.append((f"bn{bn} w{w} s{st}", LaunchConfig(block_n=bn, num_warps=w, num_stages=st)))
        configs.append(("table, no fast loop", LaunchConfig(fast_loop=False)))
        configs.append(("table, 2 per SM", LaunchConfig(ctas_per_sm=2)))
    rows = []
    for name, T, mask in cases:
        q = torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16)
        meta = AttentionMetadata(lens, D ** -0.5)
        ref = None
        for cname, cfg in configs:
            if cname.startswith("bn") and not a.sweep:
                continue
            if cname != "table" and T in (5, 6, 11) and not cname.startswith("bn"):
                continue  # row blocks and bit words change nothing at 15 / 18 / 33 rows... (33: 3 blocks of 16)
            if "bits" in cname and mask is None:
                continue
            if cname != "table" and T in (6, 11):
                continue  # the sweep is for the chain's and the tree's shapes
            fn = lambda: splitk_attention(q, k, v, meta, cfg=cfg, tree=mask)  # noqa: E731
            try:
                us, eager = time_call(fn, a.calls, a.reps)
            except OutOfResources as e:  # a config that does not fit shared memory: say so, go on with the rest
                print(f"{name:14s} {cname:22s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                rows.append({"case": name, "config": cname, "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
            out = fn()[0].float()
            if ref is None:
                ref = out
            err = (out - ref).abs().max().item()
            tag = " [eager: the graph capture failed]" if eager else ""
            print(f"{name:14s} {cname:22s} {us:8.1f} us/call  (max |diff| vs table {err:.2e}){tag}", flush=True)
            rows.append({"case": name, "rows": T, "config": cname, "us": us, "max_diff_vs_table": err, "eager": eager})
    if a.json:
        Path(a.json).write_text(json.dumps({"batch": B, "context": a.context, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
