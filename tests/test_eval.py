"""`specdec eval`: task generation, paired statistics, lossless methods score exactly dense, plugins run, CLI."""

import json

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.evaluation import (TASKS, bootstrap_ci, make_sample, markdown, parse_methods, plot, run_eval, score,
                                sign_test, task_source)

from conftest import make_tiny


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from specdec.models import _cache_dir, embedded_model_path, load_hf

    g = embedded_model_path("smollm2-135m")
    cached = _cache_dir() / f"{g.stem}-{g.stat().st_size}"
    if not (cached / "tokenizer_config.json").is_file():
        load_hf("smollm2-135m")
    return AutoTokenizer.from_pretrained(str(cached), local_files_only=True)


@pytest.fixture(scope="module")
def tiny_vocab():
    """A tiny random Llama with the embedded model's vocabulary (its tokenizer makes the tasks)."""
    return make_tiny("llama", seed=5, vocab_size=49152, num_hidden_layers=2)


@pytest.mark.parametrize("task", TASKS)
def test_samples_fill_the_context_and_hold_their_answers(tok, task):
    s = make_sample(task, tok, 512, seed=3)
    assert len(s["prompt"]) == 512
    text = tok.decode(s["prompt"])
    assert s["answers"] and all(a in text for a in s["answers"])
    assert make_sample(task, tok, 512, seed=3)["prompt"] == s["prompt"]  # seeded
    assert make_sample(task, tok, 512, seed=4)["prompt"] != s["prompt"]


def test_score_and_paired_statistics():
    assert score("The pass key is 12345.", ["12345"]) == 1.0
    assert score("a B c", ["b", "d"]) == 0.5
    assert sign_test([1, 1, 1, 1, 1, 1]) == pytest.approx(2 / 64)
    assert sign_test([0, 0, 0]) == 1.0
    assert sign_test([1, -1, 0]) == 1.0
    lo, hi = bootstrap_ci([0.0] * 10)
    assert lo == hi == 0.0
    lo, hi = bootstrap_ci([1.0, 0.0] * 20)
    assert 0.3 < lo < 0.5 < hi < 0.7


def test_parse_methods():
    m = parse_methods("vegas,dustin:draft=early-exit:dense_every=8")
    assert m["dustin:draft=early-exit:dense_every=8"] == ("dustin", {"draft": "early-exit", "dense_every": 8})
    with pytest.raises(SpecdecError, match="unknown method"):
        parse_methods("nope")
    with pytest.raises(SpecdecError, match="key=value"):
        parse_methods("dustin:oops")


def test_lossless_methods_score_exactly_dense_and_plugins_run(tok, tiny_vocab, tmp_path):
    from specdec import presets
    from specdec.dustin import DustinOptions, build_dustin
    from specdec.registry import METHODS

    @presets.register_method("eval-test-plugin", "a lossy plugin method (Dustin under another name)", lossless=False,
                             options=DustinOptions)
    def _plugin(model, cfg, options, **kw):
        return build_dustin(model, cfg, options, **kw)

    try:
        methods = parse_methods("vegas,eval-test-plugin:draft=early-exit")
        res = run_eval(tiny_vocab, methods, TASKS, context=256, samples=1, budget=48, gamma=3,
                       documents=["pydoc"], doc_tokens=8, tokenizer=tok, log=lambda s: None, max_new_tokens=4)
    finally:
        METHODS._entries.pop("eval-test-plugin", None)  # do not leak into other tests' method matrices
    for label in ("vegas",):
        for r in res["tasks"]:
            assert r["methods"][label]["identical"], (label, r["task"])
            assert r["methods"][label]["score"] == r["dense"]
        s = res["summary"][label]
        assert s["agreement"] == 1.0 and s["tf_agreement"] == 1.0 and s["tv_mean"] == 0.0
        assert all(t["diff"] == 0 and t["sign_p"] == 1.0 for t in s["tasks"].values())
    assert "eval-test-plugin:draft=early-exit" in res["summary"]
    md = markdown(res, dict(date="today", command="specdec eval"))
    assert "| passkey |" in md and "| pydoc | vegas | 100.00% (7) | 100.00% |" in md
    png = plot(res, tmp_path / "e.png")
    assert png.stat().st_size > 1000
    json.dumps(res)  # JSON-serialisable
    assert res["task_text"] == task_source()  # recorded from the Python API too, not only by the CLI


def test_a_context_past_the_models_positions_is_refused_before_any_prefill(tok, tiny_vocab, monkeypatch):
    """``eval --context-tokens`` past the model's positions: one line at once (it ran for minutes, then failed)."""
    from specdec.engine import SpeculativeEngine

    def no_prefill(*a, **k):
        raise AssertionError("prefilled before the positions were checked")

    eng = SpeculativeEngine(tiny_vocab, method="dense")
    n = tiny_vocab.dims.max_positions
    with pytest.raises(SpecdecError, match=f"prompt of {n + 1} tokens \\+ max_new_tokens 0 exceeds"):
        eng.prefill([list(range(5, n + 6))])  # (the engine's own prefill: refused before the forward)
    monkeypatch.setattr(SpeculativeEngine, "prefill", no_prefill)
    with pytest.raises(SpecdecError, match=f"exceeds the model's {n} positions; .*--context-tokens {n - 8}"):
        run_eval(tiny_vocab, parse_methods("magicdec"), ["passkey"], context=n, samples=1, documents=[],
                 tokenizer=tok, log=lambda s: None)
    with pytest.raises(SpecdecError, match=f"exceeds the model's {n} positions; .*--context-tokens {n - 64}"):
        run_eval(tiny_vocab, parse_methods("magicdec"), [], context=256, doc_context=n, samples=1,
                 documents=["pydoc"], tokenizer=tok, log=lambda s: None)


def test_sparse_verification_shows_tv(tok, tiny_vocab):
    """The TV probe can fail: a tiny-budget Dustin verifies sparsely, so its distributions differ from dense."""
    res = run_eval(tiny_vocab, parse_methods("dustin:draft=early-exit"), ["passkey"], context=256, samples=1,
                   budget=24, gamma=3, documents=["pydoc"], doc_tokens=12, tokenizer=tok, log=lambda s: None,
                   max_new_tokens=4)
    s = res["summary"]["dustin:draft=early-exit"]
    assert s["tv_mean"] > 0
    assert 0 < s["kv_read_vs_dense"] < 1  # the cost of a lossy verifier is reported beside its fidelity
    assert f"{s['kv_read_vs_dense']:.1%} |" in markdown(res, {})


def test_cli_bad_input_one_line(tmp_path):
    from typer.testing import CliRunner

    from specdec.cli import app

    r = CliRunner().invoke(app, ["eval", "--output-json", str(tmp_path / "o.json"), "--tasks", "bogus"])
    assert r.exit_code == 2 and "unknown task 'bogus'" in r.output
    r = CliRunner().invoke(app, ["eval", "--output-json", str(tmp_path / "o.json"), "--methods", "nope"])
    assert r.exit_code == 2 and "unknown method" in r.output
    r = CliRunner().invoke(app, ["eval", "--output-json", str(tmp_path / "o.json"), "--budget", "9999"])
    assert r.exit_code == 2 and "exceeds --context-tokens" in r.output


def test_teacher_forced_agreement_counts_each_position(tiny_vocab):
    """Forced onto a trajectory, the run emits exactly it, and each position whose greedy token differs
    from the trajectory's is counted once: a lossless verifier on a trajectory with its last token changed
    agrees everywhere but there."""
    from specdec.engine import SpeculativeEngine
    from specdec.evaluation import DenseTwin
    from specdec.presets import PipelineConfig, build_engine

    prompt = [int(t) for t in torch.randint(5, 1000, (40,), generator=torch.Generator().manual_seed(3))]
    dense = SpeculativeEngine(tiny_vocab, method="dense", eos_token_id=-1)
    ref = dense.generate([prompt], 12).tokens[0]
    planted = ref[:-1] + [(ref[-1] + 1) % 1000]
    for traj, misses in ((ref, 0), (planted, 1)):
        eng = build_engine(tiny_vocab, PipelineConfig.make(method="vegas", gamma=3), eos_token_id=-1)
        eng.verifier = DenseTwin(eng.verifier, forced=[prompt + traj])
        out = eng.generate([prompt], 12).tokens[0]
        assert out == traj
        s = eng.verifier.summary()
        assert s["tf_rows"] == 11  # every position after the prefill's token, scored once
        assert s["tf_agreement"] == (11 - misses) / 11


def test_teacher_forced_agreement_is_reported_for_documents(tok, tiny_vocab):
    """Both agreements per document: a full budget is exactly dense, a tiny one is not (teacher-forced < 1)."""
    res = run_eval(tiny_vocab, parse_methods("dustin:draft=early-exit"), [], context=256, samples=1,
                   budget_ratio=1.0, gamma=3, documents=["pydoc"], doc_tokens=10, tokenizer=tok, log=lambda s: None)
    d = res["documents"][0]["methods"]["dustin:draft=early-exit"]
    assert d["tf_agreement"] == 1.0 and d["agreement"] == 1.0 and d["tf_rows"] == 9
    res = run_eval(tiny_vocab, parse_methods("dustin:draft=early-exit"), [], context=256, samples=1,
                   budget=12, gamma=3, documents=["pydoc"], doc_tokens=10, tokenizer=tok, log=lambda s: None)
    s = res["summary"]["dustin:draft=early-exit"]
    assert s["tf_agreement"] < 1.0
    assert "agreement, teacher-forced" in markdown(res, {})


def test_pydoc_parts_are_held_out_prose():
    """``pydoc:<i>/<n>`` split the topics into n runs that cover them once; the built-in ``pydoc`` text
    (whose end is what benchmarks read) ends with the last part, and bad specs say how to write one."""
    from specdec.data import load_document

    full = load_document("pydoc")
    parts = [load_document(f"pydoc:{i}/4") for i in range(1, 5)]
    assert "\n\n".join(parts) == full and all(len(p) > len(full) // 8 for p in parts)
    with pytest.raises(SpecdecError, match="pydoc:<i>/<n>"):
        load_document("pydoc:5/4")


def test_the_task_text_is_recorded_with_the_python_that_made_it(tmp_path, monkeypatch):
    """The synthetic tasks' haystack and words are the running Python's ``pydoc_data``: ``specdec eval`` records the
    Python version and a digest of that text in its settings (JSON and Markdown), so runs on 3.11 and 3.12 — which
    have other samples — can be told apart. The digest follows the text."""
    import platform

    from typer.testing import CliRunner

    import specdec.data
    import specdec.evaluation as ev
    import specdec.loading
    from specdec.cli import app

    src = ev.task_source()
    assert src["python"] == platform.python_version() and len(src["pydoc_sha256"]) == 12
    real = specdec.data.load_document
    with monkeypatch.context() as mp:
        mp.setattr(specdec.data, "load_document", lambda n: real(n) + " changed" if n == "pydoc" else real(n))
        assert ev.task_source()["pydoc_sha256"] != src["pydoc_sha256"]

    monkeypatch.setattr(specdec.loading, "load_model", lambda *a, **k: object())  # no model: the run is faked
    monkeypatch.setattr(ev, "run_eval", lambda *a, **k: dict(tasks=[], documents=[], summary={}))
    out, md = tmp_path / "e.json", tmp_path / "e.md"
    r = CliRunner().invoke(app, ["eval", "--output-json", str(out), "--output-md", str(md), "--documents", ""])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["meta"]["task_text"] == src
    assert f'"pydoc_sha256": "{src["pydoc_sha256"]}"' in md.read_text()


@pytest.mark.parametrize("kw, said", [
    (dict(budget=0), r"^budget must be >= 1 \(got 0\)\.$"),
    (dict(budget=64, budget_ratio=0.1), r"^budget 64 and budget_ratio 0.1 were both given; pass only one\.$"),
    (dict(budget_ratio=1.5), r"^budget_ratio must be in \(0, 1\] \(got 1.5\)\.$"),
    (dict(budget=999), r"^budget 999 exceeds context 256; use a budget <= 256\.$"),
    (dict(samples=0), r"^context must be >= 256 and samples >= 1 \(got 256, 0\)\.$"),
])
def test_run_eval_names_its_own_arguments(tok, tiny_vocab, kw, said):
    """The Python API checks what the CLI checks (``budget_ratio``, ``budget`` < 1 and both budgets were the CLI's
    alone), naming ``run_eval``'s arguments rather than the CLI's flags; nothing is prefilled first."""
    with pytest.raises(SpecdecError, match=said):
        run_eval(tiny_vocab, parse_methods("magicdec"), ["passkey"], **{"context": 256, "samples": 1, **kw},
                 documents=[], tokenizer=tok, log=lambda s: None)


def test_a_bad_document_or_method_fails_before_any_run(tok, tiny_vocab, monkeypatch, tmp_path):
    """An unknown or short document given last, or a method that cannot be built, failed only after every task and
    the earlier documents had run (57 s in a tiny run, nothing written); they fail before the first prefill now,
    naming the document. A list or a string where a dict / list belongs is one line too."""
    from specdec.engine import SpeculativeEngine

    def no_prefill(*a, **k):
        raise AssertionError("prefilled before the inputs were checked")

    monkeypatch.setattr(SpeculativeEngine, "prefill", no_prefill)
    short = tmp_path / "short.txt"
    short.write_text("only a few words here")
    kw = dict(context=256, samples=1, tokenizer=tok, log=lambda s: None)
    with pytest.raises(SpecdecError, match=r"unknown document 'nosuch.txt'"):
        run_eval(tiny_vocab, parse_methods("magicdec"), ["passkey"], documents=["pydoc", "nosuch.txt"], **kw)
    with pytest.raises(SpecdecError, match=rf"the document '{short}' has \d+ tokens, fewer than the 336 requested "
                                           r"\(256 of context \+ 80 after it\)"):
        run_eval(tiny_vocab, parse_methods("magicdec"), ["passkey"], documents=[str(short)], **kw)
    with pytest.raises(SpecdecError, match=r"srh"):
        run_eval(tiny_vocab, parse_methods(f"magicdec,dustin:srh={tmp_path / 'none.json'}"), ["passkey"],
                 documents=[], **kw)
    with pytest.raises(SpecdecError, match=r"^methods must be a dict \{label: \(method, options\)\}, got list"):
        run_eval(tiny_vocab, ["vegas"], ["passkey"], documents=[], **kw)
    with pytest.raises(SpecdecError, match=r"^tasks must be a list of names, not the string 'passkey'"):
        run_eval(tiny_vocab, parse_methods("vegas"), "passkey", documents=[], **kw)
    with pytest.raises(SpecdecError, match=r"^--methods names vegas more than once"):
        parse_methods("vegas,magicdec,vegas")


def test_fidelity_checks_positions_documents_and_variants_before_any_prefill(tok, tiny_vocab, monkeypatch, tmp_path):
    """``run_fidelity`` (``specdec fidelity``): a context past the model's positions ran its prefills for minutes
    before failing; an unknown or short document given last failed after the others ran; a variant that cannot be
    built failed after the dense run."""
    from specdec.engine import SpeculativeEngine
    from specdec.fidelity import run_fidelity

    def no_prefill(*a, **k):
        raise AssertionError("prefilled before the inputs were checked")

    monkeypatch.setattr(SpeculativeEngine, "prefill", no_prefill)
    monkeypatch.setattr(tiny_vocab, "tokenizer", tok, raising=False)
    n = tiny_vocab.dims.max_positions
    variants = {"static": ("dustin", {"draft": "early-exit"})}
    with pytest.raises(SpecdecError, match=f"exceeds the model's {n} positions; .*--context-tokens {n - 8}"):
        run_fidelity(tiny_vocab, ["pydoc"], n, [64], variants, max_new_tokens=8, log=lambda s: None)
    with pytest.raises(SpecdecError, match=r"unknown document 'nosuch.txt'"):
        run_fidelity(tiny_vocab, ["pydoc", "nosuch.txt"], 256, [64], variants, max_new_tokens=8, log=lambda s: None)
    with pytest.raises(SpecdecError, match=r"srh"):
        run_fidelity(tiny_vocab, ["pydoc"], 256, [64], {"static": ("dustin", {"srh": str(tmp_path / "no.json")})},
                     max_new_tokens=8, log=lambda s: None)


def test_fidelity_report_explains_agreement_against_identical_runs_and_dashes_no_divergence():
    """Finding 35 of a new user's walk: ``emitted agreement 100.00%`` beside ``identical runs 1/2`` read as a
    contradiction with no legend, and a run that never diverged showed ``first divergence 8`` (its length)."""
    from specdec.fidelity import markdown

    row = dict(document="pydoc", budget=128, variant="static", emitted_agreement=1.0, row_agreement=1.0, tv_mean=0.0,
               tau=2.0, verifier={})
    result = dict(rows=[dict(row, identical=True, first_divergence=8),
                        dict(row, document="stdlib:argparse", identical=False, first_divergence=7)], passkey=[])
    md = markdown(result, "specdec fidelity", {})
    assert "*Emitted agreement*" in md and "*Identical runs*" in md and "still not be identical" in md
    per_doc = [ln for ln in md.splitlines() if ln.startswith(("| pydoc |", "| stdlib:argparse |"))]
    assert [ln.split(" | ")[5] for ln in per_doc] == ["—", "7"], per_doc


def test_eval_report_dashes_a_document_run_that_never_diverged():
    """Finding 35, the same in ``specdec eval``'s document table: a run equal to dense's showed its length."""
    from specdec.evaluation import markdown

    m = dict(tf_agreement=1.0, tf_rows=8, agreement=1.0, tv_mean=0.0, tv_max=0.0, tau=2.0, kv_read_vs_dense=None)
    result = dict(summary={"vegas": dict(tasks={}, tf_agreement=1.0, agreement=1.0)},
                  documents=[dict(document="pydoc", methods={"vegas": dict(m, identical=True, first_divergence=8)}),
                             dict(document="a.txt", methods={"vegas": dict(m, identical=False, first_divergence=3)})])
    md = markdown(result, {})
    rows = [ln for ln in md.splitlines() if ln.startswith(("| pydoc | vegas", "| a.txt | vegas"))]
    assert [ln.split(" | ")[4] for ln in rows] == ["—", "3"], rows
    assert "*First divergence*" in md
