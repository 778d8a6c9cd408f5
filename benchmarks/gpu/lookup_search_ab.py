"""Dustin's prompt lookup searched on the host (per-sequence dictionaries) or on the device (:func:`specdec.lookup.
locate_batch`), interleaved in one run, against dense decoding.

    python3 benchmarks/gpu/lookup_search_ab.py --gguf /tmp/m/smol.gguf --out DIR --documents a.py,b.txt [--ratios 0.05,0.25]

Per document: dense (warm-up + median of ``--repeats``), then per verification budget one Dustin engine, free-running
and on dense's text (:func:`specdec.bench.dense_text_replay`), each timed with ``search="host"`` and ``"device"`` in
turn (a warm-up of each, then ``--repeats`` rounds of the two); the tokens of every run compared (the same drafts
must give the same tokens). 8k context, B = 64, 96 new tokens, γ 4, bf16, Triton, CUDA graphs, fused projections, the
engine's default phase timing (CUDA events). Writes ``DIR/lookup_search.{json,md}``. ``--smoke``: the embedded model on
the CPU, context 128, B = 2, 8 tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SEARCH = ("host", "device")


def main(argv: list[str] | None = None) -> int:
    from sync_timing import common_args, host_times, load

    ap = common_args(__doc__)
    ap.add_argument("--ratios", default="0.05", help="comma-separated verification budgets (share of the context)")
    a = ap.parse_args(argv)
    from specdec.bench import _prefilled, dense_text_replay
    from specdec.data import context_windows, load_document
    from specdec.engine import cache_positions
    from specdec.loading import pipeline_config
    from specdec.lookup import LookupDrafter
    from specdec.presets import build_engine

    model, ctx, B, new, repeats = load(a)

    def gen(eng, pre):
        return eng.generate(pre.ids, max_new_tokens=new, prefilled=pre)

    rows, t0 = [], time.time()
    micro = None if a.smoke else device_round_micro(B, ctx + new + 6)
    for doc in a.documents.split(","):
        ids = context_windows(model.tokenizer, load_document(doc), ctx, 1, new + 16, 1000)[0]
        model.release_cache()
        model.new_cache(B, cache_positions(len(ids), new, 4), reuse=True)
        dense = build_engine(model, pipeline_config("dense", 4, None, None, 0.0, 1.0, 0, None), eos_token_id=-1)
        pre = _prefilled(dense, model, [ids], B, random_cache=False)
        gen(dense, pre)
        d_runs = [gen(dense, pre) for _ in range(repeats)]
        d_tps = statistics.median(r.stats.tokens_per_second for r in d_runs)
        rows.append(dict(document=doc, setting="dense", tokens_per_second=d_tps, speedup_vs_dense=1.0))
        dense = None
        for ratio in (float(x) for x in a.ratios.split(",")):
            eng = build_engine(model, pipeline_config("dustin", 4, None, ratio, 0.0, 1.0, 0, None), eos_token_id=-1)
            look = eng.drafter
            assert isinstance(look, LookupDrafter), type(look)
            for label, replay in ((f"dustin {ratio:.0%}", None),
                                  (f"dustin {ratio:.0%} (dense's text)", dense_text_replay(eng, pre, new)[0])):
                eng.replay = replay
                res = {s: [] for s in SEARCH}
                for s in SEARCH:  # warm-up of each (graph captures, the first device buffer)
                    look.search = s
                    gen(eng, pre)
                for _ in range(repeats):
                    for s in SEARCH:
                        look.search = s
                        res[s].append(gen(eng, pre))
                first = res["host"][0].tokens
                row = dict(document=doc, setting=label, tau=res["device"][0].stats.mean_accepted_length,
                           same_tokens_every_run=all(r.tokens == first for rs in res.values() for r in rs))
                for s, rs in res.items():
                    tps = [r.stats.tokens_per_second for r in rs]
                    med = sorted(rs, key=lambda r: r.stats.tokens_per_second)[(len(rs) - 1) // 2]
                    look.search = s
                    row[s] = dict(median=statistics.median(tps), min=min(tps), max=max(tps),
                                  speedup_vs_dense=statistics.median(tps) / d_tps,
                                  ms_per_iteration={k: 1e3 * v / max(med.stats.iterations, 1)
                                                    for k, v in med.stats.phase_seconds.items() if v and k != "prefill"},
                                  host_ms_per_iteration=host_times(eng, lambda: gen(eng, pre)))
                rows.append(row)
                print(f"{doc} {label}: dense {d_tps:.0f}, host {row['host']['median']:.0f}, device "
                      f"{row['device']['median']:.0f} tok/s ({time.time() - t0:.0f} s)", flush=True)
            eng = None
    write(a, rows, micro)
    return 0


def device_round_micro(B: int, W: int, reps: int = 200) -> dict:
    """GPU microseconds of :func:`specdec.lookup.locate_batch` and of a whole device round (eager launches and one
    graph replay) on random tokens ``(B, W)`` of a 64-token alphabet, γ 4, keep 16: CUDA events around ``reps``
    calls, after a warm-up."""
    import torch

    from specdec.graphs import CapturedCall, keep_address
    from specdec.interfaces import Drafter
    from specdec.lookup import LookupDrafter, locate_batch

    class Inner(Drafter):
        def prefill(self, state):
            pass

        def draft(self, state, gamma):
            raise AssertionError

    look = LookupDrafter(Inner(), 2, 4, trust_n=4, keep=16)
    toks = keep_address(torch.randint(0, 64, (B, W), device="cuda"))
    last = torch.full((B,), W - 10, device="cuda")
    drafts = torch.randint(0, 64, (B, 4), device="cuda")
    la = torch.rand(B, W, device="cuda")
    calls = CapturedCall()

    def timed(fn) -> dict:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t = time.perf_counter()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        host = (time.perf_counter() - t) / reps * 1e6
        torch.cuda.synchronize()
        return dict(gpu_us=start.elapsed_time(end) / reps * 1e3, host_us=host)

    out = dict(B=B, W=W, locate=timed(lambda: locate_batch(toks, last, 2, 4)),
               round_eager=timed(lambda: look._device_round(toks, last, drafts, la)),
               round_graph=timed(lambda: calls("r", look._device_round, toks, last, drafts, la, keep=look)))
    print("device round micro:", out, flush=True)
    return out


def write(a, rows: list[dict], micro: dict | None = None) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lookup_search.json").write_text(json.dumps(dict(argv=sys.argv, rows=rows, micro=micro), indent=1))
    lines = [f"# Prompt lookup on the host or on the device — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"`{' '.join(sys.argv)}`", "",
             "| document | setting | τ | host tok/s (× dense) | device tok/s (× dense) | device / host | same tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["setting"] == "dense":
            lines.append(f"| {r['document']} | dense | 1.00 | {r['tokens_per_second']:.0f} | | | |")
            continue
        h, d = r["host"], r["device"]
        lines.append(f"| {r['document']} | {r['setting']} | {r['tau']:.2f} | {h['median']:.0f} ({h['min']:.0f}–"
                     f"{h['max']:.0f}; {h['speedup_vs_dense']:.2f}×) | {d['median']:.0f} ({d['min']:.0f}–{d['max']:.0f}; "
                     f"{d['speedup_vs_dense']:.2f}×) | {d['median'] / h['median']:.3f} | {r['same_tokens_every_run']} |")
    lines += ["", "ms per iteration (median run; phases from CUDA events, host: time inside each hook): host / device",
              ""]
    for r in rows:
        if r["setting"] == "dense":
            continue
        cells = []
        for key in ("ms_per_iteration", "host_ms_per_iteration"):
            names = sorted(set(r["host"][key]) | set(r["device"][key]))
            cells.append(", ".join(f"{k} {r['host'][key].get(k, 0):.2f} / {r['device'][key].get(k, 0):.2f}"
                                   for k in names))
        lines.append(f"- {r['document']} {r['setting']}: phases {cells[0]}; host {cells[1]}")
    if micro:
        lines += ["", f"Device round alone (B {micro['B']}, W {micro['W']}; µs per call, GPU / host): " + ", ".join(
            f"{k} {v['gpu_us']:.0f} / {v['host_us']:.0f}" for k, v in micro.items() if isinstance(v, dict))]
    (out / "lookup_search.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
