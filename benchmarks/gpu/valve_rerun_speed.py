"""What Dustin's confidence valve costs per pass at B = 64 x 8k (a diagnostic): the dense re-run of the γ + 1 = 5 rows
with only the fired sequences live (the others read none of their context; with the few-live launch,
``KVCache.few_live``, and without it, at 1 / ``--live`` / 2x / 4x live), against a dense forward with all live and
the sparse verify step it follows (low-rank keys, rank 16, 25 %), each with and without the target's SRH score request
the verifier records in the same pass. Random-weight SmolLM2-135M shape, bf16, Triton backend, CUDA graphs; medians of
``--reps`` CUDA-event timings; kernel tables of the re-run (``DIR/valve_rerun_speed.{json,md}``).

    python3 benchmarks/gpu/valve_rerun_speed.py --out DIR [--live 8]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from layer_plan_speed import kernel_table, random_verify_step  # noqa: E402
from script_io import timed  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--live", type=int, default=8, help="fired sequences in the re-run")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="CPU, float32, tiny sizes (checks the script runs)")
    a = ap.parse_args(argv)
    gpu = not a.smoke
    if a.smoke:
        a.context, a.batch, a.live, a.reps = 96, 4, 1, 1
    from specdec.planner import planner_for
    from specdec.selectors.hybrid_srh import HybridSRHConfig, HybridSRHSelector, heads_by_layer
    from specdec.verifiers import srh_request

    m, cache, lengths, ids, t_heads = random_verify_step(gpu, a.batch, a.context)
    dev = m.device
    B, L, T = a.batch, a.context, ids.shape[1]
    cache.live = torch.ones(B, dtype=torch.bool, device=dev)
    heads = heads_by_layer(t_heads)
    fired = torch.zeros(B, dtype=torch.bool, device=dev)
    fired[: a.live] = True
    sel = HybridSRHSelector(HybridSRHConfig(budget_ratio=0.25, target_heads=[tuple(x) for x in t_heads], layer_share=1.0,
                                            layer_scores="keys", key_rank=16))
    sel.draft_signal = torch.rand(B, cache.capacity, device=dev)
    sel.target_signal = torch.rand(B, cache.capacity, device=dev)
    sel.prepare(cache, lengths, [L] * B)
    planner = planner_for(cache)

    def dense(live=None, srh=False, few=0):
        def run():
            if live is not None:
                cache.live.copy_(live)
            cache.few_live = few  # > 0: the valve's launch for at most that many live (KVCache.few_live)
            try:
                return m.forward(ids, cache, lengths, scores=[srh_request(heads, T)] if srh else ())
            finally:
                cache.live.fill_(True)
                cache.few_live = 0
        return run

    def sparse(srh=False):
        return lambda: m.forward(ids, cache, lengths, plan=planner.plan(sel, lengths),
                                 scores=[srh_request(heads, T)] if srh else ())

    cases = {"dense, all live": dense(), "dense, all live + SRH": dense(srh=True),
             f"re-run, {a.live} live": dense(fired), f"re-run, {a.live} live + SRH": dense(fired, True),
             "re-run, none live + SRH": dense(torch.zeros_like(fired), True),
             f"re-run few-live launch, {a.live} live + SRH": dense(fired, True, a.live),
             "re-run few-live launch, 1 live + SRH": dense(torch.arange(B, device=dev) < 1, True, 1),
             "re-run, 1 live + SRH": dense(torch.arange(B, device=dev) < 1, True),
             f"re-run few-live launch, {2 * a.live} live + SRH": dense(torch.arange(B, device=dev) < 2 * a.live, True, 2 * a.live),
             f"re-run, {2 * a.live} live + SRH": dense(torch.arange(B, device=dev) < 2 * a.live, True),
             f"re-run few-live launch, {4 * a.live} live + SRH": dense(torch.arange(B, device=dev) < 4 * a.live, True, 4 * a.live),
             f"re-run, {4 * a.live} live + SRH": dense(torch.arange(B, device=dev) < 4 * a.live, True),
             "sparse keys r16 (plan + forward)": sparse(), "sparse keys r16 + SRH": sparse(True)}
    res = dict(meta=dict(batch=B, context=L, rows=T, live=a.live, srh_heads=heads, device=torch.cuda.get_device_name() if gpu else "cpu",
                         torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                         command=" ".join(sys.argv)), ms={}, kernels={})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, fn in cases.items():
        res["ms"][name] = round(timed(fn, a.reps, dev, 3), 4)
        print(name, res["ms"][name], flush=True)
    for name in (f"re-run, {a.live} live + SRH", f"re-run few-live launch, {a.live} live + SRH") if gpu else ():
        res["kernels"][name] = kernel_table(cases[name], 5)
    (out / "valve_rerun_speed.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Dustin's valve re-run at B = {B} x {L} — {res['meta']['date']}", "",
             f"`{res['meta']['command']}` on {res['meta']['device']} (torch {torch.__version__}); T = {T}, random-weight "
             f"SmolLM2-135M shape, SRH heads {heads}.", "", "| case | ms |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in res["ms"].items()]
    for name, p in res["kernels"].items():
        lines += ["", f"## {name}: kernels ({p['device_us_per_call']} µs, {p['launches_per_call']} launches)", "",
                  "| kernel | µs | launches |", "|---|---|---|"]
        lines += [f"| `{k['name']}` | {k['us_per_call']} | {k['count']:g} |" for k in p["top"]]
    (out / "valve_rerun_speed.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
