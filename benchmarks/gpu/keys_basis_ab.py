"""The specdec command line with Dustin's key basis (:func:`specdec.selectors.key_rank.top_directions`) chosen by the
environment's ``MODE``: ``host32`` (as shipped: host LAPACK, float32), ``host64`` (host, float64) or ``cuda32`` (CUDA
``eigh``, float32, one solver call per 64 x 64 matrix). At the first basis of the run it prints, per way, the time and
how far its top-32 subspace is from CUDA's float64 one (spectral norm of the projectors' difference) on the run's real
Gram matrices. A diagnostic for the GPU (2026-12-06).

    MODE=host64 python3 benchmarks/gpu/keys_basis_ab.py bench --methods dense,dustin:layer_share=1.0:layer_scores=keys ...
"""
import os, sys
import torch
import specdec.selectors.key_rank as kr
from concurrent.futures import ThreadPoolExecutor

shipped = kr.top_directions
def host64(g):
    flat = g.detach().to("cpu", torch.float64).reshape(-1, *g.shape[-2:])
    n = torch.get_num_threads(); torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(n) as pool:
            v = torch.cat([x for _, x in pool.map(torch.linalg.eigh, flat.chunk(n))])
    finally:
        torch.set_num_threads(n)
    return v.view(g.shape).to(g.device, torch.float32)
modes = {"host32": shipped, "host64": host64, "cuda32": lambda g: torch.linalg.eigh(g)[1]}
done = [False]
def td(g):
    if not done[0]:
        done[0] = True
        ref = torch.linalg.eigh(g.double())[1][..., 32:]
        w = torch.linalg.eigvalsh(g.double())
        spread = (w[..., -1] / w[..., 31].clamp_min(1e-30)).flatten()
        print("DIAG lambda_max/lambda_32: median %.3g max %.3g" % (spread.median().item(), spread.max().item()), flush=True)
        P = lambda v: v @ v.transpose(-1, -2)
        for name, fn in modes.items():
            import time; t = time.perf_counter(); v = fn(g); torch.cuda.synchronize(); t = time.perf_counter() - t
            d = torch.linalg.matrix_norm(P(v[..., 32:].double()) - P(ref), ord=2).flatten()
            print(f"DIAG {name}: {t:.2f} s; subspace distance to cuda64: median {d.median().item():.2e} "
                  f"p99 {d.quantile(0.99).item():.2e} max {d.max().item():.2e} (>0.1: {(d > 0.1).sum().item()}/{d.numel()})", flush=True)
    return modes[os.environ.get("MODE", "host32")](g)
kr.top_directions = td
from specdec.cli import app
sys.argv = ["specdec"] + sys.argv[1:]
app()
