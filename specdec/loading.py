"""Loading a model and merging a pipeline config from command-line style options (no CLI toolkit here).

Library layer: the commands (``bench``, ``tune``, ``profile-srh``, ``fidelity``, ``demo``) and
:mod:`specdec.cli` call these; they raise :class:`~specdec.errors.SpecdecError` with one clear sentence.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from specdec.errors import SpecdecError


def resolve_device(device: str) -> str:
    from specdec.fastpath import cuda_available

    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device.startswith("cuda") and not cuda_available():
        raise SpecdecError(f"--device {device} was requested but no CUDA GPU is available; use --device cpu.")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; use cpu, cuda or auto.")
    return device


def load_model(model: str, dtype: str, device: str, backend: str, cuda_graphs: bool = False, compile: bool = False,
               fuse: bool = False, shape: str | None = None, tp: int = 1):
    """Load a :class:`~specdec.models.SpecdecModel` with a registered backend (CLI helper).

    ``cuda_graphs`` captures decode-sized forwards as CUDA graphs (GPU only; the ``torch`` backend
    switches to its static mode); ``compile`` applies ``torch.compile`` to them; ``fuse`` fuses the
    q/k/v and gate/up projections first (:meth:`~specdec.models.SpecdecModel.fuse_projections`),
    with the fused Triton kernels on CUDA. ``shape`` (e.g. ``llama-3.1-8b``) builds a random-weight
    model of that shape on the device instead of loading ``model`` (:mod:`specdec.shapes`).
    ``tp > 1`` joins the torchrun group of ``tp`` processes and shards the model over it
    (:mod:`specdec.parallel`) before fusing, compiling or capturing.
    """
    import torch

    from specdec.cuda.triton_pdl import pdl_requested
    from specdec.models import SpecdecModel, resolve_dtype
    from specdec.registry import BACKENDS

    pdl_requested()  # a bad SPECDEC_PDL fails here, in one line, not at the first kernel launch
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    if dev == "cpu" and torch_dtype == torch.float16:
        raise SpecdecError("float16 is not supported on the CPU here; use --dtype float32 or bfloat16.")
    if cuda_graphs and dev == "cpu":
        raise SpecdecError("--cuda-graphs needs a CUDA GPU; drop it or use --device cuda.")
    group = None
    if tp > 1:
        from specdec.parallel import init_tensor_parallel

        group = init_tensor_parallel(dev)
        if group.world != tp:
            raise SpecdecError(
                f"--tp {tp} needs {tp} processes, found {group.world}; launch it with "
                f"`torchrun --nproc-per-node {tp} -m specdec ... --tp {tp}`."
            )
    be = BACKENDS.build(backend, **({"static": True} if (cuda_graphs and backend == "torch") else {}))
    reason = be.validate(torch.device(dev), torch_dtype)
    if reason:
        raise SpecdecError(f"backend {backend!r} cannot run here: {reason}")
    skipped = None
    if shape is not None:
        from specdec.shapes import compile_skip_reason, random_model

        if compile:
            skipped = compile_skip_reason(shape)
            if skipped is not None:
                print(f"note: {skipped}", file=sys.stderr, flush=True)
                compile = False
        m = SpecdecModel(random_model(shape, dev, torch_dtype), None, be)
    else:
        m = SpecdecModel.from_pretrained(model, dtype=dtype, device=dev, backend=be)
    if group is not None:
        from specdec.parallel import shard_model

        shard_model(m, group)
    if fuse:
        m.fuse_projections()
    if compile:
        m.enable_compile()
    if cuda_graphs:
        m.enable_cuda_graphs()
    m.compile_skipped = skipped  # the reason torch.compile was skipped at this shape (bench records it)
    return m


def pipeline_config(
    method: Optional[str],
    gamma: Optional[int],
    budget: Optional[int],
    budget_ratio: Optional[float],
    temperature: float,
    top_p: float,
    top_k: int,
    seed: Optional[int],
    config_file: Optional[Path] = None,
    options: Sequence[str] = (),
):
    """Merge ``--config FILE`` (JSON from ``specdec tune``) with the options given explicitly; ``options``: the
    method's ``--option key=value`` items, over the file's ``options``."""
    from specdec.presets import PipelineConfig, get_method
    from specdec.sampling import SamplingConfig

    base: dict[str, Any] = {}
    if config_file is not None:
        base = read_config(config_file)
    if options:
        given_opts = parse_options(options)
        file_opts = base.get("options") or {}
        if not isinstance(file_opts, dict):
            raise SpecdecError(f"config file {config_file}: 'options' must be a JSON object of method options.")
        base["options"] = {**file_opts, **given_opts}
    given = {"method": method, "gamma": gamma, "budget": budget, "budget_ratio": budget_ratio}
    # each value given as a flag is checked alone first, so its error names the flag and the value, not the
    # config's field ("pipeline config: field 'gamma'"); a --config file's values keep their field names
    for field, flag, value, cls in (("gamma", "--gamma", gamma, PipelineConfig),
                                    ("budget", "--budget", budget, PipelineConfig),
                                    ("budget_ratio", "--budget-ratio", budget_ratio, PipelineConfig),
                                    ("temperature", "--temperature", temperature, SamplingConfig),
                                    ("top_p", "--top-p", top_p, SamplingConfig),
                                    ("top_k", "--top-k", top_k, SamplingConfig),
                                    ("seed", "--seed", seed, SamplingConfig)):
        if value is not None:
            _check_flag(cls, field, value, flag)
    if budget is not None or budget_ratio is not None:  # a budget given here replaces the file's
        base.pop("budget", None)
        base.pop("budget_ratio", None)
    merged = {**base, **{k: v for k, v in given.items() if v is not None}}  # both given: BudgetConfig's rule
    merged.setdefault("method", PipelineConfig.model_fields["method"].default)
    get_method(merged["method"])  # unknown names list the known ones
    merged["sampling"] = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    return PipelineConfig.make(**merged)


def _check_flag(cls, field: str, value: Any, flag: str) -> None:
    """``value``, given as ``flag``, against the field ``field`` of ``cls`` alone: one line naming the flag and the
    value (``--gamma must be less than or equal to 64 (got 100).``)."""
    from pydantic import ValidationError

    try:
        cls(**{field: value})
    except ValidationError as exc:
        msg = exc.errors()[0].get("msg", "is invalid")
        msg = msg[len("Value error, "):] if msg.startswith("Value error, ") else msg.lower()
        msg = msg.rstrip(".")
        if msg.startswith("input should be "):
            raise SpecdecError(f"{flag} must be {msg[len('input should be '):]} (got {value}).") from None
        raise SpecdecError(f"{flag} {value}: {msg}.") from None


def unused_settings(cfg, gamma: Optional[int], budget: Optional[int], budget_ratio: Optional[float],
                    temperature: float, top_p: float, top_k: int, seed: Optional[int]) -> list[str]:
    """The settings given on the command line that this run cannot use, one line each (printed as notes: nothing a
    user gave is dropped without a word)."""
    out = []
    given = [f for f, v in (("--gamma", gamma), ("--budget", budget), ("--budget-ratio", budget_ratio))
             if v is not None]
    flags = lambda fs: f"{' and '.join(fs)} {'does' if len(fs) == 1 else 'do'}"  # noqa: E731
    if cfg.method == "dense" and given:
        out.append(f"{flags(given)} not apply to --method dense (no drafts, full attention).")
    elif not budget_applies(cfg) and (budget is not None or budget_ratio is not None):
        out.append(f"{flags([f for f in given if f != '--gamma'])} not apply with --option verify=dense (the whole "
                   "context is verified).")
    sampling = [f for f, used in (("--top-p", top_p != 1.0), ("--top-k", top_k != 0), ("--seed", seed is not None))
                if used]
    if temperature == 0 and sampling:
        out.append(f"{', '.join(sampling)} only shape sampling; with --temperature 0 decoding is greedy (give "
                   "--temperature > 0 to sample).")
    return out


def unused_budget(entries: dict[str, tuple[str, dict[str, Any]]], budget: Optional[int],
                  budget_ratio: Optional[float]) -> list[str]:
    """``eval`` / ``bench``: the ``--methods`` entries (``{entry: (method, options)}``) that read no budget, one line
    each, when ``--budget`` / ``--budget-ratio`` was given (:func:`unused_settings`' wording for ``generate``).
    ``dense`` beside an entry that reads the budget is the usual baseline (``bench --methods dense,magicdec``) and
    gets no line; ``dustin:verify=dense`` always does (that its budget goes unread is not obvious)."""
    from types import SimpleNamespace

    given = [f for f, v in (("--budget", budget), ("--budget-ratio", budget_ratio)) if v is not None]
    if not given:
        return []
    reads = {e: budget_applies(SimpleNamespace(method=m, options=o)) for e, (m, o) in entries.items()}
    flags = f"{' and '.join(given)} {'does' if len(given) == 1 else 'do'}"
    out = []
    for entry, (method, opts) in entries.items():
        if reads[entry] or (method == "dense" and any(reads.values())):
            continue
        why = "no drafts, full attention" if method == "dense" else "verify=dense: the whole context is verified"
        out.append(f"{flags} not apply to {entry} in --methods ({why}).")
    return out


def _key_value(text: str, error: str) -> tuple[str, Any]:
    """``"key=value"`` → ``(key, value)``, the value JSON-decoded where it parses (``8``, ``0.5``, ``true``, ``null``),
    else the string; ``error`` (one line) when there is no ``=`` or no key."""
    k, eq, v = text.partition("=")
    if not eq or not k.strip():
        raise SpecdecError(error)
    try:
        return k.strip(), json.loads(v)
    except json.JSONDecodeError:
        return k.strip(), v


def method_spec(item: str) -> tuple[str, dict[str, Any]]:
    """``"dustin:verify=dense:tree=true"`` → ``("dustin", {"verify": "dense", "tree": True})``: a method entry of
    ``--methods`` (``specdec bench``, ``specdec eval``) with its options (:func:`_key_value`); the method name is
    checked (an unknown one lists the known ones)."""
    from specdec.presets import get_method

    name, *opts = (x.strip() for x in item.strip().split(":"))
    get_method(name)
    return name, dict(_key_value(o, f"method option {o!r} in {item!r} must look like key=value "
                                    "(e.g. dustin:dense_every=8).") for o in opts)


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` (``--option``, repeatable) → a dict (:func:`_key_value`)."""
    return dict(_key_value(it, f"--option {it!r} must look like key=value (e.g. --option verify=dense).")
                for it in items)


#: top-level keys of ``--config`` besides the pipeline fields: a ``specdec tune`` report (its ``recommended``
#: key is read, the rest is the report's record); any other section is refused rather than silently dropped
CONFIG_SECTIONS_NOT_READ = {
    "sampling": "the CLI does not read a 'sampling' section; pass --temperature, --top-p, --top-k and --seed instead",
}


def read_config(config_file: Path) -> dict[str, Any]:
    """The pipeline fields of ``--config FILE``: a JSON object, or a ``specdec tune`` report's ``recommended``."""
    from specdec.inputs import read_json_object

    base = read_json_object(config_file, "--config")
    if "recommended" in base:
        base = base["recommended"]
        if not isinstance(base, dict):
            raise SpecdecError(f"config file {config_file} must hold a JSON object of pipeline fields.")
    for key, why in CONFIG_SECTIONS_NOT_READ.items():
        if key in base:
            raise SpecdecError(f"config file {config_file}: {why}.")
    return dict(base)


def budget_applies(cfg) -> bool:
    """Whether the run reads a KV budget: not dense decoding, not Dustin with ``verify=dense`` (its drafter is a
    model or head of its own, and it verifies the whole context)."""
    if cfg.method == "dense":
        return False
    return not (cfg.method.startswith("dustin") and (cfg.options or {}).get("verify") == "dense")


def check_budget(cfg, context: int) -> None:
    """The budget fits the context; explicitly given sinks + recent fit the budget and the context. Nothing is
    checked for a run that reads no budget (:func:`budget_applies`; ``generate`` prints a note for it instead)."""
    if not budget_applies(cfg):
        return
    if cfg.budget is not None and cfg.budget > context:
        raise SpecdecError(
            f"--budget {cfg.budget} exceeds the context of {context} tokens; use a budget <= {context} or --budget-ratio."
        )
    if {"sinks", "recent"} & cfg.model_fields_set and cfg.sinks + cfg.recent > context:
        raise SpecdecError(
            f"sinks {cfg.sinks} + recent {cfg.recent} exceed the context of {context} tokens; "
            f"use sinks + recent <= {context}."
        )
