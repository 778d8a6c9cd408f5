"""benchmarks/gpu/dustin_budget_speed.py --smoke (the embedded model on the CPU): dense first, then every setting on the
same documents, with its budget and options, and the ratios and agreements against dense's row of that document."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    path = ROOT / "benchmarks" / "gpu" / "dustin_budget_speed.py"
    spec = importlib.util.spec_from_file_location("dustin_budget_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_settings_run_against_dense(tmp_path):
    settings = {"25%": [0.25, {}], "full budget": [1.0, {"lookup_min": 0}]}
    assert _script().main(["--smoke", "--out", str(tmp_path), "--documents", "pydoc",
                           "--settings", json.dumps(settings)]) == 0
    rows = json.loads((tmp_path / "budget_speed.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == ["dense", "25%", "full budget"]
    dense, quarter, full = rows
    assert dense["speedup_vs_dense"] == 1.0 and dense["token_agreement"] == 1.0 and dense["tau"] == 1.0
    for r in rows:
        assert r["tokens_per_second"] > 0 and r["tps_min_max"][0] <= r["tokens_per_second"] <= r["tps_min_max"][1]
        assert abs(r["speedup_vs_dense"] - r["tokens_per_second"] / dense["tokens_per_second"]) < 1e-9
        assert (r["token_agreement"] == 1.0) == r["same_tokens_as_dense"]  # agreement counts up to the first difference
    # a budget of the whole context verifies densely: greedy output equals dense's
    assert full["token_agreement"] == 1.0 and full["same_tokens_as_dense"] is True
    assert 0.0 <= quarter["token_agreement"] <= 1.0
    md = (tmp_path / "budget_speed.md").read_text()
    assert "| pydoc | 25% |" in md and "| pydoc | full budget |" in md


def test_dense_text_replays_dense_verifications_acceptance(tmp_path):
    """--dense-text: a trace recorded by dense verification of Dustin's drafter (dense's tokens), then every setting
    again with that acceptance replayed, labelled as such."""
    settings = {"25%": [0.25, {}]}
    assert _script().main(["--smoke", "--out", str(tmp_path), "--documents", "pydoc", "--dense-text",
                           "--settings", json.dumps(settings)]) == 0
    data = json.loads((tmp_path / "budget_speed.json").read_text())
    rows = data["rows"]
    assert [r["setting"] for r in rows] == ["dense", "25%", "25% (dense's text)"]
    assert [r["replayed"] for r in rows] == [False, False, True]
    trace = data["dense_text"]["pydoc"]
    assert trace["equals_dense"] is True  # dense verification emits dense's tokens
    recorded = json.loads(Path(trace["path"]).read_text())
    assert recorded["rounds"] and recorded["tau"] == trace["tau"]
    # the replayed row accepts what the recording accepted (its rounds cycled over the batch)
    assert abs(rows[2]["tau"] - trace["tau"]) < 0.5
    md = (tmp_path / "budget_speed.md").read_text()
    assert "| pydoc | 25% (dense's text) |" in md and "(replayed)" in md and "Dense's text of pydoc" in md
