"""``specdec demo``: continue Python's own documentation and compare dense with speculative decoding.

The workload is chosen for the device, so that the first numbers a user sees show where speculation pays:
on a CPU the longest context the model allows at batch 1 with the ``numba`` backend where it is installed
(``torch`` otherwise) — the KV cache is then the largest share of what a decoding step reads; on a GPU
the fast path (:data:`specdec.fastpath.FAST_CUDA`). The table shows the speedup over dense next to τ;
when no speculative method is faster, one line says why. No typer import here (the command is in
:mod:`specdec.cli`, which passes its loading helpers in).
"""

from __future__ import annotations

import importlib.util
import time
from typing import Any, Callable, Sequence

from specdec.errors import SpecdecError

__all__ = ["run_demo", "default_backend", "longest_context"]

DOC_OFFSET = 20000  # tokens kept after the prompt (the document's tail is not the prompt)


def default_backend(device_type: str) -> str:
    """``numba`` on a CPU where installed, else ``torch``; the fast path's backend on CUDA."""
    from specdec.fastpath import FAST_CUDA

    if device_type == "cuda":
        return FAST_CUDA.backend
    return "numba" if importlib.util.find_spec("numba") is not None else "torch"


def longest_context(max_positions: int, doc_tokens: int, max_new_tokens: int, gamma: int) -> int:
    """The longest prompt the model's positions and the document allow, leaving room for the new tokens."""
    return min(max_positions - max_new_tokens - gamma - 1, doc_tokens - DOC_OFFSET)


def kv_share(model, context: int, batch: int) -> float:  # noqa: ANN001
    """Share of the bytes one dense decoding step reads that is KV cache (the rest is the weights)."""
    d = model.dims
    item = model.dtype.itemsize
    kv = 2 * d.n_layers * batch * d.n_kv_heads * context * d.head_dim * item
    weights = sum(p.numel() * p.element_size() for p in model.hf.parameters()) if hasattr(model, "hf") else 0
    return kv / (kv + weights) if kv + weights else 0.0


def run_demo(context_tokens: int | None, max_new_tokens: int, methods: Sequence[str], budget_ratio: float, gamma: int,
             batch_size: int, model: str, device: str, backend: str | None, load: Callable, config: Callable,
             resolve: Callable[[str], str]) -> dict[str, Any]:
    """Run the demo and print it; returns the results by method."""
    from rich.console import Console
    from rich.table import Table

    from specdec.data import context_ids, load_document
    from specdec.fastpath import FAST_CUDA, PORTABLE
    from specdec.memory import check_fits
    from specdec.presets import build_engine

    console = Console()
    dev = resolve(device).split(":")[0]
    cfgs = {name: config(name, gamma, None, budget_ratio, 0.0, 1.0, 0, None) for name in methods}  # fail fast
    fast = dev == "cuda" and backend in (None, FAST_CUDA.backend)
    speed = FAST_CUDA if fast else PORTABLE
    backend = backend or default_backend(dev)
    m = load(model, speed.dtype, device, backend, speed.cuda_graphs, speed.compile, speed.fuse)
    doc_ids = context_ids(m.tokenizer, load_document("pydoc"), None)
    longest = longest_context(m.dims.max_positions, len(doc_ids), max_new_tokens, gamma)
    if context_tokens is None:
        context_tokens = longest
    elif context_tokens > longest:
        raise SpecdecError(f"--context-tokens {context_tokens} is more than this model and document allow with "
                           f"--max-new-tokens {max_new_tokens}; use 16 to {longest}.")
    ids = doc_ids[len(doc_ids) - DOC_OFFSET - context_tokens: len(doc_ids) - DOC_OFFSET]
    for cfg in cfgs.values():
        if {"sinks", "recent"} & cfg.model_fields_set and cfg.sinks + cfg.recent > len(ids):
            raise SpecdecError(f"sinks + recent exceed the context of {len(ids)} tokens; use a longer --context-tokens.")
    check_fits(m, batch_size, len(ids), max_new_tokens, gamma)
    longest_note = " (the longest this model allows)" if context_tokens == longest else ""
    console.print(f"[bold]specdec demo[/]: {model}, {len(ids)} tokens of pydoc_data.topics{longest_note}, "
                  f"batch {batch_size}, {max_new_tokens} new tokens, {backend} backend on {dev}")
    prompts = [ids] * batch_size
    results: dict[str, Any] = {}
    t0 = time.perf_counter()
    pre = None
    with console.status("prefill ...") as status:
        for name in methods:
            eng = build_engine(m, cfgs[name])
            if pre is None:
                pre = eng.prefill(prompts)  # one prefill shared by every method (the decode phase is compared)
            if fast:  # captures and compilations happen in an untimed run of the same shape
                eng.generate(prompts, max_new_tokens=max_new_tokens, prefilled=pre)
            status.update(f"generating with {name} ...")
            results[name] = eng.generate(prompts, max_new_tokens=max_new_tokens, prefilled=pre)
    first = results[methods[0]]
    console.rule("continuation")
    console.print(first.text[0])
    console.rule()
    same = all(r.tokens == first.tokens for r in results.values())
    base = results["dense"].stats.tokens_per_second if "dense" in results else None
    table = Table(title=f"dense vs speculative (budget {budget_ratio:.0%}, γ={gamma}, context {len(ids)}, "
                        f"batch {batch_size}, {dev}, {backend} backend)")
    for col in ("method", "τ", "speedup vs dense", "tokens/s", "iterations", "same tokens as first"):
        table.add_column(col)
    for name, r in results.items():
        s = r.stats
        table.add_row(name, f"{s.mean_accepted_length:.2f}",
                      f"{s.tokens_per_second / base:.2f}×" if base else "-",
                      f"{s.tokens_per_second:.2f}", str(s.iterations), "yes" if r.tokens == first.tokens else "no")
    console.print(table)
    spec = {n: r.stats.tokens_per_second / base for n, r in results.items() if n != "dense" and base}
    if spec:
        best = max(spec, key=spec.get)
        if spec[best] >= 1.0:
            console.print(f"speculation pays here: {best} is {spec[best]:.2f}× dense at τ = "
                          f"{results[best].stats.mean_accepted_length:.2f}.")
        else:
            share = kv_share(m, len(ids), batch_size)
            console.print(
                f"no speedup on this device: a dense step here reads the weights plus a KV cache that is only "
                f"{share:.0%} of its bytes, and every draft step still reads all the weights, so τ = "
                f"{results[best].stats.mean_accepted_length:.2f} cannot pay for the γ = {gamma} draft steps; the gain "
                f"appears where the KV cache dominates a step (long context × batch on a GPU)."
            )
    if not same:
        console.print("[yellow]note: a near-lossless method changed the output[/]")
    console.print(f"[dim]{time.perf_counter() - t0:.1f} s for prefill and generation[/]")
    return results
