"""The wheel ships the test kit: build it, install it in a fresh venv with a 28-line selector plugin,
and run ``pytest --pyargs specdec.testing`` there, away from the source tree.

The fresh venv gets specdec and the plugin from their wheels; the third-party dependencies (torch,
transformers, pytest, ...) come from this interpreter's site-packages through a plain path line in a
``.pth`` file (not ``--system-site-packages``, and without running that directory's ``.pth`` hooks,
so the source checkout's editable install stays invisible). The test asserts that ``specdec`` and
``specdec.testing`` are imported from the fresh venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = Path(__file__).resolve().parent / "plugin_knorm"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_installed_wheel_runs_the_kit_on_a_plugin(tmp_path):
    src = tmp_path / "src"  # build from the files git knows (no build/ or caches of the worktree)
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode == 0:
        for rel in filter(None, listed.stdout.decode().split("\0")):
            if (ROOT / rel).is_file():
                dest = src / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes((ROOT / rel).read_bytes())
    else:  # not a git checkout (an exported tree): copy it without environments and build outputs
        shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
            ".venv", ".git", "site", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"))
    plugin = tmp_path / "plugin"  # pip builds in place (build/, *.egg-info): never in the shared source tree
    shutil.copytree(PLUGIN, plugin, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    wheels = tmp_path / "wheels"
    for project in (src, plugin):
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
             str(project)], cwd=tmp_path)
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("specdec-") for n in names) and any(n.startswith("knorm_plugin-") for n in names), names
    # the trained drafts ship inside the wheel (package-data), each within the 10 MB budget
    shipped = sorted(p.name for p in (ROOT / "specdec" / "draft_weights").glob("*.safetensors"))
    assert shipped and all((ROOT / "specdec" / "draft_weights" / n).stat().st_size < 10 * 2**20 for n in shipped)
    with zipfile.ZipFile(next(wheels.glob("specdec-*.whl"))) as whl:
        in_wheel = sorted(n.rsplit("/", 1)[1] for n in whl.namelist() if n.startswith("specdec/draft_weights/"))
    assert in_wheel == shipped, f"draft weights in the wheel {in_wheel}, in the source tree {shipped}"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q",
         *map(str, sorted(wheels.glob("*.whl")))])

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECDEC_TESTING_ONLY")}
    where = run([str(py), "-c", "import specdec.testing, knorm_plugin; print(specdec.testing.__file__)"],
                cwd=tmp_path, env=env).stdout.strip()
    assert where.startswith(str(venv)), f"specdec.testing came from {where}, not the fresh venv"
    proc = run([str(py), "-m", "pytest", "--pyargs", "specdec.testing", "-q", "-p", "no:cacheprovider",
                "-k", "knorm or reference"], cwd=tmp_path, env=env)
    assert "2 passed" in proc.stdout, proc.stdout[-2000:]
