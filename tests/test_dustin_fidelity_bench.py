"""benchmarks/dustin_fidelity.py --smoke (the GPU script f15_fidelity.sh runs it): every variant runs free, the tasks
go through specdec eval's paired comparison, and each part's time box is its own."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("dustin_fidelity", ROOT / "benchmarks" / "dustin_fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BASE = ["--smoke", "--context", "4096", "--budgets", "1024", "--documents", "stdlib:textwrap", "--new-tokens", "8",
        "--margins", "0.5,1", "--variants", '{"dustin": {}, "valve1": {"margin": 1.0}}', "--tasks", "passkey",
        "--samples", "1", "--task-context", "4096", "--task-budget", "1024"]


def test_variants_tasks_and_valve_replay(tmp_path):
    assert _bench().main(BASE + ["--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "fidelity.json").read_text())
    assert res["failures"] == []
    doc = res["documents"][0]
    b = res["meta"]["budgets"][0]
    assert float(b) == 0.25  # 1024 of 4096 keeps its share at the smoke's 256 tokens
    assert set(doc["budgets"][b]["valve"]) == {"0.5", "1.0"}
    assert set(doc["free"][b]) == {"dustin", "valve1"}
    ev = json.loads((tmp_path / "tasks.json").read_text())
    assert set(ev["summary"]) == {"dustin", "valve1"}
    assert ev["summary"]["valve1"]["tasks"]["passkey"]["n"] == 1
    assert ev["meta"]["methods"]["valve1"]["margin"] == 1.0
    assert "valve1" in (tmp_path / "fidelity.md").read_text() and "Δ valve1" in (tmp_path / "tasks.md").read_text()


def test_each_part_has_its_own_time_box(tmp_path):
    """A zero task box skips every task (recorded) but not the document parts before it."""
    assert _bench().main(BASE + ["--task-budget-s", "0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "fidelity.json").read_text())
    assert [f["part"] for f in res["failures"]] == ["passkey#0"]
    assert res["documents"] and res["documents"][0]["free"]
    assert not (tmp_path / "tasks.json").exists()
