"""The CLI on bad input: exit code 2, exactly one ``error: ...`` line on stderr, no traceback, nothing written.

Each case runs ``specdec generate`` in-process (typer's runner) on a tiny model directory, so the whole
table takes seconds; two cases also run as a real subprocess. ``python tests/test_cli_errors.py``
prints the table of bad inputs and their messages (the one in ``docs/guarantees.md``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_validation import save_tiny_dir

# (id, what is wrong, extra/override arguments, substring the one error line must contain)
# ``{x}`` placeholders name files of the ``files`` fixture.
CASES = [
    ("unknown-method", "unknown method", ["--method", "nope"], "known: dense"),
    ("option-no-eq", "--option without '='", ["--method", "dustin", "--option", "verify"], "must look like key=value"),
    ("option-unknown", "an option the method does not take", ["--method", "magicdec", "--option", "tree=true"],
     "unknown magicdec option 'tree'"),
    ("option-bad-value", "an option value out of its set", ["--method", "dustin", "--option", "verify=fast"],
     "'sparse' or 'dense'"),
    ("option-tree-value", "a tree that is neither a flag, a count nor rank paths",
     ["--method", "dustin", "--option", "tree=abc"], "a node count (1 to 32)"),
    ("option-tree-count", "a tree of 0 nodes", ["--method", "dustin", "--option", "tree=0"], "(got 0)"),
    ("unknown-backend", "unknown backend", ["--backend", "nope"], "reference, torch"),
    ("unknown-dtype", "unknown dtype", ["--dtype", "float64"], "choose one of float32"),
    ("gamma-0", "γ < 1", ["--gamma", "0"], "--gamma must be greater than or equal to 1 (got 0)"),
    ("gamma-100", "γ absurd (> 64)", ["--gamma", "100"], "--gamma must be less than or equal to 64 (got 100)"),
    ("gamma-abc", "γ not a number", ["--gamma", "abc"], "'--gamma'"),
    ("budget-0", "budget ≤ 0", ["--budget", "0"], "--budget must be greater than 0 (got 0)"),
    ("budget-both", "--budget and --budget-ratio together", ["--budget", "4", "--budget-ratio", "0.5"], "pass only one"),
    ("budget-big", "budget > context", ["--budget", "500"], "exceeds the context"),
    ("ratio-0", "budget ratio 0", ["--budget-ratio", "0"], "--budget-ratio must be greater than 0 (got 0.0)"),
    ("ratio-1.5", "budget ratio > 1", ["--budget-ratio", "1.5"], "--budget-ratio must be less than or equal to 1"),
    ("batch-0", "batch size < 1", ["--batch-size", "0"], "--batch-size"),
    ("temperature", "temperature < 0", ["--temperature", "-1"], "--temperature must be greater than or equal to 0"),
    ("top-p-0", "top-p = 0", ["--top-p", "0"], "--top-p must be greater than 0 (got 0.0)"),
    ("top-p-1.5", "top-p > 1", ["--top-p", "1.5"], "--top-p must be less than or equal to 1"),
    ("top-k", "top-k < 0", ["--top-k", "-1"], "--top-k must be greater than or equal to 0 (got -1)"),
    ("max-new-0", "max-new-tokens < 1", ["--max-new-tokens", "0"], "'--max-new-tokens'"),
    ("context-0", "context-tokens < 1", ["--context-tokens", "0"], "--context-tokens"),
    ("empty-prompt", "empty prompt file", ["--prompt-file", "{empty}"], "empty or whitespace"),
    ("blank-prompt", "whitespace-only prompt file", ["--prompt-file", "{blank}"], "empty or whitespace"),
    ("no-prompt", "missing prompt file", ["--prompt-file", "{nowhere}/p.txt"], "file not found"),
    ("dir-prompt", "a directory as prompt file", ["--prompt-file", "{root}"], "is a directory"),
    ("long-prompt", "prompt beyond the model's positions", ["--prompt-file", "{long}"], "positions"),
    ("no-model", "missing model", ["--model", "{nowhere}/model"], "not an embedded name"),
    ("no-gguf", "missing GGUF file", ["--model", "{nowhere}/m.gguf"], "does not exist"),
    ("bad-gguf", "corrupt GGUF file", ["--model", "{gguf}"], "could not load model"),
    ("bad-weights", "corrupt safetensors weights", ["--model", "{corrupt}"], "could not load model"),
    ("empty-dir", "model directory without config.json", ["--model", "{emptydir}"], "no config.json"),
    ("encoder", "unsupported architecture (BERT encoder)", ["--model", "{bert}"], "bidirectional"),
    ("no-attention", "unsupported architecture (Mamba)", ["--model", "{mamba}"], "no attention geometry"),
    ("fp16-cpu", "float16 on the CPU", ["--dtype", "float16", "--device", "cpu"], "float16 is not supported on the CPU"),
    ("cuda", "--device cuda without a GPU", ["--device", "cuda"], "no CUDA GPU"),
    ("bad-device", "unknown device", ["--device", "tpu"], "unknown device"),
    ("triton-cpu", "--backend triton without GPU or TRITON_INTERPRET", ["--backend", "triton"], "CUDA GPU"),
    ("config-json", "malformed --config (not JSON)", ["--config", "{cfg_bad}"], "not valid JSON"),
    ("config-list", "--config not an object", ["--config", "{cfg_list}"], "JSON object"),
    ("config-field", "--config with an unknown field", ["--config", "{cfg_field}"], "'gama'"),
    ("config-value", "--config with a bad value", ["--config", "{cfg_value}"], "'gamma'"),
    ("config-method", "--config with an unknown method", ["--config", "{cfg_method}"], "unknown method"),
    ("config-missing", "missing --config file", ["--config", "{nowhere}/c.json"], "does not exist"),
    ("nan-model", "NaN in the model's weights", ["--model", "{nan}"], "NaN or +inf logits"),
    ("unknown-option", "unknown option", ["--frobnicate"], "No such option"),
    ("missing-option", "missing --output-json", ["--drop-output"], "Missing option '--output-json'"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_files(tmp_path_factory.mktemp("cli"))


def make_files(root: Path) -> dict[str, str]:
    """Model directories, prompt and config files for the cases (``{name}`` placeholders)."""
    import torch
    import transformers as tf

    from test_validation import word_tokenizer

    f = {"root": str(root), "nowhere": str(root / "nowhere")}
    f["model"] = str(save_tiny_dir(root / "tiny", max_position_embeddings=64))
    f["nan"] = str(save_tiny_dir(root / "nan", nan=True))
    corrupt = save_tiny_dir(root / "corrupt")
    (corrupt / "model.safetensors").write_bytes(os.urandom(4096))
    f["corrupt"] = str(corrupt)
    torch.manual_seed(0)
    for name, hf in [
        ("bert", tf.BertLMHeadModel(tf.BertConfig(num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                                                  intermediate_size=32, vocab_size=96))),
        ("mamba", tf.MambaForCausalLM(tf.MambaConfig(num_hidden_layers=1, hidden_size=16, vocab_size=96))),
    ]:
        hf.save_pretrained(root / name)
        word_tokenizer(96).save_pretrained(root / name)
        f[name] = str(root / name)
    (root / "emptydir").mkdir()
    f["emptydir"] = str(root / "emptydir")
    (root / "bad.gguf").write_bytes(b"GGUF" + os.urandom(512))
    f["gguf"] = str(root / "bad.gguf")
    texts = {"prompt": " ".join(f"w{i % 90 + 1}" for i in range(12)), "empty": "", "blank": "  \n\t  \n",
             "long": " ".join(f"w{i % 90 + 1}" for i in range(200))}
    for k, t in texts.items():
        (root / f"{k}.txt").write_text(t)
        f[k] = str(root / f"{k}.txt")
    cfgs = {"cfg_bad": "{not json", "cfg_list": "[1, 2]", "cfg_field": '{"gama": 3}', "cfg_value": '{"gamma": -3}',
            "cfg_method": '{"method": "nope"}'}
    for k, t in cfgs.items():
        (root / f"{k}.json").write_text(t)
        f[k] = str(root / f"{k}.json")
    return f


def base_options(files, out: Path) -> dict[str, str]:
    return {"--prompt-file": files["prompt"], "--max-new-tokens": "4", "--output-json": str(out),
            "--model": files["model"], "--device": "cpu"}


def base_args(files, out: Path) -> list[str]:
    return ["generate", *[x for kv in base_options(files, out).items() for x in kv]]


def build_args(files, extra: list[str], out: Path) -> list[str]:
    """The valid baseline with ``extra``'s options overriding (or adding to) it."""
    opts: dict[str, str | None] = dict(base_options(files, out))
    extra = [e.format(**files) for e in extra]
    i = 0
    while i < len(extra):
        if i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            opts[extra[i]] = extra[i + 1]
            i += 2
        else:
            opts[extra[i]] = None
            i += 1
    if "--drop-output" in opts:
        del opts["--drop-output"], opts["--output-json"]
    return ["generate", *[x for k, v in opts.items() for x in ((k,) if v is None else (k, v))]]


def run_in_process(args: list[str]):
    from typer.testing import CliRunner

    from specdec.cli import app

    return CliRunner().invoke(app, args)


def _import_kernels_interpreted() -> None:
    """Import specdec's Triton kernel modules while ``TRITON_INTERPRET=1`` still holds: ``@triton.jit`` reads it when
    a module is imported, so a module first imported inside a test below (interpreter off) would keep compiled-only
    kernels for the rest of the worker process, and a later test on CPU tensors would fail with "0 active drivers"."""
    import importlib
    import importlib.util
    import pkgutil

    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    import specdec.cuda

    for mod in pkgutil.iter_modules(specdec.cuda.__path__):
        importlib.import_module(f"specdec.cuda.{mod.name}")


@pytest.fixture(autouse=True)
def _no_triton_interpreter(monkeypatch):
    _import_kernels_interpreted()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # CI sets it; the triton case needs it off


def test_good_input_runs(files, tmp_path):
    """The baseline the bad cases modify is itself valid."""
    out = tmp_path / "sub" / "o.json"
    res = run_in_process(base_args(files, out))
    assert res.exit_code == 0, res.stderr
    assert len(json.loads(out.read_text())["tokens"][0]) == 4


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line(files, tmp_path, case):
    _, _, extra, expect = case
    out = tmp_path / "sub" / "o.json"
    res = run_in_process(build_args(files, extra, out))
    unexpected = res.exception if res.exception is not None and not isinstance(res.exception, SystemExit) else None
    assert unexpected is None, f"uncaught {type(unexpected).__name__}: {unexpected}"
    assert res.exit_code == 2, (res.exit_code, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert expect in lines[0], lines[0]
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout
    assert res.stdout.strip() == ""
    assert not out.exists() and not out.parent.exists(), "nothing may be written on failure"
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file may be left behind"


@pytest.mark.parametrize("case", ["nan-model"])
def test_bad_input_in_a_real_process(files, tmp_path, case):
    """The same through the console entry point: real stderr, real exit code."""
    _, _, extra, expect = next(c for c in CASES if c[0] == case)
    out = tmp_path / "o.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "specdec.cli", *build_args(files, extra, out)],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "Warning" not in ln and "warn(" not in ln]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], proc.stderr
    assert not out.exists()


def test_bad_pdl_environment_is_one_error_line(files, tmp_path, monkeypatch):
    """A bad ``SPECDEC_PDL`` ends like any bad input, before the model loads (it used to escape as a ValueError
    traceback at the first Triton launch on a GPU)."""
    monkeypatch.setenv("SPECDEC_PDL", "yes")
    out = tmp_path / "o.json"
    res = run_in_process(base_args(files, out))
    assert res.exit_code == 2, (res.exit_code, res.exception)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == ["error: SPECDEC_PDL='yes' is not a valid setting; use 1 (programmatic dependent launch on) "
                     "or 0 (off)."], res.stderr
    assert not out.exists()


def test_unknown_command_and_no_arguments():
    res = run_in_process(["frobnicate"])
    assert res.exit_code == 2 and res.stderr.strip().startswith("error: No such command")
    assert len(res.stderr.strip().splitlines()) == 1
    res = run_in_process([])
    assert res.exit_code == 2 and "generate" in (res.stdout + res.stderr)  # prints the help


def markdown_table() -> str:
    """The bad-input table of docs/guarantees.md, from the live CLI."""
    import tempfile

    os.environ.pop("TRITON_INTERPRET", None)
    f = make_files(Path(tempfile.mkdtemp(prefix="cli")))
    rows = ["| bad input | arguments | exit | message (stderr) |", "|---|---|---|---|"]
    for cid, what, extra, _ in CASES:
        out = Path(tempfile.mkdtemp()) / "o.json"
        res = run_in_process(build_args(f, extra, out))
        shown = " ".join(e.format(**f) for e in extra).replace(f["root"] + "/", "").replace(f["root"], ".")
        msg = res.stderr.strip().replace(str(out), "o.json").replace(f["root"] + "/", "").replace(f["root"], ".")
        msg = msg.replace("`root ", "`specdec ").replace("|", "\\|")  # the runner's program name is "root"
        rows.append(f"| {what} | `{shown}` | {res.exit_code} | `` {msg} `` |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    sys.path.insert(0, str(Path(__file__).parent))
    print(markdown_table())


def test_fuse_option_gives_the_same_tokens(files, tmp_path):
    """`specdec generate --fuse` (fused q/k/v and gate/up) emits what the unfused model emits."""
    tokens = []
    for extra in ([], ["--fuse"]):
        out = tmp_path / f"out{len(extra)}.json"
        res = run_in_process(build_args(files, ["--method", "magicdec", "--budget", "6", *extra], out))
        assert res.exit_code == 0, res.stdout + res.stderr
        tokens.append(json.loads(out.read_text())["tokens"])
    assert tokens[0] == tokens[1]


def test_settings_a_run_cannot_use_are_named_in_notes():
    """``generate``: a budget or γ for dense, a budget with Dustin's dense verification and sampling flags at
    temperature 0 are each named in one note (they were dropped without a word); nothing for a run that uses them."""
    from specdec.loading import pipeline_config, unused_settings

    def notes(method, gamma=None, budget=None, ratio=None, t=0.0, p=1.0, k=0, seed=None, options=()):
        cfg = pipeline_config(method, gamma, budget, ratio, t, p, k, seed, None, list(options))
        return unused_settings(cfg, gamma, budget, ratio, t, p, k, seed)

    assert notes("dense", gamma=8, budget=64) == ["--gamma and --budget do not apply to --method dense (no drafts, "
                                                  "full attention)."]
    assert notes("dense", budget=64) == ["--budget does not apply to --method dense (no drafts, full attention)."]
    assert notes("dustin", gamma=4, budget=64, options=["verify=dense"]) == [
        "--budget does not apply with --option verify=dense (the whole context is verified)."]
    assert notes("magicdec", k=5, seed=3)[0].startswith("--top-k, --seed only shape sampling")
    assert notes("magicdec", p=0.9)[0].startswith("--top-p only shape sampling")
    for quiet in (notes("magicdec", gamma=8, budget=64), notes("vegas", t=0.7, p=0.9, k=5, seed=1), notes("dense"),
                  notes("dustin", budget=64)):
        assert quiet == []


def test_a_budget_larger_than_the_prompt_is_refused_only_where_a_budget_is_read():
    """``check_budget``: ``--budget`` beyond the context is an error for a sparse method, and no error for dense
    decoding or Dustin's dense verification, which read no budget (they get a note; the run goes on)."""
    from specdec.errors import SpecdecError
    from specdec.loading import check_budget, pipeline_config

    def check(method, options=()):
        check_budget(pipeline_config(method, None, 4096, None, 0.0, 1.0, 0, None, None, list(options)), 8)

    check("dense")
    check("dustin", ["verify=dense"])
    for method in ("vegas", "magicdec", "dustin"):
        with pytest.raises(SpecdecError, match="exceeds the context of 8 tokens"):
            check(method)


@pytest.mark.parametrize("args, said", [
    (["eval", "--methods", "dense", "--budget", "64", "--output-json", "{tmp}/e.json", "--device", "cpu"],
     ["--budget does not apply to dense in --methods (no drafts, full attention)."]),
    (["eval", "--methods", "vegas,dustin:verify=dense", "--budget-ratio", "0.1", "--output-json", "{tmp}/e.json",
      "--device", "cpu"],
     ["--budget-ratio does not apply to dustin:verify=dense in --methods (verify=dense: the whole context is "
      "verified)."]),
    (["bench", "--methods", "dense,dustin:verify=dense", "--budget", "64", "--output-dir", "{tmp}/b",
      "--device", "cpu"],
     ["--budget does not apply to dense in --methods (no drafts, full attention).",
      "--budget does not apply to dustin:verify=dense in --methods (verify=dense: the whole context is verified)."]),
    (["bench", "--methods", "dense,magicdec,dustin:verify=dense", "--budget", "64", "--output-dir", "{tmp}/b",
      "--device", "cpu"],  # dense beside a method that reads it: the usual baseline, no note
     ["--budget does not apply to dustin:verify=dense in --methods (verify=dense: the whole context is verified)."]),
    (["bench", "--methods", "dense,magicdec", "--budget-ratio", "0.1", "--output-dir", "{tmp}/b", "--device", "cpu"],
     []),
])
def test_eval_and_bench_note_a_budget_a_method_does_not_read(args, said, tmp_path):
    """Finding 25 of a new user's walk: a budget for dense (or Dustin's verify=dense) in ``eval`` / ``bench`` was
    dropped without the note ``generate`` prints; the notes come before the model loads (a missing one here)."""
    res = run_in_process([a.format(tmp=tmp_path) for a in args] + ["--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert lines[:-1] == [f"note: {x}" for x in said], res.stderr
    assert lines[-1].startswith("error: ") and "nowhere" in lines[-1], res.stderr


@pytest.mark.parametrize("args", [
    ["bench", "--methods", "dense", "--output-dir", "{tmp}/b"],
    ["eval", "--output-json", "{tmp}/e.json"],
    ["fidelity", "--output-json", "{tmp}/f.json"],
    ["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "256", "--budget", "64"],
])
@pytest.mark.parametrize("docs, said", [
    ("a.txt,a.txt", "--documents names 'a.txt' twice; give each document once."),
    ("a.txt,./a.txt", "--documents names './a.txt' twice (as 'a.txt' and './a.txt', the same file); give each "
                      "document once."),
    ("pydoc,stdlib:argparse,pydoc", "--documents names 'pydoc' twice; give each document once."),
])
def test_a_document_named_twice_is_refused_before_loading_the_model(args, docs, said, tmp_path, monkeypatch):
    """Finding 27: ``bench --documents a.txt,a.txt`` ran the document twice and printed two identical rows (``eval``
    kept one); every command with ``--documents`` refuses it in one line, as ``eval`` refuses a method named twice."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("some text to read " * 50)
    res = run_in_process([a.format(tmp=tmp_path) for a in args] + ["--documents", docs, "--device", "cpu",
                                                                   "--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert lines == [f"error: {said}"], res.stderr


@pytest.mark.parametrize("args", [
    ["bench", "--methods", "dense", "--output-dir", "{tmp}/b", "--documents"],
    ["eval", "--output-json", "{tmp}/e.json", "--documents"],
    ["fidelity", "--output-json", "{tmp}/f.json", "--documents"],
    ["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "256", "--budget", "64", "--documents"],
])
def test_a_file_named_like_a_built_in_document_is_noted(args, tmp_path, monkeypatch):
    """Finding 28: a file ``./pydoc`` (or ``long:prose``) in the working folder was shadowed by the built-in document
    without a word. The built-in one is still read (scripts keep their meaning); a note says how to read the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pydoc").write_text("my own notes " * 50)
    (tmp_path / "long:prose").write_text("my own prose " * 50)
    res = run_in_process([a.format(tmp=tmp_path) for a in args] + ["pydoc,./pydoc,long:prose", "--device", "cpu",
                                                                   "--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2, res.output  # the missing model, after the notes
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert lines[:-1] == [
        "note: --documents pydoc is the built-in document; a file pydoc exists here too: pass ./pydoc to read the file.",
        "note: --documents long:prose is the built-in document; a file long:prose exists here too: pass ./long:prose "
        "to read the file."], res.stderr
    assert lines[-1].startswith("error: ") and "nowhere" in lines[-1], res.stderr


def test_methods_listing_keeps_its_columns_and_wraps_the_options(capsys):
    """``specdec methods``: every name fits its column (``dustin-adaptive`` pushed its row out of line), the
    near-lossless / lossless column starts at one place, and the option lists wrap at 100 characters."""
    from specdec.cli import list_methods
    from specdec.presets import method_names

    list_methods()
    lines = capsys.readouterr().out.splitlines()
    assert max(len(x) for x in lines) <= 100, max(lines, key=len)
    rows = [x for x in lines if x.split(" ", 1)[0] in method_names()]
    assert len(rows) == len(method_names())
    starts = {len(x) - len(x.split(" ", 1)[1].lstrip()) for x in rows}  # where the second column begins
    assert len(starts) == 1, rows


def test_one_new_token_reports_no_rate(files, tmp_path):
    """``--max-new-tokens 1``: the token comes from the prefill, so there is no decode step to time; the summary says
    so instead of printing 0.00 tok/s. Two tokens print a rate."""
    for n, want in ((1, "no decode step (the prefill gave each token)"), (2, " tok/s")):
        out = tmp_path / f"o{n}.json"
        res = run_in_process(build_args(files, ["--method", "dense", "--max-new-tokens", str(n)], out))
        assert res.exit_code == 0, res.stdout + res.stderr
        assert want in res.stdout and "0.00 tok/s" not in res.stdout, res.stdout


@pytest.mark.parametrize("extra, said", [
    (["--option", "verify=dense"], "verifies densely, so there is nothing to compare"),  # was an AttributeError
    (["--option", "adaptive=true"], "use --adaptive/--no-adaptive"),  # the 'static' row ran the adaptive split
    (["--srh", "a.json", "--option", "srh=b.json"], "--srh a.json and --option srh=b.json were both given"),
    (["--documents", "pydoc,nosuch.txt"], "unknown document 'nosuch.txt'"),  # was found after pydoc had run
    (["--documents", ""], "--documents is empty"),
    (["--passkey-trials", "-2"], "'--passkey-trials'"),  # ran as 0
    (["--context-tokens", "0", "--budgets", "64"], "--context-tokens must be >= 16 (got 0)"),
    (["--gamma", "100"], "--gamma must be between 1 and 64 (got 100)"),  # "pipeline config: field 'gamma'", late
    (["--budgets", ""], "--budgets '' names no budget"),  # finding 33: "(got )"
    (["--budgets", " , "], "--budgets ' , ' names no budget"),
    (["--context-tokens", "256", "--budgets", "64,4096"], "--budgets 4096 is outside 1 .. --context-tokens 256"),
    (["--budgets", "64,64"], "--budgets names 64 twice"),  # ran (and reported) twice
])
def test_fidelity_refuses_what_it_cannot_run_before_loading_the_model(extra, said, tmp_path):
    """``--model`` is a missing path: each error must come before any model work (a new user's report)."""
    res = run_in_process(["fidelity", "--output-json", str(tmp_path / "f.json"), "--model", str(tmp_path / "nowhere"),
                          "--device", "cpu", *extra])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], res.stderr
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("args, said", [
    (["bench", "--methods", "dense,magicdec", "--contexts", "512", "--budget", "1024"],
     "--budget 1024 exceeds the context 512 (--contexts) that magicdec would read it at"),  # ran, table said 1024
    (["bench", "--methods", "dense,magicdec", "--windows", "4", "--batch-sizes", "1"],
     "--windows 4 needs a batch of at least 4 sequences"),  # reported 4 windows, used one
    (["bench", "--methods", "dense", "--documents", "stdlib:nosuch.sub"],
     "no pure-Python standard-library module 'nosuch.sub'"),  # was a ModuleNotFoundError traceback
    (["bench", "--methods", "dense", "--documents", "{tmp}"], "is a directory"),  # was "not an existing file"
    (["bench", "--gamma", "100"], "--gamma must be less than or equal to 64 (got 100)"),  # "pipeline config: field"
    (["demo", "--budget-ratio", "3"], "--budget-ratio must be less than or equal to 1 (got 3.0)"),  # (finding 36)
    (["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "256", "--budget", "1024"],
     "--budget 1024 must be smaller than --context-tokens 256"),  # wrote an artifact of arbitrary heads
    (["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "256", "--budget", "8"],
     "leaves no slot after the 4 sinks and the 16 recent tokens"),
    (["profile-srh", "--output", "{tmp}/s.json", "--documents", "", "--retrieval", "0"],
     "nothing to calibrate on"),  # was a ValueError traceback
    (["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "-10"], "--context-tokens must be >= 24"),
    (["profile-srh", "--output", "{tmp}/s.json", "--context-tokens", "256", "--budget", "64", "--points", "200"],
     "--points 200 exceeds the 124 distinct probe positions of --context-tokens 256"),  # measured duplicates (29)
])
def test_bench_and_profile_srh_refuse_before_loading_the_model(args, said, tmp_path):
    res = run_in_process([a.format(tmp=tmp_path) for a in args] + ["--model", str(tmp_path / "nowhere")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], res.stderr


def test_profile_srh_names_a_context_beyond_the_model_positions(files, tmp_path):
    """Finding 32: ``--context-tokens 100000`` failed in the prefill naming ``max_new_tokens 0`` (not a profile-srh
    option) and ``context_tokens=8192``; it names the user's option and value and the model's limit."""
    res = run_in_process(["profile-srh", "--output", str(tmp_path / "s.json"), "--model", files["model"],
                          "--device", "cpu", "--context-tokens", "100", "--budget", "32", "--documents", files["long"],
                          "--retrieval", "0", "--draft-layers", "1", "--points", "4"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip() and ln.startswith(("error", "note"))]
    assert lines == ["error: --context-tokens 100 exceeds the model's 64 positions; use --context-tokens <= 64."], \
        res.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("extra, said", [
    (["--gamma", "100"], "--gamma must be between 1 and 64 (got 100)"),
    (["--tasks", "", "--documents", ""], "nothing to evaluate: --tasks and --documents are both empty"),
    (["--documents", "pydoc,{tmp}"], "is a directory"),
])
def test_eval_refuses_before_loading_the_model(extra, said, tmp_path):
    res = run_in_process(["eval", "--output-json", str(tmp_path / "e.json"), "--model", str(tmp_path / "nowhere"),
                          "--device", "cpu", *[a.format(tmp=tmp_path) for a in extra]])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], res.stderr


def test_an_output_folder_that_refuses_files_is_found_before_the_work(tmp_path, monkeypatch):
    """``os.access`` says yes to root in ``/proc`` or on a file system that refuses files: the run failed at its
    final write, naming the temporary file ("file not found: /proc/.h.safetensors.axjy2try.tmp"). The output check
    makes (and removes) a probe file; a write that fails still names the user's path."""
    import tempfile as tf

    from specdec.errors import SpecdecError
    from specdec.outputs import check_output, check_output_dir, write_text

    real = tf.mkstemp

    def refuse(*a, dir=None, **k):
        if str(dir).startswith(str(tmp_path / "ro")):
            raise PermissionError(13, "Permission denied")
        return real(*a, dir=dir, **k)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(tf, "mkstemp", refuse)
    with pytest.raises(SpecdecError, match=r"^--output-json .*/ro/o.json: directory .*/ro is not writable"):
        check_output(tmp_path / "ro" / "o.json", "--output-json")
    with pytest.raises(SpecdecError, match=r"^--output-dir .*/ro: directory .*/ro is not writable"):
        check_output_dir(tmp_path / "ro", "--output-dir")
    with pytest.raises(SpecdecError, match=r"^--output-dir .*/ro/new: directory .*/ro is not writable"):
        check_output_dir(tmp_path / "ro" / "new", "--output-dir")
    assert check_output(tmp_path / "o.json", "--output-json") == tmp_path / "o.json"
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".specdec-probe")]  # the probe is removed

    import specdec.outputs as outputs

    monkeypatch.setattr(outputs, "check_output", lambda p, o: outputs.Path(p))  # the folder changed after the check
    with pytest.raises(SpecdecError, match=r"^cannot write --out .*/ro/d.safetensors: Permission denied"):
        write_text(tmp_path / "ro" / "d.safetensors", "x", "--out")
