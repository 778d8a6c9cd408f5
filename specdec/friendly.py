"""What every command shares: bad input ends as one ``error: ...`` line on stderr and exit code 2
(Ctrl-C: one line, exit code 130).

Commands layer (docs/architecture.md): the command modules (:mod:`specdec.bench`, :mod:`specdec.tune`,
:mod:`specdec.srh`, :mod:`specdec.fidelity`) and :mod:`specdec.cli` use it; the library never does.
"""

from __future__ import annotations

import shutil
import sys
from functools import wraps
from importlib import import_module
from typing import Any, Callable

import typer
from pydantic import ValidationError
from typer.core import TyperCommand, TyperGroup

from specdec.errors import SpecdecError

#: the click exceptions module typer uses (its vendored copy in typer >= 0.20, click itself before)
_CLICK = sys.modules[typer.BadParameter.__module__]
_CLICK_GLOBALS = import_module(_CLICK.__name__.rsplit(".", 1)[0] + ".globals")  # get_current_context
_NO_ARGS = getattr(_CLICK, "NoArgsIsHelpError", ())  # click < 8.2 prints the help itself

#: Ctrl-C: one line, exit code 130 (128 + SIGINT, the shell convention), no partial output file
INTERRUPTED = "error: interrupted."
EXIT_INTERRUPTED = 130


#: below this terminal width ``--help`` is click's plain text (wrapped, nothing cut); typer's rich panels cut long
#: option names and words to fit ("--record-accept…", "Llama/Qwen2/Qwe…") at 80 columns or in a pipe
RICH_HELP_MIN_COLUMNS = 100


def _plain_help() -> bool:
    return shutil.get_terminal_size().columns < RICH_HELP_MIN_COLUMNS


class HelpCommand(TyperCommand):
    """A command whose ``--help`` is plain, wrapped text on a terminal narrower than :data:`RICH_HELP_MIN_COLUMNS`."""

    def format_help(self, ctx, formatter):  # noqa: ANN001
        if _plain_help():
            return super(TyperCommand, self).format_help(ctx, formatter)  # click's: wraps, never cuts
        return super().format_help(ctx, formatter)


class SpecdecTyper(typer.Typer):
    """``typer.Typer`` whose commands are :class:`HelpCommand` unless one names another class."""

    def command(self, *args: Any, cls: Any = None, **kw: Any):  # noqa: ANN201
        return super().command(*args, cls=cls or HelpCommand, **kw)


class OneLineErrors(TyperGroup):
    """Usage errors (a bad option value, an unknown or missing option) as one ``error: ...`` line, exit 2.

    Typer's default prints a multi-line usage banner and a boxed message; a script reading stderr
    should get the same single line as every other bad input.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: ANN001
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except _CLICK.ClickException as exc:
            cmd = f"{exc.ctx.command_path} --help" if getattr(exc, "ctx", None) is not None else "--help"
            msg = " ".join(exc.format_message().split())
            typer.echo(f"error: {msg.rstrip('.')}; see `{cmd}`.", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt):
                typer.echo(INTERRUPTED, err=True)
                sys.exit(EXIT_INTERRUPTED)
            typer.echo("error: aborted.", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED, err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else 0)


def fail(message: str) -> None:
    """Print one error line and exit 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def friendly(fn: Callable) -> Callable:
    """Turn expected failures into one clear line (exit 2) instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any):
        try:
            check_finite_options(kwargs)
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except SpecdecError as exc:
            fail(str(exc))
        except ValidationError as exc:
            from specdec.registry import format_validation_error

            fail(format_validation_error("config", exc))
        except FileNotFoundError as exc:
            fail(f"file not found: {exc.filename}; check the path.")
        except NotADirectoryError as exc:
            fail(f"{exc.filename}: a parent of this path is a file, not a directory; check the path.")
        except IsADirectoryError as exc:
            fail(f"{exc.filename} is a directory, not a file; pass a file path.")
        except PermissionError as exc:
            fail(f"permission denied: {exc.filename}; check the file's permissions.")
        except FloatingPointError as exc:
            fail(str(exc))
        except torch_oom() as exc:  # type: ignore[misc]
            fail(f"out of memory ({str(exc).splitlines()[0]}); use a smaller --batch-size or --context-tokens.")
        except RuntimeError as exc:
            if "can't allocate memory" not in str(exc) and "not enough memory" not in str(exc):
                raise
            from specdec.memory import oom_message

            fail(oom_message(kwargs.get("batch_size"), kwargs.get("context_tokens"),
                             f" ({str(exc).splitlines()[0].split('] ')[-1].rstrip('.')})"))
        except KeyboardInterrupt:
            typer.echo(INTERRUPTED, err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def check_finite_options(values: dict[str, Any]) -> None:
    """Refuse ``inf``/``nan`` for every float option of the running command, naming the option."""
    import math

    ctx = _CLICK_GLOBALS.get_current_context(silent=True)
    if ctx is None:
        return
    for param in ctx.command.params:
        v = values.get(param.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecdecError(f"{param.opts[0]} must be a finite number (got {v}).")


def torch_oom() -> type[BaseException]:
    import torch

    return torch.OutOfMemoryError
