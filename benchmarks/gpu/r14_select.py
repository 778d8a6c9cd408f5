"""Vegas' selection per iteration (``on_verify`` + the plan), three ways, with their index sets compared in the same run:

* ``torch``: ``torch.topk`` + the per-sequence cut (the default; the KV-head sum in ``on_verify``, the plan as one
  CUDA graph);
* ``triton_topk``: ``TRITON_SELECT = True``, the top-k of the summed scores in one Triton launch (the plan graph
  around it; rows of at most 16384 positions, else it is the torch path);
* ``fused``: ``TRITON_SELECT = "fused"``, the whole plan in one launch (``specdec.cuda.triton_select.select_plan``:
  head sum + mask + radix select + fixed positions; ``on_verify`` only keeps the emitted scores);
* ``radix16``: ``TRITON_SELECT = "radix16"``, the same plan over 16-bit keys with each row split over several programs
  (``select_plan16``: 4 launches, two 8-bit passes; no plan graph), and ``radix16_graph`` (``"radix16-graph"``: the
  same launches inside the plan CUDA graph, which copies Vegas' emitted scores into its input buffer at each replay;
  GPU only). Their sets may differ from torch's inside the boundary bucket (scores equal in their top 16 order bits):
  for them parity's ``tie_rows`` counts the rows that differ only there (``bad_rows`` must stay 0).

* ``auto``: ``TRITON_SELECT = "auto"`` (radix16 eager at >= ``AUTO_EAGER_ELEMENTS`` score elements, in the plan graph
  below), only in ``--e2e-auto``.

    timeout 170 python3 benchmarks/gpu/r14_select.py --out $OUT/sel14b --budget-s 115  # H200 (e2e: /tmp/m/smol.gguf)
    python3 benchmarks/gpu/r14_select.py --out /tmp/sel14 --smoke            # CPU, tiny, TRITON_INTERPRET=1
    timeout 150 python3 benchmarks/gpu/r14_select.py --out $OUT/selauto --e2e-auto --budget-s 100  # H200, ~1.5 min
    python3 benchmarks/gpu/r14_select.py --out /tmp/selauto --e2e-auto --smoke

``--e2e-auto`` runs only part 2, torch vs ``auto`` at B 1, 16 and 64 x 8k (the smoke: B 1 / 2 x 160), 2 rounds, each
round every (B, setting) in turn (torch first at each B), same tokens checked per (round, B); the Markdown ends with
the verdict: flip the default to ``"auto"`` only if its select ms/iteration is below torch's at every B in both
rounds with the same tokens (a skipped or failed run counts against it).

Parts, in this order (each records its failure with the traceback and the next one runs; none starts after
``--budget-s``; a SIGTERM, e.g. from ``timeout``, still writes the files):

1. ``micro``: shapes SmolLM2 (30 layers, 3 KV heads) B 64 / 16 / 1 x 8k and Llama-3.1-8B (32 layers, 8 KV heads)
   B 16 x 32k, Collect-2-Query, 5 % budget, random scores (fp32; bf16 too at B 64 and 8B), all lengths full.
   Per setting (a fresh planner each, so a fresh plan graph): wall time with ``torch.cuda.synchronize()`` of
   ``on_verify`` + ``Planner.plan`` and of each part, medians of ``--reps`` after 3 warm-ups; the fused kernel alone
   (CUDA events) against its memory floor (score bytes / 4.2 TB/s). Parity: eager plans of the same scores with
   random lengths in [L/2, L]: per (layer, sequence, head) row the index sets of each setting vs ``torch``; a row
   that differs only among equal scores at the threshold is counted apart (``tie_rows``: ``torch.topk`` breaks
   ties arbitrarily, the Triton paths take the lowest positions).
2. ``e2e`` (skipped with ``--no-e2e``): the embedded model, bf16, triton, graphs, fused, B 64 x 8k of ``ssl.py``, gamma 4,
   5 %, 64 new tokens, ``run_bench`` (warm-up + 1 timed run) of vegas with ``torch``, ``fused`` and ``radix16``
   (``--old-key`` adds ``torch_old_key``: the score buffer as a tensor attribute again, a plan graph captured inside
   the timed call, as before the plan-graph fix), 2 rounds interleaved; the second with ``on_verify`` and ``Planner.plan`` timed apart (a sync around each)
   and the plan-graph captures of the timed call counted; every run counts its plans built eagerly / through the
   plan graph (``plans_in_one_launch``).
3. ``sweep``: the fused kernel alone at B 64 x 8k (fp32) over radix bits, ``num_warps`` and rows per program, and
   ``select_plan16`` over its block (positions per program) and ``num_warps``.

Writes ``<out>/r14_select.json`` and ``.md`` after every part, and ``<out>.tgz`` at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import ssl
import statistics
import sys
import tarfile
import time
import traceback
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

T0 = time.perf_counter()
BW = 4.2e12  # H200 copy bandwidth, bytes/s (DESIGN.md: 4.24-4.25 TB/s)
GAMMA = 4
RATIO = 0.05  # the budget (the smoke: 0.3, so that its short rows have top-k slots)
WARM = 3  # warm-up calls before timing (the smoke: 1)
SHAPES = [("smol B64 x 8k", 30, 64, 3, 8000), ("smol B16 x 8k", 30, 16, 3, 8000), ("smol B1 x 8k", 30, 1, 3, 8000),
          ("8b B16 x 32k", 32, 16, 8, 32768)]
SMOKE_SHAPES = [("smoke B3 x 300", 3, 3, 3, 300), ("smoke B2 x 600", 2, 2, 2, 600)]


def elapsed() -> float:
    return time.perf_counter() - T0


def settings(smoke: bool):
    """(label, TRITON_SELECT value) of the paths (the CPU smoke: the interpreter's ``always`` values, no graphs)."""
    return [("torch", False), ("triton_topk", "always" if smoke else True),
            ("fused", "fused-always" if smoke else "fused"), ("radix16", "radix16-always" if smoke else "radix16")] + (
        [] if smoke else [("radix16_graph", "radix16-graph")])


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def wall_med(fn, reps: int, dev) -> float:
    """Median ms of ``fn()`` + a sync, after 3 warm-ups."""
    for _ in range(WARM):
        fn()
    _sync(dev)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        _sync(dev)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def gpu_med(fn, reps: int, dev) -> float:
    """Median ms of ``fn()`` by CUDA events (wall on the CPU)."""
    if dev.type != "cuda":
        return wall_med(fn, reps, dev)
    for _ in range(WARM):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _setup(N, B, H, L, dt, dev, seed=0):
    from specdec import SELECTORS, KVCache
    from specdec.interfaces import ScoreRequest

    cap = L + 16
    cache = KVCache(N, B, H, cap, 8, torch.bfloat16 if dev.type == "cuda" else torch.float32, dev)
    g = torch.Generator(device=dev).manual_seed(seed)
    stacked = torch.rand(N, B, H, cap, device=dev, generator=g).to(dt)  # as emitted: one buffer, per KV head
    req = ScoreRequest(rows=[0, GAMMA], kind="sink_softmax", heads="group")
    req.scores = dict(zip(range(N), stacked.unbind(0)))
    return cache, req, stacked, lambda: SELECTORS.build("collect2", budget_ratio=RATIO)


def _fresh_planner(cache):
    from specdec import planner

    planner._PLANNERS.pop(cache, None)  # a new plan graph for this setting (the setting is not in the graph key)
    return planner.planner_for(cache)


def _key16(s: torch.Tensor) -> torch.Tensor:
    """The 16-bit order key of fp32 ``s`` that ``select_plan16`` ranks (as int32)."""
    bits = s.float().contiguous().view(torch.int32)
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF) >> 16


def parity(N, B, H, L, dev, smoke) -> dict:
    """Eager plans of one set of scores (random lengths) with each setting, rows compared with torch's."""
    from specdec.selectors import base

    cache, req, stacked, build = _setup(N, B, H, L, torch.float32, dev, seed=1)
    g = torch.Generator(device=dev).manual_seed(2)
    lengths = torch.randint(L // 2, L + 1, (B,), device=dev, generator=g)
    summed = stacked.float().sum(2, keepdim=True)  # (N, B, 1, cap): what the plan ranks
    plans = {}
    for label, flag in settings(smoke):
        base.TRITON_SELECT = flag
        try:
            sel = build()
            sel.reset(cache)
            sel.on_verify(req, lengths)
            plans[label] = sel.plan(cache, lengths).indices
        finally:
            base.TRITON_SELECT = False
    want = plans["torch"]
    out = dict(shape=list(want.shape), empty_slots=int((want == -1).sum()))
    for label, got in plans.items():
        if label == "torch":
            continue
        if got.shape != want.shape:
            out[label] = dict(error=f"shape {tuple(got.shape)} vs {tuple(want.shape)}")
            continue
        a, b = want.sort(-1).values, got.sort(-1).values
        same = (a == b).all(-1)  # (N, B, 1)
        # rows that differ: equal multisets of scores -> the difference is among ties at the threshold
        va = torch.where(a >= 0, summed.gather(3, a.clamp(min=0)), float("-inf")).sort(-1).values
        vb = torch.where(b >= 0, summed.gather(3, b.clamp(min=0)), float("-inf")).sort(-1).values
        ties = (~same) & (va == vb).all(-1)
        if label.startswith("radix16"):  # rows that differ only inside the boundary bucket of 16-bit keys
            k16 = _key16(summed)
            a, b = want[..., 20:], got[..., 20:]  # the top-k parts (the fixed 20 positions are compared below)
            ka = torch.where(a >= 0, k16.gather(3, a.clamp(min=0)), 2 ** 20)
            kb = torch.where(b >= 0, k16.gather(3, b.clamp(min=0)), 2 ** 20)
            t = kb.min(-1, keepdim=True).values  # the boundary key of each row
            above = lambda idx, k: torch.where((idx >= 0) & (k > t) & (k < 2 ** 20), idx, -1).sort(-1).values  # noqa: E731
            ties = (~same) & (above(a, ka) == above(b, kb)).all(-1) & (ka >= t).all(-1) & ((a >= 0) == (b >= 0)).all(-1)
        out[label] = dict(rows=int(same.numel()), same_rows=int(same.sum()), tie_rows=int(ties.sum()),
                          bad_rows=int((~same & ~ties).sum()), same_index_sets=bool(same.all()),
                          same_fixed=bool(torch.equal(got[..., :20], want[..., :20])))
    return out


def micro(a, dev, log) -> list[dict]:
    from specdec.selectors import base

    rows = []
    for name, N, B, H, L in (SMOKE_SHAPES if a.smoke else SHAPES):
        if elapsed() > a.budget_s:
            rows.append(dict(shape=name, skipped="budget"))
            continue
        try:
            row = dict(shape=name, N=N, B=B, H_kv=H, L=L, parity=parity(N, B, H, L, dev, a.smoke))
            log(f"{name} parity {row['parity']}")
            for dt in ((torch.float32, torch.bfloat16) if (a.smoke and L == 300) or B == 64 or H == 8 else (torch.float32,)):
                cache, req, stacked, build = _setup(N, B, H, L, dt, dev)
                lengths = torch.full((B,), L, dtype=torch.long, device=dev)
                dkey = str(dt).replace("torch.", "")
                for label, flag in settings(a.smoke):
                    if label == "triton_topk" and L + 16 > 16384:
                        row[f"{label} {dkey}"] = dict(skipped="rows > 16384 positions: the torch path")
                        continue
                    base.TRITON_SELECT = flag
                    try:
                        sel = build()
                        sel.reset(cache)
                        planner = _fresh_planner(cache)

                        def step():
                            sel.on_verify(req, lengths)
                            planner.plan(sel, lengths)

                        r = dict(ms=wall_med(step, a.reps, dev), on_verify_ms=wall_med(lambda: sel.on_verify(req, lengths), a.reps, dev),
                                 plan_ms=wall_med(lambda: planner.plan(sel, lengths), a.reps, dev),
                                 plan_graphs=planner.plan_graphs.captures if planner.plan_graphs is not None else 0)
                        if label in ("fused", "radix16"):
                            from specdec.cuda.triton_select import select_plan, select_plan16

                            k_sel = sel.max_selected(cache.capacity)
                            c = sel.config
                            fn = select_plan if label == "fused" else select_plan16
                            r["kernel_ms"] = gpu_med(lambda: fn(stacked, lengths, k_sel, sinks=c.sinks, recent=c.recent,
                                                                budget_ratio=c.budget_ratio, sum_heads=True), a.reps, dev)
                            r["floor_ms"] = stacked.numel() * stacked.element_size() / BW * 1e3
                    except Exception:
                        r = dict(error=traceback.format_exc())
                    finally:
                        base.TRITON_SELECT = False
                    row[f"{label} {dkey}"] = r
                    log(f"{name} {label} {dkey}: {r}")
                del cache, req, stacked
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        except Exception:
            row = dict(shape=name, error=traceback.format_exc())
            log(row["error"])
        rows.append(row)
    return rows


def sweep(a, dev, log) -> list[dict]:
    from specdec.cuda.triton_select import select_plan, select_plan16

    name, N, B, H, L = SMOKE_SHAPES[0] if a.smoke else SHAPES[0]
    _, _, stacked, _ = _setup(N, B, H, L, torch.float32, dev)
    lengths = torch.full((B,), L, dtype=torch.long, device=dev)
    from specdec.selectors.base import BudgetConfig

    k_sel = BudgetConfig(budget_ratio=RATIO).max_room(L + 16)
    base_idx, _ = select_plan(stacked, lengths, k_sel, sinks=4, recent=16, budget_ratio=RATIO, sum_heads=True)
    out = []
    # (radix bits, num_warps, rows per program): the default (5, 8 warps at 8k, 1) first
    grid = ([(5, 4, 1), (8, 4, 2)] if a.smoke else
            [(5, 8, 1), (5, 16, 1), (8, 16, 1)])  # the default and the two best of gpu_select_2026-12-01e.md
    for bits, warps, rows in grid:
        if elapsed() > a.budget_s:
            out.append(dict(radix_bits=bits, num_warps=warps, rows_per_program=rows, skipped="budget"))
            continue
        try:
            fn = lambda: select_plan(stacked, lengths, k_sel, sinks=4, recent=16, budget_ratio=RATIO,  # noqa: E731
                                     sum_heads=True, num_warps=warps, rows_per_program=rows, radix_bits=bits)
            same = bool(torch.equal(fn()[0], base_idx))
            out.append(dict(shape=name, radix_bits=bits, num_warps=warps, rows_per_program=rows,
                            kernel_ms=gpu_med(fn, a.reps, dev), same_as_default=same))
        except Exception:
            out.append(dict(radix_bits=bits, num_warps=warps, rows_per_program=rows, error=traceback.format_exc(limit=4)))
        log(f"sweep {out[-1]}")
    # select_plan16: (block, num_warps); the default (1024 at 8k, 4 warps) first
    base16, _ = select_plan16(stacked, lengths, k_sel, sinks=4, recent=16, budget_ratio=RATIO, sum_heads=True)
    for blk, warps in ([(256, 4), (512, 2)] if a.smoke else
                       [(1024, 4), (512, 4), (256, 2), (256, 4), (2048, 4), (2048, 8), (1024, 8), (4096, 8)]):
        if elapsed() > a.budget_s:
            out.append(dict(kernel="radix16", block=blk, num_warps=warps, skipped="budget"))
            continue
        try:
            fn = lambda: select_plan16(stacked, lengths, k_sel, sinks=4, recent=16, budget_ratio=RATIO,  # noqa: E731
                                       sum_heads=True, block=blk, num_warps=warps)
            same = bool(torch.equal(fn()[0], base16))
            out.append(dict(kernel="radix16", shape=name, block=blk, num_warps=warps, kernel_ms=gpu_med(fn, a.reps, dev),
                            same_as_default=same))
        except Exception:
            out.append(dict(kernel="radix16", block=blk, num_warps=warps, error=traceback.format_exc(limit=4)))
        log(f"sweep {out[-1]}")
    return out


def _plan_captures() -> int:
    """Plan CUDA graphs captured so far by every live planner."""
    from specdec import planner

    return sum(p.plan_graphs.captures for p in list(planner._PLANNERS.values()) if p.plan_graphs is not None)


class _SubTimers:
    """``on_verify`` and ``Planner.plan`` timed apart (a sync around each), reset at each ``generate``."""

    def __init__(self, dev, on: bool = True):
        from specdec.engine import SpeculativeEngine
        from specdec.planner import Planner
        from specdec.selectors.verification_guided import VerificationGuidedSelector

        self.targets = [(VerificationGuidedSelector, "on_verify"), (Planner, "plan"), (SpeculativeEngine, "generate")]
        self.saved = [getattr(c, n) for c, n in self.targets]
        self.acc, self.calls, self.dev, self.on = defaultdict(float), [], dev, on

    def __enter__(self):
        t = self
        if not self.on:
            self.targets = []
            return self

        def timed(name, fn):
            def wrapper(*args, **kw):
                _sync(t.dev)
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kw)
                finally:
                    _sync(t.dev)
                    t.acc[name + "_s"] += time.perf_counter() - t0
                    t.acc[name + "_calls"] += 1
            return wrapper

        def generate(eng, *args, **kw):
            t.acc = defaultdict(float)
            before = _plan_captures()
            res = t.saved[2](eng, *args, **kw)
            t.calls.append(dict(t.acc, plan_graph_captures=_plan_captures() - before))
            return res

        for (c, n), f in zip(self.targets[:2], self.saved[:2]):
            setattr(c, n, timed(n, f))
        setattr(self.targets[2][0], "generate", generate)
        return self

    def __exit__(self, *exc):
        for (c, n), f in zip(self.targets, self.saved):
            setattr(c, n, f)


class _OldKey:
    """With ``on``: Vegas' score buffer also as a tensor attribute kept across ``reset`` (the code before this branch)."""

    def __init__(self, on: bool):
        from specdec.selectors.verification_guided import VerificationGuidedSelector

        self.on, self.cls, self.saved = on, VerificationGuidedSelector, VerificationGuidedSelector.reset

    def __enter__(self):
        saved = self.saved

        def reset(sel, cache):
            from specdec.planner import planner_for

            saved(sel, cache)
            sel._buf = planner_for(cache)._buffers.get("verification_guided.scores.h1")  # None before the first

        if self.on:
            self.cls.reset = reset
        return self

    def __exit__(self, *exc):
        self.cls.reset = self.saved


class _PathSpy:
    """Counts the plans built as eager launches vs through the plan graph (``plans_in_one_launch``'s answers)."""

    def __init__(self):
        from specdec.selectors.base import BudgetSelector

        self.cls, self.saved, self.eager, self.graph = BudgetSelector, BudgetSelector.plans_in_one_launch, 0, 0

    def __enter__(self):
        spy, saved = self, self.saved

        def counted(sel, lengths):
            one = saved(sel, lengths)
            spy.eager, spy.graph = spy.eager + bool(one), spy.graph + (not one)
            return one

        self.cls.plans_in_one_launch = counted
        return self

    def __exit__(self, *exc):
        self.cls.plans_in_one_launch = self.saved


def e2e(a, dev, log) -> list[dict]:
    from specdec.bench import run_bench
    from specdec.loading import load_model
    from specdec.selectors import base

    smoke = a.smoke
    m = load_model("smollm2-135m" if smoke else a.gguf, "float32" if smoke else "bfloat16", dev.type,
                   "reference" if smoke else "triton", not smoke, False, True)
    common = dict(contexts=[160 if smoke else 8000], documents=[ssl.__file__], budget=None, budget_ratio=RATIO,
                  gamma=GAMMA, model=m, backend="reference" if smoke else "triton",
                  dtype="float32" if smoke else "bfloat16", device=dev.type, output_dir=Path(a.out),
                  cuda_graphs=not smoke, fuse=True, warmup=True, repeats=1, hf_baseline=False, adaptive=False,
                  max_new_tokens=8 if smoke else 64)
    rows, tokens = [], {}
    if a.e2e_auto:  # torch vs "auto" at B 1 / 16 / 64 (the smoke: B 1 / 2), both rounds in the smoke too
        paths, batches, rounds = [("torch", False), ("auto", "auto")], ([1, 2] if smoke else [1, 16, 64]), range(2)
    else:
        # torch_old_key: the torch path with the score buffer as a tensor attribute again (as before this branch),
        # so the timed call's first plan has a plan-graph key the warm-up did not capture
        paths = [p for p in settings(smoke) if p[0] in ("torch", "fused", "radix16")] + (
            [("torch_old_key", False)] if a.old_key else [])
        batches, rounds = [2 if smoke else 64], (range(1, 2) if smoke else range(2))  # the smoke: the timed-apart round
    for rnd, B, (label, flag) in [(r, b, p) for r in rounds for b in batches for p in paths]:
        if elapsed() > a.budget_s:
            rows.append(dict(round=rnd, batch=B, setting=label, skipped="budget"))
            continue
        base.TRITON_SELECT = flag
        try:
            with _OldKey(label == "torch_old_key"), _SubTimers(dev, on=rnd == 1) as st, _PathSpy() as spy:
                r = run_bench(["vegas"], tag="r14_select_e2e", batch_sizes=[B], **common)[-1]
            split = (st.calls[-1] if st.calls else {}) if rnd == 1 else None
            ph = r.get("phase_seconds") or {}
            it = r.get("iterations") or 1
            row = dict(round=rnd, batch=B, setting=label, tok_s=r.get("tokens_per_second"), tau=r.get("tau"),
                       iterations=it, select_share=r.get("selection_overhead_share"),
                       plans_eager=spy.eager, plans_graph=spy.graph,
                       select_ms_per_iter=1e3 * (ph.get("select", 0.0) + ph.get("select_in_draft", 0.0)) / it,
                       phase_ms_per_iter={k: 1e3 * v / it for k, v in ph.items()})
            if split is not None:
                row["split"] = {k: (1e3 * v / it if k.endswith("_s") else v) for k, v in split.items()}
            tokens.setdefault((rnd, B), {})[label] = r.get("tokens")
            row["same_tokens_as_torch"] = tokens[rnd, B].get(label) == tokens[rnd, B].get("torch")
        except Exception:
            row = dict(round=rnd, batch=B, setting=label, error=traceback.format_exc())
        finally:
            base.TRITON_SELECT = False
        rows.append(row)
        log(f"e2e {row}")
    return rows


def auto_verdict(rows: list[dict]) -> str:
    """Whether the e2e rows justify ``TRITON_SELECT = "auto"`` as the default: auto's select ms/iteration below
    torch's at every batch in every round, with the same tokens (a skipped or failed run: no)."""
    cells = {(r["round"], r.get("batch"), r["setting"]): r for r in rows}
    keys = sorted({(rnd, b) for rnd, b, _ in cells})
    bad = []
    for rnd, b in keys:
        t, u = cells.get((rnd, b, "torch"), {}), cells.get((rnd, b, "auto"), {})
        if "select_ms_per_iter" not in t or "select_ms_per_iter" not in u:
            bad.append(f"round {rnd} B {b}: a run is missing")
        elif not u["same_tokens_as_torch"]:
            bad.append(f"round {rnd} B {b}: other tokens")
        elif not u["select_ms_per_iter"] < t["select_ms_per_iter"]:
            bad.append(f"round {rnd} B {b}: auto {u['select_ms_per_iter']:.3f} >= torch {t['select_ms_per_iter']:.3f} ms")
    if not keys:
        bad.append("no e2e rows")
    return ("**Verdict: flip** the default to `\"auto\"` (select ms/iteration lower than torch's at every B in every "
            "round, same tokens)." if not bad else "**Verdict: keep torch** (" + "; ".join(bad) + ").")


def markdown(res) -> str:
    L = [f"# Vegas' selection: torch vs Triton top-k vs fused plan vs radix16 ({res['date']}, {res['gpu']})", ""]
    if res["args"].get("e2e_auto"):
        L[0] = f"# Vegas' selection end to end: torch vs TRITON_SELECT=\"auto\" ({res['date']}, {res['gpu']})"
    if res.get("micro"):
        L += ["| shape | scores | setting | on_verify + plan ms | on_verify ms | plan ms | fused kernel ms | floor ms |",
              "|---|---|---|---|---|---|---|---|"]
    for row in res.get("micro", []):
        for key, r in row.items():
            if not isinstance(r, dict) or key == "parity":
                continue
            if "ms" in r:
                L.append(f"| {row['shape']} | {key.split()[-1]} | {key.split()[0]} | {r['ms']:.3f} | {r['on_verify_ms']:.3f} | "
                         f"{r['plan_ms']:.3f} | {r.get('kernel_ms', float('nan')):.3f} | {r.get('floor_ms', float('nan')):.3f} |")
            else:
                L.append(f"| {row['shape']} | {key.split()[-1]} | {key.split()[0]} | {r.get('skipped') or 'error'} | | | | |")
    if res.get("micro"):
        L += ["", "Parity (eager plans, random lengths in [L/2, L]; rows: same sets / differ only among equal scores / "
              "bad):", ""]
    for row in res.get("micro", []):
        p = row.get("parity", {})
        for label in ("triton_topk", "fused", "radix16", "radix16_graph"):
            if label in p:
                q = p[label]
                L.append(f"- {row['shape']} {label}: " + (q["error"] if "error" in q else
                         f"{q['same_rows']} / {q['tie_rows']} / {q['bad_rows']} of {q['rows']} (fixed part equal: {q['same_fixed']})"
                         + (" [radix16: the middle count is rows differing only inside the boundary bucket]"
                            if label.startswith("radix16") else "")))
    if res.get("sweep"):
        L += ["", "| kernel | radix bits / block | num_warps | rows/program | kernel ms | same as default |",
              "|---|---|---|---|---|---|"]
        L += [f"| {s.get('kernel', 'fused')} | {s.get('radix_bits', s.get('block'))} | {s['num_warps']} | {s.get('rows_per_program', '')} | "
              f"{s.get('kernel_ms', float('nan')):.3f} | {s.get('same_as_default', 'error' if 'error' in s else s.get('skipped'))} |"
              for s in res["sweep"]]
    if res.get("e2e"):
        L += ["", "| round | B | setting | tok/s | tau | select share | select ms/iter | on_verify ms/iter | plan ms/iter | "
              "plan graph captures | plans eager / graph | same tokens |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["e2e"]:
            if "tok_s" not in r:
                L.append(f"| {r['round']} | {r.get('batch', '')} | {r['setting']} | {r.get('skipped') or 'error'} "
                         "| | | | | | | | | |")
                continue
            sp = r.get("split") or {}
            L.append(f"| {r['round']} | {r.get('batch', '')} | {r['setting']} | {r['tok_s']:.0f} | {r['tau']:.2f} | "
                     f"{100 * r['select_share']:.1f} % | {r['select_ms_per_iter']:.3f} | "
                     f"{sp.get('on_verify_s', float('nan')):.3f} | {sp.get('plan_s', float('nan')):.3f} | "
                     f"{sp.get('plan_graph_captures', '')} | {r.get('plans_eager', '')} / {r.get('plans_graph', '')} | "
                     f"{r['same_tokens_as_torch']} |")
        if res["args"].get("e2e_auto"):
            L += ["", auto_verdict(res["e2e"])]
    errs = [f"- {k}: {v}" for k, v in res.get("errors", {}).items()]
    return "\n".join(L + ([""] + errs if errs else [])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=100.0, help="no part or shape starts after this many seconds")
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--no-e2e", action="store_true")
    ap.add_argument("--old-key", action="store_true", help="e2e: also torch_old_key (the plan-graph recapture of 12-01e)")
    ap.add_argument("--e2e-auto", action="store_true",
                    help='only the e2e part, torch vs TRITON_SELECT="auto" at B 1 / 16 / 64 x 8k, 2 rounds interleaved')
    a = ap.parse_args()
    a.reps = a.reps or (2 if a.smoke else 20)
    global RATIO, WARM
    RATIO, WARM = (0.3, 1) if a.smoke else (RATIO, WARM)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "r14_select.log", "a")

    def log(msg):
        line = f"[{elapsed():6.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    dev = torch.device("cpu" if a.smoke else "cuda")
    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (smoke)", args=vars(a), errors={})
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass

    def save():
        (out / "r14_select.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "r14_select.md").write_text(markdown(res))

    # a `timeout` (SIGTERM) still leaves the JSON, the Markdown and the tarball (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    parts = ([("e2e", e2e)] if a.e2e_auto else
             [("micro", micro)] + ([] if a.no_e2e else [("e2e", e2e)]) + [("sweep", sweep)])
    try:
        for name, fn in parts:
            if elapsed() > a.budget_s:
                res["errors"][name] = "skipped: out of budget"
                continue
            try:
                res[name] = fn(a, dev, log)
            except Exception:
                res["errors"][name] = traceback.format_exc()
                log(res["errors"][name])
            res[f"{name}_done_s"] = round(elapsed(), 1)
            save()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        save()
        logf.close()
        with tarfile.open(str(out) + ".tgz", "w:gz") as tar:
            tar.add(out, arcname=out.name)
    print(markdown(res))


if __name__ == "__main__":
    main()
