"""``specdec bench`` with a method's own options per ``--methods`` entry (``dustin:verify=dense:tree=true``, as
``specdec eval`` takes them): variants of one method run side by side, interleaved with the same dense engine."""

from __future__ import annotations

import json

import pytest

from specdec.bench import method_specs, run_bench
from specdec.errors import SpecdecError

CHAIN, TREE = "dustin:verify=dense", "dustin:verify=dense:tree=true"


def test_variants_run_their_own_options_beside_dense(tmp_path):
    rows = run_bench(["dense", CHAIN, TREE], [96], [1], ["stdlib:textwrap"], 8, 24, None, 4, "smollm2-135m", "torch",
                     "float32", "cpu", False, tmp_path, "v", repeats=1, adaptive=False)
    assert [r["method"] for r in rows] == ["dense", CHAIN, TREE]
    assert rows[1]["base_method"] == rows[2]["base_method"] == "dustin" and "base_method" not in rows[0]
    assert rows[1]["options"] == {"verify": "dense"} and rows[2]["options"] == {"verify": "dense", "tree": True}
    assert all(r["lossless"] and r["same_tokens_as_dense"] for r in rows)  # dense verification: dense's tokens
    meta = json.loads((tmp_path / "v.json").read_text())["meta"]
    assert meta["methods"][TREE] == {"method": "dustin", "options": {"verify": "dense", "tree": True}}
    assert f'- {TREE}: dustin with options {{"verify": "dense", "tree": true}}' in (tmp_path / "v.md").read_text()


def test_bad_entries_are_one_line_errors(tmp_path):
    assert method_specs(["dense", "dustin:lookup_min=0:margin=0.5"]) == {
        "dense": ("dense", {}), "dustin:lookup_min=0:margin=0.5": ("dustin", {"lookup_min": 0, "margin": 0.5})}
    for methods, what in [(["dense", "dense"], "twice"), (["dustin:verify"], "must look like key=value"),
                          (["nope:x=1"], "unknown method")]:
        with pytest.raises(SpecdecError, match=what):
            method_specs(methods)
    args = ([96], [1], ["stdlib:textwrap"], 4, 24, None, 4, "smollm2-135m", "torch", "float32", "cpu", False, tmp_path,
            "e")
    for methods, what in [(["dense", "magicdec:tree=true"], "unknown magicdec option 'tree'"),
                          (["dense", "dustin:verify=fast"], "'sparse' or 'dense'")]:  # before the model loads
        with pytest.raises(SpecdecError, match=what):
            run_bench(methods, *args)
    with pytest.raises(SpecdecError, match="add the option verify=dense"):
        run_bench(["dense", "dustin:tree=true"], *args)
