"""Issue 15 item 4 on the H200 (≤ 4 minutes): Dustin with the EAGLE head graph-captured, at 8k, B = 1, 16, 64.

    python3 benchmarks/gpu/dustin_graphs.py --out $OUT [--budget-s 150 --tests-s 60 --profile-s 10] [--draft PATH]
    python3 benchmarks/gpu/dustin_graphs.py --smoke --out /tmp/smoke      # CPU, embedded model, B = 2, tiny shapes

Model: the embedded SmolLM2-135M from ``--gguf`` (``/tmp/m/smol.gguf``), bf16, Triton backend, fused projections,
CUDA graphs (target forwards and, since this change, the head's draft). Document: the source file of a
standard-library module that is held out of the head's training text (``tarfile``), read from the device's own
Python (not a built-in document), ``--context`` tokens ending 96 tokens before its end; every sequence of a batch
gets it (one prefill, expanded).

Methods per batch size (each warmed up at its shape first, then ``--repeats`` timed runs without phase syncs,
median; then one run with phase syncs for the time split):

* ``dense`` — one target row per step (this engine's dense decoding; its step is the "target step");
* ``eagle-dense`` — the EAGLE head + dense verification (lossless: must equal dense);
* ``dustin-25%`` — the head + Dustin's sparse verification over 25 % of the context;
* ``dustin-default`` — the same at the default budget (5 %);
* ``dustin-25%-replace`` / ``dustin-default-replace`` — with prompt lookup's ``replace`` policy (the default before
  ``chain``: a match's continuation replaces the head's tokens), the before of the default rows in the same run;
* ``dustin-25%-before`` — ``dustin-25%`` with the head's attention in PyTorch matmuls and the SRH scores by
  ``group_attention`` (the paths before ``specdec/cuda/triton_srh.py`` and the head on the backend).

Per row: tokens/s (median), × dense, τ, free-running token agreement with dense (share of equal positions, all
sequences) and the first divergence, the phase split (draft / verify / sample / select, ms per iteration), the
**draft step / target step** ratio (draft phase / (rounds · γ) over dense's verify phase / steps; target ≤ 35 %),
and for Dustin the verifier's counters (KV read vs dense, dense passes, its own plan time). Part ``tests`` runs
``pytest tests/test_dustin_gpu.py`` in subprocesses (the EAGLE capture tests first) with the time left. Last, a
``torch.profiler`` run of ``dustin-25%`` at the largest batch (top operators by device time, launches and graph
replays per iteration: where the iteration's time goes). Everything lands in
``<out>/dustin_graphs.json`` + ``.md`` after each row; a failing row records its traceback and the next one runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
T0 = time.perf_counter()
GAMMA = 4
#: Dustin's options for the ``*-replace`` rows (specdec.lookup: the policy before "chain" became the default)
REPLACE = dict(lookup_policy="replace")


def elapsed() -> float:
    return time.perf_counter() - T0


def agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, int | None]:
    """Share of positions where two generations agree (all sequences), and the first divergence of sequence 0."""
    same = total = 0
    for x, y in zip(a, b):
        n = min(len(x), len(y))
        same += sum(p == q for p, q in zip(x[:n], y[:n]))
        total += n
    first = next((i for i, (p, q) in enumerate(zip(a[0], b[0])) if p != q), None)
    return same / max(total, 1), first


def engines(m, a):
    """``{name: engine}`` (built lazily: each EAGLE drafter sets ``model.keep_hidden``)."""
    from specdec import PipelineConfig, build_engine
    from specdec.eagle import EagleDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.train_draft import shipped_draft
    from specdec.verifiers import FullVerifier

    head = a.draft or shipped_draft(m, "eagle")
    opts = {"draft": head} if a.draft else {}

    def dustin(lookup=None, **budget):
        o = dict(opts, **(lookup or {}))
        return build_engine(m, PipelineConfig.make(method="dustin", gamma=GAMMA, options=o, **budget), eos_token_id=-1)

    return head, {
        "dense": lambda: SpeculativeEngine(m, method="dense", eos_token_id=-1),
        "eagle-dense": lambda: SpeculativeEngine(m, EagleDrafter(m, head), FullVerifier(m), gamma=GAMMA,
                                                 method="eagle-dense", eos_token_id=-1),
        "dustin-25%": lambda: dustin(budget_ratio=0.25),
        "dustin-default": lambda: dustin(),
        # the same at 25 % on the paths before the d15 kernels (head attention in PyTorch matmuls, SRH scores
        # by group_attention): the before/after of one run (see ``before_paths``)
        "dustin-25%-before": lambda: dustin(budget_ratio=0.25),
        # prompt lookup's drafting before tau15 (lookup_policy=replace): the "before" of the default rows, same run
        "dustin-25%-replace": lambda: dustin(REPLACE, budget_ratio=0.25),
        "dustin-default-replace": lambda: dustin(REPLACE),
    }


@contextlib.contextmanager
def before_paths(eng, name: str):
    """For a ``*-before`` method: the EAGLE head's attention in PyTorch (``EagleDrafter.attention = "torch"``)
    and the SRH scores by ``group_attention`` (``recording.GROUP_SCORES = "torch"``) while it runs."""
    if not name.endswith("-before"):
        yield
        return
    from specdec.attention import recording
    from specdec.lookup import base_drafter

    head = base_drafter(eng.drafter)
    old = recording.GROUP_SCORES, getattr(head, "attention", None)
    recording.GROUP_SCORES = "torch"
    if old[1] is not None:
        head.attention = "torch"
    try:
        yield
    finally:
        recording.GROUP_SCORES = old[0]
        if old[1] is not None:
            head.attention = old[1]


def measure(eng, prompts, pre, a) -> dict:
    eng.sync_timing = False
    eng.generate(prompts, a.new, prefilled=pre)  # warm-up at this shape: captures
    runs = [eng.generate(prompts, a.new, prefilled=pre) for _ in range(a.repeats)]
    tps = [r.stats.tokens_per_second for r in runs]
    med = sorted(runs, key=lambda r: r.stats.tokens_per_second)[(len(runs) - 1) // 2]
    eng.sync_timing = True  # one more run with a sync at each phase boundary: the time split
    timed = eng.generate(prompts, a.new, prefilled=pre)
    eng.sync_timing = False
    st = timed.stats
    it = max(1, st.iterations)
    row = dict(tokens_per_second=statistics.median(tps), tokens_per_second_runs=tps, tau=med.stats.mean_accepted_length,
               iterations=med.stats.iterations, tokens=med.tokens,
               phase_ms_per_iteration={k: 1e3 * v / it for k, v in st.phase_seconds.items() if k != "prefill"},
               phase_seconds=dict(st.phase_seconds), timed_iterations=st.iterations,
               decode_seconds=st.decode_seconds)
    v = getattr(eng, "verifier", None)
    if v is not None and hasattr(v, "report"):
        rep = v.report()
        row["verifier"] = {k: rep[k] for k in ("passes", "dense_passes", "kv_read_vs_dense", "select_seconds",
                                               "srh_seconds", "sparse_seconds", "dense_seconds") if k in rep}
    d = getattr(eng, "drafter", None)
    g = getattr(d, "graphs", None)
    if g is not None:
        row["draft_graphs"] = dict(captures=g.captures, replays=g.replays, refused=list(map(str, g.uncapturable.values())))
    return row


def part_batch(a, m, ids, B: int, res: dict, save) -> None:
    from specdec.engine import Prefilled

    head, makers = engines(m, a)
    res["meta"]["draft"] = str(head)
    prompts = [ids] * B
    # the prompt's hidden states, for the head: an engine records what its own drafter reads (a dense engine nothing)
    one = makers["eagle-dense"]().prefill([ids])
    pre = Prefilled(ids=prompts, k=one.k.expand(-1, B, -1, -1, -1), v=one.v.expand(-1, B, -1, -1, -1),
                    last_logits=one.last_logits.expand(B, -1), hidden=one.hidden.expand(B, -1, -1))
    rows = res.setdefault("rows", [])
    dense = dense_tokens = None
    for name in a.methods:
        if elapsed() > a.budget_s:
            res["skipped"].append(f"B={B} {name}")
            save()
            continue
        t = time.perf_counter()
        try:
            eng = makers[name]()
            hidden = m.keep_hidden
            if name == "dense":  # the baseline does not record hidden states (no drafter reads them)
                m.keep_hidden = False
            try:
                with before_paths(eng, name):
                    r = measure(eng, prompts, pre, a)
            finally:
                m.keep_hidden = hidden
            r.update(method=name, batch=B, context=len(ids), seconds=round(time.perf_counter() - t, 1))
            if name == "dense":
                dense, dense_tokens = r, r["tokens"]
            elif dense is not None:
                dph = dense["phase_seconds"]
                target_step = dph["verify"] / max(1, dense["timed_iterations"])
                rounds = max(1, r["timed_iterations"])
                draft_step = r["phase_seconds"].get("draft", 0.0) / (rounds * GAMMA)
                r.update(speedup_vs_dense=r["tokens_per_second"] / dense["tokens_per_second"],
                         target_step_ms=1e3 * target_step, draft_step_ms=1e3 * draft_step,
                         draft_over_target=draft_step / target_step,
                         verify_ms=1e3 * r["phase_seconds"]["verify"] / rounds)
                r["agreement_with_dense"], r["first_divergence"] = agreement(r["tokens"], dense_tokens)
                r["equals_dense"] = r["tokens"] == dense_tokens
            r["tokens"] = r["tokens"][0]  # one sequence in the record (all sequences share the prompt)
            rows.append(r)
            del eng
        except Exception:
            res["errors"][f"B={B} {name}"] = traceback.format_exc()
        if m.device.type == "cuda":
            torch.cuda.empty_cache()
        save()


def part_profile(a, m, ids, B: int, res: dict) -> None:
    """Where one Dustin iteration's time goes at batch ``B``: ``torch.profiler`` over a short generation of
    ``dustin-25%`` (already warmed up at this shape by its row): the top operators by device time, and the
    launches per iteration (kernels launched one by one vs graph replays)."""
    from torch.profiler import ProfilerActivity, profile

    from specdec.engine import Prefilled, SpeculativeEngine

    _, makers = engines(m, a)
    one = SpeculativeEngine(m, method="dense", eos_token_id=-1).prefill([ids])
    pre = Prefilled(ids=[ids] * B, k=one.k.expand(-1, B, -1, -1, -1), v=one.v.expand(-1, B, -1, -1, -1),
                    last_logits=one.last_logits.expand(B, -1), hidden=one.hidden.expand(B, -1, -1))
    eng = makers["dustin-25%"]()
    eng.sync_timing = False
    eng.generate([ids] * B, a.new, prefilled=pre)  # warm-up (captures)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if m.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        r = eng.generate([ids] * B, a.new, prefilled=pre)
    it = max(1, r.stats.iterations)
    ev = prof.key_averages()
    calls = {e.key: e.count for e in ev}
    launches = sum(n for k, n in calls.items() if k in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    replays = calls.get("cudaGraphLaunch", 0)
    syncs = sum(n for k, n in calls.items() if "Synchronize" in k or k == "cudaMemcpyAsync")
    sort = "self_cuda_time_total" if m.device.type == "cuda" else "self_cpu_time_total"
    table = ev.table(sort_by=sort, row_limit=30)
    (Path(a.out) / f"profile_dustin25_b{B}.txt").write_text(table)
    res["profile"] = dict(batch=B, iterations=it, tokens_per_second=r.stats.tokens_per_second,
                          kernel_launches_per_iteration=launches / it, graph_replays_per_iteration=replays / it,
                          memcpy_or_sync_per_iteration=syncs / it, table=f"profile_dustin25_b{B}.txt")


def part_tests(a, res) -> None:
    """``pytest tests/test_dustin_gpu.py``: the EAGLE capture tests first, then the rest (torch.compile: slower),
    each with the time left."""
    env = dict(os.environ, SPECDEC_TEST_DEVICE="cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():  # the kernels run compiled, not in the interpreter
        env.pop("TRITON_INTERPRET", None)
    res["tests"] = []
    for sel in ("eagle", "not eagle"):
        left = int(a.budget_s + a.tests_s - elapsed())
        if left < 10:
            res["tests"].append(dict(select=sel, returncode=None, summary="skipped (time budget)"))
            continue
        cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "tests/test_dustin_gpu.py", "-k", sel]
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=left)
            out, rc = p.stdout + p.stderr, p.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = f"timed out after {left} s\n{(e.stdout or b'')[-4000:]!r}", 124
        name = "eagle" if sel == "eagle" else "rest"
        (Path(a.out) / f"test_dustin_gpu_{name}.log").write_text(out)
        res["tests"].append(dict(select=sel, returncode=rc, summary=(out.strip().splitlines() or [""])[-1], limit_s=left))


def markdown(res) -> str:
    meta = res["meta"]
    lines = [f"# Dustin with the captured EAGLE head — {meta['date']}", "",
             f"`{meta['argv']}` — {meta['device']}, context {meta.get('context')} tokens of `{meta['document']}`, "
             f"{meta['new_tokens']} new tokens, γ = {GAMMA}, draft `{meta.get('draft')}`", "",
             "| B | method | tok/s | × dense | τ | agreement (first diff) | draft step ms | target step ms | draft/target "
             "| verify ms/iter (plan) | ms/iter draft · verify · sample · select | KV read |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("rows", []):
        f = lambda k, fmt: (fmt.format(r[k]) if r.get(k) is not None else "")  # noqa: E731
        ph = r["phase_ms_per_iteration"]
        split = " · ".join(f"{ph.get(k, 0.0):.2f}" for k in ("draft", "verify", "sample", "select"))
        agree = "" if r["method"] == "dense" else f"{r['agreement_with_dense']:.1%} ({r['first_divergence']})"
        kv = r.get("verifier", {}).get("kv_read_vs_dense")
        vs = r.get("verifier", {})
        sel = f" (plan {1e3 * vs['select_seconds'] / max(1, vs['passes']):.2f})" if vs.get("passes") else ""
        lines.append(f"| {r['batch']} | {r['method']} | {r['tokens_per_second']:.0f} | {f('speedup_vs_dense', '{:.2f}×')} "
                     f"| {r['tau']:.2f} | {agree} | {f('draft_step_ms', '{:.3f}')} | {f('target_step_ms', '{:.3f}')} "
                     f"| {f('draft_over_target', '{:.0%}')} | {f('verify_ms', '{:.2f}')}{sel} | {split} "
                     f"| {'' if kv is None else f'{kv:.1%}'} |")
    if "profile" in res:
        p = res["profile"]
        lines += ["", f"Profile of dustin-25% at B = {p['batch']} ({p['iterations']} iterations, `{p['table']}`): "
                  f"{p['kernel_launches_per_iteration']:.0f} kernel launches, {p['graph_replays_per_iteration']:.1f} "
                  f"graph replays, {p['memcpy_or_sync_per_iteration']:.1f} copies/syncs per iteration"]
    return "\n".join(lines + markdown_tail(res)) + "\n"


def markdown_tail(res) -> list[str]:
    """The Markdown lines every Dustin GPU report ends with: the GPU tests, failed parts, skipped parts."""
    lines = []
    for t in res.get("tests", []):
        lines += ["", f"GPU tests (`tests/test_dustin_gpu.py -k '{t['select']}'`): rc {t['returncode']}, {t['summary']}"]
    for k, v in res.get("errors", {}).items():
        lines += ["", f"**{k} failed**:", "```", v[-3000:], "```"]
    if res.get("skipped"):
        lines += ["", "skipped (time budget): " + ", ".join(res["skipped"])]
    return lines


def setup(a, name: str, to_markdown):
    """The shared run settings (smoke: CPU, reference backend, tiny shapes; else the H200's bf16 Triton + graphs),
    the result dict and its ``save()`` (``<out>/<name>.json`` + ``.md``); returns ``(batches, res, save)``."""
    a.methods = a.methods.split(",")
    if a.smoke:
        a.gguf, a.device, a.dtype, a.backend, a.graphs, a.fuse = "smollm2-135m", "cpu", "float32", "reference", False, False
        a.context, a.new, a.repeats, batches = 128, 8, 1, [2]
        torch.set_num_threads(1)
    else:
        a.device, a.dtype, a.backend, a.graphs, a.fuse = "cuda", "bfloat16", "triton", True, True
        a.context, a.new, a.repeats, batches = 8000, 64, 3, [int(b) for b in a.batches.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec(a.module)
    doc = spec.origin if spec is not None else None
    res = dict(meta=dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), argv=" ".join(sys.argv),
                         device=torch.cuda.get_device_name() if a.device == "cuda" else "cpu", document=doc,
                         new_tokens=a.new, repeats=a.repeats, torch=torch.__version__),
               errors={}, skipped=[])

    def save():
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        (out / f"{name}.md").write_text(to_markdown(res))

    return batches, res, save


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150, help="seconds (from the start) for the benchmark rows")
    ap.add_argument("--tests-s", type=float, default=60, help="extra seconds the GPU tests may use after them")
    ap.add_argument("--profile-s", type=float, default=10, help="the profile runs if it can start within these after")
    ap.add_argument("--draft", default=None, help="an EAGLE head artifact (default: the shipped one)")
    ap.add_argument("--module", default="tarfile", help="held-out standard-library module whose source is the document")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--methods", default="dense,eagle-dense,dustin-25%,dustin-default")
    ap.add_argument("--smoke", action="store_true", help="CPU: embedded model, context 128, B = 2, 8 tokens")
    a = ap.parse_args()
    batches, res, save = setup(a, "dustin_graphs", markdown)
    doc = res["meta"]["document"]

    try:
        from specdec.data import context_ids, load_document
        from specdec.loading import load_model

        m = load_model(a.gguf, a.dtype, a.device, a.backend, a.graphs, False, a.fuse)
        ids = context_ids(m.tokenizer, load_document(doc), a.context, offset=96)
        res["meta"]["context"] = len(ids)
        res["meta"]["load_seconds"] = round(elapsed(), 1)
        save()
        for B in batches:
            part_batch(a, m, ids, B, res, save)
    except Exception:
        m = None
        res["errors"]["setup"] = traceback.format_exc()
    save()
    try:  # before the profile: a profiler failure must not cost the tests
        part_tests(a, res)
    except Exception:
        res["errors"]["tests"] = traceback.format_exc()
    save()
    if m is not None and elapsed() < a.budget_s + a.tests_s + a.profile_s:
        try:
            part_profile(a, m, ids, batches[-1], res)
        except Exception:
            res["errors"]["profile"] = traceback.format_exc()
    else:
        res["skipped"].append("profile")
    save()
    print(markdown(res))


if __name__ == "__main__":
    main()
