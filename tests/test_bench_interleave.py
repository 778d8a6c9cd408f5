"""``specdec bench --interleave`` (the default): the method's engine and the setting's dense engine take turns (an
untimed run, then a timed one), and the row's speed-up is the median of the ratios of each timed method run to the
dense run timed just before it. Before, dense was timed once, first, and a
ratio of two medians timed a minute apart moved by ±8 % at B = 1 on an H200 for rows doing identical work."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from specdec.bench import _paired_fields, run_bench
from specdec.engine import SpeculativeEngine


def _run(tokens_per_second: float, tokens):
    return SimpleNamespace(stats=SimpleNamespace(tokens_per_second=tokens_per_second), tokens=tokens)


def test_paired_fields_take_the_median_ratio_and_check_the_dense_runs_tokens():
    partners = [_run(100.0, [[1, 2]]), _run(50.0, [[1, 2]]), _run(80.0, [[1, 2]])]
    f = _paired_fields(([1.5, 0.9, 1.0], partners), [[1, 2]])
    assert f["speedup_vs_dense"] == 1.0 and (f["speedup_paired_min"], f["speedup_paired_max"]) == (0.9, 1.5)
    assert f["dense_paired_tokens_per_second"] == 80.0
    assert (f["dense_paired_tokens_per_second_min"], f["dense_paired_tokens_per_second_max"]) == (50.0, 100.0)
    assert f["dense_paired_same_tokens"] is True
    partners[1] = _run(50.0, [[1, 3]])  # a dense run that a method run before it changed
    assert _paired_fields(([1.5, 0.9, 1.0], partners), [[1, 2]])["dense_paired_same_tokens"] is False
    assert _paired_fields(([1.0], partners[:1]), None)["dense_paired_same_tokens"] is None


@pytest.mark.parametrize("interleave", [True, False])
def test_methods_alternate_with_dense_and_the_ratio_is_paired(tmp_path, monkeypatch, interleave):
    calls = []
    plain = SpeculativeEngine.generate

    def logged(self, *args, **kwargs):
        out = plain(self, *args, **kwargs)
        calls.append((self.method, out.stats.tokens_per_second))
        return out

    monkeypatch.setattr(SpeculativeEngine, "generate", logged)
    rows = run_bench(["dense", "magicdec"], [96], [2], ["stdlib:textwrap"], 6, 24, None, 3, "smollm2-135m",
                     "reference", "float32", "cpu", False, tmp_path, "i", repeats=3, adaptive=False,
                     interleave=interleave)
    dense, spec = rows
    order = [m for m, _ in calls]
    if not interleave:
        assert order == ["dense"] * 3 + ["magicdec"] * 3
        assert spec["speedup_vs_dense"] == spec["tokens_per_second"] / dense["tokens_per_second"]
        assert "dense_paired_tokens_per_second" not in spec
        assert "ratio of the two rows' medians" in (tmp_path / "i.md").read_text()
        return
    # turns of an untimed run (the switch) and a timed one: no timed run is the first after the other engine's
    assert order == ["dense"] * 3 + ["dense", "dense", "magicdec", "magicdec"] * 3
    pairs = [(calls[i + 1][1], calls[i + 3][1]) for i in range(3, 15, 4)]
    ratios = sorted(m / d for d, m in pairs)
    assert spec["speedup_vs_dense"] == ratios[1]
    assert spec["speedup_medians"] == spec["tokens_per_second"] / dense["tokens_per_second"]  # kept next to it
    assert (spec["speedup_paired_min"], spec["speedup_paired_max"]) == (ratios[0], ratios[2])
    assert spec["dense_paired_tokens_per_second"] == sorted(d for d, _ in pairs)[1]
    assert spec["dense_paired_same_tokens"] is True and spec["same_tokens_as_dense"] is True
    assert "speedup_vs_dense" in dense and "dense_paired_tokens_per_second" not in dense  # dense: its own runs
    data = json.loads((tmp_path / "i.json").read_text())
    assert data["meta"]["interleave"] is True and data["rows"][1]["speedup_paired_min"] == ratios[0]
    md = (tmp_path / "i.md").read_text()
    assert "dense and each method took turns (an untimed run, then a timed one, each turn)" in md
    assert f"{ratios[1]:.2f}× ({ratios[0]:.2f}–{ratios[2]:.2f})" in md
