"""SRH search and artifact: round trip, identity check, greedy search optimality on the grid, CLI errors."""

import json

import pytest
import torch
from typer.testing import CliRunner

from specdec import PipelineConfig, build_engine
from specdec.drafters import EarlyExitDrafter, ModelDrafter
from specdec.errors import SpecdecError
from specdec.srh import Calibration, calibrate, evaluate, greedy_search, load_srh, model_identity, save_srh

from conftest import make_tiny


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=0, num_hidden_layers=3)


@pytest.fixture(scope="module")
def cal(target):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (160,), generator=g).tolist()
    return calibrate(target, EarlyExitDrafter(target, 2), ids, gamma=3, points=6)


def payload(target, drafter, **over):
    d = dict(target=model_identity(target), draft=drafter.identity(), target_heads=[[2, 1]], draft_heads=[[0, 3]],
             layer_map=drafter.layer_map(target.dims.n_layers), m_ratio=0.25)
    d.update(over)
    return d


def test_artifact_round_trip_and_identity(tmp_path, target):
    drafter = EarlyExitDrafter(target, 2)
    path = save_srh(tmp_path / "srh.json", payload(target, drafter))
    data = load_srh(path, target, drafter)
    assert data["target_heads"] == [[2, 1]] and data["m_ratio"] == 0.25 and data["layer_map"] == [0, 1, 1]
    # the dustin preset loads it and uses its heads and split
    eng = build_engine(target, PipelineConfig.make(method="dustin", budget=12, sinks=2, recent=4,
                                                   options=dict(srh=str(path), draft_layers=2)), eos_token_id=-1)
    sel = eng.verifier.selector
    assert sel.target_heads == {2: [1]} and sel.draft_heads == {0: [3]} and sel.config.m_ratio == 0.25
    assert len(eng.generate([list(range(3, 50))], max_new_tokens=6).tokens[0]) == 6
    # another target, or another draft, is refused in one line
    other = make_tiny("llama", seed=5, num_hidden_layers=3)
    for t, d in [(other, EarlyExitDrafter(other, 2)), (target, EarlyExitDrafter(target, 1)),
                 (target, ModelDrafter(make_tiny("llama", seed=1)))]:
        with pytest.raises(SpecdecError, match="profile-srh") as e:
            load_srh(path, t, d)
        assert "\n" not in str(e.value)
    with pytest.raises(SpecdecError, match="profile-srh"):
        build_engine(other, PipelineConfig.make(method="dustin", budget=12, options=dict(srh=str(path), draft_layers=2)))


def test_an_early_exit_artifact_with_the_eagle_head_names_both_drafts_and_the_fix(tmp_path, target):
    """profile-srh profiles early-exit drafts; Dustin's default draft for the embedded model is the EAGLE head. The
    refusal printed both drafts alike (", early exit at 2" the only difference) and told the user to re-run
    profile-srh, which cannot profile the head: it names the head and the option that uses the artifact."""
    from types import SimpleNamespace

    path = save_srh(tmp_path / "srh.json", payload(target, EarlyExitDrafter(target, 2)))
    eagle = SimpleNamespace(identity=lambda: {**model_identity(target), "eagle_head": "smollm2-135m-eagle.safetensors"})
    with pytest.raises(SpecdecError, match=r"early exit at 2, not .*, EAGLE head smollm2-135m-eagle.safetensors; use it "
                                           r"with the draft it was made for \(--option draft_layers=2\)"):
        load_srh(path, target, eagle)
    skip = SimpleNamespace(identity=lambda: {**model_identity(target), "early_exit_layers": 1, "skip_tail_layers": 1})
    with pytest.raises(SpecdecError, match=r"layer-skipping draft \(1 \+ 1 tail layers\)"):
        load_srh(path, target, skip)


def test_bad_artifacts_are_one_clear_error(tmp_path, target):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SpecdecError, match="not valid JSON"):
        load_srh(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(SpecdecError, match="not a specdec-srh"):
        load_srh(bad)
    with pytest.raises(SpecdecError, match="missing"):
        save_srh(tmp_path / "x.json", {"target": {}})


def test_calibration_shapes_and_truth_is_a_distribution(cal, target):
    N, H = target.dims.n_layers, target.dims.n_heads
    assert cal.truth.shape == (N, 6, 160) and cal.history.shape == (N, H, 6, 160) and cal.lookahead.shape == (2, H, 6, 160)
    assert torch.allclose(cal.truth.sum(-1), torch.ones(N, 6), atol=1e-4)
    # the early-exit draft's layer 0 sees the same keys as the target's layer 0
    assert float(cal.lookahead[0].sum()) == pytest.approx(3 * H * 6, rel=1e-4)


def test_greedy_search_hybrid_at_least_either_signal(cal):
    res = greedy_search(cal, budget=40, sinks=2, recent=4, max_heads=4, pool=6)
    t, d = [tuple(x) for x in res["target_heads"]], [tuple(x) for x in res["draft_heads"]]
    hyb = float(evaluate(cal, 40, 2, 4, t, d, res["m_ratio"]).mean())
    assert res["trace"], "the search added no head: the calibration gives no gain to check"
    assert hyb == pytest.approx(res["arr"], abs=1e-6)
    assert hyb >= float(evaluate(cal, 40, 2, 4, t, d, 0.0).mean()) - 1e-6
    assert hyb >= float(evaluate(cal, 40, 2, 4, t, d, 1.0).mean()) - 1e-6
    full = Calibration(cal.lengths, cal.truth, cal.history, cal.lookahead)
    assert float(evaluate(full, 10_000, 2, 4, t, d, 0.5).mean()) == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("cmd", [
    ["profile-srh", "--output", "x.json", "--budget", "0"],
    ["fidelity", "--output-json", "x.json", "--budgets", "0"],
    ["fidelity", "--output-json", "x.json", "--budgets", "a,b"],
])
def test_cli_bad_input_is_one_line(cmd):
    from specdec.cli import app

    r = CliRunner().invoke(app, cmd)
    assert r.exit_code == 2
    assert r.output.strip().startswith("error:") and len(r.output.strip().splitlines()) == 1


def test_explicit_probe_points_are_checked(target):
    ids = list(range(3, 80))
    with pytest.raises(SpecdecError, match="probe points"):
        calibrate(target, EarlyExitDrafter(target, 2), ids, gamma=3, points=1, probes=[2])
    c = calibrate(target, EarlyExitDrafter(target, 2), ids, gamma=3, points=1, probes=[40, 60])
    assert c.lengths.tolist() == [40, 60]


def test_more_points_than_probe_positions_measure_each_position_once(target):
    """Finding 29 of a new user's walk: ``--points`` past the distinct probe positions came from
    ``linspace(...).round()`` with repeats, each measured and weighted twice; each position is measured once."""
    ids = list(range(3, 43))  # 40 tokens, γ 3: positions 20 .. 36, 17 of them
    c = calibrate(target, EarlyExitDrafter(target, 2), ids, gamma=3, points=30)
    assert c.lengths.tolist() == list(range(20, 37))
    c = calibrate(target, EarlyExitDrafter(target, 2), ids, gamma=3, points=5)
    assert c.lengths.tolist() == [20, 24, 28, 32, 36]


def test_retrieval_calibration_probes_the_answer(smol):
    """Pass-key probes: the target's dense attention at the answer rows lands on the hidden key
    in some layers (what makes the search value retrieval heads)."""
    from specdec.srh import retrieval_calibration

    c = retrieval_calibration(smol, EarlyExitDrafter(smol, 9), n=2, context=384, gamma=4)
    assert c.truth.shape[:2] == (smol.dims.n_layers, 2) and c.history.shape[2] == 2
    for j, pos in enumerate(c.meta["key_positions"]):
        assert len(pos) == 5
        share = c.truth[:, j, pos].sum(1) / c.truth[:, j].sum(1)  # (N,) share of each layer's mass on the key
        assert float(share.max()) > 0.1, share  # 5 of ~380 positions: 1.3 % if attention were uniform


def test_identity_survives_a_dtype_change(target):
    """An artifact profiled in float32 (CPU) must load for the same model in bf16 (GPU)."""
    import copy

    half = copy.deepcopy(target)
    half.hf.to(torch.bfloat16)
    assert model_identity(half) == model_identity(target)
    other = make_tiny("llama", seed=5, num_hidden_layers=3)
    assert model_identity(other)["fingerprint"] != model_identity(target)["fingerprint"]
