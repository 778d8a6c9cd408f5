"""``specdec train-draft`` and ``specdec tune`` on bad input: one ``error:`` line (exit 2) before the model work it
would waste, or a ``note:`` line for a setting the run cannot use as given -- never a silent clamp, a traceback or an
artifact trained on nothing.

The refusals that need no model pass ``--model`` a path that does not exist: they must fire before the model loads
(the missing model would be the error otherwise). The rest run on a tiny Llama directory with a word-level tokenizer
(512 positions), with the expensive step (collection, prefill) patched to fail the test if it is reached.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specdec.cli import app
from specdec.errors import SpecdecError

from test_validation import save_tiny_dir


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error(r, *needles: str) -> str:
    """The run failed as bad input: exit 2, one ``error:`` line holding every needle, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    errors = [line for line in r.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_dir(tmp_path_factory.mktemp("tiny") / "m", num_hidden_layers=4)


@pytest.fixture
def no_collection(monkeypatch):
    """Reaching the training text (the start of the collection) fails the test."""
    def boom(*a, **k):
        raise AssertionError("the collection started before the bad input was refused")

    import specdec.train_eagle  # noqa: F401 - imported first: its own name must not be bound to the patched one

    monkeypatch.setattr("specdec.train_eagle.training_texts", boom)
    monkeypatch.setattr("specdec.train_draft.training_texts", boom)


# -- train-draft --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needles", [
    (["--k", "99", "--t", "99"], ["--k and --t are for --kind skip", "EAGLE head"]),
    (["--rank", "8"], ["--rank is for --kind skip"]),
    (["--full-vocab", "0"], ["--full-vocab is for --kind skip"]),
    (["--kind", "skip", "--batch", "3"], ["--batch is for --kind eagle", "layer-skipping draft"]),
    (["--kind", "skip", "--device", "cuda"], ["--device is for --kind eagle"]),
    (["--kind", "skip", "--recipe", "v2"], ["--recipe is for --kind eagle"]),
    (["--kind", "skip", "--seq", "64", "--batch", "2"], ["--batch and --seq are for --kind eagle"]),
])
def test_train_draft_refuses_options_the_kind_does_not_read(args, needles, tmp_path):
    one_error(cli("train-draft", "--model", tmp_path / "nowhere", "--out", tmp_path / "d.safetensors", *args), *needles)
    assert not (tmp_path / "d.safetensors").exists()


def test_train_draft_refuses_to_replace_a_file_that_is_not_a_draft(tmp_path):
    """Finding 38 of a new user's walk: ``--out notes.md`` replaced a text file with safetensors (any existing file
    was replaced). A file that is not a draft artifact is refused before the model loads unless ``--overwrite`` is
    given; a draft artifact (a head trained again) is replaced as before."""
    from safetensors.torch import save_file

    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n")
    weights = tmp_path / "weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(weights))  # a safetensors file without specdec's metadata
    draft = tmp_path / "draft.safetensors"
    save_file({"w": torch.zeros(2)}, str(draft), metadata={"specdec_draft": json.dumps({"kind": "eagle"})})
    nowhere = tmp_path / "nowhere"
    for out in (notes, weights):
        one_error(cli("train-draft", "--model", nowhere, "--out", out), f"--out {out} exists and is not a specdec "
                  "draft artifact", "pass --overwrite")
    assert notes.read_text() == "# my notes\n"
    for args in (["--out", draft], ["--out", notes, "--overwrite"]):  # past the check: the missing model is the error
        one_error(cli("train-draft", "--model", nowhere, *args), "nowhere")


def test_train_draft_refuses_tokens_below_one_sequence(tmp_path, tiny_dir, no_collection):
    # skip: the sequence is fixed (256 tokens), so this is refused before the model loads
    one_error(cli("train-draft", "--kind", "skip", "--tokens", "1", "--model", tmp_path / "nowhere",
                  "--out", tmp_path / "d.safetensors"), "--tokens 1", "256")
    # eagle: the sequence follows --seq (or the recipe and device)
    one_error(cli("train-draft", "--tokens", "10", "--seq", "64", "--model", tiny_dir,
                  "--out", tmp_path / "e.safetensors"), "--tokens 10", "--seq 64", "--tokens 64 or more")
    assert not list(tmp_path.glob("*.safetensors"))


def test_train_draft_refuses_seq_beyond_the_models_positions(tmp_path, tiny_dir, no_collection):
    out = tmp_path / "e.safetensors"
    one_error(cli("train-draft", "--seq", "1000", "--tokens", "600", "--model", tiny_dir, "--out", out),
              "--seq 1000", "512 positions")
    assert not out.exists()


def test_train_draft_without_training_text_is_an_error_not_an_artifact(tmp_path, tiny_dir, monkeypatch):
    """No text gives a whole sequence: the old code trained on nothing for --minutes and wrote the head anyway."""
    monkeypatch.setattr("specdec.train_eagle.training_texts", lambda *a, **k: [("short", "w1 w2 w3")])
    out = tmp_path / "e.safetensors"
    one_error(cli("train-draft", "--seq", "64", "--tokens", "256", "--minutes", "0.05", "--model", tiny_dir,
                  "--out", out), "no training text", "--tokens")
    assert not out.exists()


def test_skip_train_out_of_minutes_before_training_tokens_is_one_line(tmp_path, tiny_dir):
    """The collection's share of --minutes spent on the model and the held-out tokens: the old code divided by zero."""
    from specdec.train_draft import train

    out = tmp_path / "d.safetensors"
    with pytest.raises(SpecdecError, match="ran out before any training tokens were collected.*raise --minutes"):
        train(str(tiny_dir), k=1, t=1, rank=8, tokens=256, minutes=1e-4, out=out, log=lambda s: None)
    assert not out.exists()


def test_skip_init_checks_name_an_eagle_head_and_the_shape(tmp_path, tiny_dir, no_collection):
    from safetensors.torch import save_file

    from specdec.artifacts import model_identity
    from specdec.models import SpecdecModel
    from specdec.train_draft import SkipAdapter, load_draft, save_draft, train

    sm = SpecdecModel.from_pretrained(str(tiny_dir))
    eagle = tmp_path / "head.safetensors"
    save_file({"fc.weight": torch.zeros(2, 2)},
              str(eagle), metadata={"specdec_draft": json.dumps({"kind": "eagle", "target": model_identity(sm)})})
    with pytest.raises(SpecdecError, match="is an EAGLE head; --kind skip needs a layer-skipping draft"):
        train(str(tiny_dir), k=1, t=1, rank=8, tokens=256, init=eagle, log=lambda s: None)
    with pytest.raises(SpecdecError, match="is an EAGLE head, not a layer-skipping draft"):
        load_draft(eagle)
    skip = tmp_path / "skip.safetensors"
    save_draft(skip, SkipAdapter(sm.hf.config.hidden_size, 8), dict(k=1, t=1, rank=8, target=model_identity(sm)))
    with pytest.raises(SpecdecError, match="has k=1, t=1, rank=8, this run k=1, t=1, rank=16"):
        train(str(tiny_dir), k=1, t=1, rank=16, tokens=256, init=skip, log=lambda s: None)


# -- tune -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, needles", [
    (["--fine", "0.75,0"], ["--fine", "> 0", "(got 0)"]),
    (["--fine", "-1"], ["--fine", "(got -1)"]),
    (["--gammas", "2,100"], ["--gammas", "1 to 64", "(got 100)"]),
    (["--gammas", "2.7,3.9"], ["--gammas must be integers (got 2.7)"]),
    (["--gammas", "2.7,0.5"], ["--gammas must be integers (got 2.7)"]),
    (["--gamma", "65"], ["--gamma ", "1 to 64"]),
    (["--sparsities", "0.1,1.5"], ["--sparsities", "(0, 1]"]),
    (["--plateau-tol", "1"], ["--plateau-tol"]),
    (["--min-budget", "-1"], ["--min-budget must be >= 0"]),
    (["--method", "dustin"], ["--method dustin", "not a sparse self-speculative method", "magicdec", "vegas"]),
    (["--method", "dustin-adaptive"], ["not a sparse self-speculative method"]),
    (["--method", "dense"], ["--method dense", "tune supports", "quest"]),
])
def test_tune_refuses_bad_sweeps_before_the_model_loads(args, needles, tmp_path):
    one_error(cli("tune", "--model", tmp_path / "nowhere", "--output-dir", tmp_path / "o", *args), *needles)
    assert not (tmp_path / "o" / "tune_report.json").exists()


def synthetic(ratio: float, gamma: int) -> dict:
    p = min(0.9, 0.5 + 4 * ratio)
    return {"tau": (1 - p ** (gamma + 1)) / (1 - p), "tokens_per_second": 1.0 / (gamma * (0.2 + ratio) + 1.0)}


@pytest.fixture
def no_prefill(monkeypatch):
    """Reaching ``engine_measure`` (the shared prefill) fails the test."""
    def boom(*a, **k):
        raise AssertionError("the prefill started before the bad input was refused")

    monkeypatch.setattr("specdec.tune.engine_measure", boom)


@pytest.fixture
def fake_measure(monkeypatch):
    """The tuner's measurements on a synthetic surface (the command around them runs for real); records the prompts."""
    seen = []

    def measure(model, prompts, method, max_new_tokens, min_budget=0):
        seen.append(prompts)
        return synthetic

    monkeypatch.setattr("specdec.tune.engine_measure", measure)
    return seen


def words(n: int) -> str:
    return " ".join(f"w{i % 90 + 1}" for i in range(n))


def test_tune_checks_positions_before_the_prefill(tmp_path, tiny_dir, no_prefill):
    prompt = tmp_path / "p.txt"
    prompt.write_text(words(600))
    one_error(cli("tune", "--model", tiny_dir, "--device", "cpu", "--prompt-file", prompt, "--context-tokens", "500",
                  "--max-new-tokens", "64", "--output-dir", tmp_path / "o"), "512 positions", "--context-tokens 448")


def test_tune_refuses_a_min_budget_not_below_the_context(tmp_path, tiny_dir, no_prefill):
    prompt = tmp_path / "p.txt"
    prompt.write_text(words(100))
    one_error(cli("tune", "--model", tiny_dir, "--device", "cpu", "--prompt-file", prompt, "--context-tokens", "64",
                  "--min-budget", "100000", "--output-dir", tmp_path / "o"), "--min-budget 100000", "64 tokens")


def test_tune_notes_a_short_prompt_and_an_unread_document(tmp_path, tiny_dir, fake_measure):
    prompt = tmp_path / "p.txt"
    prompt.write_text(words(10))
    r = cli("tune", "--model", tiny_dir, "--device", "cpu", "--prompt-file", prompt, "--document", "stdlib:argparse",
            "--sparsities", "0.2,0.5", "--gammas", "2,3", "--gamma", "2", "--output-dir", tmp_path / "o")
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("note:")]
    assert any("--document stdlib:argparse does not apply with --prompt-file" in n for n in notes), r.output
    assert any("10 tokens, fewer than --context-tokens 2048" in n for n in notes), r.output
    assert [len(p) for p in fake_measure[0]] == [10]
    rep = json.loads((tmp_path / "o" / "tune_report.json").read_text())
    assert len(rep["notes"]) == 2


def test_tune_notes_fine_points_past_the_whole_cache(tmp_path, tiny_dir, fake_measure):
    prompt = tmp_path / "p.txt"
    prompt.write_text(words(100))
    base = ["tune", "--model", tiny_dir, "--device", "cpu", "--prompt-file", prompt, "--context-tokens", "64",
            "--gammas", "2", "--gamma", "2"]
    r = cli(*base, "--sparsities", "0.1", "--fine", "1.0,50", "--output-dir", tmp_path / "a")
    assert r.exit_code == 0, r.output
    assert "note: --fine 50: the plateau ratio 0.1 × 50 = 5 exceeds the whole KV cache; step 3 measures ratio 1" \
        in r.output, r.output
    r = cli(*base, "--sparsities", "1.0", "--fine", "1.25", "--output-dir", tmp_path / "b")
    assert r.exit_code == 0, r.output
    assert "note: --fine 1.25:" in r.output and "the plateau itself, so no new point" in r.output, r.output


def test_three_step_search_tells_its_clamped_points():
    from specdec.tune import three_step_search

    told = []
    rep = three_step_search(synthetic, [0.5], [2], 2, 0.03, (0.5, 4.0), note=told.append)
    assert [m["budget_ratio"] for m in rep["steps"]["fine_sparsity"]] == [0.25, 0.5, 1.0]
    assert len(told) == 1 and rep["notes"] == told
    assert told[0].startswith("fine_factors 4: the plateau ratio 0.5 × 4 = 2")
    with pytest.raises(SpecdecError, match="gammas must be integers"):
        three_step_search(synthetic, [0.5], [2.5], 2)
    with pytest.raises(SpecdecError, match="fine_factors factors must be > 0"):
        three_step_search(synthetic, [0.5], [2], 2, 0.03, (0.0,))


def test_engine_measure_checks_positions_before_the_prefill(monkeypatch):
    from conftest import make_tiny
    from specdec.tune import engine_measure

    model = make_tiny("llama", seed=4)  # 512 positions

    def boom(*a, **k):
        raise AssertionError("prefill reached")

    monkeypatch.setattr("specdec.engine.SpeculativeEngine.prefill", boom)
    with pytest.raises(SpecdecError, match="512 positions"):
        engine_measure(model, [list(range(3, 500))], "vegas", max_new_tokens=64)


def test_gamma_plot_has_integer_ticks(tmp_path, monkeypatch):
    import specdec.tune as tune

    figs = []
    monkeypatch.setattr(tune, "_save_png", lambda fig, path: figs.append(fig))
    rep = tune.three_step_search(synthetic, [0.1, 0.2], [2, 3], 2)
    tune.plot_report(rep, tmp_path)
    ticks = figs[1].axes[0].get_xticks()
    assert len(ticks) and all(float(x).is_integer() for x in ticks), ticks
