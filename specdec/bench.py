"""``specdec bench``: methods × contexts × batch sizes × documents on one engine → JSON + Markdown."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from specdec.errors import SpecdecError


def machine_info(device: str) -> dict[str, Any]:
    import transformers

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def hf_generate_tps(model, ids: list[int], batch: int, max_new_tokens: int) -> float:
    """Hugging Face ``generate`` (greedy, its own cache, SDPA) tokens/s excluding the prefill."""
    hf = model.hf
    x = torch.tensor([ids] * batch, device=model.device)
    kw = dict(do_sample=False, min_new_tokens=max_new_tokens, max_new_tokens=max_new_tokens, pad_token_id=0)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    hf.generate(x, **{**kw, "max_new_tokens": 1, "min_new_tokens": 1})
    sync()
    t1 = time.perf_counter()
    hf.generate(x, **kw)
    sync()
    t2 = time.perf_counter()
    decode = (t2 - t1) - (t1 - t0)
    return batch * (max_new_tokens - 1) / decode if decode > 0 else float("nan")


def run_bench(
    methods: Sequence[str],
    contexts: Sequence[int],
    batch_sizes: Sequence[int],
    documents: Sequence[str],
    max_new_tokens: int,
    budget: int | None,
    budget_ratio: float | None,
    gamma: int,
    model: str,
    backend: str,
    dtype: str,
    device: str,
    hf_baseline: bool,
    output_dir: Path,
    tag: str,
    argv: Sequence[str] = (),
    options: dict[str, Any] | None = None,
    cuda_graphs: bool = False,
    compile: bool = False,
    fuse: bool = False,
    warmup: bool = False,
) -> list[dict[str, Any]]:
    """Run every combination; write ``<tag>.json`` and ``<tag>.md`` under ``output_dir``.

    ``warmup`` runs each (setting, method) once untimed before the timed run, so CUDA-graph captures
    and ``torch.compile`` compilations (they depend on the cache size) are not timed. With ``fuse``
    the model's projections are fused; Hugging Face ``generate`` then runs the fused modules too.
    """
    from rich.progress import Progress

    from specdec.loading import load_model, pipeline_config
    from specdec.data import context_ids, load_document
    from specdec.memory import check_fits
    from specdec.outputs import check_output_dir, write_text
    from specdec.presets import build_engine

    if any(c < 1 for c in contexts) or any(b < 1 for b in batch_sizes):
        raise SpecdecError("contexts and batch sizes must be >= 1.")
    if not methods or not contexts or not batch_sizes or not documents:
        raise SpecdecError("methods, contexts, batch sizes and documents each need at least one value.")
    check_output_dir(output_dir, "--output-dir")
    for name in methods:
        pipeline_config(name, gamma, budget, budget_ratio, 0.0, 1.0, 0, None)  # fail fast on bad input
    m = load_model(model, dtype, device, backend, cuda_graphs, compile, fuse)
    too_long = [c for c in contexts if c + max_new_tokens > m.dims.max_positions]
    if too_long:
        raise SpecdecError(
            f"context {too_long[0]} + max_new_tokens {max_new_tokens} exceeds the model's {m.dims.max_positions} "
            f"positions; use contexts <= {m.dims.max_positions - max_new_tokens}."
        )
    meta = dict(command=" ".join(shlex.quote(a) for a in (["specdec", *argv[1:]] if argv else [])),
                machine=machine_info(str(m.device)), model=model, backend=backend, dtype=dtype, gamma=gamma,
                budget=budget, budget_ratio=budget_ratio, max_new_tokens=max_new_tokens,
                cuda_graphs=cuda_graphs, compile=compile, fuse=fuse, warmup=warmup)

    def save() -> None:  # after every row, each file replaced atomically (a complete file at any time)
        write_text(output_dir / f"{tag}.json", json.dumps(dict(meta=meta, rows=rows), indent=2), "--output-dir")
        write_text(output_dir / f"{tag}.md", markdown_table(meta, rows), "--output-dir")
    rows: list[dict[str, Any]] = []
    total = len(documents) * len(contexts) * len(batch_sizes) * (len(methods) + int(hf_baseline))
    with Progress() as progress:
        task = progress.add_task("bench", total=total)
        for doc in documents:
            text = load_document(doc)
            for ctx in contexts:
                ids = context_ids(m.tokenizer, text, ctx, offset=max_new_tokens + 16)
                for bs in batch_sizes:
                    check_fits(m, bs, len(ids), max_new_tokens, gamma)
                    dense_tps = None
                    pre = None
                    for name in methods:
                        cfg = pipeline_config(name, gamma, budget, budget_ratio, 0.0, 1.0, 0, None)
                        if options:
                            cfg = cfg.model_copy(update={"options": options})
                        progress.update(task, description=f"{doc} ctx={ctx} B={bs} {name}")
                        eng = build_engine(m, cfg)
                        if pre is None:
                            pre = eng.prefill([ids] * bs)  # one prefill shared by every method
                        if warmup:  # same length: every capture and compilation happens here
                            eng.generate([ids] * bs, max_new_tokens=max_new_tokens, prefilled=pre)
                        res = eng.generate([ids] * bs, max_new_tokens=max_new_tokens, prefilled=pre)
                        s = res.stats
                        if name == "dense":
                            dense_tps = s.tokens_per_second
                        rows.append(
                            dict(
                                document=doc,
                                context=ctx,
                                batch=bs,
                                method=name,
                                tau=s.mean_accepted_length,
                                tokens_per_second=s.tokens_per_second,
                                speedup_vs_dense=(s.tokens_per_second / dense_tps) if dense_tps else None,
                                iterations=s.iterations,
                                acceptance_per_position=s.acceptance_per_position,
                                phase_seconds=s.phase_seconds,
                                selection_overhead_share=s.selection_overhead_share,
                                lossless=s.lossless,
                                tokens=res.tokens[0],
                            )
                        )
                        progress.advance(task)
                        save()
                    if hf_baseline:
                        progress.update(task, description=f"{doc} ctx={ctx} B={bs} hf-generate")
                        tps = hf_generate_tps(m, ids, bs, max_new_tokens)
                        rows.append(dict(document=doc, context=ctx, batch=bs, method="hf-generate", tau=1.0,
                                         tokens_per_second=tps,
                                         speedup_vs_dense=(tps / dense_tps) if dense_tps else None))
                        progress.advance(task)
    # greedy losslessness check: lossless methods must reproduce dense tokens
    for r in rows:
        dense = next((x for x in rows if x["method"] == "dense" and x["document"] == r["document"]
                      and x["context"] == r["context"] and x["batch"] == r["batch"]), None)
        if dense is not None and "tokens" in r:
            r["same_tokens_as_dense"] = r["tokens"] == dense["tokens"]
    save()
    print(markdown_table(meta, rows))
    return rows


def markdown_table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# {meta.get('model')} — γ={meta.get('gamma')}, budget={meta.get('budget') or meta.get('budget_ratio')}",
        "",
        f"- command: `{meta.get('command')}`",
        f"- machine: {json.dumps(meta.get('machine'))}",
        "",
        "| document | context | batch | method | τ | tokens/s | speedup vs dense | select share | same tokens as dense |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = r.get("speedup_vs_dense")
        lines.append(
            f"| {r['document']} | {r['context']} | {r['batch']} | {r['method']} | {r['tau']:.2f} | "
            f"{r['tokens_per_second']:.2f} | {'' if sp is None else f'{sp:.2f}×'} | "
            f"{r.get('selection_overhead_share', 0):.1%} | {r.get('same_tokens_as_dense', '')} |"
        )
    return "\n".join(lines) + "\n"
