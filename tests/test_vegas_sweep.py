"""``benchmarks/gpu/vegas_sweep.py`` (how Vegas' ``spread`` default was chosen): variant parsing, per-sequence τ
from an acceptance trace, and the report's per-document ratios, on hand-made runs (no model)."""

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "vegas_sweep.py"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("vegas_sweep", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_parse_variants(sweep):
    v = sweep.parse_variants('magicdec=magicdec; a=vegas-all:{"spread": 4, "recent": 64};')
    assert v == [("magicdec", "magicdec", {}), ("a", "vegas-all", {"spread": 4, "recent": 64})]
    names = [n for n, _, _ in sweep.parse_variants(sweep.VARIANTS)]
    assert names[0] == "magicdec" and len(names) == len(set(names))


def test_per_sequence_tau_skips_finished_sequences(sweep):
    trace = [[3, 0], [1, -1], [-1, -1]]  # sequence 1 finished after round 0
    assert sweep.per_sequence_tau(trace, 2) == [1.0 + 4 / 2, 1.0]


def test_report_ratios_and_counts(sweep):
    res = dict(date="d", gpu=None, args={}, sets={"held": ["code:a", "code:a", "prose:b"]}, runs=[
        dict(set="held", variant="magicdec", method="magicdec", gamma=8, tau=5.0,
             tau_by_doc={"code:a": 4.0, "prose:b": 6.0}),
        dict(set="held", variant="v", method="vegas", gamma=8, tau=6.0, tau_by_doc={"code:a": 6.0, "prose:b": 6.0}),
        dict(set="held", variant="w", error="Traceback ... boom"),
    ])
    md = sweep.report_md(res)
    # geo-mean of 6/4 and 6/6 = sqrt(1.5) = 1.225; ahead on one document of two
    assert "| v | 6.00 | 1.225 | 1/2 | 6.00 | 6.00 |" in md
    assert "| magicdec | 5.00 | 1.000 | 0/2 | 4.00 | 6.00 |" in md
    assert "## Not run" in md and "boom" in md
