"""Sweep ``select_top``'s kernel (:func:`specdec.cuda.triton_select.select_top`) on the GPU at the shape of Dustin's
low-rank key ranking: 192 rows (B 64 x 3 KV heads) of 8,192 float32 masses (8,000 cached, -inf off the addable ones),
the top 2,000 per row, at 4, 8 and 16 warps: microseconds per launch (median of 50, CUDA events) and whether the picks
equal the first launch's. (On 2026-12-06 it also ran the bisection over int64 keys, the kernel before, since removed:
``benchmarks/results/gpu_keyrank_bf16_2026-12-06.md``.)

    python3 benchmarks/gpu/select_sweep.py
"""
import statistics

import torch
import triton

from specdec.cuda import triton_select as ts

dev = "cuda"
B, H, C, L, k = 64, 3, 8192, 8000, 2000
g = torch.Generator(device=dev).manual_seed(0)
s = torch.rand(1, B, H, C, device=dev, generator=g)
s[..., L:] = float("-inf")
s[torch.rand(1, B, H, C, device=dev, generator=g) < 0.3] = float("-inf")  # the shared part and sinks / recent
room = torch.full((B,), k, device=dev)


def t(fn, reps=50):
    for _ in range(5):
        fn()
    ts_ = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts_.append(a.elapsed_time(b))
    return statistics.median(ts_) * 1e3


ref = None
for w in (4, 8, 16):
    out = torch.empty((1, B, H, k), dtype=torch.long, device=dev)
    fn = lambda: ts._select_kernel[(B * H,)](s, out, room, C, k, H, B, BLOCK=triton.next_power_of_2(C),  # noqa: E731
                                            KBLOCK=triton.next_power_of_2(k), num_warps=w)
    us = t(fn)
    fn(); torch.cuda.synchronize()
    if ref is None:
        ref = out.clone()
    print(f"warps {w:2d}: {us:7.1f} us per launch (192 rows), same picks: {bool(torch.equal(out, ref))}", flush=True)
out = ts.select_top(s, k, room)
torch.cuda.synchronize()
print("select_top (shipped launch) same picks:", bool(torch.equal(out, ref)), f"{t(lambda: ts.select_top(s, k, room)):.1f} us")
