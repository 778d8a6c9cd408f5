"""``benchmarks/gpu/spread14.py`` (Vegas' spread through Triton launches vs PyTorch): its micro part under the
interpreter at a tiny shape checks what the GPU run checks (the launch keeps the same scores and plans) and reports."""

import importlib.util
import os
from pathlib import Path

import pytest

pytest.importorskip("triton")
PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "spread14.py"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="needs TRITON_INTERPRET=1 on the CPU")
def test_micro_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("spread14", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    import argparse

    import torch

    a = argparse.Namespace(smoke=True, reps=1)
    row = mod.micro_shape("smoke B3 x 300", 3, 3, 3, 300, a, torch.device("cpu"), lambda m: None)
    assert row["kept_scores_equal"] and row["plans_equal"] and row["passes_equal"] and row["spread"] == 8
    assert {"pytorch", "launch", "launch+auto"} <= set(row)
    md = mod.markdown(dict(date="d", gpu="cpu", argv="x", micro=[row], e2e=[
        dict(document="d", setting="launch", method="magicdec", tok_s=10.0, tok_s_min=9.0, tok_s_max=11.0, tau=5.0,
             same_tokens=True, select_ms_per_iter=0.3, verify_ms_per_iter=1.0),
        dict(document="d", setting="launch", method="vegas", tok_s=11.0, tok_s_min=10.0, tok_s_max=12.0, tau=6.0,
             same_tokens=True, select_ms_per_iter=0.5, verify_ms_per_iter=1.1)]))
    assert "| smoke B3 x 300 |" in md and "| d | launch | vegas | 6.00 | 11 (10–12) | 1.100 |" in md
