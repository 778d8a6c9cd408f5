"""``specdec train-draft``: the command around :func:`specdec.train_draft.train` (commands layer,
docs/architecture.md: the training itself is library code, which the ``dustin`` method and the
skip drafter use)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from specdec.errors import SpecdecError
from specdec.train_draft import train


def register(app) -> None:
    """Add ``specdec train-draft`` to the CLI."""
    import typer

    from specdec.friendly import friendly

    @app.command("train-draft")
    @friendly
    def train_draft_cmd(
        model: str = typer.Option("smollm2-135m", help="target model (embedded name, directory or .gguf)"),
        out: Path = typer.Option(Path("draft.safetensors"), help="artifact to write (use it with --option draft=PATH)"),
        k: int = typer.Option(6, help="leading target layers the draft runs"),
        t: int = typer.Option(4, help="trailing target layers the draft runs after the adapter"),
        rank: int = typer.Option(384, help="adapter inner width"),
        tokens: int = typer.Option(30_000, help="training tokens (stdlib sources + pydoc topics, held-out ones excluded)"),
        minutes: float = typer.Option(4.0, help="CPU-time budget of this process (one thread), collection included"),
        full_vocab: float = typer.Option(0.0, "--full-vocab", help="weight of the full-vocabulary CE on the target's argmax"),
        init: Optional[Path] = typer.Option(None, "--init", help="warm start from an artifact of the same k/t/rank"),
        seed: int = typer.Option(0, help="seed of the adapter's initialisation and the batch order"),
    ) -> None:
        """Self-distil a layer-skipping draft (first k layers + adapter + last t layers) from the target."""
        for name, v in (("k", k), ("t", t), ("rank", rank), ("tokens", tokens)):
            if v < 1:
                raise SpecdecError(f"--{name} must be >= 1 (got {v}).")
        if not minutes > 0 or not math.isfinite(minutes):
            raise SpecdecError(f"--minutes must be > 0 (got {minutes}).")
        if full_vocab < 0:
            raise SpecdecError(f"--full-vocab must be >= 0 (got {full_vocab}).")
        from specdec.outputs import check_output

        check_output(out, "--out")
        res = train(model, k=k, t=t, rank=rank, tokens=tokens, minutes=minutes, out=out, seed=seed,
                    full_vocab=full_vocab, init=init, log=lambda s: typer.echo(s, err=True))
        typer.echo(json.dumps({k_: v for k_, v in res.items() if k_ != "target"}, indent=1))
