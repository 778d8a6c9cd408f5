"""The de-quantized model cache under ``$SPECDEC_CACHE`` is safe to fill from several processes at once
(parallel test workers, two CLI runs): one process builds, the others wait and read the finished copy,
and no process ever sees a half-written directory (``specdec.models._build_cached``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specdec.errors import SpecdecError
from specdec.models import _build_cached

WEIGHTS = b"w" * (1 << 20)

# A process that waits for GO, then builds DEST the way load_hf does: the marker first, the weights after
# a pause (a real build writes config.json long before the weights are complete), each build logged.
BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from specdec.models import _build_cached

    ready, go, dest, log, pause = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], float(sys.argv[5])

    def build(tmp):
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\\n")
        (tmp / "config.json").write_text("{}")
        time.sleep(pause)
        (tmp / "model.safetensors").write_bytes(b"w" * (1 << 20))

    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    _build_cached(dest, "config.json", build)
    assert (dest / "model.safetensors").read_bytes() == b"w" * (1 << 20), "read an incomplete cache"
    print("ok")
""")

# The real thing: load_hf of the embedded model into an empty $SPECDEC_CACHE, started at the same moment.
LOADER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import specdec.models

    save = specdec.models._save_dequantized

    def logged(*args):  # count the conversions
        with open(sys.argv[3], "a") as f:
            f.write("built\\n")
        save(*args)

    specdec.models._save_dequantized = logged
    Path(sys.argv[1]).touch()
    while not Path(sys.argv[2]).exists():
        time.sleep(0.01)
    hf, tok = specdec.models.load_hf("smollm2-135m")
    print(hf.config.num_hidden_layers, len(tok))
""")


def _start(tmp_path: Path, code: str, n: int, *args, env: dict | None = None) -> list[subprocess.Popen]:
    """``n`` processes running ``code`` that start its work together once all are ready (imports done)."""
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"ready{i}"), str(go), *map(str, args)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for i in range(n)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(n)):
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
        assert time.monotonic() < deadline, "the builder processes did not start"
        time.sleep(0.02)
    go.touch()
    return procs


def _leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir() if p.name != dest.name)


def test_processes_building_at_once_build_once_and_all_read_it(tmp_path):
    cache = tmp_path / "cache"
    dest = cache / "model-123"
    procs = _start(tmp_path, BUILDER, 3, dest, tmp_path / "builds.log", 1.0)
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in results]
    builds = (tmp_path / "builds.log").read_text().split()
    assert len(builds) == 1, f"{len(builds)} processes built the same cache"
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert _leftovers(dest) == [], "a lock file or a temporary directory was left in the cache"


def test_a_cache_being_written_is_never_visible(tmp_path):
    """While a build runs, ``dest/config.json`` (what loaders test for) exists only with the weights complete."""
    dest = tmp_path / "cache" / "model-123"
    (proc,) = _start(tmp_path, BUILDER, 1, dest, tmp_path / "builds.log", 1.5)
    while proc.poll() is None:
        if (dest / "config.json").is_file():
            assert (dest / "model.safetensors").is_file() and (dest / "model.safetensors").stat().st_size == len(WEIGHTS), \
                "config.json visible before the weights were complete"
        time.sleep(0.005)
    out, err = proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert (dest / "config.json").is_file() and _leftovers(dest) == []


def test_an_incomplete_cache_and_a_stale_build_are_replaced(tmp_path):
    dest = tmp_path / "model-123"
    dest.mkdir()
    (dest / "model.safetensors").write_bytes(b"half")  # no config.json: an interrupted older copy
    (tmp_path / "model-123.tmp99999").mkdir()  # left by a process killed mid-build
    _build_cached(dest, "config.json", lambda tmp: [(tmp / "config.json").write_text("{}"),
                                                   (tmp / "model.safetensors").write_bytes(WEIGHTS)])
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    assert _leftovers(dest) == []
    _build_cached(dest, "config.json", lambda tmp: pytest.fail("built a second time"))


def test_a_failed_build_leaves_nothing(tmp_path):
    dest = tmp_path / "model-123"

    def fail(tmp):
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("planted")

    with pytest.raises(RuntimeError, match="planted"):
        _build_cached(dest, "config.json", fail)
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_two_processes_loading_the_embedded_model_into_an_empty_cache(tmp_path):
    """What two test workers do at the start of a parallel run: both load, one copy is made, nothing is left over."""
    from specdec.models import embedded_model_path

    try:
        g = embedded_model_path("smollm2-135m")
    except SpecdecError:
        pytest.skip("embedded model package not installed")
    cache = tmp_path / "cache"
    env = dict(os.environ, SPECDEC_CACHE=str(cache), HF_HUB_OFFLINE="1")
    procs = _start(tmp_path, LOADER, 2, tmp_path / "builds.log", env=env)
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in results]
    assert (tmp_path / "builds.log").read_text().split() == ["built"], "the model was converted more than once"
    assert results[0][0] == results[1][0]
    assert sorted(os.listdir(cache)) == [f"{g.stem}-{g.stat().st_size}"], "a lock file or a temporary copy was left"
    assert (cache / f"{g.stem}-{g.stat().st_size}" / "model.safetensors").is_file()
