"""``--help`` of every command is whole at any terminal width: typer's rich panels cut long option names and words
to fit 80 columns (``--record-accept…``, ``Llama/Qwen2/Qwe…``), so below 100 columns (and in a pipe) the help is
click's plain text, wrapped (``specdec.friendly.HelpCommand``)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from specdec.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_cuts_nothing(command):
    cmd = typer.main.get_command(app).commands[command]
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}).output
    assert "…" not in out, out
    words = set(out.replace(",", " ").split())
    for p in cmd.params:
        for opt in [*p.opts, *getattr(p, "secondary_opts", [])]:
            if opt.startswith("--"):
                assert opt in words, f"{command} --help at 80 columns lacks {opt}"
    assert max(len(line) for line in out.splitlines()) <= 80


def test_wide_terminals_keep_the_panels():
    out = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "120"}).output
    assert "╭─ Options" in out and "--record-acceptance" in out
    assert "╭─ Commands" in CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).output
