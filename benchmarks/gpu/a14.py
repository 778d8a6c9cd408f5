"""Issue 14 item 5 (speculation that never loses): fixed γ vs adaptive, interleaved, with a noise floor.

    timeout 180 python3 benchmarks/gpu/a14.py --out $OUT/a14      # H200, <= 3 minutes, $OUT/a14.tgz
    python3 benchmarks/gpu/a14.py --smoke --out /tmp/a14_smoke        # CPU, tiny shapes, ~1 minute

Embedded model (``/tmp/m/smol.gguf``, bf16, ``--backend triton``, CUDA graphs, fused projections +
kernels, the defaults of the merged tree for score emission and selection), ~8k-token contexts (8000, cut to
fit the model's positions with the new tokens) of two held-out documents: the interpreter's own ``ssl.py``
(code) and the docstrings of its ``email`` package (prose, written to ``<out>/email_docstrings.txt``).
γ = 4, 5 % budget, greedy, 160 new tokens per call (``--new``).

Per part (doc, B), in this order: ``ssl_B1``, ``prose_B1``, ``prose_B64``, ``ssl_B64`` (``--parts``; add ``ssl_B16``,
``prose_B16`` for B = 16). The defaults fit one call of 3 minutes with the model on the machine (``--budget-s`` 158,
``--hard-s`` 172: ~40 s load, ~15-20 s per B = 1 part, ~35-40 s per B = 64 part). One engine per arm, all alive at once,
sharing one prefill of the context:

- ``dense_a``, ``dense_b``: dense twice (the dense A/A pair: the noise floor of the B = 1 rows);
- for magicdec and vegas: ``<m>_fixed``, ``<m>_fixed2`` (two independent fixed-γ engines: the A/A pair, the
  noise floor of the B > 1 rows) and ``<m>_adaptive`` (``adaptive=True``).

Every arm is warmed up once at its shape (captures, and the adaptive controller's first decisions: it keeps
its estimates between calls of one engine), then, per method, one fixed-γ call (``--warm-new``, 8 new
tokens) at each other rung the adaptive controller may explore (its arms: γ = 2, 1), so those graphs are
captured before timing (``warm_gammas``, ``warm_gammas_s``, each call's ``captures`` in the JSON), then
``--repeats`` (5) timed rounds; each round calls every arm
once, in the arm order on even rounds and reversed on odd rounds (fixed and adaptive alternate which goes
first; a linear drift cancels), after one untimed settling round (every arm once, after ``gc.collect()``; its calls
are ``settle`` in the JSON; ``--no-settle`` skips it). Per arm: median tokens/s with min–max; per pair: the *paired* ratio (the
two arms' calls of the same round) median with min–max, and the ratio of medians. Every timed call's tokens
(all sequences) must equal the first dense call's (greedy): ``same_tokens``.

Verdict, per speculative row (noise floor of its (doc, B): ``|median(fixed2/fixed) − 1|`` for B > 1 — the
larger of the two methods' — and ``|median(dense_b/dense_a) − 1|`` for B = 1):

- old criterion (``ok``): B = 1 adaptive ≥ 0.97× dense (paired median against ``dense_a``), B > 1 adaptive
  ≥ 0.98× fixed (paired median), same tokens;
- ``loses``: below the bar by more than the noise floor (a loss the A/A pair cannot explain);
- ``adaptive_never_loses``: ``True`` if every row is ``ok``, ``False`` if any row ``loses`` or gives
  other tokens, else ``"within noise"``; ``noise_floor_max`` and ``noise_resolves_2pct`` are stated next to it.

Results are written after every round (``<out>/a14.json``: every call's tokens/s, τ, dense steps, mean γ,
iterations and phases; ``<out>/a14.md``: the tables and the verdict). No part or warm-up call starts after
``--budget-s``, and a round starts only if it should end within it (the previous round's time; the first
round: the warm-up's), so the run ends near ``--budget-s`` (its rows record the rounds done). A failing part
records its traceback and the next one runs. ``--hf`` adds Hugging Face static-cache ``generate`` at B = 16
(32 new tokens) last, for the "vegas ≥ 10× HF static" row (off by default: it does not decide the switch).

Hard budget: a watchdog ends the process at ``--hard-s`` (default ``--budget-s`` + 20 s) after writing what it has.
At the end (or at the watchdog) the output folder is packed into ``<out>.tgz`` (``$OUT/a14.tgz``) and one verdict
line per (document, B) is printed: ``VERDICT <doc>_B<B>: never-loses=<True|False|within noise> noise-floor=…``
with each method's paired ratio against its bar.
"""

from __future__ import annotations

import argparse
import ast
import gc
import glob
import json
import os
import statistics
import sys
import tarfile
import threading
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = time.perf_counter()
METHODS = ("magicdec", "vegas")


def email_docstrings(path: Path) -> str:
    """The docstrings of this interpreter's ``email`` package (~20k tokens of English), written to ``path``."""
    import email

    root = os.path.dirname(email.__file__)
    texts = []
    for f in sorted(glob.glob(root + "/*.py")) + sorted(glob.glob(root + "/mime/*.py")):
        for n in ast.walk(ast.parse(Path(f).read_text())):
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                s = ast.get_docstring(n)
                if s:
                    texts.append(s)
    path.write_text("\n\n".join(texts))
    return str(path)


def arms() -> list[tuple[str, str, bool]]:
    """(arm, method, adaptive), in the order of an even round (odd rounds run it reversed)."""
    out = [("dense_a", "dense", False)]
    for m in METHODS:
        out += [(f"{m}_fixed", m, False), (f"{m}_adaptive", m, True)]
    out += [("dense_b", "dense", False)] + [(f"{m}_fixed2", m, False) for m in METHODS]
    return out


def _stats(xs):
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs)) if xs else None


def _call(eng, ids, B, new, pre):
    from specdec.adaptive import warm_up_events

    e0, t0 = warm_up_events(), time.perf_counter()
    r = eng.generate([ids] * B, max_new_tokens=new, prefilled=pre)
    wall = time.perf_counter() - t0
    s = r.stats
    g = s.gamma_per_round
    c = eng._controllers.get(eng.gamma) if eng.drafter is not None else None  # the adaptive controller's state after
    ctrl = None if c is None else dict(current=c.current, explorations=c.explorations, switches=c.switches,
                                       regret_s=c.regret, warm_up_s=c.warm_up, elapsed_s=c.elapsed,
                                       t={str(a): c.t(a) for a in c.arms})
    # host time outside the timed phases (emission, the controller, Python) per step of a call made only of dense
    # steps (in rounds, the select phase is partly nested in the draft phase): at B = 1 the adaptive engine committed
    # to dense spent ~50 µs per step more here than the dense method (20:03 UTC run)
    outside_us = None
    if eng.drafter is None or s.dense_steps == s.iterations:
        inside = s.phase_seconds.get("verify", 0.0) + s.phase_seconds.get("sample", 0.0)
        outside_us = 1e6 * (s.decode_seconds - inside) / max(1, s.iterations)
    return r.tokens, dict(tps=s.tokens_per_second, tau=s.mean_accepted_length, dense_steps=s.dense_steps,
                          gamma_mean=(sum(g) / len(g)) if g else None, iterations=s.iterations,
                          decode_s=s.decode_seconds, wall_s=wall, outside_us_per_iteration=outside_us,
                          phase_seconds=s.phase_seconds, captures=warm_up_events() - e0, controller=ctrl)


def explored_gammas(eng, gamma: int) -> list[int]:
    """The draft lengths other than ``gamma`` that ``eng``'s adaptive controller
    (:class:`specdec.adaptive.SpeculationController`, the one its warm-up call ran) may run: its arms, less
    dense ``0``; none when the engine does not adapt."""
    c = eng._controller(gamma)
    return [] if c is None else [g for g in c.arms if g not in (0, gamma)]


def warm_gammas(a, p, m, engines, ids, B, pre, ref) -> None:
    """Capture, before timing, the graphs the adaptive engines may need at the other rungs of their ladder:
    the same prompts once per rung with a fixed-γ engine of that γ, ``--warm-new`` new tokens each.

    The engines share the model's graph cache (``SpecdecModel._graphs``), and its keys hold nothing of one
    engine: the step's rows (γ + 1 for a verify), the batch, the model's reused cache (its buffers'
    addresses: a γ-rung engine reuses the γ = ``a.gamma`` cache, which is larger), the plan's shapes, the
    score request (a function of the method and γ), the backend; plan-construction graphs belong to the
    cache's planner, also shared. So a capture made here is the one an adaptive call at that rung would
    make: ``captures`` of every timed call in the JSON shows whether one was still missed."""
    from specdec.loading import pipeline_config
    from specdec.presets import build_engine

    t = time.perf_counter()
    p["warm_gammas"], p["warm_gamma_calls"] = {}, []
    for mth in METHODS:
        gammas = explored_gammas(engines[f"{mth}_adaptive"], a.gamma)
        p["warm_gammas"][mth] = gammas
        for g in gammas:
            if time.perf_counter() - T0 > a.budget_s:
                p["warm_gammas_stopped"] = f"out of time before {mth} gamma {g}"
                p["warm_gammas_s"] = time.perf_counter() - t
                return
            cfg = pipeline_config(mth, g, None, a.ratio, 0.0, 1.0, 0, None).model_copy(update={"adaptive": False})
            toks, w = _call(build_engine(m, cfg), ids, B, a.warm_new, pre)
            w.update(method=mth, gamma=g, same_tokens=all(r[:len(x)] == x for x, r in zip(toks, ref)))
            p["warm_gamma_calls"].append(w)
            if not w["same_tokens"]:  # greedy: a prefix of the dense tokens
                p["same_tokens"] = False
    p["warm_gammas_s"] = time.perf_counter() - t


def part_interleaved(a, res, m, doc_label, doc, B, save):
    from specdec.bench import _free_memory, _prefilled
    from specdec.data import context_ids, load_document
    from specdec.engine import cache_positions
    from specdec.loading import pipeline_config
    from specdec.memory import check_fits
    from specdec.presets import build_engine

    ids = context_ids(m.tokenizer, load_document(doc), a.ctx, offset=a.new + 16)
    m.release_cache()
    _free_memory(m.device)
    check_fits(m, B, len(ids), a.new, a.gamma)
    m.new_cache(B, cache_positions(len(ids), a.new, a.gamma), reuse=True)
    key = f"{doc_label}_B{B}"
    p = res["runs"][key] = dict(doc=doc_label, batch=B, context=len(ids), new_tokens=a.new, rounds_done=0,
                                warmup_s=None, arms={}, same_tokens=True)
    engines, pre, ref = {}, None, None
    t = time.perf_counter()
    for name, method, adaptive in arms():  # build + warm up every arm at this shape (captures happen here)
        if time.perf_counter() - T0 > a.budget_s:
            p["stopped"] = f"out of time in the warm-up (before {name})"
            return
        cfg = pipeline_config(method, a.gamma, None, a.ratio, 0.0, 1.0, 0, None)
        cfg = cfg.model_copy(update={"adaptive": adaptive})
        eng = engines[name] = build_engine(m, cfg)
        if pre is None:
            pre = _prefilled(eng, m, ids, B, random_cache=False)
        toks, w = _call(eng, ids, B, a.new, pre)
        if ref is None:
            ref = toks
        p["arms"][name] = dict(method=method, adaptive=adaptive, warmup=w, calls=[])
        if toks != ref:
            p["same_tokens"] = False
            p["arms"][name]["warmup_tokens_differ"] = True
    p["warmup_s"] = time.perf_counter() - t
    # the rungs the adaptive engines may explore, captured now rather than inside a timed call (~0.8 s each at
    # B = 64 on the H200); not counted in warmup_s (the first round's time estimate)
    warm_gammas(a, p, m, engines, ids, B, pre, ref)
    if p.get("warm_gammas_stopped"):
        p["stopped"] = "out of time in the warm-up of the adaptive rungs"
        return
    order = arms()
    # the first round's estimate: each arm's warm-up call, those that captured taken at the median of the others (the
    # whole warm-up, captures included, kept the last part of a 3-minute run from timing any round)
    walls = [(x["warmup"]["wall_s"], x["warmup"]["captures"]) for x in p["arms"].values()]
    clean = [w for w, c in walls if not c]
    last = sum(min(w, statistics.median(clean)) for w, _ in walls) if clean else p["warmup_s"]
    p["first_round_estimate_s"] = last
    # one untimed settling round (every arm once, the even order) after a collection of the warm-up engines: in the
    # 20:47 UTC run every arm after dense_a in ssl_B1's first timed round ran 9-15 % slow (dense_b / dense_a 0.908
    # there, 0.99-1.01 in the other rounds), a host-side stall after the warm-ups that the paired ratios of that
    # round carried into the B = 1 medians
    gc.collect()
    if a.settle and time.perf_counter() - T0 + last <= a.budget_s:
        t = time.perf_counter()
        for name, _, _ in order:
            toks, c = _call(engines[name], ids, B, a.new, pre)
            c["same_tokens"] = toks == ref
            p["same_tokens"] = p["same_tokens"] and c["same_tokens"]
            p["arms"][name]["settle"] = c
        p["settle_s"] = last = time.perf_counter() - t
    for rnd in range(a.repeats):
        if time.perf_counter() - T0 + last > a.budget_s:  # a round starts only if it should end within the budget
            p["stopped"] = f"out of time after {rnd} rounds"
            break
        t = time.perf_counter()
        for name, _, _ in (order if rnd % 2 == 0 else order[::-1]):
            toks, c = _call(engines[name], ids, B, a.new, pre)
            c["round"] = rnd
            c["same_tokens"] = toks == ref
            p["same_tokens"] = p["same_tokens"] and c["same_tokens"]
            p["arms"][name]["calls"].append(c)
        p["rounds_done"] = rnd + 1
        last = time.perf_counter() - t
        analyse(res)
        save()
    engines.clear()
    pre = None
    _free_memory(m.device)
    return


def _paired(p, num, den):
    """Per-round ratio num/den (both arms' calls of the same round)."""
    a = {c["round"]: c["tps"] for c in p["arms"][num]["calls"]}
    b = {c["round"]: c["tps"] for c in p["arms"][den]["calls"]}
    return _stats([a[r] / b[r] for r in sorted(a) if r in b])


def analyse(res) -> None:
    """Per (doc, B): arm medians, paired ratios, noise floors; rows with the old criterion and `loses`; verdict."""
    rows = []
    for key, p in res["runs"].items():
        if not p.get("rounds_done"):
            continue
        for arm in p["arms"].values():
            arm["tps"] = _stats([c["tps"] for c in arm["calls"]])
            arm["same_tokens"] = all(c["same_tokens"] for c in arm["calls"]) and not arm.get("warmup_tokens_differ")
        B = p["batch"]
        p["aa_dense"] = _paired(p, "dense_b", "dense_a")
        p["aa_fixed"] = {mth: _paired(p, f"{mth}_fixed2", f"{mth}_fixed") for mth in METHODS}
        floor_dense = abs(p["aa_dense"]["median"] - 1)
        floor_fixed = max(abs(s["median"] - 1) for s in p["aa_fixed"].values())
        p["noise_floor"] = floor_dense if B == 1 else floor_fixed
        med = lambda arm: p["arms"][arm]["tps"]["median"]  # noqa: E731
        for mth in METHODS:
            fx, ad = f"{mth}_fixed", f"{mth}_adaptive"
            calls = p["arms"][ad]["calls"]
            r = dict(doc=p["doc"], batch=B, method=mth, rounds=p["rounds_done"],
                     fixed_tps=p["arms"][fx]["tps"], adaptive_tps=p["arms"][ad]["tps"],
                     dense_tps=p["arms"]["dense_a"]["tps"],
                     adaptive_over_fixed=_paired(p, ad, fx), fixed2_over_fixed=p["aa_fixed"][mth],
                     adaptive_over_dense=_paired(p, ad, "dense_a"), fixed_over_dense=_paired(p, fx, "dense_a"),
                     dense_b_over_dense_a=p["aa_dense"],
                     adaptive_over_fixed_of_medians=med(ad) / med(fx),
                     adaptive_over_dense_of_medians=med(ad) / med("dense_a"),
                     tau_fixed=statistics.median(c["tau"] for c in p["arms"][fx]["calls"]),
                     tau_adaptive=statistics.median(c["tau"] for c in calls),
                     dense_steps_adaptive=[c["dense_steps"] for c in calls],
                     gamma_mean_adaptive=[c["gamma_mean"] for c in calls],
                     noise_floor=p["noise_floor"],
                     same_tokens=all(p["arms"][x]["same_tokens"]
                                     for x in (fx, ad, f"{mth}_fixed2", "dense_a", "dense_b")))
            if B == 1:
                r["criterion"], r["bar"], x = "adaptive >= 0.97x dense", 0.97, r["adaptive_over_dense"]["median"]
            else:
                r["criterion"], r["bar"], x = "adaptive >= 0.98x fixed", 0.98, r["adaptive_over_fixed"]["median"]
            r["ok"] = x >= r["bar"] and r["same_tokens"]
            r["loses"] = x < r["bar"] - r["noise_floor"] or not r["same_tokens"]
            rows.append(r)
    res["rows"] = rows
    floors = [p["noise_floor"] for p in res["runs"].values() if "noise_floor" in p]
    res["noise_floor_max"] = max(floors) if floors else None
    res["noise_resolves_2pct"] = bool(floors) and max(floors) < 0.02
    if not rows:
        res["adaptive_never_loses"] = None
    elif any(r["loses"] for r in rows):
        res["adaptive_never_loses"] = False
    elif all(r["ok"] for r in rows):
        res["adaptive_never_loses"] = True
    else:
        res["adaptive_never_loses"] = "within noise"
    res["verdict_covers"] = sorted({f"{r['doc']}_B{r['batch']}" for r in rows})


def part_hf(a, res, m, doc, B):
    from specdec.bench import hf_generate_tps
    from specdec.data import context_ids, load_document

    ids = context_ids(m.tokenizer, load_document(doc), a.ctx, offset=a.hf_new + 16)
    r = hf_generate_tps(m, ids, B, a.hf_new, "static", 3)
    res["hf_static"] = dict(batch=B, new_tokens=a.hf_new, **r)
    p = res["runs"].get(f"ssl_B{B}")
    if p and p.get("rounds_done"):
        for kind in ("fixed", "adaptive"):
            res["hf_static"][f"vegas_{kind}_over_hf_static"] = p["arms"][f"vegas_{kind}"]["tps"]["median"] / r["median"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, not the numbers")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="no part or round starts after this many seconds (default 158; smoke 100)")
    ap.add_argument("--hard-s", type=float, default=None, help="the watchdog ends the run here (default budget + 14)")
    ap.add_argument("--parts", default=None, help="default: ssl_B1,prose_B1,prose_B64,ssl_B64 (smoke: ssl_B1,prose_B2)")
    ap.add_argument("--new", type=int, default=None, help="new tokens per call (default 160; smoke 6)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; smoke 2)")
    ap.add_argument("--warm-new", type=int, default=None,
                    help="new tokens of each warm-up call at the adaptive controller's other rungs (default 8; smoke 2)")
    ap.add_argument("--hf", action="store_true", help="add HF static-cache generate at B = 16 last")
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="skip the untimed settling round (every arm once) before the timed rounds")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import ssl

    docs = {"ssl": ssl.__file__, "prose": email_docstrings(out / "email_docstrings.txt")}
    a.gamma, a.ratio = 4, 0.05
    a.budget_s = a.budget_s if a.budget_s is not None else (100.0 if a.smoke else 158.0)
    if a.smoke:
        a.model, a.device, a.dtype, a.backend, a.graphs = "smollm2-135m", "cpu", "float32", "reference", False
        a.context, a.hf_new, a.hf_batch = 200, 4, 1
        a.new, a.repeats, a.warm_new = a.new or 6, a.repeats or 2, a.warm_new or 2
        a.parts = a.parts or "ssl_B1,prose_B2"
    else:
        a.model, a.device, a.dtype, a.backend, a.graphs = a.gguf, "cuda", "bfloat16", "triton", True
        a.context, a.hf_new, a.hf_batch = 8000, 32, 16
        a.new, a.repeats, a.warm_new = a.new or 160, a.repeats or 5, a.warm_new or 8
        a.parts = a.parts or "ssl_B1,prose_B1,prose_B64,ssl_B64"
    if a.repeats < 1 or a.new < 1 or a.warm_new < 1:
        sys.exit("a14.py: --repeats, --new and --warm-new must be >= 1; use e.g. --repeats 5 --new 256 --warm-new 8.")
    if a.warm_new > a.new:  # the warm-up calls must fit the cache the timed calls reuse (its graphs are tied to it)
        sys.exit(f"a14.py: --warm-new {a.warm_new} is more than --new {a.new}; use --warm-new <= --new, e.g. 8.")
    todo = []
    for s in a.parts.split(","):
        doc, _, b = s.partition("_B")
        if doc not in docs or not b.isdigit() or int(b) < 1:
            sys.exit(f"a14.py: bad part {s!r} in --parts; use <ssl|prose>_B<batch>, e.g. ssl_B64,ssl_B1.")
        todo.append((doc, int(b)))
    import transformers

    import specdec.adaptive
    from specdec.loading import load_model

    res = dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), torch=torch.__version__,
               transformers=transformers.__version__, gpu=torch.cuda.get_device_name() if a.device == "cuda" else None,
               adaptive_default=specdec.adaptive.ADAPTIVE_DEFAULT, documents=docs, arms=[x[0] for x in arms()],
               args={k: str(v) for k, v in vars(a).items()}, parts={}, runs={})
    m = load_model(a.model, a.dtype, a.device, a.backend, a.graphs, False, True)
    # ~8k tokens of context, cut so that context + new tokens (+ γ draft rows) fit the model's positions
    a.ctx = min(a.context, m.dims.max_positions - a.new - 2 * a.gamma - 8)
    res["context"], res["load_s"] = a.ctx, time.perf_counter() - T0

    def save() -> None:
        res["elapsed_s"] = time.perf_counter() - T0
        (out / "a14.json").write_text(json.dumps(res, indent=2, default=str))
        (out / "a14.md").write_text(summary(res))

    def finish(code: int | None) -> None:
        """Pack ``out`` into ``<out>.tgz`` and print the per-(doc, B) verdicts; ``code``: exit now (watchdog)."""
        if code is not None:
            res["watchdog"] = f"hard budget {a.hard_s:.0f} s reached: the run was ended there"
            try:
                analyse(res)
                save()
            except Exception:  # the main thread may be mid-update; the last round's files are on disk
                print("a14.py: watchdog could not write the final state:", traceback.format_exc(limit=2), flush=True)
        with tarfile.open(out.parent / f"{out.name}.tgz", "w:gz") as tar:
            tar.add(out, arcname=out.name)
        print("\n".join(verdict_lines(res)), flush=True)
        if code is not None:
            os._exit(code)

    a.hard_s = a.hard_s if a.hard_s is not None else a.budget_s + 14
    dog = threading.Timer(max(1.0, a.hard_s - (time.perf_counter() - T0)), finish, args=(3,))
    dog.daemon = True
    dog.start()

    parts = [(f"{d}_B{b}", lambda d=d, b=b: part_interleaved(a, res, m, d, docs[d], b, save)) for d, b in todo]
    if a.hf:
        parts.append((f"hf_static_B{a.hf_batch}", lambda: part_hf(a, res, m, docs["ssl"], a.hf_batch)))
    for name, fn in parts:
        if time.perf_counter() - T0 > a.budget_s:
            res["parts"][name] = "skipped: out of time"
            continue
        t = time.perf_counter()
        try:
            fn()
            res["parts"][name] = f"ok in {time.perf_counter() - t:.0f} s"
        except Exception:
            res["parts"][name] = "error: " + traceback.format_exc(limit=8)
        print(name, res["parts"][name][:3000], f"(t = {time.perf_counter() - T0:.0f} s)", flush=True)
        analyse(res)
        save()
        if a.device == "cuda":
            torch.cuda.empty_cache()
    res["total_s"] = time.perf_counter() - T0
    save()
    dog.cancel()
    print(summary(res))
    finish(None)


def verdict_lines(res) -> list[str]:
    """One line per (doc, B): never-loses for that part, its noise floor, each method's ratio against its bar."""
    out = []
    for key, p in res["runs"].items():
        rows = [r for r in res.get("rows", []) if f"{r['doc']}_B{r['batch']}" == key]
        if not rows:
            out.append(f"VERDICT {key}: no rounds ({p.get('stopped', 'not run')})")
            continue
        v = False if any(r["loses"] for r in rows) else True if all(r["ok"] for r in rows) else "within noise"
        what = ", ".join(f"{r['method']} {(r['adaptive_over_dense'] if r['batch'] == 1 else r['adaptive_over_fixed'])['median']:.3f}"
                         f" ({r['criterion']})" for r in rows)
        out.append(f"VERDICT {key}: never-loses={v} noise-floor={rows[0]['noise_floor']:.3f} rounds={rows[0]['rounds']}: "
                   f"{what}")
    out.append(f"VERDICT all: adaptive_never_loses={res.get('adaptive_never_loses')} "
               f"noise_floor_max={res.get('noise_floor_max')} resolves_2pct={res.get('noise_resolves_2pct')}")
    return out


def summary(res) -> str:
    f = lambda x: "" if x is None else f"{x:.3f}"  # noqa: E731
    s = lambda d: "" if not d else f"{d['median']:.3f} ({d['min']:.3f}–{d['max']:.3f})"  # noqa: E731
    t = lambda d: "" if not d else f"{d['median']:,.0f} ({d['min']:,.0f}–{d['max']:,.0f})"  # noqa: E731
    lines = [f"# a14: fixed γ vs adaptive, interleaved ({res['date']}, {res.get('gpu') or 'cpu'})", "",
             f"ADAPTIVE_DEFAULT in this tree: {res['adaptive_default']}; context {res.get('context')} tokens, "
             f"{res['args'].get('new')} new tokens, {res['args'].get('repeats')} interleaved rounds "
             "(forward/reversed); "
             f"documents: {json.dumps(res['documents'])}", "",
             "parts: " + json.dumps({k: v[:200] for k, v in res["parts"].items()}), "",
             "Ratios are paired (the two arms' calls of one round): median (min–max). A/A = fixed2 / fixed (B > 1) or "
             "dense_b / dense_a (B = 1); noise floor = |median A/A − 1|.", "",
             "| doc | B | method | rounds | dense tok/s | fixed tok/s | adaptive tok/s | adaptive / fixed "
             "| fixed2 / fixed "
             "| adaptive × dense | dense_b / dense_a | τ fixed → adaptive | adaptive dense steps | adaptive mean γ "
             "| noise floor | same tokens | criterion | ok | loses |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        gm = [g for g in r["gamma_mean_adaptive"] if g is not None]
        lines.append(f"| {r['doc']} | {r['batch']} | {r['method']} | {r['rounds']} | {t(r['dense_tps'])} | "
                     f"{t(r['fixed_tps'])} | {t(r['adaptive_tps'])} | {s(r['adaptive_over_fixed'])} | "
                     f"{s(r['fixed2_over_fixed'])} | {s(r['adaptive_over_dense'])} | {s(r['dense_b_over_dense_a'])} | "
                     f"{r['tau_fixed']:.2f} → {r['tau_adaptive']:.2f} | {r['dense_steps_adaptive']} | "
                     f"{f(statistics.median(gm)) if gm else '—'} | {r['noise_floor']:.3f} | {r['same_tokens']} | "
                     f"{r['criterion']} | "
                     f"{r['ok']} | {r['loses']} |")
    lines += ["", "adaptive never loses (old criterion: B=1 >= 0.97x dense, B>1 >= 0.98x fixed γ, paired medians, "
              "same "
              f"tokens; False only if a row is below its bar by more than its noise floor), over "
              f"{res.get('verdict_covers')}: **{res.get('adaptive_never_loses')}**; noise floor max "
              f"{f(res.get('noise_floor_max'))}, resolves 2 %: {res.get('noise_resolves_2pct')}", ""]
    lines += ["Adaptive rungs warmed before timing (fixed-γ calls at the same batch): " + "; ".join(
        f"{k} {p.get('warm_gammas')} in {p['warm_gammas_s']:.1f} s" for k, p in res["runs"].items()
        if p.get("warm_gammas_s") is not None) + "; graph captures in timed adaptive calls: " + json.dumps(
        {k: {n: [c.get("captures") for c in arm["calls"]] for n, arm in p["arms"].items() if arm.get("adaptive")}
         for k, p in res["runs"].items()}), ""]
    out = {}
    for k, p in res["runs"].items():
        for n, arm in p["arms"].items():
            xs = [c["outside_us_per_iteration"] for c in arm["calls"] if c.get("outside_us_per_iteration") is not None]
            if xs and (n == "dense_a" or arm.get("adaptive")):
                out[f"{k} {n}"] = round(statistics.median(xs), 1)
    if out:
        lines += ["Host µs per step outside the timed phases, calls of dense steps only (median; dense vs adaptive): "
                  + json.dumps(out), ""]
    ctl = {}
    for k, p in res["runs"].items():
        for n, arm in p["arms"].items():
            last = (arm["calls"] or [arm.get("warmup") or {}])[-1].get("controller") if arm.get("adaptive") else None
            if last:
                ctl[f"{k} {n}"] = {x: (round(v, 4) if isinstance(v, float) else v) for x, v in last.items() if x != "t"}
    if ctl:
        lines += ["Adaptive controllers after their last call (committed arm, explorations, switches, regret / "
                  "warm-up / observed seconds): " + json.dumps(ctl), ""]
    lines += ["## Verdict per (document, B)", ""] + [f"- {x}" for x in verdict_lines(res)] + [""]
    h = res.get("hf_static")
    if h:
        lines.append(f"- HF static generate B={h['batch']}: {h['median']:.1f} tok/s ({h.get('attn_implementation')}); "
                     f"vegas fixed / HF static = {f(h.get('vegas_fixed_over_hf_static'))}, "
                     f"vegas adaptive / HF static = {f(h.get('vegas_adaptive_over_hf_static'))} (target >= 10)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
