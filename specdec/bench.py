"""``specdec bench``: methods × contexts × batch sizes × documents on one engine → JSON + Markdown."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from specdec.errors import SpecdecError
from specdec.adaptive import ADAPTIVE_DEFAULT
from specdec.fusion import kernels_off


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


def _stats(values: Sequence[float]) -> dict[str, float]:
    """``median``, ``min``, ``max`` of timed runs."""
    v = sorted(values)
    n = len(v)
    med = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    return dict(median=med, min=v[0], max=v[-1])


def hf_generate_tps(model, ids: list[int] | list[list[int]], batch: int, max_new_tokens: int,
                    cache_implementation: str | None = None, repeats: int = 3) -> dict[str, float]:
    """Hugging Face ``generate`` tokens/s (greedy, its own cache, excluding the prefill): median, min, max.

    ``ids``: one prompt, which every sequence of the batch continues, or several prompts of one length (``bench
    --windows K``), where sequence ``b`` continues prompt ``b % K``, as specdec's methods do in the same run.

    Run on the model as loaded (fused projections included, with torch's element-wise code: the fused
    Triton kernels are specdec's, not Hugging Face's). A warm-up call at the same shape comes first
    (HF's first call at a shape is much slower: allocations, kernel selection, and with
    ``cache_implementation="static"`` its automatic ``torch.compile`` on CUDA); then each of
    ``repeats`` timed runs measures a 1-token and a ``max_new_tokens`` call and keeps the difference.

    The model runs *detached* from specdec (:meth:`SpecdecModel.detached`): with the attention
    implementation it was loaded with (SDPA), as a transformers user runs it. Through specdec's route
    each layer's attention is a ``torch.compiler.disable`` call: 30 graph breaks in the static cache's
    compiled step, which measured HF static ``generate`` at 417 tok/s at B = 16 where HF itself runs
    1.47k (H200, 2026-12-01). The result's ``attn_implementation`` says what ran.
    """
    hf = model.hf
    prompts = ids if ids and isinstance(ids[0], (list, tuple)) else [ids]
    if len({len(p) for p in prompts}) != 1:
        raise SpecdecError(f"hf_generate_tps: the prompts have different lengths ({sorted({len(p) for p in prompts})}); "
                           "pass windows of one length (specdec.data.context_windows).")
    x = torch.tensor([list(prompts[b % len(prompts)]) for b in range(batch)], device=model.device)
    kw = dict(do_sample=False, min_new_tokens=max_new_tokens, max_new_tokens=max_new_tokens, pad_token_id=0)
    if cache_implementation is not None:
        kw["cache_implementation"] = cache_implementation
    one = {**kw, "max_new_tokens": 1, "min_new_tokens": 1}
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    out = []
    # HF's own attention (not specdec's route) and its own element-wise code (its static cache compiles the model)
    with model.detached(), kernels_off(hf):
        impl = hf.config._attn_implementation
        hf.generate(x, **one)  # warm-up, both lengths
        hf.generate(x, **kw)
        for _ in range(max(1, repeats)):
            sync()
            t0 = time.perf_counter()
            hf.generate(x, **one)
            sync()
            t1 = time.perf_counter()
            hf.generate(x, **kw)
            sync()
            t2 = time.perf_counter()
            decode = (t2 - t1) - (t1 - t0)
            out.append(batch * (max_new_tokens - 1) / decode if decode > 0 else float("nan"))
    return {**_stats(out), "attn_implementation": impl}


def _free_memory(device) -> None:
    """Collect what was dropped (engines hold reference cycles) and, on a GPU, hand cached blocks back, so the
    next allocation and :func:`specdec.memory.check_fits` see the memory as free."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _kv_heads(m) -> tuple[int, int]:
    """``[start, end)`` of the KV heads this process holds (all of them unless the model is tensor-parallel)."""
    n = m.hf.config.num_key_value_heads
    tp = getattr(m, "tp", None)
    return (0, n) if tp is None or tp.world == 1 else tp.shard(n)


def _prefilled(eng, m, windows: list[list[int]], batch: int, random_cache: bool):
    """The ``windows`` (contexts of one length) prefilled once (or, for a random-weight shape, a random cache: no
    prefill), as ``batch`` sequences: sequence ``b`` continues window ``b % len(windows)``. One window: expanded
    views, no copy; several: the prefilled cache gathered to the batch."""
    from specdec.engine import Prefilled

    if random_cache:
        d = m.dims
        g = torch.Generator(device=m.device).manual_seed(0)
        # every KV head's values, then this rank's heads (tensor parallel): a sharded run sees one process's cache
        kv0, kv1 = _kv_heads(m)
        shape = (d.n_layers, 1, m.hf.config.num_key_value_heads, len(windows[0]), d.head_dim)
        # (a sharded rank copies its heads out, so the other ranks' values are freed, not kept alive by a view)
        k = torch.randn(shape, generator=g, device=m.device, dtype=m.dtype)[:, :, kv0:kv1].contiguous()
        v = torch.randn(shape, generator=g, device=m.device, dtype=m.dtype)[:, :, kv0:kv1].contiguous()
        one = Prefilled(ids=windows[:1], k=k, v=v, last_logits=torch.zeros(1, d.vocab_size, device=m.device))
    else:
        one = eng.prefill(windows)
    n = len(one.ids)
    if n == 1:
        def to_batch(t, dim):
            return None if t is None else t.expand(*[batch if i == dim else -1 for i in range(t.dim())])
    else:
        idx = torch.arange(batch, device=m.device) % n

        def to_batch(t, dim):
            return None if t is None else t.index_select(dim, idx.to(t.device))
    return Prefilled(ids=[one.ids[b % n] for b in range(batch)], k=to_batch(one.k, 1), v=to_batch(one.v, 1),
                     last_logits=to_batch(one.last_logits, 0), ring_k=to_batch(one.ring_k, 1),
                     ring_v=to_batch(one.ring_v, 1), hidden=to_batch(one.hidden, 0))


def run_bench(
    methods: Sequence[str],
    contexts: Sequence[int],
    batch_sizes: Sequence[int],
    documents: Sequence[str],
    max_new_tokens: int,
    budget: int | None,
    budget_ratio: float | None,
    gamma: int,
    model: Any,
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
    repeats: int = 3,
    shape: str | None = None,
    acceptance_trace: str | Path | dict[str, str | Path] | None = None,
    adaptive: bool | None = None,
    windows: int = 1,
    window_stride: int = 1000,
    dense_text: bool = False,
    interleave: bool = True,
    tp: int = 1,
) -> list[dict[str, Any]]:
    """Run every combination; write ``<tag>.json`` and ``<tag>.md`` under ``output_dir``.

    Every GPU table of the project comes from here (``benchmarks/`` scripts call this function).

    - ``model``: a name/path to load, or a :class:`~specdec.models.SpecdecModel` already loaded (scripts that
      call this several times load once).
    - Each (setting, method) row is timed ``repeats`` times; tokens/s is the median, with min–max.
    - ``interleave`` (on by default): the method's engine and the setting's dense engine take turns (each turn an
      untimed run, then a timed one: :func:`_timed`), and the row's ``speedup_vs_dense`` is the median of the ratios of
      each timed method run to the dense run timed just before it
      (``speedup_paired_min`` / ``_max``; the dense runs: ``dense_paired_tokens_per_second``, and whether they emitted
      dense's tokens: ``dense_paired_same_tokens``); ``speedup_medians`` keeps the ratio of the row's median to the
      dense row's. A ratio of two medians timed a minute apart moved by ±8 % at B = 1 on an H200 for rows doing
      identical work; alternated runs share the machine's drift. Methods timed before dense (``--methods`` order)
      and HF rows keep the ratio of medians.
    - ``warmup`` runs each (setting, method) untimed first (:meth:`SpeculativeEngine.warm_up`: every step kind the
      adaptive controller may pick; then once as timed), so CUDA-graph captures and ``torch.compile`` compilations
      (they depend on the cache size) are not timed.
    - ``hf_baseline``: Hugging Face ``generate`` with its default cache and with
      ``cache_implementation="static"``, each warmed up at the same shape, on the model as loaded but
      detached from specdec's attention route (HF's own SDPA, :meth:`SpecdecModel.detached`)
      (``fuse`` fuses the projections, so HF runs the fused modules too).
    - ``methods``: method names, each optionally with its own options as ``name:key=value:...`` (as ``specdec eval``
      takes them: ``dustin:verify=dense:tree=true``), so variants of one method run side by side against the same
      dense engine; ``options``: options for every method (for calls that time one). A row's ``method`` is the entry
      as given; ``base_method`` and ``options`` say what ran.
    - ``documents``: file paths or built-in names (:func:`specdec.data.load_document`).
    - ``shape``: a random-weight model of that shape built on the device (:mod:`specdec.shapes`);
      its contexts are random token ids and its cache random values (no prefill).
      ``acceptance_trace`` (one file, or ``{method: file}``): speculative rows replay the accepted
      lengths a real run of that method recorded (:class:`specdec.adaptive.AcceptanceReplay`) and are
      labelled ``replayed``; their tokens are not compared with dense.
    - Every sequence of a batch gets the same context, prefilled once and shared (expanded views); with
      ``windows`` K > 1 the batch cycles K different windows of each document (window ``k`` ends
      ``max_new_tokens + 16 + k * window_stride`` tokens before its end; sequence ``b`` continues window ``b % K``),
      prefilled once, so τ is read over K continuations instead of one (the prefill is gathered to the batch: a copy
      of B sequences' KV next to the cache, where one window shares views). Every sequence's tokens are compared
      with dense's (``same_tokens_as_dense``; where they differ, ``divergence``: :func:`divergence`).
    - ``adaptive``: the adaptive γ / dense fall-back of :mod:`specdec.adaptive` (off under replay).
    - ``dense_text``: a near-lossless method (sparse verification: Dustin, a lossy plugin) free-running writes its own
      text, and its τ is that text's. With this, each such row is followed by a row timed on **dense's text**: the
      same engine first runs with dense verification in place of its own (:func:`dense_text_replay`: its drafter's
      acceptance on dense's tokens, recorded), then is timed replaying that acceptance (every cost of the method is
      real). Labelled ``(dense's text)``; ``dense_text_tau`` is the recorded τ.
    - ``tp`` > 1: the model is split over ``tp`` torchrun processes (:mod:`specdec.parallel`; launch with
      ``torchrun --nproc-per-node N -m specdec bench ... --tp N``). Every rank runs every row (the collectives keep
      the ranks in step); rank 0 writes the files, with its own timings, and shows the progress. A ``shape``'s random
      cache holds the values one process would have for this rank's KV heads, so a sharded row does the same work as
      an unsharded one. No HF baselines, and only the methods of :data:`specdec.parallel.TP_METHODS`.
    """
    from rich.progress import Progress

    from specdec.loading import load_model, pipeline_config
    from specdec.data import check_documents, context_windows, load_document
    from specdec.memory import check_fits
    from specdec.outputs import check_output_dir, write_text
    from specdec.presets import build_engine
    from specdec.engine import cache_positions

    from specdec.adaptive import AcceptanceReplay

    for opt, values in (("--contexts", contexts), ("--batch-sizes", batch_sizes)):
        bad = [v for v in values if v < 1]
        if bad:
            raise SpecdecError(f"{opt} must be >= 1 each (got {bad[0]}); e.g. {opt} "
                               f"{'2048,8192' if opt == '--contexts' else '1,16'}.")
    if repeats < 1:
        raise SpecdecError(f"--repeats must be >= 1 (got {repeats}); use 3 or more for a median.")
    if windows < 1 or window_stride < 1:
        raise SpecdecError(f"--windows and --window-stride must be >= 1 (got {windows}, {window_stride}); "
                           "e.g. --windows 4 --window-stride 1000.")
    if windows > 1 and shape is not None:
        raise SpecdecError("--windows takes windows of documents; a random-weight --shape has random contexts: "
                           "drop --windows (or --shape).")
    if not methods or not contexts or not batch_sizes or not documents:
        raise SpecdecError("methods, contexts, batch sizes and documents each need at least one value.")
    check_output_dir(output_dir, "--output-dir")
    specs = method_specs(methods)  # entry -> (the registered method, its own options)
    base = {name: m for name, (m, _) in specs.items()}

    def config(name):
        cfg = pipeline_config(base[name], gamma, budget, budget_ratio, 0.0, 1.0, 0, None)
        opts = {**(options or {}), **specs[name][1]}
        upd = {**({"adaptive": adaptive} if adaptive is not None else {}), **({"options": opts} if opts else {})}
        return cfg.model_copy(update=upd)

    from specdec.presets import method_options as check_options
    from specdec.selectors.base import BudgetConfig

    methods = list(base)
    for name in methods:
        check_options(config(name))  # fail fast on bad input (unknown options, values out of range)
    from specdec.loading import budget_applies

    reads = [name for name in methods if budget_applies(config(name))]
    if budget is not None and reads and budget > min(contexts):  # it ran, with the table saying budget=1024
        raise SpecdecError(f"--budget {budget} exceeds the context {min(contexts)} (--contexts) that {reads[0]} would "
                           f"read it at; use --budget <= {min(contexts)} or --budget-ratio.")
    if windows > 1 and windows > max(batch_sizes):  # sequence b continues window b mod K: a batch of 1 reads one
        raise SpecdecError(f"--windows {windows} needs a batch of at least {windows} sequences (sequence b continues "
                           f"window b mod {windows}); the largest --batch-sizes is {max(batch_sizes)}.")
    if tp < 1:
        raise SpecdecError(f"--tp must be >= 1 (got {tp}).")
    if tp > 1:
        from specdec.parallel import check_method

        for name in methods:
            check_method(base[name])
        if hf_baseline:
            raise SpecdecError("--hf-baseline does not run with --tp (Hugging Face generate is not sharded); drop one.")
    if isinstance(acceptance_trace, dict):
        replays = {k: AcceptanceReplay.load(v) for k, v in acceptance_trace.items()}
    elif acceptance_trace is not None:
        one = AcceptanceReplay.load(acceptance_trace)
        replays = {name: one for name in methods if name != "dense"}
    else:
        replays = {}
    if shape is not None:
        from specdec.shapes import shape_config

        shape_config(shape)  # unknown names fail before anything loads
        if hf_baseline:
            raise SpecdecError("--hf-baseline needs a real model (a random-weight --shape has no tokenizer); drop one.")
    else:
        # a missing file fails before the model loads; one named twice ran twice (two identical rows)
        for line in check_documents(documents):
            print(f"note: {line}", file=sys.stderr, flush=True)
    if isinstance(model, str):
        m = load_model(model, dtype, device, backend, cuda_graphs, compile, fuse, shape=shape, tp=tp)
    else:  # a SpecdecModel loaded by the caller (benchmark scripts reuse one across calls)
        m, model = model, getattr(model, "name", None) or type(model.hf).__name__
        world = 1 if getattr(m, "tp", None) is None else m.tp.world
        if world != tp:
            raise SpecdecError(f"the model passed is split over {world} rank(s) but tp={tp}; pass tp={world}.")
    lead = getattr(m, "tp", None) is None or m.tp.rank == 0  # the rank that writes the files
    too_long = [c for c in contexts if c + max_new_tokens > m.dims.max_positions]
    if too_long:
        raise SpecdecError(
            f"context {too_long[0]} + max_new_tokens {max_new_tokens} exceeds the model's {m.dims.max_positions} "
            f"positions; use contexts <= {m.dims.max_positions - max_new_tokens}."
        )
    meta = dict(command=" ".join(shlex.quote(a) for a in (["specdec", *argv[1:]] if argv else [])),
                machine=machine_info(str(m.device)), model=shape or model, backend=backend, dtype=dtype, gamma=gamma,
                # the budget the sparse methods used: BudgetConfig's default ratio where none was given
                budget=budget, budget_ratio=budget_ratio if budget is not None or budget_ratio is not None else
                BudgetConfig().budget_ratio, max_new_tokens=max_new_tokens,
                cuda_graphs=cuda_graphs, compile=compile and getattr(m, "compile_skipped", None) is None,
                compile_skipped=getattr(m, "compile_skipped", None), fuse=fuse, warmup=warmup, repeats=repeats,
                shape=shape, acceptance_trace=str(acceptance_trace) if acceptance_trace else None,
                replayed_tau={k: 1.0 + r.mean_accepted for k, r in replays.items()} or None,
                adaptive=ADAPTIVE_DEFAULT if adaptive is None else adaptive, windows=windows, interleave=interleave,
                window_stride=window_stride if windows > 1 else None, tensor_parallel=tp,
                methods={name: dict(method=base[name], options=dict(config(name).options)) for name in methods})

    def save() -> None:  # after every row, each file replaced atomically (a complete file at any time)
        if not lead:
            return
        write_text(output_dir / f"{tag}.json", json.dumps(dict(meta=meta, rows=rows), indent=2), "--output-dir")
        write_text(output_dir / f"{tag}.md", markdown_table(meta, rows), "--output-dir")
    rows: list[dict[str, Any]] = []
    all_tokens: list = []  # per row (specdec methods; HF rows get None): each sequence's tokens

    def check(i: int) -> None:
        """Row ``i``'s tokens against dense's of its setting (greedy losslessness), once both exist: each row as soon
        as it is timed, so a run cut short (a time limit, Ctrl-C) keeps the check of what it saved."""
        r, toks = rows[i], all_tokens[i]
        d = next((j for j, x in enumerate(rows) if x["method"] == "dense" and x["document"] == r["document"]
                  and x["context"] == r["context"] and x["batch"] == r["batch"]), None)
        if d is not None and toks is not None and not r.get("replayed"):
            r["same_tokens_as_dense"] = toks == all_tokens[d]  # every sequence of the batch
            if not r["same_tokens_as_dense"]:
                r["divergence"] = divergence(toks, all_tokens[d])
    if shape is not None:
        documents = ["random"]
    total = len(documents) * len(contexts) * len(batch_sizes) * (len(methods) + 2 * int(hf_baseline))
    with Progress(disable=not lead) as progress:
        task = progress.add_task("bench", total=total)
        for doc in documents:
            text = load_document(doc) if shape is None else None
            for ctx in contexts:
                if shape is None:
                    wins = context_windows(m.tokenizer, text, ctx, windows, max_new_tokens + 16, window_stride,
                                           name=f"document {doc!r}", context_option="--contexts")
                    ids = wins[0]
                else:
                    g = torch.Generator().manual_seed(ctx)
                    ids = torch.randint(0, m.dims.vocab_size, (ctx,), generator=g).tolist()
                    wins = [ids]
                for bs in batch_sizes:
                    # the previous setting's engine, prefill and cache go before this one allocates (at the 8B
                    # shape, B 16 x 32k, a cache is 64 GiB: two do not fit next to the model on an H200)
                    eng = pre = dense_eng = None
                    m.release_cache()
                    _free_memory(m.device)
                    check_fits(m, bs, len(ids), max_new_tokens, gamma)
                    # one cache for every method of this setting (sized for γ draft rows; dense needs fewer)
                    m.new_cache(bs, cache_positions(len(ids), max_new_tokens, gamma), reuse=True)
                    dense_tps = None

                    def dense_row_tokens(doc=doc, ctx=ctx, bs=bs):
                        return next((t for x, t in zip(rows, all_tokens) if x["method"] == "dense"
                                     and (x["document"], x["context"], x["batch"]) == (doc, ctx, bs)), None)
                    for name in methods:
                        cfg = config(name)
                        progress.update(task, description=f"{doc} ctx={ctx} B={bs} {name}")
                        eng = None  # the previous method's engine (its buffers, its last run's state) goes first
                        _free_memory(m.device)
                        eng = build_engine(m, cfg, eos_token_id=-1 if shape is not None else None)
                        if name in replays:
                            eng.replay = replays[name]
                        if pre is None:  # one prefill shared by every method and sequence
                            pre = _prefilled(eng, m, wins[:bs], bs, random_cache=shape is not None)
                        # warm-up at the same length: every capture and compilation happens there
                        partner = dense_eng if interleave and name != "dense" else None
                        tps, res, paired = _timed(eng, pre, max_new_tokens, repeats, warmup, partner)
                        s = res.stats
                        if name == "dense":
                            dense_tps, dense_eng = tps["median"], eng
                        all_tokens.append(res.tokens)  # every sequence's, for the comparison with dense below
                        rows.append(
                            dict(
                                document=doc,
                                context=ctx,
                                batch=bs,
                                method=name,
                                **({"base_method": base[name]} if base[name] != name else {}),
                                **({"options": dict(cfg.options)} if cfg.options else {}),
                                replayed=s.replayed,
                                tau=s.mean_accepted_length,
                                tokens_per_second=tps["median"],
                                tokens_per_second_min=tps["min"],
                                tokens_per_second_max=tps["max"],
                                repeats=repeats,
                                speedup_vs_dense=(tps["median"] / dense_tps) if dense_tps else None,
                                dense_steps=s.dense_steps,
                                gamma_mean=(sum(s.gamma_per_round) / len(s.gamma_per_round)) if s.gamma_per_round else None,
                                iterations=s.iterations,
                                acceptance_per_position=s.acceptance_per_position,
                                phase_seconds=s.phase_seconds,
                                selection_overhead_share=s.selection_overhead_share,
                                lossless=s.lossless,
                                tokens=res.tokens[0],
                            )
                        )
                        if paired is not None:  # the ratio of the medians stays, next to the paired one
                            rows[-1]["speedup_medians"] = rows[-1]["speedup_vs_dense"]
                            rows[-1].update(_paired_fields(paired, dense_row_tokens()))
                        progress.advance(task)
                        check(len(rows) - 1)
                        save()
                        if dense_text and not s.lossless and name not in replays:
                            rp, rec = dense_text_replay(eng, pre, max_new_tokens)
                            eng.replay = rp
                            tps, s2, paired = _timed(eng, pre, max_new_tokens, repeats, warmup, partner)
                            s2 = s2.stats
                            eng.replay = None
                            d_tokens = dense_row_tokens()
                            all_tokens.append(None)  # replayed: its tokens are not compared
                            free = {k: v for k, v in rows[-1].items() if k not in (
                                "same_tokens_as_dense", "divergence", *_PAIRED_FIELDS)}
                            rows.append(dict(free, replayed=s2.replayed, dense_text=True, tau=s2.mean_accepted_length,
                                             dense_text_tau=rec.stats.mean_accepted_length,
                                             dense_text_equals_dense=None if d_tokens is None else rec.tokens == d_tokens,
                                             tokens_per_second=tps["median"], tokens_per_second_min=tps["min"],
                                             tokens_per_second_max=tps["max"],
                                             speedup_vs_dense=(tps["median"] / dense_tps) if dense_tps else None,
                                             dense_steps=s2.dense_steps, iterations=s2.iterations,
                                             acceptance_per_position=s2.acceptance_per_position,
                                             phase_seconds=s2.phase_seconds,
                                             selection_overhead_share=s2.selection_overhead_share, tokens=None))
                            if paired is not None:
                                rows[-1]["speedup_medians"] = rows[-1]["speedup_vs_dense"]
                                rows[-1].update(_paired_fields(paired, d_tokens))
                            save()
                    if hf_baseline:
                        for label, impl in (("hf-generate", None), ("hf-generate-static", "static")):
                            progress.update(task, description=f"{doc} ctx={ctx} B={bs} {label}")
                            tps = hf_generate_tps(m, wins[:bs], bs, max_new_tokens, impl, repeats)
                            all_tokens.append(None)
                            rows.append(dict(document=doc, context=ctx, batch=bs, method=label, tau=1.0,
                                             tokens_per_second=tps["median"], tokens_per_second_min=tps["min"],
                                             tokens_per_second_max=tps["max"], repeats=repeats,
                                             attn_implementation=tps["attn_implementation"],
                                             speedup_vs_dense=(tps["median"] / dense_tps) if dense_tps else None))
                            progress.advance(task)
                            save()
    # greedy losslessness check: lossless methods must reproduce dense tokens (again for every row: a row timed before
    # its setting's dense row has its check only now)
    for i in range(len(rows)):
        check(i)
    save()
    print(markdown_table(meta, rows))
    return rows


def method_specs(methods: Sequence[str]) -> dict[str, tuple[str, dict[str, Any]]]:
    """``{entry: (method, options)}`` of ``--methods`` entries ``name`` or ``name:key=value:...``
    (:func:`specdec.loading.method_spec`); an entry given twice is refused."""
    from specdec.loading import method_spec

    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for item in methods:
        item = item.strip()
        if item in out:
            raise SpecdecError(f"--methods names {item!r} twice; give each entry once.")
        out[item] = method_spec(item)
    return out


def divergence(tokens: list[list[int]], dense: list[list[int]]) -> dict[str, int]:
    """Where a batch's tokens leave dense's: ``{"sequences": how many differ, "of": the batch, "first": the earliest
    token index at which one differs}`` (a length difference counts at the shorter length)."""
    firsts = []
    for a, b in zip(tokens, dense):
        if a != b:
            firsts.append(next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))))
    return dict(sequences=len(firsts), of=len(dense), first=min(firsts) if firsts else -1)


def _timed(eng, pre, max_new_tokens: int, repeats: int, warmup: bool, partner=None):
    """``(tokens/s statistics, the median run, paired)`` of ``repeats`` timed generations of ``pre``'s prompts. With
    ``warmup``, untimed first: :meth:`~specdec.engine.SpeculativeEngine.warm_up` (every step kind the adaptive
    controller may pick, so no timed call captures a graph) and one plain call (the controller's costs).

    ``partner`` (the dense engine of the setting, ``bench --interleave``): the two engines take turns, each turn one
    untimed run (the switch) and one timed run on the same prompts — partner, partner, eng, eng, partner, … — so a drift
    of the machine (clocks, a busy host) falls on both, and no timed run is the first after the other engine's (in a
    first H200 run without the untimed switch, the dense runs between MagicDec's at B 16 read up to 7 % below the dense
    row; with turns that did not recur); ``paired`` is then ``(ratios, partner runs)`` with ``ratios[i]`` = timed run
    ``i``'s tokens/s over its partner's, else ``None``."""
    if warmup:
        eng.warm_up(pre.ids, max_new_tokens=max_new_tokens, prefilled=pre)
        eng.generate(pre.ids, max_new_tokens=max_new_tokens, prefilled=pre)
    runs, partners = [], []

    def settled(e):
        if partner is not None:  # the switch from the other engine: untimed
            e.generate(pre.ids, max_new_tokens=max_new_tokens, prefilled=pre)
        return e.generate(pre.ids, max_new_tokens=max_new_tokens, prefilled=pre)
    for _ in range(repeats):
        if partner is not None:
            partners.append(settled(partner))
        runs.append(settled(eng))
    paired = None
    if partner is not None:
        paired = ([r.stats.tokens_per_second / d.stats.tokens_per_second for r, d in zip(runs, partners)], partners)
    return _stats([r.stats.tokens_per_second for r in runs]), sorted(
        runs, key=lambda r: r.stats.tokens_per_second)[(len(runs) - 1) // 2], paired


_PAIRED_FIELDS = ("speedup_medians", "speedup_paired_min", "speedup_paired_max", "dense_paired_tokens_per_second",
                  "dense_paired_tokens_per_second_min", "dense_paired_tokens_per_second_max", "dense_paired_same_tokens")


def _paired_fields(paired, dense_tokens) -> dict[str, Any]:
    """A row's fields from :func:`_timed`'s ``paired``: the median of the per-run ratios (the row's speed-up), the
    dense runs it alternated with (median, min, max) and whether they emitted the dense row's tokens (a method run
    between two dense runs must leave nothing behind that changes them)."""
    ratios, partners = paired
    d = _stats([r.stats.tokens_per_second for r in partners])
    return dict(speedup_vs_dense=_stats(ratios)["median"], speedup_paired_min=min(ratios),
                speedup_paired_max=max(ratios), dense_paired_tokens_per_second=d["median"],
                dense_paired_tokens_per_second_min=d["min"], dense_paired_tokens_per_second_max=d["max"],
                dense_paired_same_tokens=None if dense_tokens is None else all(
                    r.tokens == dense_tokens for r in partners))


def dense_text_replay(eng, pre, max_new_tokens: int):
    """``(replay, run)``: the acceptance ``eng``'s drafter reaches on dense's text — one run of the same engine with
    dense verification (:class:`specdec.verifiers.FullVerifier`) in place of its own, fixed γ, every round recorded
    (``run``: that :class:`~specdec.engine.GenerationResult`) — as an :class:`~specdec.adaptive.AcceptanceReplay`. The
    engine is left as it was."""
    from specdec.adaptive import AcceptanceReplay
    from specdec.verifiers import FullVerifier

    saved = (eng.verifier, eng.lossless, eng.record_acceptance, eng.adaptive, eng.replay)
    eng.verifier, eng.lossless, eng.record_acceptance, eng.adaptive, eng.replay = (
        FullVerifier(eng.model), True, True, False, None)
    try:
        run = eng.generate(pre.ids, max_new_tokens=max_new_tokens, prefilled=pre)
    finally:
        eng.verifier, eng.lossless, eng.record_acceptance, eng.adaptive, eng.replay = saved
    return AcceptanceReplay(run.stats.acceptance_trace, dict(tau=run.stats.mean_accepted_length)), run


def _same(r: dict[str, Any]) -> str:
    """The "same tokens as dense" cell: True / False, with where a False batch first differs."""
    same = r.get("same_tokens_as_dense", "")
    dv = r.get("divergence")
    if same is False and dv:
        return f"False ({dv['sequences']}/{dv['of']} sequences, from token {dv['first']})"
    return str(same)


def _blank(x: Any) -> Any:
    """A table cell: ``x``, or empty for ``None``."""
    return "" if x is None else x


def markdown_table(meta: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    lines = [
        f"# {meta.get('model')} — γ={meta.get('gamma')}, budget={meta.get('budget') or meta.get('budget_ratio')}",
        "",
        f"- command: `{meta.get('command')}`",
        f"- machine: {json.dumps(meta.get('machine'))}",
        "",
        f"- tokens/s: median of {meta.get('repeats', 1)} timed runs (min–max)"
        + ("; HF baselines warmed up at the same shape" if any(r["method"].startswith("hf-") for r in rows) else ""),
        (f"- contexts: {meta['windows']} windows of each document, ends {meta['window_stride']} tokens apart "
         "(sequence b continues window b mod K)" if (meta.get("windows") or 1) > 1 else
         "- contexts: every sequence of a batch continues the same window"),
        *([f"- {meta['compile_skipped']}"] if meta.get("compile_skipped") else []),
        *[f"- {label}: {v['method']} with options {json.dumps(v['options'])}"
          for label, v in (meta.get("methods") or {}).items() if v.get("options")],
        *([f"- tensor parallel: the model split over {meta['tensor_parallel']} ranks (one device each; heads, MLP and "
           "KV cache sharded); rank 0's timings"] if (meta.get("tensor_parallel") or 1) > 1 else []),
        ("- speedup vs dense: dense and each method took turns (an untimed run, then a timed one, each turn); the "
         "median of the ratios of each timed run to dense's just before it (min–max)" if meta.get("interleave") else
         "- speedup vs dense: the ratio of the two rows' medians"),
        "- τ: tokens per round, the mean over the batch's sequences; iterations: the batch's rounds (decode steps for "
        "dense), which its slowest sequence sets",
        "",
        "| document | context | batch | method | τ | iterations | tokens/s (min–max) | speedup vs dense "
        "| select share | dense steps | mean γ | same tokens as dense |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sp = r.get("speedup_vs_dense")
        sp_rng = (f" ({r['speedup_paired_min']:.2f}–{r['speedup_paired_max']:.2f})"
                  if r.get("speedup_paired_min") is not None else "")
        rng = (f" ({r['tokens_per_second_min']:.1f}–{r['tokens_per_second_max']:.1f})"
               if "tokens_per_second_min" in r else "")
        method = r["method"] + (" (dense's text)" if r.get("dense_text") else " (replayed)" if r.get("replayed") else "")
        gm = r.get("gamma_mean")
        lines.append(
            f"| {r['document']} | {r['context']} | {r['batch']} | {method} | {r['tau']:.2f} | "
            f"{_blank(r.get('iterations'))} | {r['tokens_per_second']:.2f}{rng} | {'' if sp is None else f'{sp:.2f}×{sp_rng}'} | "
            f"{r.get('selection_overhead_share', 0):.1%} | {r.get('dense_steps', '')} | "
            f"{'' if gm is None else f'{gm:.1f}'} | {_same(r)} |"
        )
    return "\n".join(lines) + "\n"
