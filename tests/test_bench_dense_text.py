"""``specdec bench --dense-text``: a near-lossless method (Dustin) is also timed on dense's text — the acceptance its
drafter reaches under dense verification, recorded by the same engine and replayed — and lossless methods are not."""

from __future__ import annotations

import json

from specdec import PipelineConfig, build_engine
from specdec.bench import _prefilled, dense_text_replay, run_bench
from specdec.loading import load_model


def test_dense_text_rows_follow_near_lossless_rows_only(tmp_path):
    rows = run_bench(["dense", "dustin", "magicdec"], [128], [2], ["pydoc"], 8, None, 0.25, 4, "smollm2-135m",
                     "reference", "float32", "cpu", False, tmp_path, "dt", repeats=1, adaptive=False, dense_text=True)
    assert [(r["method"], bool(r.get("dense_text"))) for r in rows] == [
        ("dense", False), ("dustin", False), ("dustin", True), ("magicdec", False)]
    free, dt = rows[1], rows[2]
    assert free["lossless"] is False and not free.get("replayed")
    assert dt["replayed"] is True and dt["dense_text_equals_dense"] is True  # dense verification: dense's tokens
    assert abs(dt["tau"] - dt["dense_text_tau"]) < 1e-9  # the recorded rounds, replayed at the same batch
    # interleaved (the default): against the dense run timed just before it (one repeat: one pair)
    assert dt["speedup_vs_dense"] == dt["tokens_per_second"] / dt["dense_paired_tokens_per_second"]
    assert dt["dense_paired_same_tokens"] is True
    assert "same_tokens_as_dense" not in dt and rows[3]["same_tokens_as_dense"] is True
    md = (tmp_path / "dt.md").read_text()
    assert "| dustin (dense's text) |" in md and "| dustin |" in md
    assert json.loads((tmp_path / "dt.json").read_text())["rows"][2]["dense_text"] is True


def test_dense_text_replay_leaves_the_engine_as_it_was():
    m = load_model("smollm2-135m", "float32", "cpu", "reference")
    eng = build_engine(m, PipelineConfig.make(method="dustin", gamma=4, budget_ratio=0.25, adaptive=False),
                       eos_token_id=-1)
    ids = m.tokenizer("def f(x):\n    return x + 1\n" * 12, add_special_tokens=False).input_ids[:120]
    m.new_cache(1, 160, reuse=True)
    pre = _prefilled(eng, m, [ids], 1, random_cache=False)
    verifier = eng.verifier
    replay, run = dense_text_replay(eng, pre, 8)
    assert eng.verifier is verifier and eng.lossless is False and eng.replay is None and not eng.record_acceptance
    assert run.stats.lossless is True and replay.rounds and abs(1 + replay.mean_accepted - run.stats.mean_accepted_length) < 0.5
