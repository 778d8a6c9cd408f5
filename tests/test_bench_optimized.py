"""``benchmarks/gpu/bench_optimized.py``: argument parsing, and every code path at toy sizes on the CPU
(Triton interpreter) so the one GPU call it is written for does not fail on a typo."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

# a CPU-only test module: it must not switch Triton to its interpreter in a GPU session (pytest imports
# every module at collection, so the variable would reach the compiled GPU tests collected with it)
_GPU_SESSION = os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cuda"
if not _GPU_SESSION:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402

if _GPU_SESSION:
    pytest.skip("CPU-only test (Triton interpreter); run it without SPECDEC_TEST_DEVICE=cuda", allow_module_level=True)

pytest.importorskip("triton", reason="the benchmark needs the optional 'triton' package")

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "bench_optimized.py"


def _load():
    spec = importlib.util.spec_from_file_location("bench_optimized", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_args():
    mod = _load()
    a = mod.parse_args(["--out", "x.json"])
    assert a.out == "x.json" and a.sections == ["sparse", "scores", "quest"] and not a.tiny
    assert mod.parse_args(["--sections", "quest, sparse", "--tiny"]).sections == ["quest", "sparse"]
    with pytest.raises(SystemExit):
        mod.parse_args(["--sections", "sparse,bogus"])


def test_tiny_run_writes_json(tmp_path):
    mod = _load()
    out = tmp_path / "r.json"
    mod.main(["--tiny", "--out", str(out)])
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert {r["section"] for r in rows} == {"sparse", "scores", "quest"}
    assert len([r for r in rows if r["section"] == "sparse"]) == 2 * len(mod.SPARSE_VARIANTS)
    assert all(r["eager_us"] is not None and r["eager_us"] > 0 for r in rows)
    assert all(r["rel_err"] < 1e-4 for r in rows if r.get("rel_err") is not None)
    assert "| sparse |" in res["table_md"]
