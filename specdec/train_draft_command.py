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
        kind: str = typer.Option("eagle", help="eagle: an EAGLE head fed the target's hidden states; "
                                 "skip: first k layers + adapter + last t layers"),
        out: Path = typer.Option(Path("draft.safetensors"), help="artifact to write (use it with --option draft=PATH)"),
        k: Optional[int] = typer.Option(None, help="skip only: leading target layers the draft runs (default 6)"),
        t: Optional[int] = typer.Option(None, help="skip only: trailing target layers the draft runs after the adapter "
                                        "(default 4)"),
        rank: Optional[int] = typer.Option(None, help="skip only: adapter inner width (default 384)"),
        tokens: Optional[int] = typer.Option(None, help="training tokens (stdlib sources + pydoc topics, held-out ones "
                                             "excluded; default 100000 for eagle, 30000 for skip; at least one "
                                             "training sequence: --seq for eagle, 256 for skip; collection stops "
                                             "earlier when its share of --minutes is spent)"),
        minutes: Optional[float] = typer.Option(None, help="CPU-time budget of this process (one thread), collection "
                                                "included (default 8 for eagle, 4 for skip)"),
        full_vocab: Optional[float] = typer.Option(None, "--full-vocab", help="skip only: weight of the "
                                                   "full-vocabulary CE on the target's argmax (default 0)"),
        init: Optional[Path] = typer.Option(None, "--init", help="warm start: skip, from an artifact of the same "
                                            "k/t/rank; eagle, from an EAGLE head of this target ('shipped': the "
                                            "packaged one)"),
        seed: int = typer.Option(0, help="seed of the adapter's initialisation and the batch order"),
        device: Optional[str] = typer.Option(None, help="eagle only: cpu (--minutes of CPU time; the default) or cuda "
                                             "(--minutes of wall time)"),
        batch: Optional[int] = typer.Option(None, help="eagle only: sequences per optimizer step (--seq tokens each; "
                                            "default 4)"),
        recipe: Optional[str] = typer.Option(None, help="eagle only: training recipe (default v2; v2: 3 exactly "
                                   "unrolled steps, wide text, "
                                   "cosine schedule; on a GPU 2048-token sequences and the full-vocabulary KL; "
                                   "v3: v2 with the texts packed into one stream, so texts shorter than a sequence "
                                   "count; v4: v3 with every 512 tokens ending in 64 of the target's own greedy "
                                   "continuation; v5: v3 with EAGLE-3's fused features (a low and a middle layer "
                                   "besides the last); v6: v5 with every third row prose ending in the target's "
                                   "sampled continuations; v1: the first shipped head's)"),
        seq: Optional[int] = typer.Option(None, help="eagle only: tokens per training sequence (default: the recipe's; "
                                          "v2: 2048 on a GPU, 256 on the CPU)"),
        overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing --out that is not a draft "
                                       "artifact (one is replaced without it)"),
    ) -> None:
        """Self-distil a draft from the target: an EAGLE head (default) or a layer-skipping draft."""
        if kind not in ("eagle", "skip"):
            raise SpecdecError(f"--kind must be eagle or skip (got {kind!r}).")
        for name, v in (("k", k), ("t", t), ("rank", rank), ("tokens", tokens), ("batch", batch)):
            if v is not None and v < 1:
                raise SpecdecError(f"--{name} must be >= 1 (got {v}).")
        if minutes is not None and (not minutes > 0 or not math.isfinite(minutes)):
            raise SpecdecError(f"--minutes must be > 0 (got {minutes}).")
        if full_vocab is not None and (full_vocab < 0 or not math.isfinite(full_vocab)):
            raise SpecdecError(f"--full-vocab must be >= 0 (got {full_vocab}).")
        if seq is not None and seq < 2:
            raise SpecdecError(f"--seq must be >= 2 (got {seq}).")
        # an option the chosen kind does not read is refused, not ignored
        only = {"skip": (("--k", k), ("--t", t), ("--rank", rank), ("--full-vocab", full_vocab)),
                "eagle": (("--device", device), ("--batch", batch), ("--recipe", recipe), ("--seq", seq))}
        other = "skip" if kind == "eagle" else "eagle"
        foreign = [name for name, v in only[other] if v is not None]
        if foreign:
            what = "an EAGLE head" if kind == "eagle" else "a layer-skipping draft"
            names = ", ".join(foreign[:-1]) + (" and " if len(foreign) > 1 else "") + foreign[-1]
            raise SpecdecError(f"{names} {'is' if len(foreign) == 1 else 'are'} for --kind {other}; leave "
                               f"{'it' if len(foreign) == 1 else 'them'} out for {what}.")
        tokens = tokens if tokens is not None else (100_000 if kind == "eagle" else 30_000)
        minutes = minutes if minutes is not None else (8.0 if kind == "eagle" else 4.0)
        k, t, rank, full_vocab = (k if k is not None else 6), (t if t is not None else 4), \
            (rank if rank is not None else 384), (full_vocab if full_vocab is not None else 0.0)
        batch, recipe = (batch if batch is not None else 4), (recipe if recipe is not None else "v2")
        from specdec.artifacts import check_draft_out
        from specdec.outputs import check_output

        check_output(out, "--out")
        check_draft_out(out, overwrite)  # --out notes.md replaced a text file with safetensors
        log = lambda s: typer.echo(s, err=True)  # noqa: E731
        if kind == "eagle":
            from specdec.loading import resolve_device
            from specdec.train_eagle import RECIPES
            from specdec.train_eagle import train as train_eagle

            if recipe not in RECIPES:
                raise SpecdecError(f"--recipe must be one of {', '.join(RECIPES)} (got {recipe!r}).")
            dev = str(resolve_device(device if device is not None else "cpu"))
            res = train_eagle(model, tokens=tokens, minutes=minutes, out=out, seed=seed, device=dev,
                              batch=batch, recipe=recipe, seq=seq, init=init, log=log)
        else:
            res = train(model, k=k, t=t, rank=rank, tokens=tokens, minutes=minutes, out=out, seed=seed,
                        full_vocab=full_vocab, init=init, log=log)
        typer.echo(json.dumps({k_: v for k_, v in res.items() if k_ != "target"}, indent=1))
