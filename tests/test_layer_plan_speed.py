"""benchmarks/gpu/layer_plan_speed.py --smoke (random-weight SmolLM2 shape on the CPU, tiny sizes): dense, the shared
set and the per-layer set each timed, the per-layer plan declared capturable, and the kernels-alone rows (Triton
interpreter) written to the JSON and the Markdown."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_times_every_setting(tmp_path):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels-alone rows need the Triton interpreter on the CPU (the test command sets it)")
    pytest.importorskip("triton", reason="the page kernels need the optional 'triton' package")
    spec = importlib.util.spec_from_file_location("layer_plan_speed", ROOT / "benchmarks" / "gpu" / "layer_plan_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--smoke", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "layer_plan_speed.json").read_text())
    rows = res["rows"]
    assert set(rows) == {"dense T=5", "25% shared", "25% layer_share 0.5"}
    per = rows["25% layer_share 0.5"]
    assert per["plan_type"] == "LayerSetPlan" and per["plan_captured"] is True
    assert all(r["forward_ms"] > 0 for r in rows.values())
    assert {"select_pages, 1 warps", "select_pages, 8 warps"} <= set(res["kernels"])
    md = (tmp_path / "layer_plan_speed.md").read_text()
    assert "| 25% layer_share 0.5 |" in md and "kernels alone" in md
