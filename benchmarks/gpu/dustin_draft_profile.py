"""Where a Dustin iteration's GPU time goes: CUDA kernels of one profiled generation, by phase.

    python3 benchmarks/gpu/dustin_draft_profile.py --gguf /tmp/m/smol.gguf --out DIR --document a.py [--ratio 0.05]

Dustin (or ``--method``, with options; defaults; ``--context`` 8k, ``--batch`` 64, 96 new tokens, γ 4, bf16, Triton, CUDA graphs, fused projections) after two
warm-up generations; ``torch.profiler`` over a third, with a ``record_function`` range around each engine phase
(``draft``, ``verify``, ``select``, ``sample``). Writes ``DIR/profile.md`` (the phases' CUDA time per iteration and the
top kernels by CUDA time, with calls per iteration) and ``DIR/profile.json``. ``--smoke``: the embedded model on the
CPU, context 128, B = 2, 8 tokens (CPU operators instead of kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--document", required=True)
    ap.add_argument("--method", default="dustin", help="any method (the kernels of its iterations, by phase), with its "
                    "options as in specdec bench --methods: dustin:verify=dense:tree=true")
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--ratio", type=float, default=0.05)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--trace", action="store_true", help="also write the Chrome trace, DIR/trace.json.gz, with ranges "
                    "around the drafter's hooks")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import specdec.engine as engine_mod
    from specdec.bench import _prefilled
    from specdec.data import context_windows, load_document
    from specdec.engine import PhaseTimer, cache_positions
    from specdec.loading import load_model, pipeline_config
    from specdec.presets import build_engine

    gpu = not a.smoke
    model = load_model("smollm2-135m" if a.smoke else a.gguf, "bfloat16" if gpu else "float32", "cuda" if gpu else "cpu",
                       "triton" if gpu else "reference", gpu, False, gpu)
    ctx, B, new = (128, 2, 8) if a.smoke else (a.context, a.batch, a.new)
    method, *options = a.method.split(":")
    ids = context_windows(model.tokenizer, load_document(a.document), ctx, 1, new + 16, 1000)[0]
    model.new_cache(B, cache_positions(len(ids), new, 4), reuse=True)
    eng = build_engine(model, pipeline_config(method, 4, None, a.ratio, 0.0, 1.0, 0, None, options=options), eos_token_id=-1)
    pre = _prefilled(eng, model, [ids], B, random_cache=False)
    for _ in range(2):
        eng.generate(pre.ids, max_new_tokens=new, prefilled=pre)

    class Ranged(PhaseTimer):  # each phase also a profiler range
        @contextmanager
        def __call__(self, phase):
            with record_function(f"phase:{phase}"), super().__call__(phase):
                yield

    engine_mod.PhaseTimer = Ranged
    if a.trace:  # the drafter's hooks as ranges too (instance attributes: gone with the engine)
        look = eng.drafter
        for obj, name in ((look, "_tokens_on"), (getattr(look, "inner", look), "draft"), (look, "_device_round"),
                          (look, "_merged")):
            if hasattr(obj, name):
                fn = getattr(obj, name)
                setattr(obj, name, lambda *x, _fn=fn, _n=f"{type(obj).__name__}.{name}", **k: _ranged(_n, _fn, x, k))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    try:
        with profile(activities=acts) as prof:
            res = eng.generate(pre.ids, max_new_tokens=new, prefilled=pre)
            if gpu:
                torch.cuda.synchronize()
    finally:
        engine_mod.PhaseTimer = PhaseTimer
    if a.trace:
        import gzip
        import os
        import tempfile

        Path(a.out).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(os.path.join(tmp, "t.json"))
            with open(os.path.join(tmp, "t.json"), "rb") as f, gzip.open(Path(a.out, "trace.json.gz"), "wb") as g:
                g.write(f.read())
    it = max(res.stats.iterations, 1)
    graphs = getattr(model, "_graphs", None)
    graph_state = None if graphs is None else dict(
        captured=len(graphs.graphs), replays=graphs.replays,
        uncapturable={str(k)[:300]: str(v)[:300] for k, v in graphs.uncapturable.items()})
    print("graphs:", json.dumps(graph_state, indent=1))
    events = prof.key_averages()
    dev_time = (lambda e: e.device_time_total) if gpu else (lambda e: e.cpu_time_total)
    phases = {e.key: dev_time(e) / it for e in events if e.key.startswith("phase:")}
    kernels = sorted((e for e in events if not e.key.startswith("phase:") and dev_time(e) > 0
                      and (not gpu or e.device_type.name == "CUDA")), key=dev_time, reverse=True)
    total = sum(dev_time(e) for e in kernels)
    rows = [dict(name=e.key, us_per_iteration=dev_time(e) / it, calls_per_iteration=e.count / it,
                 share=dev_time(e) / total if total else 0.0) for e in kernels[: a.top]]
    by_phase = kernels_by_phase(prof, it, a.top) if gpu else {}
    out = dict(argv=sys.argv, iterations=it, graphs=graph_state, tau=res.stats.mean_accepted_length, kernels_by_phase=by_phase,
               phase_ms_per_iteration={k: 1e3 * v / it for k, v in res.stats.phase_seconds.items() if v},
               profiler_phase_us_per_iteration=phases, kernel_us_per_iteration=total / it, kernels=rows)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, "profile.json").write_text(json.dumps(out, indent=1))
    lines = [f"# {a.method} iteration profile — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`{' '.join(sys.argv)}`", "", f"{it} iterations, τ {out['tau']:.2f}. Phases (engine timer, ms per "
             "iteration): " + ", ".join(f"{k} {v:.2f}" for k, v in out["phase_ms_per_iteration"].items()),
             "", "Profiler ranges (device µs per iteration): " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()),
             "", f"Kernels: {out['kernel_us_per_iteration']:.0f} µs per iteration in all.", "",
             "| kernel | µs / iteration | calls / iteration | share |", "|---|---|---|---|"]
    lines += [f"| `{r['name'][:90]}` | {r['us_per_iteration']:.1f} | {r['calls_per_iteration']:.1f} | "
              f"{r['share']:.1%} |" for r in rows]
    for ph, ks in by_phase.items():
        lines += ["", f"**{ph}** ({sum(k['us_per_iteration'] for k in ks):.0f} µs per iteration in its top {len(ks)} "
                  "kernels):", "", "| kernel | µs / iteration | calls / iteration |", "|---|---|---|"]
        lines += [f"| `{k['name'][:90]}` | {k['us_per_iteration']:.1f} | {k['calls_per_iteration']:.1f} |" for k in ks]
    Path(a.out, "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _ranged(name, fn, args, kw):
    from torch.profiler import record_function

    with record_function(name):
        return fn(*args, **kw)


def kernels_by_phase(prof, iterations: int, top: int) -> dict:
    """The CUDA kernels inside each phase's range on the GPU timeline (the profiler's GPU-side copies of the
    ``phase:*`` ranges), summed by name: ``{phase: [{name, us_per_iteration, calls_per_iteration}]}``, the top ``top``."""
    evs = prof.events()
    cuda = [e for e in evs if e.device_type.name == "CUDA"]
    spans = sorted((e.time_range.start, e.time_range.end, e.name[len("phase:"):]) for e in cuda
                   if e.name.startswith("phase:"))
    out: dict[str, dict[str, list]] = {}
    import bisect

    starts = [s for s, _, _ in spans]
    for e in cuda:
        if e.name.startswith("phase:"):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start >= spans[i][1]:
            ph = "between phases"
        else:
            ph = spans[i][2]
        acc = out.setdefault(ph, {}).setdefault(e.name, [0.0, 0])
        acc[0] += e.time_range.end - e.time_range.start
        acc[1] += 1
    return {ph: [dict(name=n, us_per_iteration=v[0] / iterations, calls_per_iteration=v[1] / iterations)
                 for n, v in sorted(ks.items(), key=lambda kv: -kv[1][0])[:top]] for ph, ks in out.items()}


if __name__ == "__main__":
    raise SystemExit(main())
