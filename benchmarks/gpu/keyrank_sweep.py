"""Sweep the launch parameters of Dustin's low-rank key ranking kernel (:mod:`specdec.cuda.triton_keyrank`) on the
GPU at B 64, 8k positions, rank 32, bf16 projected keys, 15 query rows per KV head: microseconds and GB/s per pass, the
largest relative error against the exact-float32 launch's mass (chunk 256, block 64, ``"ieee"``) and whether each row's top 2,000 are the same positions.
A diagnostic (random keys: flat masses, so near-ties make the top-2,000 check strict).

    python3 benchmarks/gpu/keyrank_sweep.py --chunks 256,1024 --blocks 64,256 --warps 4 --precisions tf32x3,tf32,ieee
    python3 benchmarks/gpu/keyrank_sweep.py --rank 16 --chunks 1024 --blocks 64,128 --precisions tf32x3,bf16x3,bf16x2

``bf16xN``: bfloat16 keys against N bfloat16 pieces of the rows (the kernel's ``SPLIT``); the others are ``DOT_PREC``
values for float32 products of the widened keys. ``--rank`` sets the projection's width (32 by default).
"""
import argparse, statistics, itertools
import torch, triton
from specdec.cuda import triton_keyrank as tk

ap = argparse.ArgumentParser()
ap.add_argument("--chunks", default="256,1024")
ap.add_argument("--blocks", default="64,256")
ap.add_argument("--warps", default="4")
ap.add_argument("--precisions", default="tf32x3,tf32,ieee")
ap.add_argument("--rank", type=int, default=32)
a = ap.parse_args()
ints = lambda x: [int(v) for v in x.split(",")]
dev = "cuda"
B, H, C, r, R, L = 64, 3, 8192, a.rank, 15, 8000
g = torch.Generator(device=dev).manual_seed(0)
keys = (torch.randn(B, H, C, r, device=dev, generator=g) * 2).to(torch.bfloat16)
qr = (torch.randn(B, H, R, r, device=dev, generator=g) * 0.3).contiguous()
lengths = torch.full((B,), L, device=dev)
new = (torch.arange(C, device=dev).view(1, C) < L).expand(B, C).contiguous()
def t(fn, reps=20):
    for _ in range(3): fn()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
def launch(chunk, bc, w, prec):
    """The two passes of one launch configuration (as closures) and the mass they write."""
    nch = triton.cdiv(C, chunk)
    stats = torch.empty((B * H, nch, 2, 16), dtype=torch.float32, device=dev)
    out = torch.empty((B, H, C), dtype=torch.float32, device=dev)
    st = (keys.stride(0), keys.stride(1), keys.stride(2))
    split = int(prec[len("bf16x"):]) if prec.startswith("bf16x") else 0
    dot = "tf32x3" if split else prec
    bd = max(16, triton.next_power_of_2(r))
    def p1():
        tk._chunk_stats_kernel[(B * H, nch)](qr, keys, lengths, stats, H, R, r, nch, *st, CHUNK=chunk, BLOCK_C=bc,
                                             BLOCK_R=16, BLOCK_D=bd, DOT_PREC=dot, SPLIT=split, num_warps=w)
    def p2():
        tk._chunk_mass_kernel[(B * H, nch)](qr, keys, lengths, new.view(torch.uint8), stats, out, H, C, R, r, nch, *st,
                                            CHUNK=chunk, BLOCK_C=bc, BLOCK_R=16, BLOCK_D=bd,
                                            BLOCK_N=max(16, triton.next_power_of_2(nch)), DOT_PREC=dot, SPLIT=split,
                                            num_warps=w)
    return p1, p2, out
r1, r2, ref = launch(256, 64, 4, "ieee")
r1(); r2(); torch.cuda.synchronize()
mb = keys.numel() * 2 / 1e6
print("keys MB", mb)
rows = []
for chunk, bc, w, prec in itertools.product(ints(a.chunks), ints(a.blocks), ints(a.warps), a.precisions.split(",")):
    if bc > chunk: continue
    p1, p2, out = launch(chunk, bc, w, prec)
    a1 = t(p1); a2 = t(p2)
    fin = torch.isfinite(ref)
    err = ((out - ref).abs()[fin] / ref[fin].abs().clamp_min(1e-30)).max().item()
    top_same = (out.topk(2000, -1).indices.sort(-1).values == ref.topk(2000, -1).indices.sort(-1).values).all(-1).float().mean().item()
    rows.append((a1 + a2, chunk, bc, w, prec, a1, a2, err, top_same))
    print(f"chunk {chunk:5d} bc {bc:4d} warps {w} {prec:5s}: stats {a1*1e3:7.1f} us ({mb/a1:6.0f} GB/s) mass {a2*1e3:7.1f} us ({mb/a2:6.0f} GB/s) max rel err {err:.1e} top-2000 same {top_same:.3f}", flush=True)
rows.sort()
print("best", rows[:5])
