"""The docs site's build-time checks and generators (docs/hooks/*.py), without building the site.

The full strict build (scripts/test.sh) runs these on the real site; here each check is shown to
fail on a planted defect, in milliseconds.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"


def _load(name: str):
    """A module of docs/hooks by file (the hooks are not a package; they import each other by name)."""
    if str(HOOKS) not in sys.path:
        sys.path.insert(0, str(HOOKS))
    spec = importlib.util.spec_from_file_location(name, HOOKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


sitecheck = _load("sitecheck")
benchpage = _load("benchpage")
hooks = _load("specdec_docs")


# -- tutorials ------------------------------------------------------------------------------------
def _nb(tmp_path: Path, cells: list[dict]) -> Path:
    p = tmp_path / "t.ipynb"
    p.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return p


def _code(count, outputs=(), src="x = 1"):
    return {"cell_type": "code", "execution_count": count, "metadata": {}, "outputs": list(outputs), "source": [src]}


def test_notebook_check_accepts_an_executed_notebook(tmp_path):
    md = {"cell_type": "markdown", "metadata": {}, "source": ["# T"]}
    ok = _nb(tmp_path, [md, _code(1), _code(2, [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}]),
                        _code(None, src="   ")])  # an empty cell needs no run
    assert sitecheck.notebook_problems(ok) == []


@pytest.mark.parametrize(
    "cells, expected",
    [
        ([_code(None)], "never executed"),
        ([_code(1), _code(3)], "expected 2"),
        ([_code(2), _code(1)], "expected 1"),
        ([_code(1, [{"output_type": "stream", "name": "stderr", "text": ["TqdmWarning: IProgress not found\n"]}])], "stderr"),
        ([_code(1, [{"output_type": "error", "ename": "ValueError", "evalue": "boom", "traceback": []}])], "ValueError"),
    ],
)
def test_notebook_check_refuses_unexecuted_or_noisy_cells(tmp_path, cells, expected):
    problems = sitecheck.notebook_problems(_nb(tmp_path, cells))
    assert problems and expected in problems[0]


def test_stored_tutorials_are_executed():
    """What the site shows is what the notebooks store (scripts/execute_tutorials.sh refreshes them)."""
    notebooks = sorted((ROOT / "tutorials").glob("*.ipynb"))
    assert notebooks
    bad = {nb.name: sitecheck.notebook_problems(nb) for nb in notebooks}
    assert not {k: v for k, v in bad.items() if v}


# -- the built site -------------------------------------------------------------------------------
def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for rel, body in pages.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"<html><head></head><body>{body}</body></html>")
    return tmp_path


def test_site_check_accepts_working_links(tmp_path):
    site = _site(tmp_path, {
        "index.html": '<a href="a/">a</a> <a href="a/#sec">sec</a> <a href="#top" id="top">t</a>'
                      '<img src="img/x.svg"> <a href="https://example.org/">out</a> <a href="mailto:x@y">m</a>',
        "a/index.html": '<h2 id="sec">S</h2><a href="../">home</a><link rel="canonical" href="https://x.org/a/">',
        "img/x.svg": "",
    })
    assert sitecheck.site_problems(site) == []


@pytest.mark.parametrize(
    "body, expected",
    [
        ('<a href="missing/">x</a>', "broken link"),
        ('<a href="concepts/memory-bound.md">x</a>', "broken link"),  # an unconverted notebook link
        ('<a href="a/#nope">x</a>', "no id 'nope'"),
        ('<a href="#reading">x</a>', "no id 'reading'"),
        ('<script src="https://unpkg.com/mathjax@3/es5/tex-mml-chtml.js"></script>', "outside the site"),
        ('<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">', "outside the site"),
        ('<a href="/a/">x</a>', "absolute link"),
    ],
)
def test_site_check_finds_broken_links_and_external_loads(tmp_path, body, expected):
    site = _site(tmp_path, {"index.html": body, "a/index.html": '<h2 id="sec">S</h2>'})
    problems = sitecheck.site_problems(site)
    assert problems and expected in problems[0], problems


# -- benchmarks page ------------------------------------------------------------------------------
def _bench(path: Path, machine: dict, rows: list[dict], command="specdec bench --output-dir /tmp/x/out --tag t",
           model="m"):
    path.write_text(json.dumps({"meta": {"command": command, "machine": machine, "model": model, "dtype": "bfloat16"},
                                "rows": rows}))


def test_summary_names_the_model_where_one_device_ran_several(tmp_path):
    """Two models' runs on one H200 were two columns both headed "H200" (and "H200 = ..." twice in the legend);
    a model given as a GGUF path showed the path. The embedded model's GGUF file names are that model."""
    gpu = {"date": "2026-12-02 04:33 UTC", "gpu": "NVIDIA H200", "threads": 16}
    row = dict(document="d", context=8000, batch=64, tau=1.0, speedup_vs_dense=1.0, same_tokens_as_dense=True,
               lossless=True, method="dense", tokens_per_second=100.0)
    _bench(tmp_path / "a.json", gpu, [row], model="/tmp/m/other.gguf")
    _bench(tmp_path / "b.json", gpu, [row], model="smollm2-135m")
    _bench(tmp_path / "c.json", gpu, [row], model="/tmp/m/smol.gguf")  # the embedded model's file on the GPU
    md = benchpage.summary_markdown(tmp_path)
    head = md.splitlines()[0]
    assert "H200<br>other.gguf<br>8k" in head and "H200<br>smollm2-135m<br>8k" in head
    assert head.count("H200<br>") == 2, head
    assert "**H200 · other.gguf** = NVIDIA H200 · other.gguf bfloat16" in md and "/tmp/" not in md


def _row(method, tps, ratio=1.0, doc="d", **kw):
    return dict(dict(document=doc, context=8000, batch=64, tau=1.0, same_tokens_as_dense=True, lossless=True),
                method=method, tokens_per_second=tps, speedup_vs_dense=ratio, **kw)


def test_summary_takes_each_column_from_one_run_and_hides_machine_paths(tmp_path):
    """A column's cells come from the run that timed the most methods at that shape (newest among equals), not the
    fastest row of any run: a faster dense or Vegas of another run does not replace them."""
    old = {"date": "2026-11-29 10:00 UTC", "gpu": "NVIDIA H200", "threads": 16}
    new = {"date": "2026-12-04 13:00 UTC", "gpu": "NVIDIA H200", "threads": 16}
    _bench(tmp_path / "a.json", new, [_row("dense", 100.0), _row("vegas", 150.0, 1.5), _row("quest", 90.0, 0.9)])
    # faster, but its tokens differ from dense: a bug, never counted
    _bench(tmp_path / "b.json", new, [_row("dense", 100.0), _row("vegas", 900.0, 9.0, same_tokens_as_dense=False)])
    # an older run, faster, with fewer methods; the one method the column's run lacks comes from it
    _bench(tmp_path / "c.json", old, [_row("dense", 120.0), _row("vegas", 200.0, 1.67), _row("magicdec", 130.0, 1.08)])
    # no dense at this shape: nothing to compare with, never counted
    _bench(tmp_path / "d.json", new, [_row("dustin", 500.0, None)])
    (tmp_path / "kernels.json").write_text(json.dumps({"rows": [{"variant": "x", "graph_us": 1.0}]}))  # not end to end
    md = benchpage.summary_markdown(tmp_path)
    assert "**100** <sup>[1]</sup>" in md and "150<br>1.50× <sup>[1]</sup>" in md and "90<br>0.90×" in md
    assert "130<br>1.08× <sup>[2]</sup>" in md and "900<br>" not in md and "| 200<br>" not in md and "dustin" not in md
    assert "/tmp/" not in md and "--output-dir out" in md
    assert "H200<br>8k&nbsp;ctx<br>B&nbsp;=&nbsp;64" in md.splitlines()[0]


def test_summary_prefers_an_interleaved_run_over_one_with_more_methods(tmp_path):
    """``bench --interleave`` speed-ups (medians of runs alternated with dense's) come before a ratio of two medians
    timed apart, even from a run with fewer methods; the methods it lacks come from the other run."""
    new = {"date": "2026-12-04 13:00 UTC", "gpu": "NVIDIA H200", "threads": 16}
    old = {"date": "2026-12-04 15:00 UTC", "gpu": "NVIDIA H200", "threads": 16}  # newer, more methods, not paired
    _bench(tmp_path / "a.json", old, [_row("dense", 100.0), _row("vegas", 150.0, 1.5), _row("quest", 90.0, 0.9),
                                      _row("dustin", 300.0, 3.0, lossless=False, same_tokens_as_dense=False)])
    path = tmp_path / "b.json"
    _bench(path, new, [_row("dense", 110.0), _row("vegas", 160.0, 1.4), _row("quest", 105.0, 0.97)])
    data = json.loads(path.read_text())
    data["meta"]["interleave"] = True
    path.write_text(json.dumps(data))
    md = benchpage.summary_markdown(tmp_path)
    assert "**110** <sup>[1]</sup>" in md and "160<br>1.40× <sup>[1]</sup>" in md and "105<br>0.97× <sup>[1]</sup>" in md
    assert "300<br>3.00× <sup>[2]</sup>" in md and "150<br>" not in md
    assert "an interleaved `specdec bench` run" in md


def test_summary_averages_a_runs_documents_and_keeps_dense_text_rows_apart(tmp_path):
    gpu = {"date": "2026-12-04 13:00 UTC", "gpu": "NVIDIA H200", "threads": 16}
    _bench(tmp_path / "a.json", gpu, [
        _row("dense", 100.0, doc="/tmp/x/code.py"), _row("vegas", 200.0, 2.0, doc="/tmp/x/code.py"),
        _row("dustin", 300.0, 3.0, doc="/tmp/x/code.py", lossless=False, same_tokens_as_dense=False),
        _row("dustin", 250.0, 2.5, doc="/tmp/x/code.py", lossless=False, dense_text=True, same_tokens_as_dense=None),
        _row("dense", 400.0, doc="prose.txt"), _row("vegas", 200.0, 0.5, doc="prose.txt"),
        _row("dustin", 1200.0, 3.0, doc="prose.txt", lossless=False, same_tokens_as_dense=False)])
    md = benchpage.summary_markdown(tmp_path)
    assert "**200&nbsp;⌀2**" in md  # dense: sqrt(100 x 400)
    assert "200&nbsp;⌀2<br>1.00×" in md  # vegas: sqrt(200 x 200), its speed-ups sqrt(2.0 x 0.5)
    assert "| dustin | 600&nbsp;⌀2<br>3.00×" in md  # sqrt(300 x 1200); not the dense's-text row
    assert "‡" not in md.split("Machines:")[0]  # tokens that differ from dense are no share of agreement (no "‡0%")
    assert "| dustin (dense's text) | 250<br>2.50×" in md
    assert "documents: `code.py`, `prose.txt`" in md


def test_summary_of_the_committed_results_opens_with_gpu_rows():
    md = benchpage.summary_markdown(ROOT / "benchmarks" / "results")
    assert "``" not in md, "a run without a command renders as an empty code span"
    head, _, first = md.splitlines()[:3]
    assert head.startswith("| method |") and "H200" in head.split("|")[2]
    assert "/tmp/" not in md and "/root/" not in md


def test_reports_are_cleaned():
    text = (
        "## Run\n\n| a | b |\n|---|---|\n\n| c | d |\n|---|---|\n| 1 | 2 |\n\n"
        "| 1 | compile | error: InductorError('CompilationError: at 67:4:\\n        if SPARSE | | |\n"
        "model at /tmp/m/smol.gguf, out /root/out/e.json\n"
    )
    out = benchpage.clean_report(text)
    assert "| a | b |" not in out and "| c | d |" in out  # the table without rows is gone
    assert "InductorError('" not in out and "failed: InductorError (CompilationError)" in out
    assert "/tmp/" not in out and "smol.gguf" in out and "e.json" in out
    assert benchpage.internal_wording("# Issue 5 follow-up\nFixed in 922295c. Against the issue's targets")
    assert benchpage.internal_wording("Against the performance targets, specdec at `e22e7e8`") == []


# -- rendering ------------------------------------------------------------------------------------
def test_operatorname_star_renders_as_arg_max_with_limits():
    from latex2mathml.converter import convert

    tex = hooks.tex_for_mathml(r"T = \operatorname*{arg\,max}_{T \subseteq P,\ |T| = k} x")
    assert "operatorname" not in tex and r"\underset{T \subseteq P,\ |T| = k}{\mathrm{arg\,max}}" in tex
    mathml = convert(tex)
    assert "<munder>" in mathml and "&#x0002A;" not in mathml  # no stray "*"


def test_nav_titles_are_plain_text():
    assert hooks.plain_title("Quest (`quest`, method `quest`)") == "Quest (quest, method quest)"
    assert hooks.plain_title("Read **[the docs](x.md)**") == "Read the docs"


def test_notebook_links_point_to_site_pages():
    from types import SimpleNamespace as NS

    urls = {"concepts/memory-bound.md": "concepts/memory-bound/", "tutorials/01_pipeline.ipynb": "tutorials/01_pipeline/",
            "tutorials/02_selector_plugin.ipynb": "tutorials/02_selector_plugin/"}  # as mkdocs-jupyter makes them
    files = NS(get_file_from_path=lambda path: NS(url=urls[path]) if path in urls else None)
    page = NS(file=NS(src_uri="tutorials/01_pipeline.ipynb"), url="tutorials/01_pipeline/")
    html = ('<a href="../concepts/memory-bound.md#why">a</a> <a href="02_selector_plugin.ipynb">b</a> '
            '<a href="../nowhere.md">c</a> <a href="https://x.org/a.md">d</a>')
    out = hooks.notebook_links(html, page, files)
    assert 'href="../../concepts/memory-bound/#why"' in out
    assert 'href="../02_selector_plugin/"' in out
    assert 'href="../nowhere.md"' in out and 'href="https://x.org/a.md"' in out  # left for the link check


def test_notebook_toc_uses_the_headings_real_ids():
    from types import SimpleNamespace as NS

    reading = NS(id="reading", children=[])
    page = NS(toc=[NS(id="compose", children=[NS(id="load", children=[]), reading])])
    html = '<h1 id="compose">C</h1><h2 id="load">L</h2><h2 id="reading-runstats">Reading <code>RunStats</code></h2>'
    hooks.notebook_toc(html, page)
    assert reading.id == "reading-runstats"


def test_404_links_are_relative():
    html = ('<a href="/tutorials/">t</a><link href="/assets/x.css"><script src="/assets/j.js"></script>'
            '<a href="//cdn.example/x">c</a>{"base": "/", "search": "/assets/javascripts/workers/s.js"}')
    out = hooks.on_post_template(html, "404.html", {"site_url": None})
    assert 'href="./tutorials/"' in out and 'src="./assets/j.js"' in out and 'href="//cdn.example/x"' in out
    assert '"base": "."' in out and '"search": "./assets/' in out
    assert hooks.on_post_template(html, "sitemap.xml", {"site_url": None}) == html


def test_a_tensor_parallel_run_is_no_cell_of_the_summary(tmp_path):
    """``bench --tp 2`` over two H200s is not a cell of the one-H200 column, even as its newest interleaved run with
    more methods (its dense would stand for one GPU's); the Scale-out page reads such runs."""
    gpu = {"date": "2026-12-04 13:00 UTC", "gpu": "NVIDIA H200", "threads": 16}
    _bench(tmp_path / "a.json", gpu, [_row("dense", 100.0), _row("vegas", 150.0, 1.5)])
    path = tmp_path / "b.json"
    _bench(path, dict(gpu, date="2026-12-04 15:00 UTC"), [_row("dense", 180.0), _row("vegas", 200.0, 1.1),
                                                          _row("quest", 190.0, 1.05)])
    data = json.loads(path.read_text())
    data["meta"].update(interleave=True, tensor_parallel=2)
    path.write_text(json.dumps(data))
    md = benchpage.summary_markdown(tmp_path)
    assert "| dense | **100** <sup>[1]</sup> |" in md and "180" not in md and "quest" not in md
