"""Adaptive γ / dense fall-back is on by default (``specdec.adaptive.ADAPTIVE_DEFAULT``), and every entry point
switches it off: ``PipelineConfig(adaptive=False)``, ``build_engine(..., adaptive=False)``,
``SpeculativeEngine(..., adaptive=False)``, ``specdec generate|bench|eval --no-adaptive``.

The controller decides on wall time, so these tests put a scripted stand-in in its place
(``specdec.adaptive.SpeculationController``, which the engine looks up when a run starts): it runs every
iteration as a dense step where fall-back may run (γ = 1 where it may not). A run it drove shows dense steps; a
run with adaptation off shows none, every round at the configured γ. Greedy tokens are dense's either way.
"""

from __future__ import annotations

import json

import pytest

from specdec import PipelineConfig, build_engine
from specdec.engine import SpeculativeEngine

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
GAMMA = 3
CFG = dict(gamma=GAMMA, budget=12, sinks=2, recent=4)


class _AllDense:
    """Stands in for :class:`specdec.adaptive.SpeculationController`: dense steps only (γ = 1 without fall-back)."""

    made: list["_AllDense"] = []

    def __init__(self, gamma, fall_back=True, **kw):
        self.gamma, self.fall_back = gamma, fall_back
        _AllDense.made.append(self)

    def next_gamma(self):
        return 0 if self.fall_back else 1

    def observe_round(self, *a, **kw):
        pass

    def observe_dense(self, *a, **kw):
        pass


@pytest.fixture
def made(monkeypatch):
    import specdec.adaptive as adaptive

    _AllDense.made = []
    monkeypatch.setattr(adaptive, "SpeculationController", _AllDense)
    return _AllDense.made


@pytest.fixture(scope="module")
def m():
    return make_tiny("llama")


@pytest.fixture(scope="module")
def dense_tokens(m):
    return build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(PROMPTS, 12).tokens


def _adapted(res) -> bool:
    """Whether the stand-in controller drove the run (every step dense), or γ stayed fixed (no dense step)."""
    s = res.stats
    if s.dense_steps == s.iterations > 0 and not s.gamma_per_round:
        return True
    assert s.dense_steps == 0 and s.gamma_per_round == [GAMMA] * s.iterations, (s.dense_steps, s.gamma_per_round)
    return False


def _self_drafter(m):
    from specdec.drafters import SparseSelfDrafter
    from specdec.registry import SELECTORS

    return SparseSelfDrafter(m, SELECTORS.build("sliding_window", budget=12, sinks=2, recent=4))


def test_default_is_adaptive_and_the_python_api_switches_it_off(m, dense_tokens, made):
    from specdec.adaptive import ADAPTIVE_DEFAULT

    assert ADAPTIVE_DEFAULT is True
    assert PipelineConfig(method="vegas").adaptive is True and PipelineConfig.make(method="magicdec").adaptive is True
    on = {
        "PipelineConfig.make": build_engine(m, PipelineConfig.make(method="vegas", **CFG), eos_token_id=-1),
        "PipelineConfig": build_engine(m, PipelineConfig(method="magicdec", **CFG), eos_token_id=-1),
        "SpeculativeEngine": SpeculativeEngine(m, _self_drafter(m), gamma=GAMMA, eos_token_id=-1),
        "build_engine(adaptive=True) over the config": build_engine(
            m, PipelineConfig.make(method="vegas", adaptive=False, **CFG), eos_token_id=-1, adaptive=True),
    }
    off = {
        "PipelineConfig.make(adaptive=False)": build_engine(
            m, PipelineConfig.make(method="vegas", adaptive=False, **CFG), eos_token_id=-1),
        "PipelineConfig(adaptive=False)": build_engine(
            m, PipelineConfig(method="magicdec", adaptive=False, **CFG), eos_token_id=-1),
        "build_engine(adaptive=False)": build_engine(m, PipelineConfig.make(method="vegas", **CFG), eos_token_id=-1,
                                                     adaptive=False),
        "SpeculativeEngine(adaptive=False)": SpeculativeEngine(m, _self_drafter(m), gamma=GAMMA, eos_token_id=-1,
                                                               adaptive=False),
        "engine.adaptive = False": build_engine(m, PipelineConfig.make(method="vegas", **CFG), eos_token_id=-1),
    }
    off["engine.adaptive = False"].adaptive = False
    for name, eng in {**on, **off}.items():
        res = eng.generate(PROMPTS, 12)
        assert res.tokens == dense_tokens, name  # lossless either way
        assert _adapted(res) is (name in on), name
    assert len(made) == len(on)


def test_near_lossless_dustin_keeps_its_gamma_lossless_quest_adapts(m, made):
    """Only lossless methods adapt: Dustin's sparse verification emits what its γ gives (adapting γ to the batch's
    acceptance would make a sequence's output depend on its batch mates); Quest verifies densely and adapts."""
    from specdec.presets import get_method

    assert not get_method("dustin").lossless and get_method("quest").lossless
    dustin = build_engine(m, PipelineConfig.make(method="dustin", **CFG), eos_token_id=-1)
    assert dustin.adaptive is True and not dustin.lossless and dustin._controller(GAMMA) is None
    assert not _adapted(dustin.generate(PROMPTS, 12))
    quest = build_engine(m, PipelineConfig.make(method="quest", **CFG), eos_token_id=-1)
    assert _adapted(quest.generate(PROMPTS, 12))
    assert len(made) == 1


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from test_validation import save_tiny_dir

    root = tmp_path_factory.mktemp("adaptive_cli")
    (root / "prompt.txt").write_text(" ".join(f"w{i % 90 + 1}" for i in range(40)))
    return root, save_tiny_dir(root / "tiny", max_position_embeddings=4096)


def _cli(args):
    from typer.testing import CliRunner

    from specdec.cli import app

    res = CliRunner().invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, (res.exit_code, res.output, res.exception)
    return res


@pytest.mark.parametrize("flag", [None, "--adaptive", "--no-adaptive"])
def test_generate_is_adaptive_unless_no_adaptive(tiny_dir, tmp_path, made, flag):
    root, model = tiny_dir
    out = tmp_path / "o.json"
    _cli(["generate", "--prompt-file", root / "prompt.txt", "--max-new-tokens", 8, "--model", model, "--device", "cpu",
          "--method", "vegas", "--gamma", GAMMA, "--budget", 12, "--output-json", out, *([flag] if flag else [])])
    got = json.loads(out.read_text())
    on = flag != "--no-adaptive"
    assert got["config"]["adaptive"] is on
    s = got["stats"]
    if on:
        assert s["dense_steps"] == s["iterations"] > 0 and len(made) == 1
    else:
        assert s["dense_steps"] == 0 and set(s["gamma_per_round"]) == {GAMMA} and not made


@pytest.mark.parametrize("flag", [None, "--no-adaptive"])
def test_bench_is_adaptive_unless_no_adaptive(tiny_dir, tmp_path, made, flag):
    _, model = tiny_dir
    _cli(["bench", "--model", model, "--device", "cpu", "--methods", "magicdec", "--contexts", 32, "--budget", 12,
          "--gamma", GAMMA, "--max-new-tokens", 6, "--repeats", 1, "--documents", "stdlib:argparse",
          "--output-dir", tmp_path, *([flag] if flag else [])])
    got = json.loads((tmp_path / "bench.json").read_text())
    on = flag is None
    assert got["meta"]["adaptive"] is on
    (row,) = got["rows"]
    assert (row["dense_steps"] > 0) is on and bool(made) is on, row


@pytest.mark.parametrize("adaptive", [None, False])
def test_eval_is_adaptive_unless_switched_off(m, made, adaptive, monkeypatch):
    import specdec.data
    import specdec.evaluation as ev

    # a document of the tiny model's own token ids (run_eval imports these two when it runs)
    monkeypatch.setattr(specdec.data, "context_ids",
                        lambda tok, text, n, offset=0, name=None: [(i % 90) + 3 for i in range(n)])
    monkeypatch.setattr(specdec.data, "load_document", lambda name: "")
    res = ev.run_eval(m, {"vegas": ("vegas", {})}, [], context=256, samples=1, budget=12, gamma=GAMMA,
                      documents=["pydoc"], doc_tokens=6, tokenizer=object(), log=lambda s: None, adaptive=adaptive)
    row = res["documents"][0]["methods"]["vegas"]
    assert row["identical"]
    assert bool(made) is (adaptive is None)


def test_seeded_sampling_keeps_its_gamma_so_the_seed_reproduces(m, made):
    """γ_t follows wall time and a round's random draws depend on its γ: a seeded sampling run keeps γ fixed (same
    seed, same output, as documented); an unseeded one adapts (its samples follow the target's law either way)."""
    from specdec.sampling import SamplingConfig

    seeded = build_engine(m, PipelineConfig.make(method="vegas", sampling=SamplingConfig(temperature=1.0, seed=7), **CFG),
                          eos_token_id=-1)
    a, b = seeded.generate(PROMPTS, 12), seeded.generate(PROMPTS, 12)
    assert a.tokens == b.tokens
    assert not made and not _adapted(a)  # no controller: every round at the configured γ
    unseeded = build_engine(m, PipelineConfig.make(method="vegas", sampling=SamplingConfig(temperature=1.0), **CFG),
                            eos_token_id=-1)
    assert _adapted(unseeded.generate(PROMPTS, 12)) and len(made) == 1


@pytest.mark.parametrize("flag", [None, "--adaptive"])
def test_record_acceptance_records_fixed_gamma_unless_adaptive(tiny_dir, tmp_path, made, flag):
    """A trace is replayed at fixed γ (``bench --acceptance-trace``): ``--record-acceptance`` records every round at
    γ unless ``--adaptive`` is given explicitly."""
    root, model = tiny_dir
    out, trace = tmp_path / "o.json", tmp_path / "t.json"
    _cli(["generate", "--prompt-file", root / "prompt.txt", "--max-new-tokens", 8, "--model", model, "--device", "cpu",
          "--method", "vegas", "--gamma", GAMMA, "--budget", 12, "--output-json", out, "--record-acceptance", trace,
          *([flag] if flag else [])])
    got, t = json.loads(out.read_text()), json.loads(trace.read_text())
    on = flag == "--adaptive"
    assert got["config"]["adaptive"] is on and t["adaptive"] is on and bool(made) is on
    if not on:
        assert t["gamma_per_round"] == [GAMMA] * got["stats"]["iterations"] == [GAMMA] * len(t["rounds"])


@pytest.mark.parametrize("command", ["generate", "bench", "eval"])
def test_the_help_states_the_adaptive_default_in_words(command):
    """``--help`` said "default: specdec.adaptive.ADAPTIVE_DEFAULT" (a name a user cannot read off); it says on or
    off now, and that must follow the constant."""
    from typer.testing import CliRunner

    from specdec.adaptive import ADAPTIVE_DEFAULT
    from specdec.cli import app

    out = " ".join(CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output.split())
    assert f"(default: {'on' if ADAPTIVE_DEFAULT else 'off'}" in out and "ADAPTIVE_DEFAULT" not in out
