"""Speculation that never loses: adaptive γ, dense fall-back, acceptance traces, ``bench --shape``."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.adaptive import AcceptanceReplay, SpeculationController, save_trace
from specdec.errors import SpecdecError

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]


def _engine(model, method, adaptive=True, gamma=3, **kw):
    cfg = PipelineConfig.make(method=method, gamma=gamma, budget=12, sinks=2, recent=4, adaptive=adaptive, **kw)
    return build_engine(model, cfg, eos_token_id=-1)


# -- the controller on synthetic observations (deterministic) ---------------------------------------
def test_gamma_ladder():
    from specdec.adaptive import gamma_ladder

    assert gamma_ladder(4) == (1, 2, 4) and gamma_ladder(6) == (1, 2, 3, 6) and gamma_ladder(1) == (1,)


def test_gamma_moves_on_its_ladder_with_acceptance():
    c = SpeculationController(8, fall_back=False)
    assert c.next_gamma() == 8
    c.observe_round(8, 1.0, 1.0)  # one collapsed round: no move yet (hysteresis)
    assert c.next_gamma() == 8
    c.observe_round(8, 1.0, 1.0)  # two: down to the largest rung <= ceil(a) + 1
    assert c.next_gamma() == 2
    c.observe_round(2, 2.0, 1.0)  # saturated: one rung up
    assert c.next_gamma() == 4
    c.observe_round(4, 2.6, 1.0)  # neither: stays
    assert c.next_gamma() == 4
    for _ in range(5):
        c.observe_round(c.gamma, float(c.gamma), 1.0)
    assert c.next_gamma() == 8  # never above the configured γ
    fixed = SpeculationController(6, adapt_gamma=False, fall_back=False)
    fixed.observe_round(6, 0.0, 1.0)
    fixed.observe_round(6, 0.0, 1.0)
    assert fixed.next_gamma() == 6


def _drive(c, t_round, t_dense, accepted, n=80, warm=()):
    """``warm``: iterations whose sample is a capture (``None``) and 50x slower."""
    kinds = []
    for i in range(n):
        g = c.next_gamma()
        kinds.append(g)
        t = t_dense if g == 0 else t_round(g)
        if i in warm:
            t = None
        if g == 0:
            c.observe_dense(t)
        else:
            c.observe_round(g, min(g, accepted), t)
    return kinds


def test_falls_back_to_dense_when_drafting_cannot_pay_and_probes_back():
    # B = 1 on a tiny model: a draft step costs a dense step, so a round of γ = 4 costs 5 dense steps
    c = SpeculationController(4)
    kinds = _drive(c, lambda g: (g + 1) * 1.0, 1.0, accepted=2.0)
    assert c.dense_mode and kinds[-40:].count(0) >= 34  # dense from then on ...
    assert 0 < kinds[-40:].count(0) < 40  # ... with speculative probes now and then


def test_keeps_speculating_when_it_pays_with_rare_dense_probes():
    c = SpeculationController(4)
    kinds = _drive(c, lambda g: 1.0 + 0.1 * g, 1.0, accepted=3.5, n=200)
    assert not c.dense_mode
    assert kinds.count(0) <= 2 + 200 // 64  # the first measurements + one probe per 4·probe_every rounds


def test_capture_iterations_are_not_costs():
    """What made it fall back on the H200: an iteration that captured a graph or compiled counted as a
    cost. Samples flagged as warm-ups (``None``) and one-off outliers must not move the decision."""
    c = SpeculationController(4)
    kinds = []
    for i in range(120):
        g = c.next_gamma()
        kinds.append(g)
        if g == 0:
            c.observe_dense(1.0)
        else:
            t = 1.6 + 0.1 * g  # speculation pays: (4 + 1) / 2.0 = 2.5 tokens per dense-step time
            c.observe_round(g, float(g), None if i < 3 else (80.0 if i in (10, 40) else t))
    assert not c.dense_mode and kinds[-60:].count(0) <= 2
    assert c.discarded >= 5


def test_hysteresis_does_not_flap_near_break_even():
    c = SpeculationController(4)
    ratios = [1.015, 0.985] * 60  # speculation within ±1.5 % of dense: one mode, no flapping
    switches, last = 0, None
    for r in ratios:
        g = c.next_gamma()
        if g == 0:
            c.observe_dense(1.0)
        else:
            c.observe_round(g, 4.0, 5.0 / r)
        if last is not None and c.dense_mode != last:
            switches += 1
        last = c.dense_mode
    assert switches == 0


def test_estimates_carry_over_between_calls_of_one_shape():
    c = SpeculationController(4)
    c.start_run(1, 8000)
    _drive(c, lambda g: (g + 1) * 1.0, 1.0, accepted=2.0, n=20)
    assert c.dense_mode
    c.start_run(1, 8100)  # same batch, same context scale: it still knows dense wins
    assert c.dense_mode
    assert _drive(c, lambda g: (g + 1) * 1.0, 1.0, accepted=2.0, n=16).count(0) >= 13
    c.start_run(16, 8000)  # another batch: start over, speculate first
    assert not c.dense_mode and c.next_gamma() == 4


def test_pacing_discards_iterations_that_captured(monkeypatch):
    import specdec.adaptive as adaptive
    from specdec.adaptive import Pacing

    events = [0]
    monkeypatch.setattr(adaptive, "warm_up_events", lambda: events[0])
    seen = []

    class Rec:
        def next_gamma(self):
            return 4

        def observe_round(self, g, a, t):
            seen.append(t)

    p = Pacing(Rec(), 4)
    p.next_gamma()
    events[0] += 1  # a capture during the iteration
    p.round_done(4, 3.0)
    p.next_gamma()
    p.round_done(4, 3.0)
    assert seen[0] is None and seen[1] is not None and seen[1] >= 0


def test_one_switch_for_the_default():
    from specdec import PipelineConfig
    from specdec.adaptive import ADAPTIVE_DEFAULT

    assert PipelineConfig.make(method="vegas").adaptive is ADAPTIVE_DEFAULT
    m = make_tiny("llama")
    assert build_engine(m, PipelineConfig.make(method="vegas")).adaptive is ADAPTIVE_DEFAULT


# -- the engine: greedy output unchanged, fall-back only where it may run ---------------------------
@pytest.mark.parametrize("method", ["magicdec", "vegas", "quest"])
def test_adaptive_greedy_output_equals_dense(method):
    m = make_tiny("llama")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=24).tokens
    res = _engine(m, method, adaptive=True).generate(PROMPTS, max_new_tokens=24)
    assert res.tokens == want
    assert len(res.stats.gamma_per_round) + res.stats.dense_steps == res.stats.iterations


class _Script:
    """A controller that follows a fixed script of γ_t (0 = dense) and records what it saw."""

    def __init__(self, script):
        self.script, self.i, self.seen = script, 0, []

    def next_gamma(self):
        g = self.script[self.i % len(self.script)]
        self.i += 1
        return g

    def observe_round(self, g, a, t):
        self.seen.append(("round", g))

    def observe_dense(self, t):
        self.seen.append(("dense", 0))


@pytest.mark.parametrize("method", ["magicdec", "vegas"])
def test_dense_steps_and_varying_gamma_keep_greedy_output(monkeypatch, method):
    m = make_tiny("qwen3")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=20).tokens
    eng = _engine(m, method, gamma=4)
    script = _Script([0, 0, 4, 1, 0, 3, 2])
    monkeypatch.setattr(eng, "_controller", lambda gamma: script)
    res = eng.generate(PROMPTS, max_new_tokens=20)
    assert res.tokens == want
    assert res.stats.dense_steps == sum(1 for k, _ in script.seen if k == "dense") > 0
    assert set(res.stats.gamma_per_round) == {1, 2, 3, 4}


def test_fall_back_only_for_drafters_on_the_targets_cache():
    m = make_tiny("llama")
    assert _engine(m, "vegas")._controller(3).fall_back
    assert _engine(m, "vegas", adaptive=False)._controller(3) is None
    assert _engine(m, "dense")._controller(3) is None
    dustin = _engine(m, "vegas")
    dustin.lossless = False  # near-lossless (sparse verification): its output depends on γ, which must not follow the batch
    assert dustin._controller(3) is None
    from specdec.drafters import ModelDrafter, SparseSelfDrafter

    assert SparseSelfDrafter.dense_steps_ok
    assert not ModelDrafter.dense_steps_ok  # a draft model keeps its own cache: no dense steps


def test_dense_steps_when_sampling_are_the_dense_engines_samples():
    """A self-speculative engine that only takes dense steps samples exactly what the dense engine samples."""
    m = make_tiny("llama")
    sampling = dict(temperature=1.0, seed=3)
    want = _engine(m, "dense", sampling=sampling).generate(PROMPTS, max_new_tokens=10).tokens
    eng = _engine(m, "magicdec", gamma=4, sampling=sampling)
    eng._controller = lambda gamma: _Script([0])
    res = eng.generate(PROMPTS, max_new_tokens=10)
    assert res.tokens == want and res.stats.dense_steps == res.stats.iterations


# -- acceptance traces ----------------------------------------------------------------------------
def test_record_and_replay_acceptance(tmp_path):
    m = make_tiny("llama")
    eng = _engine(m, "vegas", adaptive=False)
    eng.record_acceptance = True
    res = eng.generate(PROMPTS, max_new_tokens=16)
    trace = res.stats.acceptance_trace
    assert len(trace) == len(res.stats.gamma_per_round) and all(len(r) == 2 for r in trace)
    kept = [n for r in trace for n in r if n >= 0]
    assert res.stats.mean_accepted_length == pytest.approx(1 + sum(kept) / len(kept))
    path = tmp_path / "trace.json"
    save_trace(path, res.stats, model="tiny")
    assert json.loads(path.read_text())["method"] == "vegas"
    # another model (its own drafts would be accepted differently) replays the recorded lengths exactly
    other = _engine(make_tiny("llama", seed=5), "vegas", adaptive=False)
    other.replay = AcceptanceReplay.load(path)
    other.record_acceptance = True
    got = other.generate(PROMPTS, max_new_tokens=16)
    assert got.stats.replayed and not res.stats.replayed
    assert got.stats.acceptance_trace == trace
    assert [len(t) for t in got.tokens] == [16, 16]


def test_a_bad_trace_is_one_clear_error(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    with pytest.raises(SpecdecError, match="cannot read acceptance trace .*--record-acceptance"):
        AcceptanceReplay.load(bad)
    with pytest.raises(ValueError, match="no rounds"):
        AcceptanceReplay([[-1, -1]])


# -- bench: shapes, repeats, documents as files ---------------------------------------------------------
def test_bench_shape_replay_repeats_and_files(tmp_path):
    from specdec.bench import run_bench

    m = make_tiny("llama")
    eng = _engine(m, "vegas", adaptive=False)
    eng.record_acceptance = True
    save_trace(tmp_path / "tr.json", eng.generate(PROMPTS, max_new_tokens=12).stats)
    rows = run_bench(["dense", "vegas"], [48], [2], ["ignored"], 8, 16, None, 3, "x", "reference", "float32", "cpu",
                     False, tmp_path, "s", repeats=3, shape="tiny", acceptance_trace=tmp_path / "tr.json")
    dense, vegas = rows
    assert dense["repeats"] == 3 and dense["tokens_per_second_min"] <= dense["tokens_per_second"] <= dense["tokens_per_second_max"]
    assert vegas["replayed"] and not dense["replayed"] and "same_tokens_as_dense" not in vegas
    md = (tmp_path / "s.md").read_text()
    assert "vegas (replayed)" in md and "median of 3" in md
    with pytest.raises(SpecdecError, match="unknown model shape 'llama-9b'; known: llama-3.1-8b"):
        run_bench(["dense"], [48], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path, "s",
                  shape="llama-9b")
    with pytest.raises(SpecdecError, match="unknown document .*no/such.txt.*not an existing file"):
        run_bench(["dense"], [48], [1], [str(tmp_path / "no/such.txt")], 4, 16, None, 3, "x", "reference",
                  "float32", "cpu", False, tmp_path, "s")


def test_random_shape_configs_match_the_published_sizes():
    from transformers import AutoModelForCausalLM

    from specdec.shapes import shape_config

    with torch.device("meta"):
        n = {s: sum(p.numel() for p in AutoModelForCausalLM.from_config(shape_config(s)).parameters())
             for s in ("llama-3.1-8b", "qwen3-8b", "smollm2-135m")}
    assert round(n["llama-3.1-8b"] / 1e9, 2) == 8.03
    assert round(n["qwen3-8b"] / 1e9, 2) == 8.19
    assert round(n["smollm2-135m"] / 1e6) == 135


def test_compile_is_skipped_with_a_message_above_the_size_limit(tmp_path, monkeypatch, capsys):
    """torch.compile at the 8B shape did not finish in 4 minutes (limit: 2): skipped there, with one line."""
    import specdec.shapes as shapes
    from specdec.bench import run_bench
    from specdec.loading import load_model

    why = shapes.compile_skip_reason("llama-3.1-8b")
    assert why.startswith("torch.compile skipped at shape llama-3.1-8b (8.0B parameters > 2B")
    assert shapes.compile_skip_reason("tiny") is None and shapes.compile_skip_reason("smollm2-135m") is None
    monkeypatch.setattr(shapes, "COMPILE_MAX_PARAMS", 1e3)  # "tiny" over the limit: nothing is compiled
    m = load_model("x", "float32", "cpu", "reference", compile=True, shape="tiny")
    assert m._compiled is None and m.compile_skipped.startswith("torch.compile skipped at shape tiny")
    assert "note: torch.compile skipped at shape tiny" in capsys.readouterr().err
    run_bench(["dense"], [32], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path, "c",
              compile=True, shape="tiny")
    meta = json.loads((tmp_path / "c.json").read_text())["meta"]
    assert meta["compile"] is False and meta["compile_skipped"].startswith("torch.compile skipped")
    assert "- torch.compile skipped at shape tiny" in (tmp_path / "c.md").read_text()


@pytest.mark.parametrize("args,expect", [
    (["--shape", "llama-9b"], "unknown model shape 'llama-9b'; known: llama-3.1-8b"),
    (["--acceptance-trace", "vegas="], "--acceptance-trace takes FILE or method=FILE"),
    (["--acceptance-trace", "{missing}"], "cannot read acceptance trace"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--documents", "{missing}"], "not an existing file"),
])
def test_bench_cli_bad_input_is_one_error_line(tmp_path, args, expect):
    from typer.testing import CliRunner

    from specdec.cli import app

    args = [a.format(missing=tmp_path / "nope.json") for a in args]
    res = CliRunner().invoke(app, ["bench", "--device", "cpu", "--output-dir", str(tmp_path / "o"), *args])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_probes_back_off_while_dense_keeps_winning():
    """B = 1 where speculation loses ~7 %: fixed-gap probes would cost ~3 % of dense speed."""
    c = SpeculationController(4)
    kinds = _drive(c, lambda g: (g + 1) / 0.93, 1.0, accepted=4.0, n=600)
    spec = sum(1 for k in kinds[100:] if k)
    assert c.dense_mode and spec <= 2 * (500 // 128 + 2)


def test_a_small_loss_is_enough_to_fall_back():
    """The B = 1 target is >= 0.97x dense: speculation at 0.965x dense must go dense."""
    c = SpeculationController(4)
    _drive(c, lambda g: (g + 1) / 0.965, 1.0, accepted=4.0, n=300)
    assert c.dense_mode
