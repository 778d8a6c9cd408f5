"""``benchmarks/gpu/gemm14.py`` runs end to end on the CPU (``--smoke``: Triton's interpreter, tiny shapes), so the
script that measured the fused-GEMM layer on the H200 cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the fused GEMM kernels need the optional 'triton' package")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu", reason="the CPU smoke of a GPU script")
def test_gemm14_smoke_runs_its_three_parts(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu/gemm14.py"), "--out", str(tmp_path), "--smoke",
                        "--parts", "kernels,steps,e2e", "--apply-best", "--budget-s", "3000"], env=env,
                       capture_output=True, text=True, timeout=1200)  # the script's own 450 s budget skips the
    # parts that would start after it: on a loaded 2-core box the e2e part did not start
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "gemm14.json").read_text())
    assert [row["M"] for row in res["kernels"]["rows"]] == [1, 18]
    for row in res["kernels"]["rows"]:  # each fused kernel ran and matched its chain
        (cfg,) = row["fused"].values()
        assert cfg["dq"] < 1e-4 and cfg["da"] < 1e-4, row
    steps = {row["step"]: row for row in res["steps"]}
    assert set(steps) == {"dense_T1", "sparse5%_T1", "verify_T9"}
    for row in steps.values():  # both arms ran; float32 logits agree to rounding
        assert row["off"]["ms"] > 0 and row["on"]["ms"] > 0 and row["max_abs_logit_diff"] < 1e-4, row
    e2e = [r for r in res["e2e"] if "method" in r]  # the embedded model, both arms, each arm's tokens = dense's
    assert {(r["arm"], r["method"]) for r in e2e} == {(a, m) for a in ("off", "on") for m in ("dense", "magicdec", "vegas")}
    assert all(r["same_tokens"] for r in e2e), e2e
    md = (tmp_path / "gemm14.md").read_text()
    assert "## Steps" in md and "Paired on / off per round" in md
