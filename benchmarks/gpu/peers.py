"""Peers side by side: our Triton kernel, FlashAttention-4, FlashInfer and PyTorch SDPA, per call kind.

Run on the H200 from the repository root (``benchmarks/gpu/peers.sh`` installs the carried wheels
first)::

    PYTHONPATH=.:/tmp/site python3 benchmarks/gpu/peers.py --out "$OUT/peers" --budget-s 200

and on this CPU as a smoke test (tiny shapes, Triton's interpreter, peers only if installed)::

    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu/peers.py --smoke --out /tmp/peers_smoke

Call kinds (bf16, every sequence at the same context ``L``):

* ``decode``: one row (``T = 1``) over the whole cache;
* ``verify``: ``γ + 1 = 5`` rows, causal inside the draft (bottom-right mask);
* ``sparse``: one row over 5 % of the KV per (sequence, KV head) through an index list, plus a
  dense tail of the 16 newest tokens (FA4 cannot serve it on SM90: recorded as such);
* ``verify_scores``: our verify kernel also emitting the Collect-2-Query scores (rows 0 and 4,
  logits summed over each KV group's heads); the peers run their verify *without* scores, which
  is what a peer-based verify would have to add a second pass to;
* ``verify_sink``: the same with Vegas' default ``sink_softmax`` scores (ours only; ``benchmarks/gpu/s18.py``).

Capturable forms (the kernels the backend may run under CUDA-graph capture, ``peers.GRAPH_PICKS``):
``flashinfer_graph`` is FlashInfer's decode / verify wrapper in CUDA-graph mode
(:class:`specdec.cuda.peers.FlashInferGraphRunner`: fixed buffers, planned outside the capture; the
host time of one re-plan, what a replay adds, is ``replan_host_us``) and ``sdpa_masked`` the SDPA
decode over the whole capacity under a mask (:func:`specdec.cuda.peers.sdpa_decode_static`).
``results.json`` also holds ``graph_picks`` (``derive_picks(rows, graph=True)``).

Shapes: the embedded model (9 q / 3 KV heads, d 64) at B = 1, 16, 64 × 8k and Llama-3.1-8B
(32 / 8, d 128) at B = 16 × 32k and B = 1 × 128k.

Per variant: median time over ``--reps`` replays (each replay a CUDA graph calling the kernel once
on each of ``copies`` KV buffers, so the working set exceeds the L2; eager ``do_bench`` when a call
cannot be captured, marked), % of the copy bandwidth measured at the start of the same run (bytes
= K/V that must be read), and max |Δ| against the fp32 reference backend on the first two
sequences. Writes ``results.json`` (after every case), ``results.md`` and ``picks.py`` — the
``PICKS`` table for :mod:`specdec.cuda.peers` derived from this run — under ``--out``.

Failures of one variant are recorded with their traceback and the run goes on. A peer that cannot
be imported is a failure unless ``--allow-missing`` (the GPU run must have both): the exit code is
1 when any import or parity check failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from specdec.attention.reference import ReferenceBackend
from specdec.cuda import peers
from specdec.interfaces import AttentionMetadata

CASES = [  # name, H, H_kv, D, B, L
    ("smollm2", 9, 3, 64, 1, 8192),
    ("smollm2", 9, 3, 64, 16, 8192),
    ("smollm2", 9, 3, 64, 64, 8192),
    ("llama8b", 32, 8, 128, 16, 32768),
    ("llama8b", 32, 8, 128, 1, 131072),
]
SMOKE_CASES = [("tiny", 6, 2, 16, 2, 96)]
KINDS = ["decode", "verify", "sparse", "verify_scores", "verify_sink"]
GAMMA = 4
TAIL = 16
RATIO = 0.05
TOL = 3e-2  # bf16 outputs of unit-variance attention: max |Δ| against the fp32 reference


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


class Timer:
    def __init__(self, cuda: bool, reps: int):
        self.cuda, self.reps = cuda, reps

    def __call__(self, fns) -> tuple[float, str]:
        """Median seconds per call of ``fns`` (one closure per KV copy)."""
        for f in fns:  # compile / JIT / warm at this shape
            f()
        if not self.cuda:
            ts = []
            for _ in range(self.reps):
                t = time.perf_counter()
                for f in fns:
                    f()
                ts.append((time.perf_counter() - t) / len(fns))
            return statistics.median(ts), "eager-cpu"
        try:
            g = _capture(fns)
            ts = []
            for _ in range(self.reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                g.replay()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3 / len(fns))
            del g
            return statistics.median(ts), "graph"
        except Exception:  # a call that syncs or allocates outside the pool: time it eagerly
            torch.cuda.synchronize()
            import triton.testing

            ms = triton.testing.do_bench(lambda: [f() for f in fns], warmup=5, rep=50, return_mode="median")
            return ms * 1e-3 / len(fns), "eager"


def _capture(fns) -> "torch.cuda.CUDAGraph":
    """One CUDA graph calling every closure of ``fns`` in order, replayed once (a capture error raises)."""
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    return g


def interleaved(fn_lists: dict, reps: int, cuda: bool) -> dict:
    """Median seconds per call of each entry of ``fn_lists`` (``label -> closures``, one per KV copy), timed
    round-robin: one CUDA graph per entry, then ``reps`` rounds that replay every graph once each (the start
    entry rotating), so slow drift of the clock or the memory affects every entry alike. An entry that cannot
    be captured is left out (``label -> None``); on the CPU each round calls the closures eagerly."""
    graphs, ts = {}, {k: [] for k in fn_lists}
    for k, fns in fn_lists.items():
        for f in fns:
            f()
        if not cuda:
            graphs[k] = fns
            continue
        try:
            graphs[k] = _capture(fns)
        except Exception:  # noqa: BLE001 -- not capturable: reported as None, the others still run
            torch.cuda.synchronize()
            graphs[k] = None
    keys = [k for k in fn_lists if graphs[k] is not None]
    for r in range(reps):
        for i in range(len(keys)):
            k = keys[(i + r) % len(keys)]
            n = len(fn_lists[k])
            if not cuda:
                t = time.perf_counter()
                for f in graphs[k]:
                    f()
                ts[k].append((time.perf_counter() - t) / n)
                continue
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graphs[k].replay()
            b.record()
            b.synchronize()
            ts[k].append(a.elapsed_time(b) * 1e-3 / n)
    graphs.clear()
    return {k: (statistics.median(v) if v else None) for k, v in ts.items()}


def copy_bandwidth(cuda: bool) -> float:
    n = (1 << 30) if cuda else (1 << 22)
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda" if cuda else "cpu").normal_()
    y = torch.empty_like(x)
    t, _ = Timer(cuda, 20)([lambda: y.copy_(x)])
    nbytes = 2 * x.numel() * x.element_size()
    del x, y
    if cuda:
        torch.cuda.empty_cache()
    return nbytes / t


def make_plan(B, Hkv, L, lengths, dev, gen):
    """5 % of the positions before the tail per (sequence, KV head), sorted; tail = 16 newest."""
    K = max(1, math.ceil(RATIO * L))
    dense_from = lengths - (TAIL - 1)
    scores = torch.rand(B, Hkv, L - TAIL - 1, generator=gen, device=dev)
    idx = scores.topk(K, dim=-1).indices.sort(dim=-1).values
    return idx, dense_from, K


def run_case(case, kinds, cuda, copies_bytes, reps, bw, log, record, budget_left, ours=None, only_ours=False,
             interleave=None, drop=()):
    """Every variant of each call kind at one shape. ``ours``: ``kind -> {label: TritonConfig fields}``,
    our kernel's variants for that kind (default: one, ``"triton"``, with the table's launch);
    ``only_ours``: no peers (a second pass over more of our variants); ``interleave``: ``(kind, variant)``
    pairs (of any of ``kinds``) to time once more after the others, round-robin (:func:`interleaved`), as
    rows with ``timing="graph-interleaved"`` (those that ran and passed parity above); ``drop``: variant names
    to leave out (e.g. ``("fa4", "sdpa")``: peers a run does not need)."""
    name, H, Hkv, D, B, L = case
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    kv_bytes = B * Hkv * L * D * 2 * (2 if cuda else 4)
    copies = max(1, min(64, math.ceil(copies_bytes / kv_bytes)))
    ks = [torch.randn(B, Hkv, L, D, generator=gen, device=dev, dtype=dtype) for _ in range(copies)]
    vs = [torch.randn(B, Hkv, L, D, generator=gen, device=dev, dtype=dtype) for _ in range(copies)]
    scale = D**-0.5
    ref_be = ReferenceBackend()
    nref = min(B, 2)
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig

    ours = ours or {}
    keep = {}  # (kind, variant) -> (closures, row) of the variants to interleave
    runner = peers.FlashInferRunner() if cuda and peers.flashinfer_installed() else None
    elem = ks[0].element_size()

    for kind in kinds:
        if budget_left() <= 0:
            record(dict(case=name, B=B, L=L, kind=kind, variant="*", skipped="budget"))
            continue
        T = 1 if kind in ("decode", "sparse") else GAMMA + 1
        lengths = torch.full((B,), L - T, dtype=torch.long, device=dev)
        q = torch.randn(B, H, T, D, generator=gen, device=dev, dtype=dtype)
        meta = AttentionMetadata(lengths, scale)
        nbytes = kv_bytes * elem // (2 if cuda else 4)
        if kind == "sparse":
            idx, dense_from, K = make_plan(B, Hkv, L, lengths, dev, gen)
            meta = meta.replace(plan_indices=idx, dense_from=dense_from)
            nbytes = B * Hkv * (K + TAIL) * D * 2 * elem
        if kind in ("verify_scores", "verify_sink"):
            meta = meta.replace(score_rows=[0, T - 1], score_kind="logits" if kind == "verify_scores" else "sink_softmax")
        sl = slice(0, nref)
        ref_meta = meta.replace(lengths=lengths[sl],
                                plan_indices=None if meta.plan_indices is None else meta.plan_indices[sl],
                                dense_from=None if meta.dense_from is None else meta.dense_from[sl])
        ref, ref_scores = ref_be.attend(q[sl].float(), ks[0][sl].float(), vs[0][sl].float(), ref_meta)

        variants = {}
        configs = {}
        for label, fields in ours.get(kind, {"triton": {}}).items():
            be = TritonBackend(TritonConfig(**dict(dict(peers="off", flash_attn="off"), **fields)))
            # q and meta bound now: the next kind reassigns them, and interleave= calls this closure later
            variants[label] = (lambda be, q, meta: lambda i: be.attend(q, ks[i], vs[i], meta))(be, q, meta)
            configs[label] = fields
        if kind in ("verify_scores", "verify_sink") or only_ours:
            pass  # ours only: the peers' verify (no scores) is the "verify" rows
        elif kind in ("decode", "verify"):
            plain = meta.without_scores()
            variants["fa4"] = lambda i: (peers.fa4_dense(q, ks[i], vs[i], lengths, scale), None)
            if runner is not None or cuda:
                variants["flashinfer"] = "plan_dense"

            def sdpa(i, plain=plain):
                k, v = ks[i], vs[i]
                mask = None
                if T > 1:
                    pos = torch.arange(L, device=dev).view(1, 1, 1, L)
                    mask = pos <= (lengths.view(B, 1, 1, 1) + torch.arange(T, device=dev).view(1, 1, T, 1))
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True), None

            variants["sdpa"] = sdpa
            if cuda:
                variants["flashinfer_graph"] = "graph_dense"  # CUDA-graph mode, planned outside the capture
            if T == 1:  # the capture-safe SDPA decode: the whole capacity under a mask, no host slice
                variants["sdpa_masked"] = lambda i: (peers.sdpa_decode_static(q, ks[i], vs[i], lengths, scale), None)
        else:
            variants["fa4"] = None  # not served: FA4's gather needs qv (MLA) and SM100
            if cuda:
                variants["flashinfer"] = "plan_sparse"

            def naive(i):  # gather the planned rows + tail, then SDPA: what PyTorch gives
                pos = torch.cat([idx, dense_from.view(B, 1, 1) + torch.arange(TAIL, device=dev).view(1, 1, TAIL)
                                 .expand(B, Hkv, TAIL)], dim=2)
                kk = ks[i].gather(2, pos.unsqueeze(-1).expand(-1, -1, -1, D))
                vv = vs[i].gather(2, pos.unsqueeze(-1).expand(-1, -1, -1, D))
                return F.scaled_dot_product_attention(q, kk, vv, scale=scale, enable_gqa=True), None

            variants["sdpa"] = naive

        for vname in drop:
            variants.pop(vname, None)
        for vname, fn in variants.items():
            row = dict(case=name, H=H, Hkv=Hkv, D=D, B=B, L=L, kind=kind, variant=vname, copies=copies,
                       bytes=nbytes)
            if vname in configs:
                row["config"] = configs[vname]
            if fn is None:
                row["skipped"] = "not served by this peer on SM90"
                record(row)
                continue
            if budget_left() <= 0:
                row["skipped"] = "budget"
                record(row)
                continue
            if vname.split("_")[0] in ("fa4", "flashinfer") and not peers.INSTALLED[vname.split("_")[0]]():
                row["error"] = f"{vname} not importable"
                row["import_failed"] = True
                record(row)
                continue
            try:
                if fn == "plan_dense":
                    r = runner or peers.FlashInferRunner()
                    run = r.plan_dense(q, ks[0], lengths, scale)
                    fn = (lambda run, q: lambda i: (run(q, ks[i], vs[i]), None))(run, q)
                elif fn == "graph_dense":
                    gr = peers.FlashInferGraphRunner()
                    key = gr.key(q, ks[0], scale)
                    host = lengths.cpu()
                    gr.plan(key, host)
                    t_plan = time.perf_counter()
                    for _ in range(5):  # what a replay adds on the host: one plan for these lengths
                        gr.plan(key, host)
                    row["replan_host_us"] = (time.perf_counter() - t_plan) / 5 * 1e6
                    fn = (lambda gr, key, q: lambda i: (gr.run(key, q, ks[i], vs[i]), None))(gr, key, q)
                elif fn == "plan_sparse":
                    r = runner or peers.FlashInferRunner()
                    run = r.plan_sparse(q, ks[0], lengths, scale, idx, dense_from)
                    fn = (lambda run: lambda i: (run(q, ks[i], vs[i]), None))(run)
                out, sc = fn(0)
                if cuda:
                    torch.cuda.synchronize()
                err = (out[sl].float() - ref).abs().max().item()
                row["max_abs_err"] = err
                row["parity_ok"] = bool(err <= TOL)
                if sc is not None and ref_scores is not None:
                    row["max_abs_err_scores"] = (sc[sl].float() - ref_scores).abs().max().item()
                    row["max_rel_err_scores"] = row["max_abs_err_scores"] / max(ref_scores.abs().max().item(), 1e-30)
                secs, how = Timer(cuda, reps)([(lambda i: lambda: fn(i))(i) for i in range(copies)])
                row.update(us=secs * 1e6, timing=how, pct_copy_bw=100.0 * nbytes / secs / bw)
                if interleave and (kind, vname) in interleave and row["parity_ok"]:
                    keep[(kind, vname)] = ([(lambda fn, i: lambda: fn(i))(fn, i) for i in range(copies)], row)
                log(f"{name} B={B} L={L} {kind:13s} {vname:10s} {secs*1e6:9.1f} us  "
                    f"{row['pct_copy_bw']:6.1f}% bw  |Δ| {err:.2e} ({how})")
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
                row["traceback"] = traceback.format_exc()
                log(f"{name} B={B} L={L} {kind} {vname}: FAILED {row['error'][:300]}")
            record(row)
            if cuda:
                torch.cuda.synchronize()
            if vname == "fa4" and "error" in row and not row.get("import_failed") and kind in ("decode", "verify"):
                # our (B, H_kv, L, D) cache as FA4's (B, L, H_kv, D) views failed: measure FA4 on its own
                # contiguous layout (copied outside the timed region) so the kernel is still compared
                try:
                    nhd = [(ks[i].transpose(1, 2).contiguous(), vs[i].transpose(1, 2).contiguous()) for i in range(copies)]
                    from flash_attn.cute import flash_attn_varlen_func

                    def fa4_nhd(i):
                        r = flash_attn_varlen_func(q.transpose(1, 2).contiguous(), nhd[i][0], nhd[i][1],
                                                   seqused_k=(lengths + T).to(torch.int32), softmax_scale=scale,
                                                   causal=True)
                        return (r[0] if isinstance(r, tuple) else r).transpose(1, 2), None

                    row2 = dict(row, variant="fa4_nhd")
                    row2.pop("error", None)
                    row2.pop("traceback", None)
                    out, _ = fa4_nhd(0)
                    err = (out[sl].float() - ref).abs().max().item()
                    row2.update(max_abs_err=err, parity_ok=bool(err <= TOL))
                    secs, how = Timer(cuda, reps)([(lambda i: lambda: fa4_nhd(i))(i) for i in range(copies)])
                    row2.update(us=secs * 1e6, timing=how, pct_copy_bw=100.0 * nbytes / secs / bw)
                    log(f"{name} B={B} L={L} {kind:13s} fa4_nhd    {secs*1e6:9.1f} us  |Δ| {err:.2e} ({how})")
                except Exception as exc:
                    row2 = dict(row, variant="fa4_nhd", error=f"{type(exc).__name__}: {exc}",
                                traceback=traceback.format_exc())
                    log(f"{name} B={B} L={L} {kind} fa4_nhd: FAILED {row2['error'][:300]}")
                record(row2)
                nhd = None
                if cuda:
                    torch.cuda.empty_cache()
    if keep and budget_left() > 0:
        try:
            got = interleaved({k: fns for k, (fns, _) in keep.items()}, reps, cuda)
            for (kind, vname), secs in got.items():
                base = keep[(kind, vname)][1]
                row = {k: base[k] for k in ("case", "H", "Hkv", "D", "B", "L", "kind", "variant", "copies", "bytes",
                                            "config", "max_abs_err", "max_rel_err_scores", "parity_ok") if k in base}
                if secs is None:
                    row.update(timing="graph-interleaved", skipped="not capturable")
                else:
                    row.update(us=secs * 1e6, timing="graph-interleaved", pct_copy_bw=100.0 * row["bytes"] / secs / bw)
                    log(f"{name} B={B} L={L} {kind:13s} {vname:10s} {secs*1e6:9.1f} us  (interleaved)")
                record(row)
        except Exception as exc:
            record(dict(case=name, B=B, L=L, kind="interleaved", error=f"{type(exc).__name__}: {exc}",
                        traceback=traceback.format_exc()))
            log(f"{name} B={B} L={L} interleaved: FAILED {exc}")
    keep.clear()
    del ks, vs
    if cuda:
        torch.cuda.empty_cache()


def derive_picks(rows, tie: float = peers.TIE, graph: bool = False) -> dict:
    """``(kind, D) -> [(max_tokens, peer)]`` from the measured rows: at each measured ``B · L`` the
    fastest of ours, FA4, FlashInfer and (decode only: the call the backend can hand it) SDPA —
    but ours whenever it is within ``tie`` of the fastest; boundaries at the geometric middle
    between sizes. Rows without a time or with a failed parity check do not count.

    ``graph``: the table for calls under CUDA-graph capture (:data:`specdec.cuda.peers.GRAPH_PICKS`):
    only capturable kernels — ours, FA4, FlashInfer's dense calls (its CUDA-graph wrapper,
    ``flashinfer_graph``, where the run measured it; for decode only, else the eagerly planned
    ``flashinfer`` row: the H200 run of 2026-12-01 15:13 UTC measured the graph wrapper equal to the
    eager one for decode but 1.6–2.4× slower for verify at B = 16, 64, so an eager verify time does
    not stand in for it) and SDPA's masked form (``sdpa_masked``, decode) — never the unmasked
    ``sdpa`` or FlashInfer's sparse path."""
    best: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for r in rows:
        if r.get("kind") not in ("decode", "verify", "sparse") or "us" not in r or not r.get("parity_ok"):
            continue
        if graph:
            ok = ("triton",) + (() if r["kind"] == "sparse" else ("fa4", "flashinfer_graph")) + (
                ("flashinfer", "sdpa_masked") if r["kind"] == "decode" else ())
        else:
            ok = ("triton", "fa4", "flashinfer") + (("sdpa",) if r["kind"] == "decode" else ())
        if r["variant"] not in ok:
            continue
        key, tok = (r["kind"], r["D"]), r["B"] * r["L"]
        best.setdefault(key, {}).setdefault(tok, {})[r["variant"]] = r["us"]
    table = {}
    for key, by_tok in best.items():
        toks = sorted(by_tok)
        entries = []
        for j, t in enumerate(toks):
            times = dict(by_tok[t])
            if graph:
                if "flashinfer_graph" in times:  # the kernel the graph path runs
                    times["flashinfer"] = times.pop("flashinfer_graph")
                if "sdpa_masked" in times:
                    times["sdpa"] = times.pop("sdpa_masked")
            fastest = min(times, key=times.get)
            ours = times.get("triton")
            win = "triton" if ours is not None and ours <= times[fastest] * (1 + tie) else fastest
            hi = int(math.sqrt(t * toks[j + 1])) if j + 1 < len(toks) else 10**12
            entries.append((hi, win))
        merged = []  # neighbours with the same pick collapse into one range
        for hi, win in entries:
            if merged and merged[-1][1] == win:
                merged[-1] = (hi, win)
            else:
                merged.append((hi, win))
        table[key] = merged
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for results.json, results.md, picks.py")
    ap.add_argument("--budget-s", type=float, default=240.0, help="stop starting new variants after this")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Triton interpreter)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--cases", default=None, help="comma-separated indices into the case list")
    ap.add_argument("--kinds", default=",".join(KINDS[:4]), help=f"comma-separated call kinds (of {','.join(KINDS)})")
    ap.add_argument("--allow-missing", action="store_true", help="a peer that cannot be imported is not a failure")
    a = ap.parse_args()
    if a.smoke:
        a.allow_missing = True  # the CPU has neither peer
    os.makedirs(a.out, exist_ok=True)
    t0 = time.monotonic()
    cuda = torch.cuda.is_available() and not a.smoke
    if a.smoke and os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
        print("--smoke on the CPU needs TRITON_INTERPRET=1 (set before the run)", file=sys.stderr)
        return 2
    if not cuda and not a.smoke:
        print("no CUDA device: run with --smoke (and TRITON_INTERPRET=1) on the CPU", file=sys.stderr)
        return 2
    cases = SMOKE_CASES if a.smoke else CASES
    if a.cases:
        cases = [cases[int(i)] for i in a.cases.split(",")]
    reps = a.reps or (1 if a.smoke else 20)
    kinds = [k for k in a.kinds.split(",") if k]
    if not kinds or any(k not in KINDS for k in kinds):
        print(f"--kinds {a.kinds!r}: use a comma-separated subset of {','.join(KINDS)}", file=sys.stderr)
        return 2
    logf = open(os.path.join(a.out, "log.txt"), "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    imports = {}
    for p in ("fa4", "flashinfer"):
        try:
            __import__("flash_attn.cute" if p == "fa4" else "flashinfer")
            imports[p] = "ok"
        except Exception as exc:  # recorded: fails the run below unless --allow-missing
            imports[p] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        log(f"import {p}: {imports[p].splitlines()[0]}")
    res = dict(date=now(), host=platform.node(), device=torch.cuda.get_device_name() if cuda else "cpu",
               torch=torch.__version__, smoke=a.smoke, imports=imports, rows=[])
    res["copy_bw"] = bw = copy_bandwidth(cuda)
    log(f"copy bandwidth {bw / 1e12:.3f} TB/s")

    def save():
        with open(os.path.join(a.out, "results.json"), "w") as f:
            json.dump(res, f, indent=1)

    def record(row):
        res["rows"].append(row)
        save()

    for case in cases:
        try:
            run_case(case, kinds, cuda, 256 << 20 if cuda else 1 << 20, reps, bw, log, record,
                     lambda: a.budget_s - (time.monotonic() - t0))
        except Exception as exc:
            record(dict(case=case[0], B=case[4], L=case[5], error=f"{type(exc).__name__}: {exc}",
                        traceback=traceback.format_exc()))
            log(f"case {case}: FAILED {exc}")
    res["picks"] = {f"{k[0]},{k[1]}": v for k, v in derive_picks(res["rows"]).items()}
    res["graph_picks"] = {f"{k[0]},{k[1]}": v for k, v in derive_picks(res["rows"], graph=True).items()}
    res["wall_s"] = time.monotonic() - t0
    save()
    write_md(res, a.out)
    write_picks(res, a.out)
    bad_imports = [p for p, s in imports.items() if s != "ok"] if not a.allow_missing else []
    bad_parity = [r for r in res["rows"] if r.get("parity_ok") is False]
    errors = [r for r in res["rows"] if "error" in r and not r.get("import_failed")]
    log(f"done in {res['wall_s']:.0f} s: {len(bad_imports)} import failures, {len(bad_parity)} parity failures, "
        f"{len(errors)} other errors")
    return 1 if bad_imports or bad_parity else 0


def write_md(res, out):
    lines = [f"# Peers side by side ({res['date']}, {res['device']}, torch {res['torch']})", "",
             f"copy bandwidth {res['copy_bw'] / 1e12:.3f} TB/s; imports: "
             + ", ".join(f"{p} {'ok' if s == 'ok' else 'FAILED'}" for p, s in res["imports"].items()), "",
             "| case | B × L | kind | variant | µs | % copy bw | max abs Δ | timing |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        if "variant" not in r:
            lines.append(f"| {r.get('case')} | {r.get('B')} × {r.get('L')} | – | – | failed: {r.get('error', '')[:80]} | | | |")
            continue
        if "us" in r:
            lines.append(f"| {r['case']} | {r['B']} × {r['L']} | {r['kind']} | {r['variant']} | {r['us']:.1f} | "
                         f"{r['pct_copy_bw']:.1f} | {r['max_abs_err']:.2e} | {r['timing']} |")
        else:
            why = r.get("skipped") or ("failed: " + r.get("error", "")[:80])
            lines.append(f"| {r['case']} | {r['B']} × {r['L']} | {r['kind']} | {r['variant']} | {why} | | | |")
    lines += ["", "Picks derived from this run (`picks.py`):", "", "```", json.dumps(res["picks"], indent=1), "```",
              "", "Picks under CUDA-graph capture (capturable kernels only):", "", "```",
              json.dumps(res.get("graph_picks", {}), indent=1), "```"]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def write_picks(res, out):
    def body(picks):
        table = {tuple(k.split(",")): v for k, v in picks.items()}
        return ",\n".join(f"    ({k[0]!r}, {int(k[1])}): {[tuple(e) for e in v]!r}" for k, v in sorted(table.items()))

    with open(os.path.join(out, "picks.py"), "w") as f:
        f.write(f"# paste into specdec/cuda/peers.py\nMEASURED = {res['date'][:10]!r}  # {res['device']}\n"
                f"PICKS = {{\n{body(res['picks'])}\n}}\n"
                f"GRAPH_PICKS = {{\n{body(res.get('graph_picks', {}))}\n}}\n")


if __name__ == "__main__":
    sys.exit(main())
