"""Issue 15, d15: Dustin at 8k on the H200 after the SRH-score kernels and the EAGLE head's attention on the Triton
backend; the verify forward, the head step and the iteration, before and after in one run (≤ 4 minutes).

    python3 benchmarks/gpu/d15_dustin_verify.py --out $OUT --budget-s 140 --profile-s 25 --tests-s 35  # GPU; $OUT/d15.tgz
    python3 benchmarks/gpu/d15_dustin_verify.py --smoke --out /tmp/d15smoke    # CPU, embedded model, tiny shapes

Part ``forward`` (first: it answers the question even if the rest runs out of time): the verify forward alone at
``--forward-batch`` (64) x 8k, graph-replayed, medians of 20 CUDA-event timings after warm-up, on a cache of random
bf16 K/V at length 8,000: dense T = 5 (no scores / + the SRH request Dustin's dense passes carry), sparse over 25 %
(+ SRH / + SRH by the pre-d15 PyTorch scores / without SRH / + SRH with the sparse kernel split as for dense), the
captured plan alone, the SRH score computation alone (``head_attention``, ``group_attention``, the Triton
``group_scores``), and one EAGLE head layer step (T = 1 with the lookahead scores; the first draft forward's 6 rows)
with its attention in PyTorch matmuls (before) or on the Triton backend (new), each captured as a CUDA graph.

Part ``rows`` (``benchmarks/gpu/dustin_graphs.py``'s measurement, same setup: SmolLM2 bf16, Triton, fused, CUDA
graphs, 8k of ``tarfile.py``, 64 new tokens, γ 4, lookup on): dense, dustin-25%, dustin-default and
dustin-25%-before (the pre-d15 paths) at B = 64 and 16, each warmed up at its shape, median of 3 timed runs, then one
run with phase syncs for the split: draft / plan / sparse forward / sample+select / host (the rest of the iteration),
agreement with dense in the same table. Part ``profile``: ``torch.profiler`` over one dustin-25% generation at the
largest batch (kernel table ``profile_dustin25_b64.txt``). Then ``tests/test_dustin_gpu.py`` with the time left.
Everything is written to ``$OUT/d15_dustin_verify.{json,md}`` after each part; failures are recorded and the next
part runs; ``$OUT/d15.tgz`` holds it all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import dustin_graphs as dg  # noqa: E402
from script_io import graphed, timed  # noqa: E402 - shared with layer_plan_speed.py

T0 = time.perf_counter()


def elapsed() -> float:
    return time.perf_counter() - T0


def part_forward(a, m, res: dict, save) -> None:
    from specdec.attention.recording import group_attention, head_attention
    from specdec.dustin import default_heads
    from specdec.planner import planner_for
    from specdec.selectors.hybrid_srh import HybridSRHConfig, HybridSRHSelector
    from specdec.verifiers import srh_request

    B, L, T = a.forward_batch, a.context, dg.GAMMA + 1
    dev = m.device
    cache = m.new_cache(B, L + 128)
    torch.manual_seed(0)
    for t in (cache.k, cache.v):  # timing does not depend on the values: random keys and values, in place
        t.normal_()
    lengths = torch.full((B,), L, device=dev, dtype=torch.long)
    ids = torch.randint(0, 1000, (B, T), device=dev)
    t_heads, _ = default_heads(m.dims.n_global, m.dims.n_heads, 1)
    heads = {int(l): [] for l, _ in t_heads}
    for l, h in t_heads:
        heads[int(l)].append(int(h))
    sel = HybridSRHSelector(HybridSRHConfig(budget_ratio=0.25, target_heads=[tuple(x) for x in t_heads]))
    sel.draft_signal = torch.rand(B, cache.capacity, device=dev)
    sel.target_signal = torch.rand(B, cache.capacity, device=dev)
    planner = planner_for(cache)
    rows = res.setdefault("forward", {})
    rows["meta"] = dict(batch=B, length=L, rows=T, srh_heads=t_heads, capacity=cache.capacity)

    def one(name, fn, reps=20):
        if elapsed() > a.budget_s:
            res["skipped"].append(f"forward {name}")
            return
        try:
            rows[name] = round(timed(fn, reps, dev), 4)
        except Exception:
            res["errors"][f"forward {name}"] = traceback.format_exc()
        save()

    plan = planner.plan(sel, lengths)
    rows["plan_K"] = int(plan.indices.shape[-1])
    rows["plan_graphs"] = None if planner.plan_graphs is None else dict(captures=planner.plan_graphs.captures)
    srh = lambda: [srh_request(heads, T)]  # noqa: E731
    one("plan (captured)", lambda: planner.plan(sel, lengths))
    one("plan (eager)", lambda: sel.plan(cache, lengths))
    one("dense T=5", lambda: m.forward(ids, cache, lengths))
    one("dense T=5 + SRH", lambda: m.forward(ids, cache, lengths, scores=srh()))
    one("sparse 25% + SRH", lambda: m.forward(ids, cache, lengths, plan=plan, scores=srh()))
    one("sparse 25%, no SRH", lambda: m.forward(ids, cache, lengths, plan=plan))
    with torch_scores():  # the forward as before d15 (its own capture: the graph key names the SRH kernels)
        one("sparse 25% + SRH, torch SRH scores (before)", lambda: m.forward(ids, cache, lengths, plan=plan, scores=srh()))
    layer = next(iter(heads))
    q = torch.randn(B, m.dims.n_heads, T, m.dims.head_dim, device=dev, dtype=cache.k.dtype)
    k_layer = cache.layer(layer)[0]  # SmolLM2: every layer global, model layer = global layer
    one("SRH scores, head_attention (oldest)", lambda: head_attention(q, k_layer, lengths, heads[layer], 0.125, full=True))
    one("SRH scores, group_attention (torch, before)",
        lambda: group_attention(q, k_layer, lengths, heads[layer], 0.125, full=True))
    if kernels_run(dev):
        from specdec.cuda.triton_srh import group_scores

        one("SRH scores, group_scores (Triton, new)", graphed(
            lambda: group_scores(q, k_layer, lengths, heads[layer], 0.125), dev, res["errors"], "SRH group_scores"))
    part_head(a, m, cache, lengths, rows, one, res["errors"])
    if dev.type == "cuda" and type(m.backend).__name__ == "TritonBackend":
        from specdec.cuda.triton_backend import TritonBackend

        cfg = m.backend.config.model_copy(update=dict(sparse_single_split_at=None))
        with m.using_backend(TritonBackend(cfg)):
            one("sparse 25% + SRH, split kernel", lambda: m.forward(ids, cache, lengths, plan=plan, scores=srh()))
    del cache
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def kernels_run(dev: torch.device) -> bool:
    """Whether the Triton kernels can run here (a GPU, or the interpreter in a ``--smoke`` run with it set)."""
    return dev.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@contextlib.contextmanager
def torch_scores():
    """The SRH (``heads="group"`` context) scores by PyTorch ``group_attention`` while inside (the pre-d15 path)."""
    from specdec.attention import recording

    old, recording.GROUP_SCORES = recording.GROUP_SCORES, "torch"
    try:
        yield
    finally:
        recording.GROUP_SCORES = old


def part_head(a, m, cache, lengths, rows: dict, one, failures: dict) -> None:
    """One EAGLE head layer step at the forward's batch and cache capacity (random bf16 head cache), each way
    captured as a CUDA graph: draft steps 2..γ (T = 1, with the lookahead scores of the draft heads) and the first
    draft forward (T = γ + 2 = 6 rows), attention by PyTorch matmuls (before) or the target's backend (new)."""
    from specdec.dustin import default_heads
    from specdec.eagle import build_head, head_layer_step, rope
    from specdec.train_draft import shipped_draft

    dev, B = m.device, cache.batch
    path = a.draft or shipped_draft(m, "eagle")
    head = build_head(m, path)[1]
    at = head.layer.self_attn
    Hkv, D = at.k_proj.out_features // at.head_dim, at.head_dim
    C = cache.capacity
    kc = torch.randn(B, Hkv, C, D, device=dev, dtype=cache.k.dtype)
    vc = torch.randn_like(kc)
    _, d_heads = default_heads(m.dims.n_global, m.dims.n_heads, 1)
    hs = [int(h) for _, h in d_heads]
    hs_t = torch.tensor(hs, device=dev)  # made before any capture (a host copy inside one is refused)
    be = m.backend
    rows["head_meta"] = dict(batch=B, capacity=C, lookahead_heads=hs, backend=type(be).__name__)
    d = m.hf.config.hidden_size
    for T in (1, dg.GAMMA + 2):
        x = torch.randn(B, T, d, device=dev, dtype=cache.k.dtype)
        pos = (lengths - T + 1).view(B, 1) + torch.arange(T, device=dev)
        cos, sin = rope(m, x, pos)
        rec = T == 1  # steps 2..γ record the lookahead signal; the first draft forward does not

        def torch_way(x=x, pos=pos, cos=cos, sin=sin, rec=rec):
            probs = [] if rec else None
            y = head_layer_step(head.layer, x, kc, vc, pos, cos, sin, probs)
            return y if not rec else (y, probs[0].index_select(1, hs_t).sum((1, 2)))

        def backend_way(x=x, pos=pos, cos=cos, sin=sin, rec=rec):
            probs = [] if rec else None
            y = head_layer_step(head.layer, x, kc, vc, pos, cos, sin, probs, backend=be, score_heads=hs)
            return y if not rec else (y, probs[0].sum(1))

        tag = "step (T=1, + lookahead)" if rec else f"first draft forward (T={T})"
        for label, fn in ((f"EAGLE head {tag}, torch matmuls (before)", torch_way),
                          (f"EAGLE head {tag}, {type(be).__name__} (new)", backend_way)):
            if fn is backend_way and not kernels_run(dev) and type(be).__name__ == "TritonBackend":
                continue
            run = graphed(fn, dev, failures, label)
            one(label + (" [eager]" if getattr(run, "eager", False) else ""), run)
    del kc, vc


def part_rows(a, m, ids, B: int, res: dict, save) -> None:
    """dustin_graphs' rows, then the per-phase split of each Dustin row from its timed run."""
    before = len(res.setdefault("rows", []))
    dg.part_batch(a, m, ids, B, res, save)
    for r in res["rows"][before:]:
        ph = r["phase_ms_per_iteration"]
        it = max(1, r["timed_iterations"])
        wall = 1e3 * r.get("decode_seconds", 0.0) / it
        v = r.get("verifier", {})
        plan = 1e3 * v.get("select_seconds", 0.0) / max(1, v.get("passes", 0)) if v else 0.0
        known = sum(ph.get(k, 0.0) for k in ("draft", "verify", "sample", "select"))
        r["split_ms"] = dict(draft=ph.get("draft", 0.0), plan=plan, forward=ph.get("verify", 0.0) - plan,
                             sample_select=ph.get("sample", 0.0) + ph.get("select", 0.0),
                             host=max(0.0, wall - known) if wall else None, iteration=wall or None)
    save()


def markdown(res) -> str:
    meta = res["meta"]
    lines = [f"# d15: Dustin's verify at 8k — {meta['date']}", "", f"`{meta['argv']}` — {meta['device']}, "
             f"context {meta.get('context')} tokens of `{meta.get('document')}`, γ = {dg.GAMMA}", ""]
    f = res.get("forward")
    if f:
        mt = f.get("meta", {})
        lines += [f"## The verify forward alone (B = {mt.get('batch')}, length {mt.get('length')}, T = {mt.get('rows')}, "
                  f"graph-replayed, median ms; plan width K = {f.get('plan_K')})", "", "| call | ms |", "|---|---|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in f.items() if isinstance(v, float)]
        lines.append("")
    lines += ["## Iterations (median of 3 timed runs; split from one run with phase syncs, ms per iteration)", "",
              "| B | method | tok/s | × dense | τ | agreement (first diff) | KV read | draft | plan | sparse forward "
              "| sample+select | host | iteration |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "" if x is None else f"{x:.2f}"  # noqa: E731
    for r in res.get("rows", []):
        s = r.get("split_ms", {})
        agree = "" if r["method"] == "dense" else f"{r['agreement_with_dense']:.1%} ({r['first_divergence']})"
        kv = r.get("verifier", {}).get("kv_read_vs_dense")
        sp = r.get("speedup_vs_dense")
        lines.append(f"| {r['batch']} | {r['method']} | {r['tokens_per_second']:.0f} | {'' if sp is None else f'{sp:.2f}×'} "
                     f"| {r['tau']:.2f} | {agree} | {'' if kv is None else f'{kv:.1%}'} | {fmt(s.get('draft'))} "
                     f"| {fmt(s.get('plan'))} | {fmt(s.get('forward'))} | {fmt(s.get('sample_select'))} "
                     f"| {fmt(s.get('host'))} | {fmt(s.get('iteration'))} |")
    p = res.get("profile")
    if p:
        lines += ["", f"Profile of dustin-25% at B = {p['batch']} ({p['iterations']} iterations, `{p['table']}`, top operators "
                  f"by device time): {p['kernel_launches_per_iteration']:.0f} kernel launches, "
                  f"{p['graph_replays_per_iteration']:.1f} graph replays, {p['memcpy_or_sync_per_iteration']:.0f} "
                  "copies/syncs per iteration"]
    return "\n".join(lines + dg.markdown_tail(res)) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="/tmp/m/smol.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150, help="hard budget (seconds from the start) for every part")
    ap.add_argument("--batches", default="64,16")
    ap.add_argument("--methods", default="dense,dustin-25%,dustin-default,dustin-25%-before")
    ap.add_argument("--profile-s", type=float, default=30, help="after the budget: the profile starts within these")
    ap.add_argument("--forward-batch", type=int, default=64)
    ap.add_argument("--tests-s", type=float, default=0, help="after the budget: seconds for tests/test_dustin_gpu.py")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--module", default="tarfile")
    ap.add_argument("--smoke", action="store_true", help="CPU: embedded model, context 128, B = 2, 8 tokens")
    a = ap.parse_args()
    batches, res, save = dg.setup(a, "d15_dustin_verify", markdown)
    doc = res["meta"]["document"]
    out = Path(a.out)
    if a.smoke:
        a.forward_batch = 2

    m = ids = None
    try:
        from specdec.data import context_ids, load_document
        from specdec.loading import load_model

        m = load_model(a.gguf, a.dtype, a.device, a.backend, a.graphs, False, a.fuse)
        ids = context_ids(m.tokenizer, load_document(doc), a.context, offset=96)
        res["meta"].update(context=len(ids), load_seconds=round(elapsed(), 1))
    except Exception:
        res["errors"]["setup"] = traceback.format_exc()
    save()
    if m is not None:
        try:
            part_forward(a, m, res, save)
        except Exception:
            res["errors"]["forward"] = traceback.format_exc()
        for B in batches:
            try:
                part_rows(a, m, ids, B, res, save)
            except Exception:
                res["errors"][f"rows B={B}"] = traceback.format_exc()
    save()
    if m is not None and elapsed() < a.budget_s + a.profile_s:
        try:  # torch.profiler over one short dustin-25% generation at the largest batch (warmed up by its row)
            dg.part_profile(a, m, ids, max(batches), res)
        except Exception:
            res["errors"]["profile"] = traceback.format_exc()
    else:
        res["skipped"].append("profile")
    save()
    if m is not None and m.device.type == "cuda":
        torch.cuda.empty_cache()
    if a.tests_s > 0:
        a.tests_s += a.profile_s  # their deadline: budget + profile + tests seconds from the start
        try:  # the GPU tests of Dustin (real graphs, the captured plan included) with the time left
            dg.part_tests(a, res)
        except Exception:
            res["errors"]["tests"] = traceback.format_exc()
        save()
    files = [p.name for p in out.iterdir() if p.is_file() and p.name != "d15.tgz"]
    subprocess.run(["tar", "czf", str(out / "d15.tgz"), "-C", str(out), *files], check=False)
    print(markdown(res))


if __name__ == "__main__":
    main()
