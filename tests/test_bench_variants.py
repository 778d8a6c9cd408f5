"""``specdec bench`` with variants of one method in the same run (``--methods dense,tree=dustin``) and per-entry
options (``--option tree:verify=dense``): each row runs its own options, interleaved with the same dense engine."""

from __future__ import annotations

import json

import pytest

from specdec.bench import method_labels, run_bench
from specdec.errors import SpecdecError


def test_variants_run_their_own_options_beside_dense(tmp_path):
    rows = run_bench(["dense", "chain=dustin", "tree=dustin"], [96], [1], ["stdlib:textwrap"], 8, 24, None, 4,
                     "smollm2-135m", "torch", "float32", "cpu", False, tmp_path, "v", repeats=1, adaptive=False,
                     method_options={"chain": {"verify": "dense"}, "tree": {"verify": "dense", "tree": True}})
    assert [r["method"] for r in rows] == ["dense", "chain", "tree"]
    assert rows[1]["base_method"] == rows[2]["base_method"] == "dustin" and "base_method" not in rows[0]
    assert rows[1]["options"] == {"verify": "dense"} and rows[2]["options"] == {"verify": "dense", "tree": True}
    assert all(r["lossless"] and r["same_tokens_as_dense"] for r in rows)  # dense verification: dense's tokens
    meta = json.loads((tmp_path / "v.json").read_text())["meta"]
    assert meta["methods"]["tree"] == {"method": "dustin", "options": {"verify": "dense", "tree": True}}
    assert '- tree: dustin with {"verify": "dense", "tree": true}' in (tmp_path / "v.md").read_text()


def test_bad_variants_are_one_line_errors(tmp_path):
    assert method_labels(["dense", "a=dustin", "magicdec"]) == {"dense": "dense", "a": "dustin", "magicdec": "magicdec"}
    for methods, what in [(["dense", "a=dustin", "a=magicdec"], "twice"), (["x=dense"], "dense takes no label"),
                          (["vegas=dustin"], "may not be a method's name"), (["=dustin"], "METHOD or LABEL=METHOD"),
                          (["a=nope"], "unknown method")]:
        with pytest.raises(SpecdecError, match=what):
            method_labels(methods)
    args = (["dense", "t=dustin"], [96], [1], ["stdlib:textwrap"], 4, 24, None, 4, "smollm2-135m", "torch", "float32",
            "cpu", False, tmp_path, "e")
    with pytest.raises(SpecdecError, match="which --methods does not name"):
        run_bench(*args, method_options={"u": {"verify": "dense"}})
    with pytest.raises(SpecdecError, match="add the option verify=dense"):
        run_bench(*args, method_options={"t": {"tree": True}})
