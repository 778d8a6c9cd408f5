"""What synchronising at phase edges costs: tokens/s of each method with the engine's phase timer in three modes,
interleaved in one run.

    python3 benchmarks/gpu/sync_timing.py --gguf /tmp/m/smol.gguf --out DIR --documents a.py,b.txt

Modes: ``sync`` (``sync_timing=True``: ``torch.cuda.synchronize()`` at every phase edge, host wall time per phase;
the engine's default until 2026-12-04), ``events`` (the default now: CUDA events at the phase edges, no host
synchronisation) and ``none`` (host ``perf_counter`` only: no synchronisation, no events — what an untimed loop
costs). Per document, method (default dense, magicdec, vegas, dustin at a 5 % budget; 8k context, B = 64, 96 new
tokens, γ 4, bf16, Triton, CUDA graphs, fused projections) and, for a near-lossless method, also on dense's text
(:func:`specdec.bench.dense_text_replay`): one warm-up per mode, then ``--repeats`` rounds of the three modes (the
order turned by one each round);
medians, min–max, the tokens of every run compared with the first. Dustin and Vegas also run once with the host time
of their hooks recorded (``perf_counter`` around each call; no synchronisation). Writes ``DIR/sync_timing.{json,md}``.
``--smoke``: the embedded model on the CPU, context 128, B = 2, 8 tokens (the modes are equal there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODES = ("sync", "events", "none")


def common_args(description: str) -> argparse.ArgumentParser:
    """The options this script shares with ``lookup_search_ab.py``."""
    ap = argparse.ArgumentParser(description=description.split("\n")[0])
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--documents", required=True, help="comma-separated files or built-in names")
    ap.add_argument("--context", type=int, default=8000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    return ap


def load(a) -> tuple:
    """``(model, context, batch, new tokens, repeats)``: the GGUF in bf16 on the GPU (Triton, graphs, fused), or with
    ``--smoke`` the embedded model in float32 on the CPU at context 128, B 2, 8 tokens, one repeat."""
    from specdec.loading import load_model

    gpu = not a.smoke
    model = load_model("smollm2-135m" if a.smoke else a.gguf, "bfloat16" if gpu else "float32", "cuda" if gpu else "cpu",
                       "triton" if gpu else "reference", gpu, False, gpu)
    return (model,) + ((128, 2, 8, 1) if a.smoke else (a.context, a.batch, a.new, a.repeats))


def main(argv: list[str] | None = None) -> int:
    ap = common_args(__doc__)
    ap.add_argument("--methods", default="dense,magicdec,vegas,dustin")
    ap.add_argument("--budget-ratio", type=float, default=0.05)
    a = ap.parse_args(argv)
    import specdec.engine as engine_mod
    from specdec.engine import PhaseTimer
    from workload import engines

    model, ctx, B, new, repeats = load(a)

    def untimed(device, sync=False):  # mode "none": no synchronisation, no events
        t = PhaseTimer(device, False)
        t.events = False
        return t

    def run(eng, pre, mode):
        eng.sync_timing = mode == "sync"
        engine_mod.PhaseTimer = untimed if mode == "none" else PhaseTimer
        try:
            return eng.generate(pre.ids, max_new_tokens=new, prefilled=pre)
        finally:
            engine_mod.PhaseTimer = PhaseTimer

    rows, t0 = [], time.time()
    for doc, name, label, eng, pre in engines(model, a.documents, a.methods, a.budget_ratio, ctx, B, new):
        for mode in MODES:  # every capture and compilation happens here
            run(eng, pre, mode)
        res = {m: [] for m in MODES}
        for i in range(repeats):  # the order turns each round (the first run of a round is not always one mode)
            for mode in MODES[i % 3 :] + MODES[: i % 3]:
                res[mode].append(run(eng, pre, mode))
        first = res[MODES[0]][0].tokens
        row = dict(document=doc, method=label, tau=res["events"][0].stats.mean_accepted_length,
                   iterations=res["events"][0].stats.iterations,
                   same_tokens_every_run=all(r.tokens == first for rs in res.values() for r in rs))
        for mode, rs in res.items():
            tps = [r.stats.tokens_per_second for r in rs]
            med = sorted(rs, key=lambda r: r.stats.tokens_per_second)[(len(rs) - 1) // 2]
            row[mode] = dict(median=statistics.median(tps), min=min(tps), max=max(tps),
                             ms_per_iteration={k: 1e3 * v / max(med.stats.iterations, 1)
                                               for k, v in med.stats.phase_seconds.items() if v})
        if name in ("dustin", "vegas"):
            row["host_ms_per_iteration"] = host_times(eng, lambda: run(eng, pre, "none"))
        rows.append(row)
        print(f"{doc} {label}: " + ", ".join(f"{m} {row[m]['median']:.0f}" for m in MODES)
              + f" tok/s ({time.time() - t0:.0f} s)", flush=True)
    write(a, rows)
    return 0


def host_times(eng, call) -> dict:
    """Host milliseconds per iteration spent inside the drafter's and verifier's hooks during ``call()`` (no
    synchronisation is added; a hook that reads the device waits inside its own time)."""
    hooks = [(eng.drafter, "draft"), (eng.drafter, "on_verify"), (eng.verifier, "verify"),
             (eng.verifier, "on_verify"), (eng, "_commit_launch"), (eng, "_commit_read")]
    inner = getattr(eng.drafter, "inner", None)
    if inner is not None:  # a prompt-lookup wrapper: its inner drafter, and its device search's token copy
        hooks += [(inner, "draft"), (eng.drafter, "_tokens_on")]
    spent: dict[str, float] = {}
    saved = []
    for obj, name in hooks:
        key = f"{type(obj).__name__}.{name}"
        fn = getattr(obj, name)
        saved.append((obj, name, obj.__dict__.get(name)))

        def timed(*args, _fn=fn, _key=key, **kw):
            t = time.perf_counter()
            try:
                return _fn(*args, **kw)
            finally:
                spent[_key] = spent.get(_key, 0.0) + time.perf_counter() - t

        setattr(obj, name, timed)
    try:
        res = call()
    finally:
        for obj, name, old in saved:
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
    n = max(res.stats.iterations, 1)
    return dict({k: 1e3 * v / n for k, v in spent.items()}, wall=1e3 * res.stats.decode_seconds / n)


def write(a, rows: list[dict]) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sync_timing.json").write_text(json.dumps(dict(argv=sys.argv, rows=rows), indent=1))
    lines = [f"# Phase-edge synchronisation and tokens/s — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`{' '.join(sys.argv)}`", "",
             "| document | method | τ | sync tok/s | events tok/s | none tok/s | events / sync | none / events | same tokens |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, e, n = (r[m]["median"] for m in MODES)
        lines.append(f"| {r['document']} | {r['method']} | {r['tau']:.2f} | {s:.0f} ({r['sync']['min']:.0f}–"
                     f"{r['sync']['max']:.0f}) | {e:.0f} ({r['events']['min']:.0f}–{r['events']['max']:.0f}) | {n:.0f} "
                     f"({r['none']['min']:.0f}–{r['none']['max']:.0f}) | {e / s:.3f} | {n / e:.3f} | "
                     f"{r['same_tokens_every_run']} |")
    lines += ["", "ms per iteration by phase (median run): sync / events", ""]
    for r in rows:
        ph = sorted(set(r["sync"]["ms_per_iteration"]) | set(r["events"]["ms_per_iteration"]))
        cells = ", ".join(f"{p} {r['sync']['ms_per_iteration'].get(p, 0):.2f} / {r['events']['ms_per_iteration'].get(p, 0):.2f}"
                          for p in ph if p != "prefill")
        host = r.get("host_ms_per_iteration")
        lines.append(f"- {r['document']} {r['method']}: {cells}" + (
            "; host ms/iteration: " + ", ".join(f"{k} {v:.2f}" for k, v in host.items()) if host else ""))
    (out / "sync_timing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
