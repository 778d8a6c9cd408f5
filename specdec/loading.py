"""Loading a model and merging a pipeline config from command-line style options (no CLI toolkit here).

Library layer: the commands (``bench``, ``tune``, ``profile-srh``, ``fidelity``) and :mod:`specdec.cli`
call these; they raise :class:`~specdec.errors.SpecdecError` with one clear sentence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from specdec.errors import SpecdecError


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecdecError(f"--device {device} was requested but no CUDA GPU is available; use --device cpu.")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise SpecdecError(f"unknown device {device!r}; use cpu, cuda or auto.")
    return device


def load_model(model: str, dtype: str, device: str, backend: str, cuda_graphs: bool = False, compile: bool = False,
               fuse: bool = False):
    """Load a :class:`~specdec.models.SpecdecModel` with a registered backend (CLI helper).

    ``cuda_graphs`` captures decode-sized forwards as CUDA graphs (GPU only; the ``torch`` backend
    switches to its static mode); ``compile`` applies ``torch.compile`` to them; ``fuse`` fuses the
    q/k/v and gate/up projections first (:meth:`~specdec.models.SpecdecModel.fuse_projections`).
    """
    import torch

    from specdec.models import SpecdecModel, resolve_dtype
    from specdec.registry import BACKENDS

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    if dev == "cpu" and torch_dtype == torch.float16:
        raise SpecdecError("float16 is not supported on the CPU here; use --dtype float32 or bfloat16.")
    if cuda_graphs and dev == "cpu":
        raise SpecdecError("--cuda-graphs needs a CUDA GPU; drop it or use --device cuda.")
    be = BACKENDS.build(backend, **({"static": True} if (cuda_graphs and backend == "torch") else {}))
    reason = be.validate(torch.device(dev), torch_dtype)
    if reason:
        raise SpecdecError(f"backend {backend!r} cannot run here: {reason}")
    m = SpecdecModel.from_pretrained(model, dtype=dtype, device=dev, backend=be)
    if fuse:
        m.fuse_projections()
    if compile:
        m.enable_compile()
    if cuda_graphs:
        m.enable_cuda_graphs()
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
):
    """Merge ``--config FILE`` (JSON from ``specdec tune``) with the options given explicitly."""
    from specdec.presets import PipelineConfig, get_method
    from specdec.sampling import SamplingConfig

    base: dict[str, Any] = {}
    if config_file is not None:
        try:
            base = json.loads(Path(config_file).read_text())
        except FileNotFoundError:
            raise SpecdecError(f"config file {config_file} does not exist; pass the JSON written by `specdec tune`.")
        except json.JSONDecodeError as exc:
            raise SpecdecError(f"config file {config_file} is not valid JSON (line {exc.lineno}: {exc.msg}).")
        if not isinstance(base, dict) or not isinstance(base.get("recommended", base), dict):
            raise SpecdecError(f"config file {config_file} must hold a JSON object of pipeline fields.")
        base = dict(base.get("recommended", base))
        base.pop("sampling", None)
    given = {"method": method, "gamma": gamma, "budget": budget, "budget_ratio": budget_ratio}
    if budget is not None or budget_ratio is not None:  # a budget given here replaces the file's
        base.pop("budget", None)
        base.pop("budget_ratio", None)
    merged = {**base, **{k: v for k, v in given.items() if v is not None}}
    merged.setdefault("method", PipelineConfig.model_fields["method"].default)
    get_method(merged["method"])  # unknown names list the known ones
    merged["sampling"] = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    return PipelineConfig.make(**merged)


def check_budget(cfg, context: int) -> None:
    if cfg.budget is not None and cfg.budget > context:
        raise SpecdecError(
            f"--budget {cfg.budget} exceeds the context of {context} tokens; use a budget <= {context} or --budget-ratio."
        )
