"""Launches of Dustin's verify on the CPU (Triton interpreter): dense verify vs sparse verify, per layer, and the plan.

    TRITON_INTERPRET=1 python benchmarks/dustin_launches_cpu.py [--layers 2,4] [--batch 4] [--context 96]

A tiny random llama (SmolLM2's GQA 3:1, head dim 64) with fused Triton projections and the Triton backend, as
on the GPU. Counts come from :func:`specdec.testing.launches.count_launches` (ATen ops that launch and Triton
launches). Two depths give the per-layer cost (difference / layers) and the per-forward rest. The plan is
counted eagerly (on a GPU it is one graph replay when ``capturable_plan``). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def counts(n_layers: int, B: int, ctx: int, gamma: int = 4, ratio: float = 0.25) -> dict:
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig
    from specdec.planner import planner_for
    from specdec.selectors.hybrid_srh import HybridSRHConfig, HybridSRHSelector
    from specdec.testing import tiny_model
    from specdec.testing.launches import count_launches
    from specdec.verifiers import srh_request

    torch.manual_seed(0)
    m = tiny_model("llama", seed=0, num_hidden_layers=n_layers, hidden_size=192, num_attention_heads=3,
                   num_key_value_heads=1, head_dim=64, intermediate_size=256)
    m.fuse_projections(kernels="triton")
    m.backend = TritonBackend(TritonConfig(peers="off"))
    cache = m.new_cache(B, ctx + 2 * (gamma + 1))
    m.forward(torch.randint(0, 96, (B, ctx)), cache, torch.zeros(B, dtype=torch.long))
    lengths = torch.full((B,), ctx)
    heads = {n_layers // 2: [0, 1, 2]}
    sel = HybridSRHSelector(HybridSRHConfig(budget_ratio=ratio, sinks=4, recent=8, target_heads=[(n_layers // 2, h) for h in range(3)]))
    sel.draft_signal = torch.rand(B, cache.capacity)
    sel.target_signal = torch.rand(B, cache.capacity)
    ids = torch.randint(0, 96, (B, gamma + 1))
    out = {}
    out["plan"] = count_launches(lambda: planner_for(cache).plan(sel, lengths))
    plan = planner_for(cache).plan(sel, lengths)
    out["dense verify"] = count_launches(lambda: m.forward(ids, cache, lengths, scores=[srh_request(heads, gamma + 1)]))
    out["sparse verify"] = count_launches(
        lambda: m.forward(ids, cache, lengths, plan=plan, scores=[srh_request(heads, gamma + 1)]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,4")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--context", type=int, default=96)
    a = ap.parse_args()
    torch.set_num_threads(1)
    l1, l2 = (int(x) for x in a.layers.split(","))
    c1, c2 = counts(l1, a.batch, a.context), counts(l2, a.batch, a.context)
    print(f"| part | launches, {l1} layers | {l2} layers | per layer | per forward (rest) |")
    print("|---|---|---|---|---|")
    for k in c1:
        n1, n2 = sum(c1[k].values()), sum(c2[k].values())
        per = (n2 - n1) / (l2 - l1)
        print(f"| {k} | {n1} | {n2} | {per:.1f} | {n1 - per * l1:.1f} |")
    for k in ("dense verify", "sparse verify"):
        diff = {op: (c2[k][op] - c1[k][op]) / (l2 - l1) for op in c2[k] if c2[k][op] != c1[k].get(op, 0)}
        print(f"\n{k}, per layer: " + ", ".join(f"{op} {v:g}" for op, v in sorted(diff.items())))
    print("\nplan ops: " + ", ".join(f"{op} {n}" for op, n in sorted(c1["plan"].items())))


if __name__ == "__main__":
    main()
