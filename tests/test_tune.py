"""The tuner's three steps on a synthetic τ/throughput surface, its report/plots, the config round
trip into ``specdec generate --config``, and one engine-backed search on a tiny model."""

import json

import pytest
from typer.testing import CliRunner

from specdec.cli import app, pipeline_config
from specdec.errors import SpecdecError
from specdec.tune import engine_measure, plateau_ratio, three_step_search, write_report

from conftest import make_tiny


def synthetic(ratio: float, gamma: int) -> dict:
    """τ saturates at ratio 0.1; a longer draft costs time, a bigger budget a little too."""
    p = min(0.9, 0.5 + 4 * ratio)  # per-token acceptance
    tau = (1 - p ** (gamma + 1)) / (1 - p)
    t_iter = gamma * (0.2 + ratio) + 1.0
    return {"tau": tau, "tokens_per_second": tau / t_iter}


def test_plateau_ratio():
    assert plateau_ratio({0.01: 2.0, 0.05: 2.95, 0.1: 3.0, 0.2: 3.01}, 0.03) == 0.05
    assert plateau_ratio({0.01: 2.0, 0.05: 2.5}, 0.0) == 0.05


def test_three_steps_on_synthetic_surface(tmp_path):
    calls = []

    def measure(r, g):
        calls.append((r, g))
        return synthetic(r, g)

    rep = three_step_search(measure, [0.02, 0.05, 0.1, 0.2, 0.4], [1, 2, 4, 8], 4, 0.03, (0.75, 1.25))
    assert rep["plateau_ratio"] == 0.1
    g = rep["recommended"]["gamma"]
    assert g == max([1, 2, 4, 8], key=lambda x: synthetic(0.1, x)["tokens_per_second"])
    assert rep["recommended"]["budget_ratio"] in (0.075, 0.1, 0.125)
    assert len(calls) == len(set(calls))  # every point measured once
    rep["method"] = "vegas"
    rep["recommended"] = dict(method="vegas", **rep["recommended"])
    path = write_report(rep, tmp_path)
    assert (tmp_path / "tau_vs_sparsity.png").stat().st_size > 1000
    assert (tmp_path / "tokens_per_second_vs_gamma.png").stat().st_size > 1000
    cfg = pipeline_config(None, None, None, None, 0.0, 1.0, 0, None, path)  # generate --config REPORT
    assert (cfg.method, cfg.gamma, cfg.budget_ratio) == ("vegas", g, rep["recommended"]["budget_ratio"])
    cfg = pipeline_config(None, 3, None, None, 0.0, 1.0, 0, None, tmp_path / "recommended.json")
    assert cfg.gamma == 3  # explicit options win over the file


def test_option_items_merge_over_the_config_files_options(tmp_path):
    """generate --option key=value: JSON-decoded values, over the --config file's options (the file's others kept)."""
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"method": "dustin", "options": {"verify": "dense", "lookup_min": 3}}))
    cfg = pipeline_config(None, None, None, None, 0.0, 1.0, 0, None, path, ["tree=true", "lookup_min=0",
                                                                           "lookup_keep=null", "draft=a=b.st"])
    assert cfg.options == {"verify": "dense", "lookup_min": 0, "tree": True, "lookup_keep": None, "draft": "a=b.st"}
    cfg = pipeline_config("dustin", None, None, None, 0.0, 1.0, 0, None, None, ["margin=0.5"])
    assert cfg.options == {"margin": 0.5}
    for bad in (["verify"], ["=dense"]):
        with pytest.raises(SpecdecError, match="must look like key=value"):
            pipeline_config("dustin", None, None, None, 0.0, 1.0, 0, None, None, bad)


@pytest.mark.parametrize("kw, field", [(dict(sparsities=[]), "sparsities"), (dict(sparsities=[1.5]), "sparsities"),
                                       (dict(gammas=[0]), "gammas"), (dict(plateau_tol=1.0), "plateau_tol")])
def test_bad_sweeps_name_the_field(kw, field):
    args = dict(measure=synthetic, sparsities=[0.05], gammas=[2], gamma0=2)
    args.update(kw)
    with pytest.raises(SpecdecError, match=field):
        three_step_search(**args)


def test_engine_measure_tiny():
    model = make_tiny("llama", seed=4)
    measure = engine_measure(model, [list(range(3, 90))], "vegas", max_new_tokens=8, sinks=2, recent=4)
    rep = three_step_search(measure, [0.1, 0.3], [2, 3], 2, 0.03, (0.8,))
    assert rep["recommended"]["gamma"] in (2, 3)
    assert all(m["tau"] >= 1.0 for m in rep["steps"]["sparsity_sweep"])


def test_cli_tune_errors():
    r = CliRunner().invoke(app, ["tune", "--method", "dense"])
    assert r.exit_code == 2 and "dense" in r.output
    r = CliRunner().invoke(app, ["tune", "--method", "nope"])
    assert r.exit_code == 2 and "unknown method" in r.output
    r = CliRunner().invoke(app, ["tune", "--sparsities", "a,b"])
    assert r.exit_code == 2 and "--sparsities" in r.output


@pytest.mark.slow
def test_cli_tune_real_model(tmp_path):
    out = tmp_path / "t"
    r = CliRunner().invoke(app, ["tune", "--document", "stdlib:argparse", "--context-tokens", "400",
                                 "--max-new-tokens", "8", "--sparsities", "0.1,0.3", "--gammas", "2,3",
                                 "--gamma", "2", "--fine", "1.2", "--output-dir", str(out), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    rep = json.loads((out / "tune_report.json").read_text())
    assert rep["recommended"]["method"] == "vegas" and (out / "tau_vs_sparsity.png").is_file()
