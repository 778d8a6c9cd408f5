"""The project's own checks and first steps: the strict docs build really is strict, setup says what it
does, the package metadata builds without warnings, and tests run one thread per process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_is_strict_and_not_quiet():
    """``-q`` hides the warnings ``--strict`` fails on (griffe's docstring warnings were invisible)."""
    lines = [ln for ln in (ROOT / "scripts/test.sh").read_text().splitlines()
             if "mkdocs build" in ln and not ln.lstrip().startswith("#")]
    assert lines, "scripts/test.sh does not build the docs"
    for ln in lines:
        opts = ln.split("mkdocs build", 1)[1].split(";")[0].split()
        assert "--strict" in opts, ln
        assert not {"-q", "--quiet"} & set(opts), f"quiet strict build hides its warnings: {ln}"


def test_setup_says_each_step():
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh"), "--test", "--dry-run"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    steps = re.findall(r"^\[setup \d+\] (.+)$", proc.stdout, flags=re.M)
    assert len(steps) >= 3, proc.stdout
    for what in ("specdec", "SmolLM2", "[test,docs]"):
        assert any(what in s for s in steps), (what, steps)
    assert "nothing was installed" in proc.stdout
    bad = subprocess.run(["bash", str(ROOT / "scripts/setup.sh"), "--bogus"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--bogus" in bad.stderr


def test_package_metadata_builds_without_warnings(tmp_path):
    """The license is an SPDX string (setuptools deprecates the ``{ text = ... }`` table)."""
    code = ("import sys, warnings; warnings.simplefilter('always'); from setuptools import build_meta as b; "
            "b.prepare_metadata_for_build_wheel(sys.argv[1])")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Warning" not in proc.stderr and "project.license" not in proc.stderr, proc.stderr[-2000:]
    meta = next(tmp_path.glob("*.dist-info/METADATA")).read_text()
    assert "License-Expression: Apache-2.0" in meta


def test_one_thread_per_test_process():
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, timeout=120)
    assert child.stdout.strip() == "1", "processes the tests start must inherit one thread"
