"""Issue 5 ("optimized backend") in one GPU call: one-split sparse path, score-emission cost, Quest kernels.

Run on a CUDA machine from the repository root (well under 4 minutes on an H200)::

    PYTHONPATH=. python3 benchmarks/gpu/bench_optimized.py --out gpu_optimized.json

``--tiny`` runs every code path at toy sizes on the CPU under ``TRITON_INTERPRET=1`` (one timed call,
wall clock: a smoke test, not a measurement).

Sections (bf16, random data, every sequence at the same context, copy bandwidth measured first):

1. **sparse** (5 % plan = ``max(256, ceil(0.05 ctx))`` random positions + 4 recent, T = 1 and 5) at
   SmolLM2 B=64 x 8k and the Llama-8B shape B=16 x 32k and B=1 x 128k: ``old`` (split + combine,
   ``sparse_single_split_at=None``: the split count chosen before), ``auto`` (the new default:
   one split, no combine, when B*H_kv >= the SM count), forced ``S=1`` and ``S=2``.
2. **scores** (dense verify T=5, rows 0 and 4) at SmolLM2 B=64 x 8k and Llama B=16 x 32k: no scores,
   ``+logits`` (summed, what Vegas uses; buffer now written in full by the kernel),
   ``+logits/row``, and ``+logits +fill`` (the same plus a ``torch.zeros`` of the score buffer in
   the same graph: the old cost, emulated).
3. **quest** (draft T=1, pages of 16, budget 5 % / at least 256) at SmolLM2 B=64 x 8k and Llama
   B=16 x 32k, per layer: page scoring torch (two einsums) vs Triton (graph); the token scores that
   feed ``torch.topk`` (torch: page scores + repeat + mask; Triton: one fused kernel; graph); the
   whole ``QuestPlan.indices_for`` (eager, it syncs once); and the page min/max update after a
   5-token append (torch: host loop over sequences, eager; Triton: one launch).

Timing: "graph" = median per call of a CUDA graph that runs the variant once per independent KV copy
(working set > L2), replayed 20x (``bench_kernels.graph_time``); "eager" = ``triton.testing.do_bench``
median (includes Python launch overhead).
"""

from __future__ import annotations

import os
import sys

if "--tiny" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_kernels import copy_bandwidth, graph_time, rel_err  # noqa: E402

from specdec.cuda.triton_attention import LaunchConfig, splitk_attention  # noqa: E402
from specdec.cuda.triton_quest import quest_token_scores, quest_update_minmax  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

# name, H, H_kv, D, B, context
SPARSE_CASES = [("smollm2", 9, 3, 64, 64, 8192), ("llama8b", 32, 8, 128, 16, 32768), ("llama8b", 32, 8, 128, 1, 131072)]
SCORE_CASES = [("smollm2", 9, 3, 64, 64, 8192), ("llama8b", 32, 8, 128, 16, 32768)]
QUEST_CASES = [("smollm2", 9, 3, 64, 64, 8192), ("llama8b", 32, 8, 128, 16, 32768)]
TINY = [("tiny", 4, 2, 16, 3, 200)]
SPARSE_VARIANTS = [
    ("old split+combine", LaunchConfig(sparse_single_split_at=None)),
    ("auto (new)", LaunchConfig()),
    ("S=1 direct", LaunchConfig(num_splits=1)),
    ("S=2 split+combine", LaunchConfig(num_splits=2)),
]


class Bench:
    def __init__(self, dev: torch.device, log):
        self.dev, self.log, self.rows = dev, log, []
        self.cuda = dev.type == "cuda"
        self.bw = copy_bandwidth() if self.cuda else float("nan")

    def time(self, fns, eager: bool = True, graph: bool = True) -> tuple[float | None, float | None]:
        """(graph seconds per call, eager seconds); on the CPU one wall-clock call as "eager"."""
        if not self.cuda:
            t0 = time.perf_counter()
            fns[0]()
            return None, time.perf_counter() - t0
        tg = graph_time(fns) if graph else None
        te = triton.testing.do_bench(fns[0], warmup=10, rep=50, return_mode="median") * 1e-3 if eager else None
        return tg, te

    def record(self, section, case, variant, tg, te, nbytes=None, **extra):
        us = lambda s: None if s is None else s * 1e6  # noqa: E731
        row = dict(section=section, case=case, variant=variant, graph_us=us(tg), eager_us=us(te), bytes=nbytes,
                   **extra)
        if nbytes and tg and self.cuda:
            row["frac_copy"] = nbytes / tg / self.bw
            row["predicted_us"] = nbytes / self.bw * 1e6
        self.rows.append(row)
        f = lambda v: "      -" if v is None else f"{v:9.1f}"  # noqa: E731
        pct = f"{row['frac_copy'] * 100:5.1f}%" if "frac_copy" in row else "     "
        err = f"  relerr {extra['rel_err']:.1e}" if extra.get("rel_err") is not None else ""
        self.log(f"  {section:<7} {case:<22} {variant:<26} graph {f(row['graph_us'])} us  eager {f(row['eager_us'])} us"
                 f"  {pct}{err}")
        return row


def _kv(B, Hkv, L, D, copies, dev, gen):
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    ks = [torch.randn(B, Hkv, L, D, device=dev, dtype=dt, generator=gen) for _ in range(copies)]
    vs = [torch.randn(B, Hkv, L, D, device=dev, dtype=dt, generator=gen) for _ in range(copies)]
    return ks, vs


def _copies(nbytes: int, dev) -> int:
    return max(1, min(16, math.ceil(400e6 / nbytes))) if dev.type == "cuda" else 1


def sparse_section(bench: Bench, cases, Ts=(1, 5)):
    from specdec.attention.reference import ReferenceBackend

    dev = bench.dev
    for name, H, Hkv, D, B, ctx in cases:
        gen = torch.Generator(device=dev).manual_seed(0)
        L = ctx + 8
        budget = max(256, math.ceil(0.05 * ctx)) if bench.cuda else 24
        ks, vs = _kv(B, Hkv, L, D, _copies(B * Hkv * ctx * D * 4, dev), dev, gen)
        idx = torch.stack([torch.randperm(ctx - 16, device=dev, generator=gen)[:budget] for _ in range(B * Hkv)])
        idx = idx.view(B, Hkv, budget).sort(dim=-1).values
        case = f"{name} B={B} ctx={ctx}"
        for T in Ts:
            lengths = torch.full((B,), ctx - T, dtype=torch.long, device=dev)
            dense_from = lengths - 4
            q = torch.randn(B, H, T, D, device=dev, dtype=ks[0].dtype, generator=gen)
            nbytes = B * Hkv * (budget + 4 + T) * D * 2 * ks[0].element_size() + idx.numel() * 8
            bb = min(B, 2)
            o_ref, _ = ReferenceBackend().attend(q[:bb], ks[0][:bb], vs[0][:bb], AttentionMetadata(lengths[:bb], D**-0.5, idx[:bb], dense_from[:bb]))
            for label, cfg in SPARSE_VARIANTS:
                o = splitk_attention(q[:bb], ks[0][:bb], vs[0][:bb], AttentionMetadata(lengths[:bb], D**-0.5, idx[:bb], dense_from[:bb]), cfg=cfg)[0]
                fns = [lambda i=i, cfg=cfg: splitk_attention(q, ks[i], vs[i], AttentionMetadata(lengths, D**-0.5, idx, dense_from), cfg=cfg)
                       for i in range(len(ks))]
                tg, te = bench.time(fns)
                bench.record("sparse", case, f"T={T} {label}", tg, te, nbytes, rel_err=rel_err(o, o_ref))
        del ks, vs
        if bench.cuda:
            torch.cuda.empty_cache()


def score_section(bench: Bench, cases, T=5, rows=(0, 4)):
    from specdec.attention.reference import ReferenceBackend
    from specdec.cuda.triton_backend import TritonBackend

    dev = bench.dev
    for name, H, Hkv, D, B, ctx in cases:
        gen = torch.Generator(device=dev).manual_seed(1)
        L = ctx + 8
        ks, vs = _kv(B, Hkv, L, D, _copies(B * Hkv * ctx * D * 4, dev), dev, gen)
        lengths = torch.full((B,), ctx - T, dtype=torch.long, device=dev)
        q = torch.randn(B, H, T, D, device=dev, dtype=ks[0].dtype, generator=gen)
        w = torch.zeros(H, T, device=dev)
        w[:, list(rows)] = 1.0
        rq, rid = TritonBackend()._row_queries(H, Hkv, T, list(rows), None, dev)
        nbytes = B * Hkv * ctx * D * 2 * ks[0].element_size()
        case = f"{name} B={B} ctx={ctx}"
        bb = min(B, 2)
        _, s_ref = ReferenceBackend().attend(q[:bb], ks[0][:bb], vs[0][:bb], AttentionMetadata(lengths[:bb], D**-0.5, score_rows=list(rows)))
        s = splitk_attention(q[:bb], ks[0][:bb], vs[0][:bb], AttentionMetadata(lengths[:bb], D**-0.5), row_weights=w)[2]
        err = rel_err(s, s_ref)
        sc = lambda i: splitk_attention(q, ks[i], vs[i], AttentionMetadata(lengths, D**-0.5), row_weights=w)  # noqa: E731
        variants = [
            ("T=5 no scores", lambda i: splitk_attention(q, ks[i], vs[i], AttentionMetadata(lengths, D**-0.5)), None),
            ("T=5 +logits", sc, err),
            ("T=5 +logits +fill (old)",
             lambda i: (torch.zeros((B, Hkv, L), dtype=torch.float32, device=dev), sc(i)), None),
            ("T=5 +logits/row", lambda i: splitk_attention(q, ks[i], vs[i], AttentionMetadata(lengths, D**-0.5), row_queries=rq, row_ids=rid, n_slots=len(rows)), None),
        ]
        base = None
        for label, fn, e in variants:
            tg, te = bench.time([lambda i=i, fn=fn: fn(i) for i in range(len(ks))])
            extra = {}
            if base is None:
                base = tg
            elif tg and base:
                extra["vs_no_scores"] = tg / base - 1
            bench.record("scores", case, label, tg, te, nbytes, rel_err=e, **extra)
        del ks, vs
        if bench.cuda:
            torch.cuda.empty_cache()


def quest_section(bench: Bench, cases, page_size=16):
    from specdec.selectors.base import fixed_positions
    from specdec.selectors.quest import Quest, QuestConfig, QuestPlan, blocked_positions, page_counts

    dev = bench.dev
    for name, H, Hkv, D, B, ctx in cases:
        gen = torch.Generator(device=dev).manual_seed(2)
        L = ctx + 8
        P = -(-L // page_size)
        a = torch.randn(1, B, Hkv, P, D, device=dev, generator=gen)
        b = torch.randn(1, B, Hkv, P, D, device=dev, generator=gen)
        kmin, kmax = torch.minimum(a, b), torch.maximum(a, b)
        del a, b
        q = torch.randn(B, H, 1, D, device=dev, generator=gen).to(torch.bfloat16 if bench.cuda else torch.float32)
        lengths = torch.full((B,), ctx, dtype=torch.long, device=dev)
        case = f"{name} B={B} ctx={ctx}"
        nbytes = 2 * kmin[0].numel() * 4
        # budget as in Vegas' code: 5 % of the context, at least 256 entries (sinks 4 + recent 16 included)
        sels = {k: Quest(QuestConfig(page_size=page_size, kernels=k, budget_ratio=0.05, min_budget=256))
                for k in ("torch", "triton")}
        ref = sels["torch"].page_scores(q, kmin[0], kmax[0])
        for kind, sel in sels.items():
            got = sel.page_scores(q, kmin[0], kmax[0])
            tg, te = bench.time([lambda sel=sel: sel.page_scores(q, kmin[0], kmax[0])])
            bench.record("quest", case, f"page scores {kind}", tg, te, nbytes, rel_err=rel_err(got, ref))
        # page scores expanded to tokens + blocked mask (the input of topk): torch chain vs one kernel
        c = sels["torch"].config
        tsel = sels["torch"]

        def tok_torch():
            tok = tsel.page_scores(q, kmin[0], kmax[0]).repeat_interleave(page_size, dim=-1)[..., :ctx]
            return tok.masked_fill(tsel.blocked(lengths, ctx).view(B, 1, ctx), float("-inf"))

        def tok_triton():
            return quest_token_scores(q, kmin[0], kmax[0], lengths, ctx, page_size, c.sinks, c.recent)

        ref_tok = tok_torch()
        for kind, fn in (("torch", tok_torch), ("triton", tok_triton)):
            got = fn()
            fin = torch.isfinite(ref_tok)
            tg, te = bench.time([fn])
            bench.record("quest", case, f"token scores {kind}", tg, te, nbytes,
                         rel_err=rel_err(got[fin], ref_tok[fin]))
        for kind, sel in sels.items():  # the whole per-layer selection (eager: it syncs once)
            sel.kmin, sel.kmax = kmin, kmax
            budget = sel.config.budget_for(lengths)
            fixed, room = fixed_positions(lengths, budget, sel.config.sinks, sel.config.recent)
            k = int(room.max())
            k_sel = min(-(-k // sel.config.k_bucket) * sel.config.k_bucket, L) if k else 0
            ps = sel.config.page_size
            new = ~blocked_positions(lengths, kmin.shape[3] * ps, sel.config.sinks, sel.config.recent)
            counts = page_counts(new, ps)
            plan = QuestPlan(indices=fixed.view(1, B, 1, -1), dense_from=lengths.clone(), lengths=lengths.clone(),
                             room=room, kmin=kmin, kmax=kmax, width=kmin.shape[3] * ps, k_sel=k_sel, page_size=ps,
                             sinks=sel.config.sinks, recent=sel.config.recent, use_triton=kind == "triton",
                             new=new, counts=counts)
            tg, te = bench.time([lambda plan=plan: plan.indices_for(0, q)], graph=False)
            bench.record("quest", case, f"indices_for {kind}", tg, te)
        # page min/max after a 5-token append, one layer
        k = torch.randn(1, B, Hkv, L, D, device=dev, generator=gen).to(q.dtype)
        old = torch.full((B,), ctx - 5, dtype=torch.long, device=dev)
        cache = SimpleNamespace(k=k, batch=B, capacity=L)
        for kind, sel in sels.items():
            sel.kmin, sel.kmax = kmin.clone(), kmax.clone()

            def upd(sel=sel):
                sel._valid = old.clone()
                sel.update(cache, lengths)

            if kind == "triton":
                fns = [lambda sel=sel: quest_update_minmax(k, sel.kmin, sel.kmax, old, lengths, page_size)]
                tg, _ = bench.time(fns, eager=False)
                _, te = bench.time([upd], graph=False)
            else:
                tg, te = bench.time([upd], graph=False)
            bench.record("quest", case, f"update +5 tokens {kind}", tg, te)
        torch.testing.assert_close(sels["triton"].kmin, sels["torch"].kmin, rtol=0, atol=0)
        torch.testing.assert_close(sels["triton"].kmax, sels["torch"].kmax, rtol=0, atol=0)
        del kmin, kmax, k, sels
        if bench.cuda:
            torch.cuda.empty_cache()


def table(rows) -> str:
    out = ["| section | case | variant | graph µs | eager µs | % copy BW | vs no scores | rel. err |",
           "|---|---|---|---|---|---|---|---|"]
    f = lambda v, fmt: "" if v is None else format(v, fmt)  # noqa: E731
    for r in rows:
        frac = r.get("frac_copy")
        vs = r.get("vs_no_scores")
        out.append(f"| {r['section']} | {r['case']} | {r['variant']} | {f(r['graph_us'], '.1f')} | "
                   f"{f(r['eager_us'], '.1f')} | {f(None if frac is None else frac * 100, '.1f')} | "
                   f"{'' if vs is None else format(vs * 100, '+.1f') + '%'} | {f(r.get('rel_err'), '.1e')} |")
    return "\n".join(out)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="gpu_optimized.json", help="JSON results path")
    ap.add_argument("--sections", default="sparse,scores,quest", help="comma list of sparse, scores, quest")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (TRITON_INTERPRET=1): smoke test")
    args = ap.parse_args(argv)
    secs = [s.strip() for s in args.sections.split(",") if s.strip()]
    bad = sorted(set(secs) - {"sparse", "scores", "quest"})
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; use sparse, scores, quest")
    args.sections = secs
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    dev = torch.device("cpu" if args.tiny else "cuda")
    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    t0 = time.time()
    meta = dict(torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command=" ".join(sys.argv), tiny=args.tiny)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta.update(gpu=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda)
    log(json.dumps(meta))
    bench = Bench(dev, log)
    meta["copy_bw_Bps"] = bench.bw
    if bench.cuda:
        log(f"copy bandwidth: {bench.bw / 1e12:.3f} TB/s")
    if "sparse" in args.sections:
        sparse_section(bench, TINY if args.tiny else SPARSE_CASES)
        log(f"   ({time.time() - t0:.0f} s elapsed)")
    if "scores" in args.sections:
        score_section(bench, TINY if args.tiny else SCORE_CASES)
        log(f"   ({time.time() - t0:.0f} s elapsed)")
    if "quest" in args.sections:
        quest_section(bench, TINY if args.tiny else QUEST_CASES, page_size=4 if args.tiny else 16)
        log(f"   ({time.time() - t0:.0f} s elapsed)")
    md = table(bench.rows)
    log(md)
    meta["seconds"] = time.time() - t0
    with open(args.out, "w") as fh:
        json.dump(dict(meta=meta, rows=bench.rows, table_md=md, log=lines), fh, indent=1)


if __name__ == "__main__":
    main()
