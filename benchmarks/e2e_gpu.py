"""End-to-end decoding on a GPU: our engine (dense and speculative methods, CUDA graphs) vs HF generate.

Workload: the embedded SmolLM2-135M (real weights, bf16), a real document (pydoc) cut to
``--context`` tokens, the prompt repeated ``B`` times, ``--new`` greedy tokens per sequence.
Reports per (B, method): tokens/s, τ, per-phase seconds, speedup over our dense and over HF
``generate`` (default and static cache, each warmed up, median of 3: :func:`specdec.bench.hf_generate_tps`;
``specdec bench`` / :func:`specdec.bench.run_bench` is the tool for new tables), a dense step against the roofline ``(weights + KV bytes) / copy bandwidth`` measured
in the same run, and token agreement with our dense output.

    python benchmarks/e2e_gpu.py --gguf /tmp/smol.gguf --context 8192 --batches 1,16,64 \
        --methods dense,magicdec,quest,vegas --backend triton --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (bytes/s, read + write counted), median of 10."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for _ in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * nbytes / statistics.median(ts[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--methods", default="dense,magicdec,quest,vegas")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--budget-ratio", type=float, default=0.05)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--hf", type=int, default=1)
    ap.add_argument("--compile", type=int, default=0, help="torch.compile decode-sized forwards")
    ap.add_argument("--fuse", type=int, default=0, help="fused q/k/v and gate/up projections (SpecdecModel.fuse_projections)")
    ap.add_argument("--options", default="{}",
                    help='JSON {method: {option: value}}, e.g. \'{"dustin": {"srh": "x_srh.json", "draft_layers": 9}}\'')
    ap.add_argument("--doc", default="pydoc", help="built-in document (pydoc, long:prose, long:code, stdlib:<module>)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from specdec import BACKENDS, PipelineConfig, SpecdecModel, build_engine
    from specdec.data import context_ids, load_document
    from specdec.engine import Prefilled
    from specdec.models import load_hf

    out: dict = {"args": vars(args), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    import transformers

    out["transformers"] = transformers.__version__
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def save():
        Path(args.out).write_text(json.dumps(out, indent=2))

    bw = copy_bandwidth()
    out["copy_bandwidth_GBps"] = bw / 1e9
    hf, tok = load_hf(args.gguf, "bfloat16", "cuda")
    be_kw = {"static": True} if (args.backend == "torch" and args.graphs) else {}
    backend = BACKENDS.build(args.backend, **be_kw)
    model = SpecdecModel(hf, tok, backend)
    d = model.dims
    # bytes a step actually reads: global layers the whole context, sliding-window layers their window
    kv_bytes_per_token = 2 * d.n_layers * d.n_kv_heads * d.head_dim * 2  # every layer full (the old model)
    weight_bytes = sum(p.numel() * p.element_size() for p in hf.parameters())
    out["kv_bytes_per_token"] = kv_bytes_per_token
    out["kv_bytes_per_sequence_at_context"] = d.kv_bytes(args.context)
    out["windows"] = list(d.windows)
    out["weight_bytes"] = weight_bytes
    probe = model.new_cache(1, args.context + args.new + args.gamma + 2)
    out["kv_cache_bytes_B1"] = probe.nbytes()  # local layers hold window + slack slots only
    del probe
    ids = context_ids(tok, load_document(args.doc), args.context, offset=20000)
    # the Hugging Face baselines run the model as loaded (separate projections, its own KV cache),
    # before our engine's optimisations touch the modules: default and static-cache generate, each
    # warmed up at the same shape, median of 3 (specdec.bench.hf_generate_tps, what `specdec bench` reports)
    from specdec.bench import hf_generate_tps

    hf_rates: dict[int, dict] = {}
    if args.hf:
        for B in [int(b) for b in args.batches.split(",")]:
            for label, impl in (("hf-generate", None), ("hf-generate-static", "static")):
                try:
                    hf_rates.setdefault(B, {})[label] = hf_generate_tps(model, ids, B, min(args.new, 32), impl)
                except Exception:
                    out.setdefault("hf_errors", {})[f"{B}/{label}"] = traceback.format_exc(limit=2)
                torch.cuda.empty_cache()
    if args.fuse:
        model.fuse_projections()
    if args.compile:
        model.enable_compile()
    save()

    # graph replay == eager, on one dense and one sparse step
    if args.graphs:
        try:
            cache = model.new_cache(2, args.context + 64)
            lengths = torch.tensor([args.context - 5, args.context - 300], device="cuda")
            cache.k.normal_()
            cache.v.normal_()
            if cache.ring_k is not None:
                cache.ring_k.normal_()
                cache.ring_v.normal_()
            x = torch.tensor([[11], [12]], device="cuda")
            eager = model.forward(x, cache, lengths)
            model.enable_cuda_graphs()
            g1 = model.forward(x, cache, lengths)
            g2 = model.forward(torch.tensor([[13], [14]], device="cuda"), cache, lengths + 1)
            model.disable_cuda_graphs()
            e2 = model.forward(torch.tensor([[13], [14]], device="cuda"), cache, lengths + 1)
            out["graph_parity_max_abs"] = [float((g1 - eager).abs().max()), float((g2 - e2).abs().max())]
            del cache
        except Exception as exc:  # keep going without graphs
            out["graph_error"] = traceback.format_exc(limit=3)
            args.graphs = 0
            model.disable_cuda_graphs()
            print("graphs disabled:", exc, flush=True)
    save()

    for B in [int(b) for b in args.batches.split(",")]:
        pre1 = None
        dense_tokens = None
        dense_tps = None
        for label, r in hf_rates.get(B, {}).items():
            out["rows"].append(dict(B=B, method=label, tokens_per_second=r["median"], tokens_per_second_min=r["min"],
                                    tokens_per_second_max=r["max"]))
            save()
        # the stronger of the two HF baselines (normally the static cache) is what "× HF" compares with
        hf_rate = max((r["median"] for r in hf_rates.get(B, {}).values()), default=None)
        for name in args.methods.split(","):
            row = dict(B=B, method=name)
            try:
                # "method@tag" runs a method under another row name with the options of "method@tag"
                # (e.g. vegas@logits with {"vegas@logits": {"score_kind": "logits"}})
                method = name.split("@")[0]
                all_opts = json.loads(args.options)
                opts = all_opts.get(name, all_opts.get(method.split("-")[0] if method.startswith("dustin") else method, {}))
                cfg = PipelineConfig.make(method=method, gamma=args.gamma, budget_ratio=args.budget_ratio, options=opts)
                eng = build_engine(model, cfg, eos_token_id=-1)
                if pre1 is None:
                    pre1 = eng.prefill([ids])
                rings = {} if pre1.ring_k is None else dict(ring_k=pre1.ring_k.expand(-1, B, -1, -1, -1),
                                                            ring_v=pre1.ring_v.expand(-1, B, -1, -1, -1))
                pre = Prefilled(ids=[ids] * B, k=pre1.k.expand(-1, B, -1, -1, -1), v=pre1.v.expand(-1, B, -1, -1, -1),
                                last_logits=pre1.last_logits.expand(B, -1), **rings)
                if args.graphs:
                    model.enable_cuda_graphs()
                # warm-up of the same length: every graph capture and compilation (they depend on the cache size) happens here
                eng.generate([ids] * B, max_new_tokens=args.new, prefilled=pre)
                torch.cuda.synchronize()
                # throughput: no synchronisation at phase edges; then the same run timed per phase
                eng.sync_timing = False
                res = eng.generate([ids] * B, max_new_tokens=args.new, prefilled=pre)
                eng.sync_timing = True
                timed = eng.generate([ids] * B, max_new_tokens=args.new, prefilled=pre)
                if model._graphs is not None:
                    row["graph_captures"] = model._graphs.captures
                    row["uncapturable"] = sorted(set(model._graphs.uncapturable.values()))
                model.disable_cuda_graphs()
                s, ts = res.stats, timed.stats
                row.update(tau=s.mean_accepted_length, tokens_per_second=s.tokens_per_second,
                           tokens_per_second_phase_synced=ts.tokens_per_second,
                           iterations=s.iterations, phase_seconds=ts.phase_seconds,
                           acceptance_per_position=s.acceptance_per_position,
                           select_share=ts.to_dict()["selection_overhead_share"])
                rep = getattr(getattr(eng, "verifier", None), "report", None)
                if callable(rep):
                    row["verifier_report"] = {k: v for k, v in rep().items() if isinstance(v, (int, float))}
                from specdec.planner import _PLANNERS

                graphs = [p.plan_graphs for p in list(_PLANNERS.values()) if p.plan_graphs is not None]
                calls = graphs[-1] if graphs else None
                if calls is not None:
                    row["plan_graphs"] = dict(captures=calls.captures, replays=calls.replays,
                                              uncapturable=sorted(set(calls.uncapturable.values())))
                if name == "dense":
                    dense_tokens, dense_tps = res.tokens, s.tokens_per_second
                    step = s.decode_seconds / max(1, s.iterations)
                    roof = (weight_bytes + d.kv_bytes(args.context + args.new // 2, batch=B)) / bw
                    row.update(step_seconds=step, roofline_seconds=roof, step_over_roofline=step / roof)
                if dense_tokens is not None:
                    agree = [sum(a == b for a, b in zip(x, y)) / len(y) for x, y in zip(res.tokens, dense_tokens)]
                    row["token_agreement_with_dense"] = sum(agree) / len(agree)
                if dense_tps:
                    row["speedup_vs_dense"] = s.tokens_per_second / dense_tps
                if hf_rate:
                    row["speedup_vs_hf"] = s.tokens_per_second / hf_rate
            except Exception:
                model.disable_cuda_graphs()
                row["error"] = traceback.format_exc(limit=4)
            out["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "phase_seconds"}), flush=True)
            save()
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
