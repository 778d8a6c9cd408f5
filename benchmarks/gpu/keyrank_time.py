"""Time Dustin's low-rank key ranking (``layer_scores="keys"``) for one layer at a given shape: the torch path
(materialised float32 logits + softmax + ``torch.topk``) against the Triton path (``lowrank_mass`` + ``select_top``),
and how often their picks agree. Random keys / queries / basis in the cache dtype; CUDA events, median of ``--reps``.

    python benchmarks/gpu/keyrank_time.py --batch 64 --context 8000 --rank 32 --budget-ratio 0.25
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics

import torch

from specdec.selectors.key_rank import KeyRankPlan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--capacity", type=int, default=8192)
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--group", type=int, default=3)
    ap.add_argument("--rows", type=int, default=5)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--budget-ratio", type=float, default=0.25)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = "cuda"
    B, H, C, r, D = a.batch, a.kv_heads, a.capacity, a.rank, a.head_dim
    g = torch.Generator(device=dev).manual_seed(0)
    lengths = torch.full((B,), a.context, device=dev)
    k_sel = int(a.context * a.budget_ratio)
    new = torch.arange(C, device=dev).view(1, C) < lengths.view(B, 1)
    new[:, :4] = False
    new[:, a.context - 64:] = False
    room = torch.minimum(torch.full((B,), k_sel, device=dev), new.sum(1))
    basis = torch.linalg.qr(torch.randn(1, B, H, D, D, device=dev, generator=g)).Q[..., :r].contiguous()
    keys = (torch.randn(1, B, H, C, D, device=dev, generator=g) @ basis).to(torch.bfloat16)
    plan = KeyRankPlan(indices=torch.tensor([[0, 1, 2, 3]] * B, device=dev).view(1, B, 1, 4), dense_from=lengths.clone(),
                       lengths=lengths, room=room, basis=basis, keys=keys, new=new, k_sel=k_sel)
    q = torch.randn(B, H * a.group, a.rows, D, device=dev, generator=g, dtype=torch.bfloat16)
    res = {"shape": vars(a), "device": torch.cuda.get_device_name()}
    picks = {}
    for name, p in (("torch", plan), ("triton", dataclasses.replace(plan, use_triton=True))):
        for _ in range(5):
            out = p.indices_for(0, q)
        times = []
        for _ in range(a.reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            out = p.indices_for(0, q)
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        res[f"{name}_ms"] = statistics.median(times)
        picks[name] = out
    a_, b_ = picks["torch"], picks["triton"]
    same = 0
    for i in range(B):
        for h in range(H):
            same += set(a_[i, h].tolist()) == set(b_[i, h].tolist())
    res["rows_with_the_same_set"] = f"{same}/{B * H}"
    # the floor: one read of the (B, H, C, r) bf16 projected keys per pass, two passes
    res["keys_bytes_MB"] = keys.numel() * keys.element_size() / 1e6
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
