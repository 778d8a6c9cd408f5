"""The SRH artifact (``specdec-srh/1`` JSON): what ``specdec profile-srh`` writes and Dustin reads.

Library layer: :mod:`specdec.srh` (the command that finds the heads) writes it with :func:`save_srh`;
:mod:`specdec.dustin` reads it with :func:`load_srh`, which checks it belongs to this (target, draft)
pair through :func:`model_identity`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.outputs import write_text

FORMAT = "specdec-srh/1"


def model_identity(model) -> dict[str, Any]:
    """Geometry + a fingerprint of the embedding weights: enough to tell two models apart.

    The fingerprint hashes the *signs* of 4096 sampled embedding entries: rounding to bf16/fp16 keeps
    them, so an artifact profiled in float32 on a CPU loads for the same model in bf16 on a GPU.
    """
    d = model.dims
    w = model.hf.get_input_embeddings().weight.detach()
    flat = w.reshape(-1)
    step = max(1, flat.numel() // 4096)
    sample = (flat[::step][:4096] > 0).cpu().numpy().tobytes()
    return dict(model_type=str(model.hf.config.model_type), n_layers=d.n_layers, n_heads=d.n_heads,
                n_kv_heads=d.n_kv_heads, head_dim=d.head_dim, vocab_size=d.vocab_size,
                fingerprint=hashlib.sha1(sample).hexdigest()[:16])


def _describe(ident: dict) -> str:
    if "eagle_head" in ident:
        kind = f", EAGLE head {ident['eagle_head']}"
    elif "skip_tail_layers" in ident:
        kind = f", layer-skipping draft ({ident['early_exit_layers']} + {ident['skip_tail_layers']} tail layers)"
    elif "early_exit_layers" in ident:
        kind = f", early exit at {ident['early_exit_layers']}"
    else:
        kind = ""
    return f"{ident.get('model_type')} {ident.get('n_layers')}L/{ident.get('n_heads')}H #{ident.get('fingerprint')}{kind}"


def is_draft_artifact(path: str | Path) -> bool:
    """Whether ``path`` is a safetensors file carrying specdec's ``specdec_draft`` metadata (what ``specdec
    train-draft`` writes). Reads the header only: 8 bytes of length, then that many bytes of JSON."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 2 <= n <= 100_000_000:  # a text file's first 8 bytes read as an absurd length
                return False
            header = json.loads(f.read(n).decode("utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8 or not JSON (UnicodeDecodeError is a ValueError)
        return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and "specdec_draft" in meta


def check_draft_out(path: str | Path, overwrite: bool, option: str = "--out") -> None:
    """``train-draft --out``: an existing file is replaced only if it is a draft artifact (a head trained again) or
    ``overwrite`` was given; any other file (``--out notes.md``, a model's weights) is refused in one line."""
    p = Path(path)
    if p.is_file() and not overwrite and not is_draft_artifact(p):
        raise SpecdecError(f"{option} {p} exists and is not a specdec draft artifact (a .safetensors file with "
                           f"specdec's metadata); choose another path, or pass --overwrite to replace it.")


def read_draft_artifact(path: str | Path, train: str) -> tuple[Any, dict]:
    """``(metadata or None, tensors)`` of a safetensors draft artifact (``specdec_draft`` metadata).

    ``train`` is the command that writes one, named in the errors: a missing file, and a corrupt or
    foreign one, are bad input (one line each); the caller checks the metadata's keys."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise SpecdecError(f"draft artifact {path} does not exist; train one with `{train}`.")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("specdec_draft", "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # a corrupt or foreign file is bad input
        raise SpecdecError(f"could not read draft artifact {path} ({type(exc).__name__}); "
                           "pass a file written by `specdec train-draft`.") from exc
    return meta, tensors


def save_srh(path: str | Path, payload: dict[str, Any]) -> Path:
    """Write an artifact (atomic). ``payload`` needs target, draft, target_heads, draft_heads, layer_map, m_ratio."""
    missing = {"target", "draft", "target_heads", "draft_heads", "layer_map", "m_ratio"} - set(payload)
    if missing:
        raise SpecdecError(f"SRH artifact is missing {', '.join(sorted(missing))}; build it with `specdec profile-srh`.")
    path = Path(path)
    write_text(path, json.dumps({"format": FORMAT, **payload}, indent=1), "--output")
    return path


def load_srh(path: str | Path, target=None, drafter=None) -> dict[str, Any]:
    """Read an artifact; with ``target``/``drafter`` check it was profiled for that exact pair."""
    p = Path(path)
    if not p.is_file():
        raise SpecdecError(f"SRH artifact {path} does not exist; run `specdec profile-srh --output {path}` first.")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise SpecdecError(f"SRH artifact {path} is not valid JSON (line {exc.lineno}); re-run `specdec profile-srh`.")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SpecdecError(f"{path} is not a {FORMAT} artifact; re-run `specdec profile-srh`.")
    if target is not None and data["target"] != model_identity(target):
        raise SpecdecError(
            f"SRH artifact {path} was profiled for target {_describe(data['target'])}, not "
            f"{_describe(model_identity(target))}; run `specdec profile-srh` for this model pair."
        )
    if drafter is not None and data["draft"] != drafter.identity():
        was, now = data["draft"], drafter.identity()
        if set(was) - {"early_exit_layers"} == set(now) - {"early_exit_layers", "eagle_head", "skip_tail_layers"} \
                and "early_exit_layers" in was and "skip_tail_layers" not in was:
            # profile-srh profiles early-exit drafts; Dustin's default draft for the embedded model is the EAGLE head
            fix = (f"use it with the draft it was made for (--option draft_layers={was['early_exit_layers']}), or run "
                   "`specdec profile-srh` for this draft")
        else:
            fix = "run `specdec profile-srh` for this model pair"
        raise SpecdecError(f"SRH artifact {path} was profiled for draft {_describe(was)}, not {_describe(now)}; {fix}.")
    return data
