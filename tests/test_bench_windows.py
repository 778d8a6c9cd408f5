"""``specdec bench --windows K``: a batch cycles K different windows of each document (one prefill), and every
sequence's tokens are compared with dense's; before, every sequence continued one window (τ of one window)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import make_tiny
from specdec import PipelineConfig, build_engine
from specdec.bench import _prefilled
from specdec.data import context_windows
from specdec.errors import SpecdecError


class _Tok:
    """A tokenizer whose ids are the characters' positions: ``"abc"`` -> ``[0, 1, 2]``."""

    def __call__(self, text, add_special_tokens=False):
        return type("E", (), {"input_ids": list(range(len(text)))})()


def test_context_windows_end_stride_apart_and_short_documents_fail():
    w = context_windows(_Tok(), "x" * 100, 10, 3, offset=5, stride=20)
    assert w == [list(range(85, 95)), list(range(65, 75)), list(range(45, 55))]
    with pytest.raises(SpecdecError, match=r"fewer than the 106 that 3 windows of 10 tokens 46 apart need; .*--windows"):
        context_windows(_Tok(), "x" * 100, 10, 3, offset=4, stride=46)
    with pytest.raises(SpecdecError, match=r"^document 'a.txt' has 100 tokens, fewer than the 106 that a context of "
                       r"100 tokens and 6 after it need; use a longer document or a smaller --contexts\.$"):
        context_windows(_Tok(), "x" * 100, 100, 1, offset=6, stride=1000, name="document 'a.txt'",
                        context_option="--contexts")


def test_prefilled_windows_cycle_over_the_batch_and_decode_like_plain_prompts():
    m = make_tiny("llama")
    wins = [list(range(3, 43)), [5, 9, 17, 33, 2, 8] * 7 + [1], list(range(60, 20, -1))]
    eng = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1)
    pre = _prefilled(eng, m, wins, 5, random_cache=False)
    assert pre.ids == [wins[0], wins[1], wins[2], wins[0], wins[1]] and pre.k.shape[1] == 5
    one = eng.prefill([wins[1]])
    torch.testing.assert_close(pre.k[:, 4], one.k[:, 0])  # sequence 4 continues window 1
    want = eng.generate(pre.ids, max_new_tokens=6).tokens
    assert eng.generate(pre.ids, max_new_tokens=6, prefilled=pre).tokens == want
    spec = build_engine(m, PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=3,
                                               adaptive=False), eos_token_id=-1)
    assert spec.generate(pre.ids, max_new_tokens=6, prefilled=pre).tokens == want
    single = _prefilled(eng, m, wins[:1], 3, random_cache=False)  # one window: views, no copy
    assert single.ids == [wins[0]] * 3 and single.k.stride(1) == 0


def test_bench_windows_on_the_embedded_model(tmp_path):
    from specdec.bench import run_bench

    rows = run_bench(["dense", "magicdec"], [96], [4], ["stdlib:textwrap"], 6, 24, None, 3, "smollm2-135m",
                     "reference", "float32", "cpu", False, tmp_path, "w", repeats=1, windows=3, window_stride=40,
                     adaptive=False)
    assert [r["same_tokens_as_dense"] for r in rows] == [True, True]  # all four sequences of each row
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["meta"]["windows"] == 3 and data["meta"]["window_stride"] == 40
    md = (tmp_path / "w.md").read_text()
    assert "- contexts: 3 windows of each document, ends 40 tokens apart" in md
    # the batch's rounds, which its slowest sequence sets, next to the mean τ
    assert "| method | τ | iterations |" in md
    assert "- tokens/s: median of 1 timed runs (min–max)\n" in md  # no HF rows: no word of HF baselines
    for r in rows:
        assert f"| {r['method']} | {r['tau']:.2f} | {r['iterations']} |" in md
    assert rows[0]["iterations"] == 5 and 1 <= rows[1]["iterations"] <= 5  # dense: a step per token after the first
    for ctx, bs, what in (([48, 0], [1], r"--contexts must be >= 1 each \(got 0\)"),
                          ([48], [1, -2], r"--batch-sizes must be >= 1 each \(got -2\)")):
        with pytest.raises(SpecdecError, match=what):
            run_bench(["dense"], ctx, bs, ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path,
                      "s")
    with pytest.raises(SpecdecError, match="--windows and --window-stride must be >= 1"):
        run_bench(["dense"], [48], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path,
                  "s", windows=0)
    with pytest.raises(SpecdecError, match="--windows takes windows of documents"):
        run_bench(["dense"], [48], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path,
                  "s", windows=2, shape="tiny")


def test_prefilled_carries_the_sliding_window_rings():
    """Gemma 3 (local + global layers): the bench's shared prefill dropped the rings, and generate refused it
    ("the prefilled cache's sliding-window rings do not match this cache's"): every Gemma bench row failed."""
    from test_sliding_window import tiny_windowed

    from specdec.models import SpecdecModel

    m = SpecdecModel(tiny_windowed("gemma3"))
    ids = list(range(3, 60))
    eng = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1)
    for wins in ([ids], [ids, ids[::-1]]):
        pre = _prefilled(eng, m, wins, 3, random_cache=False)
        assert pre.ring_k is not None and pre.ring_k.shape[1] == 3
        assert eng.generate(pre.ids, max_new_tokens=4, prefilled=pre).tokens == eng.generate(pre.ids, max_new_tokens=4).tokens


def test_markdown_table_mentions_hf_warmup_only_with_hf_rows():
    from specdec.bench import markdown_table

    row = dict(document="d", context=8, batch=1, method="dense", tau=1.0, iterations=3, tokens_per_second=2.0)
    hf = dict(row, method="hf-generate-static", iterations=None)
    meta = dict(model="m", gamma=4, budget_ratio=0.05, repeats=3)
    assert "HF baselines warmed up" not in markdown_table(meta, [row])
    md = markdown_table(meta, [row, hf])
    assert "- tokens/s: median of 3 timed runs (min–max); HF baselines warmed up at the same shape" in md
    assert "| hf-generate-static | 1.00 | None |" not in md and "| hf-generate-static | 1.00 |  |" in md


def test_a_differing_batch_says_where_it_leaves_dense():
    """A lossless row whose tokens differ from dense's (bf16 near-ties) reports how many sequences differ and from
    which token, in the row and in the table."""
    from specdec.bench import divergence, markdown_table

    dense = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 9]]
    assert divergence(got, dense) == dict(sequences=2, of=3, first=2)
    assert divergence(dense, dense) == dict(sequences=0, of=3, first=-1)
    row = dict(document="d", context=8, batch=3, method="vegas", tau=4.0, iterations=3, tokens_per_second=2.0,
               same_tokens_as_dense=False, divergence=divergence(got, dense))
    md = markdown_table(dict(model="m", gamma=4, budget_ratio=0.05, repeats=3), [row, dict(row, method="dense",
                                                                                      same_tokens_as_dense=True)])
    assert "| False (2/3 sequences, from token 2) |" in md and md.rstrip().endswith("| True |")


def test_each_row_is_checked_against_dense_when_it_is_saved(tmp_path, monkeypatch):
    """A bench cut short keeps the losslessness check of the rows it saved: each row is compared with its
    setting's dense row as soon as it is timed, not only when the whole run ends."""
    import specdec.outputs as outputs
    from specdec.bench import run_bench

    saved, real = [], outputs.write_text

    def spy(path, text, what):  # every JSON the run writes, in order (run_bench imports write_text when called)
        if str(path).endswith(".json"):
            saved.append(json.loads(text)["rows"])
        return real(path, text, what)

    monkeypatch.setattr(outputs, "write_text", spy)
    run_bench(["dense", "magicdec"], [48], [2], ["stdlib:textwrap"], 4, 16, None, 3, "smollm2-135m", "reference",
              "float32", "cpu", False, tmp_path, "c", repeats=1, adaptive=False)
    first_with_both = next(rows for rows in saved if len(rows) == 2)  # saved right after magicdec was timed
    assert [r.get("same_tokens_as_dense") for r in first_with_both] == [True, True]


def test_document_files_are_read_as_strictly_as_prompt_files(tmp_path):
    """``--documents PATH`` (bench, eval): a binary file or bytes that are not UTF-8 are refused in one line, as
    ``--prompt-file`` refuses them (they were decoded with replacement characters without a word)."""
    from specdec.data import load_document

    (tmp_path / "bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)))
    (tmp_path / "latin").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (tmp_path / "ok").write_text("café au lait\n", encoding="utf-8")
    with pytest.raises(SpecdecError, match="NUL byte at offset 7: it is a binary file"):
        load_document(str(tmp_path / "bin"))
    with pytest.raises(SpecdecError, match=r"not valid utf-8 text \(byte 0xe9 at offset 3\)"):
        load_document(str(tmp_path / "latin"))
    assert load_document(str(tmp_path / "ok")) == "café au lait\n"
