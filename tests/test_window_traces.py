"""``benchmarks/gpu/window_traces.py``: one acceptance trace over several windows of a document (the first tokens after
each), which ``bench --acceptance-trace`` replays; the embedded model's greedy text loops within ~100 tokens, so a
trace of one long continuation is mostly that loop."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

from specdec import PipelineConfig, build_engine
from specdec.adaptive import AcceptanceReplay
from specdec.loading import load_model
from specdec.prompts import encode_text

ROOT = Path(__file__).resolve().parents[1]


def test_window_traces_concatenate_every_windows_rounds(tmp_path):
    spec = importlib.util.spec_from_file_location("window_traces", ROOT / "benchmarks" / "gpu" / "window_traces.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    doc = textwrap.__file__
    assert mod.main(["--document", doc, "--methods", "magicdec", "--windows", "2", "--stride", "40", "--context", "160",
                     "--new", "10", "--gamma", "3", "--budget-ratio", "0.2", "--device", "cpu", "--out",
                     str(tmp_path)]) == 0
    data = json.loads((tmp_path / "textwrap_magicdec.json").read_text())
    assert (data["windows"], data["stride"], data["new_tokens"], data["gamma"]) == (2, 40, 10, 3)
    # the same two windows, run here: the trace is their rounds, in window order
    m = load_model("smollm2-135m", "float32", "cpu", "reference")
    ids = encode_text(m.tokenizer, Path(doc).read_text(encoding="utf-8"), False)
    eng = build_engine(m, PipelineConfig.make(method="magicdec", gamma=3, budget_ratio=0.2, adaptive=False))
    eng.record_acceptance = True
    want, taus = [], []
    for k in range(2):
        res = eng.generate([ids[: len(ids) - 40 * k][-160:]], max_new_tokens=10)
        want += res.stats.acceptance_trace
        taus.append(res.stats.mean_accepted_length)
    assert data["rounds"] == want and data["window_tau"] == taus
    replay = AcceptanceReplay.load(tmp_path / "textwrap_magicdec.json")
    assert abs(1 + replay.mean_accepted - data["tau"]) < 1e-9
