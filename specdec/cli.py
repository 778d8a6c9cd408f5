"""The ``specdec`` command line: ``demo``, ``generate``, ``bench`` (and commands added by method modules).

Every bad input ends with one line ``error: ...`` on stderr and exit code 2 — no traceback.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Optional

import typer

from specdec.errors import SpecdecError
from specdec.friendly import (  # noqa: F401 - re-exported
    EXIT_INTERRUPTED, INTERRUPTED, OneLineErrors, SpecdecTyper, fail, friendly,
)
from specdec.loading import (  # noqa: F401 - re-exported for scripts and tests
    CONFIG_SECTIONS_NOT_READ,
    check_budget,
    load_model,
    pipeline_config,
    read_config,
    resolve_device,
    unused_settings,
)


app = SpecdecTyper(
    cls=OneLineErrors, add_completion=False, no_args_is_help=True, help="Long-context speculative decoding with sparse attention."
)


# --------------------------------------------------------------------------------------------------
@app.callback()
def main_options(
    threads: Optional[int] = typer.Option(
        None, "--threads", min=1,
        help="CPU threads for torch (default: the CPUs this process may use, from os.sched_getaffinity, or "
             "OMP_NUM_THREADS when set); goes before the command: specdec --threads 2 demo"),
) -> None:
    """Long-context speculative decoding with sparse attention."""
    from specdec.threads import apply_threads

    try:
        apply_threads(threads)
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def parse_methods(option: str, text: str) -> list[str]:
    """``--methods a,b`` as a list; an empty list is refused."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise SpecdecError(f"{option} {text!r} names no method; pass comma-separated names, e.g. {option} dense,magicdec.")
    return names


def speed_options(device: str, backend, dtype, cuda_graphs, compile_, fuse):  # noqa: ANN001
    """The device's defaults (:mod:`specdec.fastpath`) for the speed options left unset."""
    from specdec.fastpath import speed_defaults

    return speed_defaults(resolve_device(device).split(":")[0], backend, dtype, cuda_graphs, compile_, fuse)


_BACKEND_HELP = "attention backend: reference, torch, triton, numba, ... (default: triton on CUDA, reference on the CPU)"
_DTYPE_HELP = "float32, bfloat16 or float16 (default: bfloat16 with the CUDA fast path, else float32)"
_GRAPHS_HELP = "capture decode steps as CUDA graphs (default: on with the CUDA fast path)"
_COMPILE_HELP = "torch.compile decode steps (default: on with the CUDA fast path)"
_FUSE_HELP = "fuse q/k/v and gate/up projections, Llama/Qwen2/Qwen3/Mistral (default: on with the CUDA fast path)"


@app.command()
@friendly
def generate(
    prompt_file: Path = typer.Option(..., "--prompt-file", help="plain-text prompt file (a regular file)"),
    max_new_tokens: int = typer.Option(..., "--max-new-tokens", min=1, help="tokens to generate per sequence"),
    output_json: Path = typer.Option(..., "--output-json", help="where to write tokens, text and stats"),
    model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
    method: Optional[str] = typer.Option(None, "--method", help="dense, magicdec, vegas, quest, dustin, ... (default magicdec)"),
    context_tokens: Optional[int] = typer.Option(
        None, "--context-tokens",
        help="keep the last N tokens of the file (with --chat: N in all, the template whole, the file's last tokens)"),
    budget: Optional[int] = typer.Option(None, "--budget", help="KV entries one sparse step sees"),
    budget_ratio: Optional[float] = typer.Option(None, "--budget-ratio", help="budget as a share of the context"),
    gamma: Optional[int] = typer.Option(None, "--gamma", help="draft length γ (default 4)"),
    temperature: float = typer.Option(0.0, "--temperature", help="sampling temperature; 0 = greedy"),
    top_p: float = typer.Option(1.0, "--top-p", help="nucleus sampling: keep the smallest set of tokens with this mass"),
    top_k: int = typer.Option(0, "--top-k", help="sample among the k most likely tokens; 0 = off"),
    seed: Optional[int] = typer.Option(None, "--seed", help="seed of the sampling generator, 0 to 2**64 - 1"),
    batch_size: int = typer.Option(1, "--batch-size", help="repeat the prompt B times"),
    backend: Optional[str] = typer.Option(None, "--backend", help=_BACKEND_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=_DTYPE_HELP),
    device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
    chat: bool = typer.Option(False, "--chat", help="wrap the prompt in the model's chat template"),
    cuda_graphs: Optional[bool] = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help=_GRAPHS_HELP),
    compile_: Optional[bool] = typer.Option(None, "--compile/--no-compile", help=_COMPILE_HELP),
    fuse: Optional[bool] = typer.Option(None, "--fuse/--no-fuse", help=_FUSE_HELP),
    config_file: Optional[Path] = typer.Option(None, "--config", help="JSON config (e.g. from `specdec tune`)"),
    option: list[str] = typer.Option(
        [], "--option", help="a method option key=value, repeatable (e.g. --option draft=PATH; `specdec methods` lists "
        "each method's); over the --config file's"),
    adaptive: Optional[bool] = typer.Option(
        None, "--adaptive/--no-adaptive",
        help="adapt γ per iteration and fall back to dense steps when drafting cannot pay "
             "(default: on; lossless methods only)"),
    record_acceptance: Optional[Path] = typer.Option(
        None, "--record-acceptance",
        help="write each round's accepted lengths as JSON (replay: bench --acceptance-trace); records at fixed γ "
             "unless --adaptive is given"),
    encoding: str = typer.Option("utf-8", "--encoding", help="text encoding of --prompt-file"),
    allow_special_tokens: bool = typer.Option(
        False, "--allow-special-tokens",
        help="parse special-token spellings in the prompt file (e.g. <|im_start|>) as control tokens; by default they are text"),
    tp: int = typer.Option(1, "--tp", min=1,
                           help="tensor-parallel ranks (heads and KV cache split over processes); launch with "
                                "`torchrun --nproc-per-node N -m specdec generate ... --tp N`"),
) -> None:
    """Generate a continuation of a prompt file and write tokens, text and stats as JSON."""
    from specdec.inputs import read_text_file
    from specdec.memory import check_fits
    from specdec.outputs import check_outputs, write_text
    from specdec.presets import build_engine
    from specdec.prompts import chat_ids, check_positions, encode_text

    check_outputs([(output_json, "--output-json"), (record_acceptance, "--record-acceptance")])
    if batch_size < 1:
        raise SpecdecError(f"--batch-size must be >= 1 (got {batch_size}).")
    if context_tokens is not None and context_tokens < 1:
        raise SpecdecError(f"--context-tokens must be >= 1 (got {context_tokens}).")
    cfg = pipeline_config(method, gamma, budget, budget_ratio, temperature, top_p, top_k, seed, config_file, option)
    for line in unused_settings(cfg, gamma, budget, budget_ratio, temperature, top_p, top_k, seed):
        typer.echo(f"note: {line}", err=True)
    text = read_text_file(prompt_file, "--prompt-file", encoding, "--encoding")
    if not text.strip():
        raise SpecdecError(f"prompt file {prompt_file} is empty or whitespace only; give it some text.")
    so = speed_options(device, backend, dtype, cuda_graphs, compile_, fuse)
    if tp > 1:
        from specdec.parallel import check_method

        check_method(cfg.method)
    m = load_model(model, so.dtype, device, so.backend, so.cuda_graphs, so.compile, so.fuse, tp=tp)
    # the file is text: a special token's spelling in it stays text (no role injection with --chat)
    if chat:  # the document is cut, not the template (--context-tokens counts the template's tokens too)
        ids = chat_ids(m.tokenizer, text, allow_special_tokens, context_tokens)
    else:
        ids = encode_text(m.tokenizer, text, allow_special_tokens)
        if context_tokens is not None:
            ids = ids[-context_tokens:]
    check_positions(len(ids), max_new_tokens, m.dims.max_positions, "--context-tokens")
    check_budget(cfg, len(ids))
    check_fits(m, batch_size, len(ids), max_new_tokens, cfg.gamma)
    if adaptive is None and record_acceptance is not None and "adaptive" not in cfg.model_fields_set:
        adaptive = False  # a trace is replayed at fixed γ (bench --acceptance-trace): every round drafts γ
    if adaptive is not None:
        cfg = cfg.model_copy(update={"adaptive": adaptive})
    engine = build_engine(m, cfg)
    engine.record_acceptance = record_acceptance is not None
    res = engine.generate([ids] * batch_size, max_new_tokens=max_new_tokens)
    if record_acceptance is not None:
        from specdec.adaptive import trace_json

        write_text(record_acceptance, trace_json(res.stats, model=model, budget=cfg.budget,
                                                 budget_ratio=cfg.budget_ratio, context_tokens=len(ids),
                                                 adaptive=cfg.adaptive), "--record-acceptance")
    import torch

    payload = {
        "model": model,
        "config": json.loads(cfg.model_dump_json()),
        "context_tokens": len(ids),
        "speed": {"backend": so.backend, "dtype": so.dtype, "cuda_graphs": so.cuda_graphs, "compile": so.compile,
                  "fuse": so.fuse, "device": str(m.device), "threads": torch.get_num_threads()},
        "tokens": res.tokens,
        "text": res.text,
        "stats": res.stats.to_dict(),
    }
    if m.tp is not None and m.tp.rank != 0:  # every rank holds the same tokens; rank 0 reports them
        return
    if m.tp is not None:
        payload["tensor_parallel"] = m.tp.world
    write_text(output_json, json.dumps(payload, indent=2), "--output-json")
    s = res.stats
    # the first token of each sequence comes from the prefill: a rate needs at least one decode step
    rate = (f"{s.tokens_per_second:.2f} tok/s" if s.generated_tokens > s.batch_size
            else "no decode step (the prefill gave each token)")
    typer.echo(
        f"{cfg.method}: {s.generated_tokens} tokens, τ={s.mean_accepted_length:.2f}, {rate}"
        f"{'' if s.lossless else ' (near-lossless: sparse verification)'} → {output_json}"
    )


@app.command()
@friendly
def demo(
    context_tokens: Optional[int] = typer.Option(
        None, "--context-tokens", min=16,
        help="prompt length in tokens (default: the longest the model allows on a CPU, 4096 on a GPU)"),
    max_new_tokens: int = typer.Option(48, "--max-new-tokens", min=1, help="tokens to generate"),
    methods: str = typer.Option("dense,magicdec", "--methods", help="comma-separated methods to compare"),
    budget_ratio: float = typer.Option(0.05, "--budget-ratio", help="budget as a share of the context"),
    gamma: int = typer.Option(4, "--gamma", help="draft length γ"),
    batch_size: int = typer.Option(1, "--batch-size", min=1, help="sequences decoded together"),
    model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
    device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
    backend: Optional[str] = typer.Option(
        None, "--backend", help="attention backend (default: numba on a CPU where installed, else torch; the CUDA fast path on a GPU)"),
) -> None:
    """Continue Python's own documentation with the embedded model; compare dense vs speculative."""
    from specdec.demo import run_demo

    run_demo(context_tokens=context_tokens, max_new_tokens=max_new_tokens, methods=parse_methods("--methods", methods),
             budget_ratio=budget_ratio, gamma=gamma, batch_size=batch_size, model=model, device=device, backend=backend,
             load=load_model, config=pipeline_config, resolve=resolve_device)


@app.command()
@friendly
def bench(
    methods: str = typer.Option("dense,magicdec", "--methods", help="comma-separated methods to compare, each with "
                                "its own options as name:key=value:... (e.g. dustin:verify=dense:tree=true)"),
    contexts: str = typer.Option("2048", "--contexts", help="comma-separated context lengths"),
    batch_sizes: str = typer.Option("1", "--batch-sizes", help="comma-separated batch sizes"),
    documents: str = typer.Option("pydoc", "--documents", help="comma-separated: file paths, pydoc, stdlib:<module>, long:prose, long:code (>= 40k tokens)"),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", min=1, help="tokens to generate per run"),
    budget: Optional[int] = typer.Option(None, "--budget", help="KV entries one sparse step sees"),
    budget_ratio: Optional[float] = typer.Option(None, "--budget-ratio", help="budget as a share of the context"),
    gamma: int = typer.Option(4, "--gamma", help="draft length γ"),
    model: str = typer.Option("smollm2-135m", "--model", help="embedded name, local dir, .gguf file or cached hub id"),
    backend: Optional[str] = typer.Option(None, "--backend", help=_BACKEND_HELP),
    dtype: Optional[str] = typer.Option(None, "--dtype", help=_DTYPE_HELP),
    device: str = typer.Option("auto", "--device", help="cpu, cuda or auto"),
    hf_baseline: bool = typer.Option(False, "--hf-baseline", help="also time Hugging Face generate (dense)"),
    cuda_graphs: Optional[bool] = typer.Option(None, "--cuda-graphs/--no-cuda-graphs", help=_GRAPHS_HELP),
    compile_: Optional[bool] = typer.Option(None, "--compile/--no-compile", help=_COMPILE_HELP),
    fuse: Optional[bool] = typer.Option(None, "--fuse/--no-fuse", help=_FUSE_HELP),
    warmup: Optional[bool] = typer.Option(
        None, "--warmup/--no-warmup",
        help="run each method once untimed first (default: on with --cuda-graphs or --compile, whose captures "
             "and compilations would otherwise be timed)"),
    output_dir: Path = typer.Option(Path("bench_out"), "--output-dir", help="folder for <tag>.json and <tag>.md"),
    tag: str = typer.Option("bench", "--tag", help="file name prefix"),
    repeats: int = typer.Option(3, "--repeats", help="timed runs per row (median, min-max reported)"),
    shape: Optional[str] = typer.Option(None, "--shape",
                                        help="random-weight model of this shape on the device: llama-3.1-8b, qwen3-8b, ..."),
    acceptance_trace: Optional[str] = typer.Option(
        None, "--acceptance-trace",
        help="replay accepted lengths recorded by generate --record-acceptance: FILE, or method=FILE,method=FILE"),
    adaptive: Optional[bool] = typer.Option(
        None, "--adaptive/--no-adaptive",
        help="adaptive γ and dense fall-back (default: on; lossless methods only)"),
    windows: int = typer.Option(1, "--windows", help="different windows of each document in a batch (sequence b "
                                "continues window b mod K; 1: every sequence the same window)"),
    window_stride: int = typer.Option(1000, "--window-stride", help="tokens between the ends of consecutive windows"),
    interleave: bool = typer.Option(
        True, "--interleave/--no-interleave",
        help="dense and each method take turns (an untimed run, then a timed one) and the speed-up is the median of "
             "the ratios of each timed run to dense's just before it (default); --no-interleave: time each row alone, "
             "speed-up = ratio of the medians"),
    dense_text: bool = typer.Option(
        False, "--dense-text",
        help="near-lossless methods (dustin): also time each on dense's text, replaying the acceptance its drafter "
             "reaches with dense verification (free-running, such a method is timed on its own text)"),
    tp: int = typer.Option(1, "--tp", min=1,
                           help="tensor-parallel ranks (heads and KV cache split over processes); launch with "
                                "`torchrun --nproc-per-node N -m specdec bench ... --tp N`; rank 0 writes the files"),
) -> None:
    """Methods × context lengths × batch sizes × documents → JSON + a Markdown table."""
    from specdec.bench import method_specs, run_bench
    from specdec.loading import unused_budget
    from specdec.outputs import check_output_dir, check_outputs

    def ints(option: str, text: str) -> list[int]:
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise SpecdecError(f"{option} takes comma-separated integers (got {text!r}), e.g. 2048,8000.") from None

    names = parse_methods("--methods", methods)
    for line in unused_budget(method_specs(names), budget, budget_ratio):
        typer.echo(f"note: {line}", err=True)  # as generate notes it
    if not tag or "/" in tag or tag in (".", ".."):
        raise SpecdecError(f"--tag {tag!r} must be a plain file name prefix (no '/').")
    check_output_dir(output_dir, "--output-dir")
    check_outputs([(output_dir / f"{tag}.json", "--output-dir"), (output_dir / f"{tag}.md", "--tag")])
    so = speed_options(device, backend, dtype, cuda_graphs, compile_, fuse)
    run_bench(
        methods=names,
        contexts=ints("--contexts", contexts),
        batch_sizes=ints("--batch-sizes", batch_sizes),
        documents=[x.strip() for x in documents.split(",") if x.strip()],
        max_new_tokens=max_new_tokens,
        budget=budget,
        budget_ratio=budget_ratio,
        gamma=gamma,
        model=model,
        backend=so.backend,
        dtype=so.dtype,
        device=device,
        hf_baseline=hf_baseline,
        cuda_graphs=so.cuda_graphs,
        compile=so.compile,
        fuse=so.fuse,
        warmup=(so.cuda_graphs or so.compile) if warmup is None else warmup,
        output_dir=output_dir,
        tag=tag,
        argv=sys.argv,
        repeats=repeats,
        shape=shape,
        acceptance_trace=_traces(acceptance_trace),
        adaptive=adaptive,
        windows=windows,
        window_stride=window_stride,
        dense_text=dense_text,
        interleave=interleave,
        tp=tp,
    )
    if tp > 1:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() != 0:
            return  # rank 0 wrote the files and says so
    typer.echo(f"wrote {output_dir / f'{tag}.json'} and {output_dir / f'{tag}.md'}")


def _traces(text: Optional[str]):
    """``--acceptance-trace``: ``FILE`` (every speculative method) or ``method=FILE,method=FILE``."""
    if text is None or "=" not in text:
        return text
    out = {}
    for part in text.split(","):
        name, sep, path = part.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise SpecdecError(f"--acceptance-trace takes FILE or method=FILE,method=FILE (got {part!r}).")
        out[name.strip()] = path.strip()
    return out


@app.command("methods")
def list_methods() -> None:
    """List the known methods, selectors and backends."""
    from specdec.presets import get_method, method_names
    from specdec.registry import BACKENDS, SELECTORS

    names = method_names()
    width = max(len(n) for n in names)
    indent = " " * (width + 16)  # under the description
    for name in names:
        spec = get_method(name)
        row = f"{name:{width}s} {'lossless' if spec.lossless else 'near-lossless':14s} {spec.description}"
        typer.echo(textwrap.fill(row, 100, subsequent_indent=indent, break_on_hyphens=False))
        if spec.options.model_fields:
            typer.echo(textwrap.fill(f"options: {', '.join(spec.options.model_fields)}", 100, initial_indent=indent,
                                     subsequent_indent=indent + " " * 9, break_on_hyphens=False))
    typer.echo(f"selectors: {', '.join(SELECTORS.names())}")
    typer.echo(f"backends:  {', '.join(BACKENDS.names())}")


#: modules that add sub-commands: each defines ``register(app)`` (e.g. ``specdec tune``, ``specdec profile-srh``)
EXTRA_COMMAND_MODULES = ("specdec.tune", "specdec.srh", "specdec.fidelity", "specdec.train_draft_command", "specdec.evaluation")


def _register_extra_commands() -> None:
    import importlib.util
    from importlib import import_module

    for mod in EXTRA_COMMAND_MODULES:
        if importlib.util.find_spec(mod) is not None:
            import_module(mod).register(app)


_register_extra_commands()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
