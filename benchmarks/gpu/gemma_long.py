"""Gemma 3 270M at long context on one GPU, in one command with a hard time budget.

Parts, most important first; each writes ``$OUT/gemma_long.json`` as rows finish (a timeout keeps the
rows done so far), a failure is recorded with its traceback and the next part runs:

1. ``layout``    versions, the per-layer windows, copy bandwidth, KV bytes held at 32k (torch.cuda
                 memory of the caches, B = 1 and 32) against every layer keeping the full context.
2. ``equality``  float32, torch backend, B = 1: greedy output of every lossless method equals Hugging
                 Face ``generate`` token for token, 16k (long:code) and 32k (long:prose).
3. ``tau``       τ of vegas and magicdec at the same absolute budget, contexts 4k/8k/16k/32k, on
                 long:prose and long:code (B = 1, bfloat16): the τ(vegas)/τ(magicdec) curve.
4. ``speed``     B = 1, 8, 32 × 16k, 32k × dense, magicdec, vegas, quest, dustin (bfloat16, triton backend,
                 CUDA graphs): τ, tokens/s (median of 3 after a warm-up), the dense step against the
                 roofline of the bytes it actually reads (local layers: their window only).

    python3 benchmarks/gpu/gemma_long.py --gguf /tmp/g/gemma.gguf --budget-s 330      # on the H200
    python3 benchmarks/gpu/gemma_long.py --smoke                                       # CPU, tiny Gemma 3

``benchmarks/gpu/gemma_long_report.py`` turns the JSON into benchmarks/results/ files and the plot.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LOSSLESS = ("dense", "magicdec", "vegas", "quest", "dustin")
#: Gemma 3 has 32,768 positions: the "32k" context leaves ROOM of them for the new tokens and the γ + 1
#: verify rows (the longest run adds --tau-new 64 + γ + 1 = 69), i.e. 32,640 prompt tokens everywhere
MAX_POSITIONS, ROOM = 32768, 128
ALL_PARTS = "layout,equality,tau,speed"
#: what the first GPU run (call 5) missed: every 32k row, plus the step profile; 16k speed again
RERUN_PARTS = "profile,layout,equality,tau,speed"


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.monotonic(), seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.t0)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Device copy bandwidth in bytes/s (read + write counted), median of 10 after 2 warm-ups."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    ts = []
    for _ in range(12):
        sync(device)
        t = time.perf_counter()
        b.copy_(a)
        sync(device)
        ts.append(time.perf_counter() - t)
    del a, b
    return 2 * nbytes / statistics.median(ts[2:])


def graph_counters(m, eng=None) -> dict:
    """Captured forwards of ``m`` (captures, replays, the steps refused and why: those ran eagerly, every
    time) and of the plan builds of ``eng``'s cache planner, if any."""
    g = getattr(m, "_graphs", None)
    out = dict(graphs_on=g is not None)
    if g is not None:
        out.update(graph_captures=g.captures, graph_replays=g.replays,
                   graph_uncapturable=sorted(set(g.uncapturable.values())))
    cache = getattr(m, "_reusable_cache", None)
    pg = getattr(getattr(cache, "planner", None), "plan_graphs", None)
    if pg is not None:
        out.update(plan_graph_captures=pg.captures, plan_graph_replays=pg.replays,
                   plan_graph_uncapturable=sorted(set(pg.uncapturable.values())))
    return out


@contextlib.contextmanager
def per_layer_masks(on: bool):
    """With ``on``: every local layer builds its own window mask and ring slots again (``per_forward``
    made a plain call in the modules that use it), i.e. the step as it was before they were shared."""
    import specdec.attention.reference as ref
    import specdec.attention.torch_backend as tb
    import specdec.cache as kc

    mods = (ref, tb, kc)
    saved = [m.per_forward for m in mods]
    if on:
        for m in mods:
            m.per_forward = lambda lengths, key, build: build()
    try:
        yield
    finally:
        for m, f in zip(mods, saved):
            m.per_forward = f


def launches(fn, device: str) -> tuple[collections.Counter, str]:
    """The kernels one call of ``fn`` launches on the GPU (CPU: the aten ops that would launch one),
    counted by name, and torch.profiler's table of it."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as p:
        fn()
        sync(device)
    counts: collections.Counter = collections.Counter()
    for e in p.events():
        if device == "cuda":
            if e.device_type == torch.autograd.DeviceType.CUDA:
                counts[e.name[:80]] += 1
        elif e.name.startswith("aten::") and e.name.removeprefix("aten::") not in _VIEW_OPS:
            counts[e.name] += 1
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    return counts, p.key_averages().table(sort_by=sort, row_limit=40)


#: aten ops that launch no kernel themselves (views, metadata, composites whose leaves are counted): the
#: CPU count approximates the kernels of a GPU step (``--smoke`` only; the GPU counts real kernels)
_VIEW_OPS = {"view", "transpose", "slice", "expand", "unsqueeze", "select", "t", "reshape", "alias", "as_strided",
             "detach", "permute", "empty", "empty_like", "new_empty", "empty_strided", "linear", "matmul", "to",
             "_to_copy", "contiguous", "clone", "lift_fresh", "item", "_local_scalar_dense", "scaled_dot_product_attention",
             "split", "chunk", "squeeze", "result_type", "_unsafe_view", "unbind", "flatten", "set_", "resolve_conj",
             "resolve_neg", "_reshape_alias", "expand_as", "type_as", "dropout"}


def tiny_gemma3(vocab: int = 512):
    """A random Gemma 3 (two local layers of a 64-token window per global one) for ``--smoke``."""
    import transformers as tf
    from transformers import AutoModelForCausalLM

    cfg = tf.Gemma3TextConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, num_hidden_layers=6, sliding_window=64,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                              max_position_embeddings=8192, query_pre_attn_scalar=16, eos_token_id=None,
                              bos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(4.0)  # peaked logits: greedy ties do not decide equality
    return hf


class Runner:
    def __init__(self, args):
        self.a = args
        self.out_dir = Path(args.out)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "gemma_long.json"
        self.device = "cpu" if args.smoke else args.device
        self.budget = Budget(args.budget_s)
        import transformers

        self.res: dict = dict(args=vars(args), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              torch=torch.__version__, transformers=transformers.__version__,
                              device=torch.cuda.get_device_name() if self.device == "cuda" else "cpu",
                              smoke=args.smoke, parts={}, layout={}, kv={}, equality=[], tau=[], speed=[], failures=[])
        self.docs: dict[str, str] = {}
        self.save()

    def save(self) -> None:
        self.res["elapsed_s"] = round(self.budget.seconds - self.budget.left(), 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.res, indent=1))
        tmp.replace(self.path)

    def log(self, *msg) -> None:
        print(f"[{self.budget.seconds - self.budget.left():6.1f}s]", *msg, flush=True)

    # ---------------------------------------------------------------- model and inputs
    def model(self, dtype: str, backend: str):
        from specdec import BACKENDS, SpecdecModel
        from specdec.models import load_hf

        if self.a.smoke:
            hf = tiny_gemma3().to(getattr(torch, dtype))
            tok = None
        else:
            hf, tok = load_hf(self.a.gguf, dtype, self.device)
        kw = {"static": True} if (backend == "torch" and self.a.graphs and self.device == "cuda") else {}
        return SpecdecModel(hf, tok, BACKENDS.build(backend, **kw))

    def ids(self, model, doc: str, context: int) -> list[int]:
        from specdec.data import context_ids, load_document

        text = self.docs.setdefault(doc, load_document(doc))
        if model.tokenizer is None:  # smoke: the document's bytes folded into the tiny vocabulary
            vocab = model.dims.vocab_size
            data = text.encode()[20000:20000 + context]
            return [3 + b % (vocab - 3) for b in data]
        return context_ids(model.tokenizer, text, context, offset=20000)

    def ctx(self, full: int) -> int:
        """The context of a part: as given on the GPU (the 32k one less :data:`ROOM`: 32,640), divided by
        ``--scale`` (32 for ``--smoke``)."""
        return min(full, MAX_POSITIONS - ROOM) // self.a.scale

    def wanted(self, part: str, full: int) -> bool:
        """Whether ``part`` runs its ``full``-token context (``--contexts``: e.g. only 32768 in a re-run)."""
        only = getattr(self.a, f"{part}_contexts", None) or self.a.contexts
        return not only or full in {int(c) for c in only.split(",")}

    def part(self, name: str, fn, min_left: float) -> None:
        left = self.budget.left()
        if left < min_left:
            self.res["parts"][name] = f"skipped: {left:.0f} s left, needs >= {min_left:.0f} s"
            self.log(name, self.res["parts"][name])
            self.save()
            return
        t0 = time.monotonic()
        self.log("part", name)
        try:
            fn()
            status = "done"
        except Exception:
            status = "failed"
            self.res["failures"].append(dict(part=name, traceback=traceback.format_exc()))
            traceback.print_exc()
        self.res["parts"][name] = f"{status} in {time.monotonic() - t0:.1f} s"
        self.log(name, self.res["parts"][name])
        free(self.device)
        self.save()

    # ---------------------------------------------------------------- 1. layout, KV bytes
    def layout(self) -> None:
        m = self.model("bfloat16", "torch")
        d = m.dims
        lay = self.res["layout"]
        lay.update(model_type=m.hf.config.model_type, windows=list(d.windows), n_layers=d.n_layers,
                   n_global=d.n_global, n_kv_heads=d.n_kv_heads, head_dim=d.head_dim, vocab=d.vocab_size,
                   weight_bytes_bf16=sum(p.numel() * p.element_size() for p in m.hf.parameters()))
        lay["copy_bandwidth_GBps"] = copy_bandwidth(self.device, (64 << 20) if self.device == "cpu" else (2 << 30)) / 1e9
        ctx = self.ctx(32768)
        per_pos = 2 * d.n_kv_heads * d.head_dim * 2
        for B in (1, 32):
            free(self.device)
            before = torch.cuda.memory_allocated() if self.device == "cuda" else 0
            cache = m.new_cache(B, ctx + 64)
            after = torch.cuda.memory_allocated() if self.device == "cuda" else 0
            ring = 0 if cache.ring_k is None else cache.ring_k.nbytes + cache.ring_v.nbytes
            self.res["kv"][str(B)] = dict(context=ctx, batch=B, dtype="bfloat16", capacity=ctx + 64,
                                          cuda_allocated_bytes=after - before, nbytes=cache.nbytes(),
                                          global_bytes=cache.k.nbytes + cache.v.nbytes, ring_bytes=ring,
                                          all_layers_full_bytes=B * (ctx + 64) * per_pos * d.n_layers,
                                          step_reads_bytes=d.kv_bytes(ctx, batch=B))
            self.log("kv", self.res["kv"][str(B)])
            del cache
        if not self.a.smoke:
            assert d.n_global == 3 and d.windows[0] == 512, f"unexpected Gemma 3 layout: {d}"

    # ---------------------------------------------------------------- 2. equality with HF generate
    def equality(self) -> None:
        from specdec import PipelineConfig, build_engine

        m = self.model("float32", "torch")
        hf = m.hf
        for full, doc in ((16384, "long:code"), (32768, "long:prose")):
            if not self.wanted("equality", full):
                continue
            ctx = self.ctx(full)
            if self.budget.left() < 60 and not self.a.smoke:
                self.res["equality"].append(dict(context=ctx, doc=doc, skipped="budget"))
                continue
            ids = self.ids(m, doc, ctx)
            gc = hf.generation_config
            saved, gc.eos_token_id = gc.eos_token_id, None  # EOS an ordinary token, as eos_token_id=-1 below
            try:
                t0 = time.perf_counter()
                with torch.no_grad():
                    ref = hf.generate(torch.tensor([ids], device=self.device), max_new_tokens=self.a.eq_new,
                                      do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
                hf_s = time.perf_counter() - t0
            finally:
                gc.eos_token_id = saved
            free(self.device)
            for method in LOSSLESS:
                row = dict(context=ctx, doc=doc, method=method, dtype="float32", backend="torch", B=1,
                           new=self.a.eq_new, hf_seconds=round(hf_s, 2))
                try:
                    cfg = PipelineConfig.make(method=method, gamma=4, budget=self.budget_tokens(ctx))
                    eng = build_engine(m, cfg, eos_token_id=-1)
                    t0 = time.perf_counter()
                    res = eng.generate([ids], max_new_tokens=self.a.eq_new)
                    row.update(equal_hf=res.tokens[0] == ref, lossless=res.stats.lossless,
                               tau=res.stats.mean_accepted_length, seconds=round(time.perf_counter() - t0, 2))
                    if not row["equal_hf"]:
                        first = next(i for i, (x, y) in enumerate(zip(res.tokens[0], ref)) if x != y)
                        row["first_difference"] = first
                except Exception:
                    row["error"] = traceback.format_exc(limit=4)
                self.res["equality"].append(row)
                self.log("equality", {k: v for k, v in row.items() if k != "error"}, "ERROR" if "error" in row else "")
                self.save()
                free(self.device)

    def budget_tokens(self, ctx: int) -> int:
        return max(64, min(self.a.tau_budget, ctx // 4)) if self.a.scale > 1 else self.a.tau_budget

    # ---------------------------------------------------------------- 3. τ vs context
    def tau(self) -> None:
        from specdec import PipelineConfig, build_engine

        m = self.model("bfloat16", self.a.backend)
        rows = []
        for full in (4096, 8192, 16384, 32768):
            if not self.wanted("tau", full):
                continue
            ctx = self.ctx(full)
            for doc in ("long:prose", "long:code"):
                if self.budget.left() < 20:
                    self.res["tau"].append(dict(context=ctx, doc=doc, skipped="budget"))
                    continue
                ids = self.ids(m, doc, ctx)
                pre = None
                for method in ("magicdec", "vegas"):
                    row = dict(context=ctx, doc=doc, method=method, B=1, budget=self.budget_tokens(ctx),
                               gamma=self.a.gamma, new=self.a.tau_new, dtype="bfloat16")
                    try:
                        cfg = PipelineConfig.make(method=method, gamma=self.a.gamma, budget=self.budget_tokens(ctx))
                        eng = build_engine(m, cfg, eos_token_id=-1)
                        pre = pre or eng.prefill([ids])
                        t0 = time.perf_counter()
                        res = eng.generate([ids], max_new_tokens=self.a.tau_new, prefilled=pre)
                        sync(self.device)
                        row.update(tau=res.stats.mean_accepted_length, iterations=res.stats.iterations,
                                   acceptance_per_position=res.stats.acceptance_per_position,
                                   seconds=round(time.perf_counter() - t0, 2))
                    except Exception:
                        row["error"] = traceback.format_exc(limit=4)
                    self.res["tau"].append(row)
                    rows.append(row)
                    self.log("tau", {k: v for k, v in row.items() if k not in ("error", "acceptance_per_position")})
                    self.save()
                del pre
                free(self.device)

    # ---------------------------------------------------------------- 0. one step, profiled
    def profile(self) -> None:
        """One dense and one sparse (5 % plan) forward at B = 1, 16k: wall time eager vs CUDA graph
        (median of ``--reps-step`` after a warm-up), the graph counters, and the kernels one eager step
        launches (torch.profiler, by name, in ``$OUT/profile_<kind>.txt``). Cache contents do not matter
        for the time, so no prefill: the step writes at position ``ctx`` each time."""
        from specdec.interfaces import SparsePlan

        m = self.model("bfloat16", self.a.backend)
        d = m.dims
        dev = self.device
        ctx = self.ctx(16384)
        B = 1
        cache = m.new_cache(B, ctx + 64)
        cache.bounded = True  # as in the engine: every write stays below the capacity, no host check per call
        lengths = torch.full((B,), ctx, dtype=torch.long, device=dev)
        ids = torch.full((B, 1), 7, dtype=torch.long, device=dev)
        K = max(64, int(self.a.budget_ratio * ctx))
        idx = torch.linspace(0, ctx - 1, K, device=dev).long().view(1, 1, 1, K).expand(1, B, d.n_kv_heads, K).contiguous()
        plans = dict(dense=None, sparse=SparsePlan(indices=idx, dense_from=lengths.clone()))
        weight_bytes = sum(p.numel() * p.element_size() for p in m.hf.parameters())
        bw = self.res["layout"].get("copy_bandwidth_GBps", 0) * 1e9 or copy_bandwidth(dev, (64 << 20) if dev == "cpu" else (2 << 30))
        prof = self.res.setdefault("profile", {})
        prof.update(context=ctx, batch=B, backend=self.a.backend, dtype="bfloat16", sparse_budget=K,
                    weight_bytes=weight_bytes, copy_bandwidth_GBps=bw / 1e9,
                    dense_roofline_seconds=(weight_bytes + d.kv_bytes(ctx, batch=B)) / bw)

        def timed(fn, n):
            fn()
            sync(dev)
            ts = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                sync(dev)
                ts.append(time.perf_counter() - t)
            return statistics.median(ts)

        # before/after, back to back: "<kind>_per_layer" rebuilds the window mask and ring slots in every
        # local layer (the code before they were shared per forward), "<kind>" is the code as it stands
        for kind, plan in plans.items():
            for variant in ("", "_per_layer"):
                step = lambda: m.forward(ids, cache, lengths, plan)  # noqa: E731
                row = prof.setdefault(kind + variant, {})
                with per_layer_masks(bool(variant)):
                    row["eager_seconds"] = timed(step, self.a.reps_step)
                    kernels, table = launches(step, dev)
                    row.update(kernels_per_step=sum(kernels.values()), kernels_top=kernels.most_common(25))
                    (self.out_dir / f"profile_{kind}{variant}.txt").write_text(table)
                    if self.a.graphs and dev == "cuda":
                        m.enable_cuda_graphs()
                        try:
                            row["graph_seconds"] = timed(step, self.a.reps_step)
                            row.update(graph_counters(m))
                        finally:
                            m.disable_cuda_graphs()
                self.log("profile", kind + variant, {k: v for k, v in row.items() if k != "kernels_top"})
                self.save()
                free(dev)

    # ---------------------------------------------------------------- 4. throughput grid
    def speed(self) -> None:
        from specdec import PipelineConfig, build_engine
        from specdec.engine import Prefilled

        m = self.model("bfloat16", self.a.backend)
        d = m.dims
        bw = self.res["layout"].get("copy_bandwidth_GBps", 0) * 1e9 or copy_bandwidth(self.device, 64 << 20)
        weight_bytes = sum(p.numel() * p.element_size() for p in m.hf.parameters())
        last_row_s = 10.0
        for full in (32768, 16384):
            if not self.wanted("speed", full):
                continue
            ctx = self.ctx(full)
            ids = self.ids(m, "long:prose", ctx)
            pre1 = None
            for B in [int(b) for b in self.a.batches.split(",")]:
                dense_tps = None
                for method in self.a.methods.split(","):
                    row = dict(context=ctx, doc="long:prose", B=B, method=method, gamma=self.a.gamma,
                               budget_ratio=self.a.budget_ratio, new=self.a.new, dtype="bfloat16",
                               backend=self.a.backend, graphs=bool(self.a.graphs and self.device == "cuda"))
                    if self.budget.left() < 1.5 * last_row_s:
                        row["skipped"] = f"budget: {self.budget.left():.0f} s left"
                        self.res["speed"].append(row)
                        continue
                    t_row = time.monotonic()
                    try:
                        cfg = PipelineConfig.make(method=method, gamma=self.a.gamma, budget_ratio=self.a.budget_ratio)
                        eng = build_engine(m, cfg, eos_token_id=-1)
                        if pre1 is None:
                            pre1 = eng.prefill([ids])
                        rings = {} if pre1.ring_k is None else dict(ring_k=pre1.ring_k.expand(-1, B, -1, -1, -1),
                                                                    ring_v=pre1.ring_v.expand(-1, B, -1, -1, -1))
                        pre = Prefilled(ids=[ids] * B, k=pre1.k.expand(-1, B, -1, -1, -1),
                                        v=pre1.v.expand(-1, B, -1, -1, -1),
                                        last_logits=pre1.last_logits.expand(B, -1), **rings)
                        if row["graphs"]:
                            m.enable_cuda_graphs()
                        eng.generate([ids] * B, max_new_tokens=self.a.new, prefilled=pre)  # warm-up: captures, compiles
                        sync(self.device)
                        eng.sync_timing = False
                        runs = [eng.generate([ids] * B, max_new_tokens=self.a.new, prefilled=pre) for _ in range(self.a.reps)]
                        row.update(graph_counters(m, eng))  # a step that could not be captured ran eagerly
                        m.disable_cuda_graphs()
                        rates = [r.stats.tokens_per_second for r in runs]
                        s = runs[0].stats
                        row.update(tau=s.mean_accepted_length, tokens_per_second=statistics.median(rates),
                                   tokens_per_second_all=rates, iterations=s.iterations,
                                   acceptance_per_position=s.acceptance_per_position)
                        if method == "dense":
                            dense_tps = row["tokens_per_second"]
                            step = statistics.median(r.stats.decode_seconds / max(1, r.stats.iterations) for r in runs)
                            read = weight_bytes + d.kv_bytes(ctx + self.a.new // 2, batch=B)
                            read_full = weight_bytes + B * (ctx + self.a.new // 2) * 2 * d.n_kv_heads * d.head_dim * 2 * d.n_layers
                            row.update(step_seconds=step, bytes_read=read, roofline_seconds=read / bw,
                                       step_over_roofline=step * bw / read, roofline_if_all_layers_full_seconds=read_full / bw)
                        elif dense_tps:
                            row["speedup_vs_dense"] = row["tokens_per_second"] / dense_tps
                    except Exception:
                        m.disable_cuda_graphs()
                        row["error"] = traceback.format_exc(limit=4)
                    last_row_s = max(5.0 if not self.a.smoke else 0.5, time.monotonic() - t_row)
                    row["row_seconds"] = round(time.monotonic() - t_row, 1)
                    self.res["speed"].append(row)
                    self.log("speed", {k: v for k, v in row.items() if k not in ("error", "acceptance_per_position", "tokens_per_second_all")},
                             "ERROR" if "error" in row else "")
                    self.save()
                    free(self.device)
            del pre1
            free(self.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="/tmp/g/gemma.gguf", help="the Gemma 3 270M GGUF (the project's loader reads it)")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"), help="folder for gemma_long.json (default $OUT)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="hard budget for all parts (seconds)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny random Gemma 3, contexts / 32")
    ap.add_argument("--parts", default=ALL_PARTS, help=f"comma-separated, in order: profile,{ALL_PARTS}")
    ap.add_argument("--rerun", action="store_true",
                    help=f"only what the first run missed: parts {RERUN_PARTS}, equality and tau at 32k only, speed at "
                         "32k and 16k (merge with the first JSON: gemma_long_report.py --merge)")
    ap.add_argument("--contexts", default="", help="run only these full contexts (e.g. 32768) in equality/tau/speed")
    ap.add_argument("--equality-contexts", default="", help="override --contexts for the equality part")
    ap.add_argument("--tau-contexts", default="", help="override --contexts for the tau part")
    ap.add_argument("--speed-contexts", default="", help="override --contexts for the speed part")
    ap.add_argument("--methods", default=",".join(LOSSLESS), help="methods of the speed rows")
    ap.add_argument("--reps-step", type=int, default=20, help="timed forwards per profile row (median)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu for a dry run of the real model with --scale")
    ap.add_argument("--scale", type=int, default=1, help="divide every context by this (dry runs)")
    ap.add_argument("--backend", default="triton", help="backend of the bfloat16 parts (equality: torch, float32)")
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget-ratio", type=float, default=0.05, help="sparse budget of the speed rows")
    ap.add_argument("--tau-budget", type=int, default=1024, help="absolute budget (tokens) of the τ-vs-context rows")
    ap.add_argument("--batches", default="1,8,32", help="batch sizes of the speed rows")
    ap.add_argument("--new", type=int, default=32, help="new tokens per speed run")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per speed row (median)")
    ap.add_argument("--tau-new", type=int, default=64)
    ap.add_argument("--eq-new", type=int, default=16)
    a = ap.parse_args()
    if a.rerun:
        a.parts = RERUN_PARTS
        a.equality_contexts = a.equality_contexts or "32768"
        a.tau_contexts = a.tau_contexts or "32768"
        a.speed_contexts = a.speed_contexts or "32768,16384"
    unknown = set(a.parts.split(",")) - set(("profile," + ALL_PARTS).split(","))
    if unknown:
        sys.exit(f"gemma_long.py: unknown part(s) {', '.join(sorted(unknown))}; use profile,{ALL_PARTS}.")
    if a.smoke:
        a.backend, a.device, a.scale = "torch", "cpu", 32
        a.graphs = 0
        a.eq_new, a.tau_new, a.new, a.reps = min(a.eq_new, 8), min(a.tau_new, 16), min(a.new, 8), min(a.reps, 2)
        a.reps_step = min(a.reps_step, 3)
        a.batches = "1,4"
    elif a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gemma_long.py: no CUDA device; run on the GPU machine or pass --smoke.")
    elif not Path(a.gguf).is_file():
        sys.exit(f"gemma_long.py: {a.gguf} does not exist; join the parts first (see benchmarks/gpu/gemma_long.sh).")
    r = Runner(a)
    # minimum seconds a part needs to start: its first rows must fit
    mins = dict(profile=0, layout=0, equality=40, tau=20, speed=20)
    for name in a.parts.split(","):
        r.part(name, getattr(r, name), 0 if a.smoke else mins[name])
    r.log("finished", r.res["parts"])


if __name__ == "__main__":
    main()
