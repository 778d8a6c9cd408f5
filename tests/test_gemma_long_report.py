"""benchmarks/gpu/gemma_long_report.py: the GPU run's JSON becomes the results report, the τ-vs-context
plot and the three docs sections, in a copy of the docs (the checkout is left alone)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/concepts/attention-layouts.md", "docs/components/models.md", "docs/benchmarks.md")


def _report():
    spec = importlib.util.spec_from_file_location("gemma_long_report", ROOT / "benchmarks/gpu/gemma_long_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(smoke: bool = False) -> dict:
    kv = dict(context=32768, batch=1, cuda_allocated_bytes=52e6, global_bytes=50e6, ring_bytes=2.5e6,
              all_layers_full_bytes=302e6, step_reads_bytes=51e6)
    eq = [dict(context=c, doc=d, method=m, lossless=m != "dustin", equal_hf=m != "quest" or c == 16384, tau=3.0, new=16)
          for c, d in ((16384, "long:code"), (32768, "long:prose")) for m in ("dense", "magicdec", "vegas", "quest", "dustin")]
    eq[-2]["first_difference"] = 7
    tau = [dict(context=c, doc=d, method=m, budget=1024, tau=(3.0 if m == "magicdec" else 3.0 + c / 65536))
           for c in (4096, 8192, 16384, 32768) for d in ("long:prose", "long:code") for m in ("magicdec", "vegas")]
    speed = [dict(context=32768, B=B, method=m, gamma=4, budget_ratio=0.05, backend="triton", graphs=True,
                  tau=1.0 if m == "dense" else 3.5, tokens_per_second=100.0 * B, speedup_vs_dense=None if m == "dense" else 1.1,
                  **(dict(step_seconds=2e-3, roofline_seconds=1e-3, step_over_roofline=2.0) if m == "dense" else {}))
             for B in (1, 8) for m in ("dense", "magicdec", "vegas", "quest", "dustin")]
    speed.append(dict(context=32768, B=32, method="dense", skipped="budget: 3 s left"))
    return dict(args=dict(budget_s=330, gamma=4, reps=3), date="2026-12-01 13:20 UTC", torch="2.11", transformers="5.17.0",
                device="NVIDIA H200", smoke=smoke, parts=dict(layout="done in 1 s"), failures=[],
                layout=dict(windows=[512] * 5 + [None], n_layers=18, n_global=3, n_kv_heads=1, head_dim=256,
                            weight_bytes_bf16=536e6, copy_bandwidth_GBps=4000.0),
                kv={"1": kv}, equality=eq, tau=tau, speed=speed, elapsed_s=300.0)


@pytest.fixture
def checkout(tmp_path):
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / page, tmp_path / page)
    return tmp_path


def test_report_fills_results_plot_and_docs(checkout, tmp_path):
    src = tmp_path / "gemma_long.json"
    src.write_text(json.dumps(_result()))
    _report().main([str(src), "--root", str(checkout)])
    md = (checkout / "benchmarks/results/gpu_gemma_long_2026-12-01.md").read_text()
    assert "| 32k | long:prose | quest | True | no (first difference at 7) |" in md
    assert "On long:prose the ratio grows: 1.02 at 4k, 1.17 at 32k." in md
    assert "Not run for lack of time in the budget: 32k/B=32/dense." in md
    assert not __import__("re").search(r"\bissue \d+|fixed in [0-9a-f]{7}", md)
    assert (checkout / "benchmarks/results/gpu_gemma_long_2026-12-01.json").is_file()
    assert (checkout / "docs/assets/gemma_tau_vs_context.svg").read_text().lstrip().startswith("<?xml")
    layouts = (checkout / PAGES[0]).read_text()
    assert "![τ(vegas)/τ(magicdec) against the context](../assets/gemma_tau_vs_context.svg)" in layouts
    assert "Not measured yet" not in layouts and "<!-- /gemma-long:tau -->" in layouts
    models = (checkout / PAGES[1]).read_text()
    assert "32k `long:prose`: dense, magicdec, vegas equal HF `generate`; **differ: quest**" in models
    bench = (checkout / PAGES[2]).read_text()
    assert "| 8 | 800 | 800 (τ 3.50, 1.10×)" in bench and "2.000 ms / 1.000 ms = 2.00×" in bench
    # a second run replaces the sections instead of adding to them
    _report().main([str(src), "--root", str(checkout)])
    assert (checkout / PAGES[0]).read_text() == layouts


def test_report_refuses_a_smoke_run_and_a_page_without_its_block(checkout, tmp_path):
    src = tmp_path / "gemma_long.json"
    src.write_text(json.dumps(_result(smoke=True)))
    with pytest.raises(SystemExit, match="--smoke run"):
        _report().main([str(src), "--root", str(checkout)])
    (checkout / PAGES[2]).write_text("# Benchmarks\n")
    with pytest.raises(SystemExit, match="no <!-- gemma-long:speed --> block"):
        _report().main([str(src), "--root", str(checkout), "--allow-smoke"])


def _first_run_with_failed_32k() -> dict:
    """The first GPU run as it came back: every 32k row failed (the prompt filled all 32,768 positions)."""
    res = _result()
    for name in ("equality", "tau", "speed"):
        for r in res[name]:
            if r.get("context") == 32768:
                r.pop("tau", None), r.pop("equal_hf", None), r.pop("tokens_per_second", None)
                r["error"] = "SpecdecError: prompt of 32768 tokens + max_new_tokens 16 exceeds the model's 32768 positions"
    res["speed"] += [dict(context=16384, doc="long:prose", B=1, method=m, gamma=4, budget_ratio=0.05, backend="triton",
                          graphs=True, tau=1.0 if m == "dense" else 4.0, tokens_per_second=235.0 if m == "dense" else 167.0,
                          **(dict(step_seconds=4.25e-3, roofline_seconds=1.4e-4, step_over_roofline=30.1) if m == "dense"
                             else dict(speedup_vs_dense=0.71)))
                     for m in ("dense", "magicdec")]
    return res


def _rerun() -> dict:
    """The re-run (--rerun): 32k rows at 32,640 tokens, 16k B = 1 speed again, the step profile."""
    c = 32640
    eq = [dict(context=c, doc="long:prose", method=m, B=1, lossless=m != "dustin", equal_hf=True, tau=3.0, new=16)
          for m in ("dense", "magicdec", "vegas", "quest", "dustin")]
    tau = [dict(context=c, doc=d, method=m, B=1, budget=1024, gamma=4, tau=3.0 if m == "magicdec" else 3.6)
           for d in ("long:prose", "long:code") for m in ("magicdec", "vegas")]
    speed = [dict(context=ctx, doc="long:prose", B=1, method=m, gamma=4, budget_ratio=0.05, backend="triton", graphs=True,
                  tau=1.0 if m == "dense" else 4.0, tokens_per_second=900.0 if m == "dense" else 1800.0,
                  graph_captures=3, graph_replays=90, graph_uncapturable=[],
                  **(dict(step_seconds=1.1e-3, roofline_seconds=1.4e-4, step_over_roofline=7.9) if m == "dense"
                     else dict(speedup_vs_dense=2.0)))
             for ctx in (c, 16384) for m in ("dense", "magicdec")]
    prof = dict(context=16384, batch=1, backend="triton", dtype="bfloat16", sparse_budget=819, dense_roofline_seconds=1.4e-4,
                dense=dict(eager_seconds=4.2e-3, graph_seconds=1.1e-3, kernels_per_step=1460, graph_captures=1,
                           graph_replays=21, graph_uncapturable=[], kernels_top=[["gemv", 120]]),
                sparse=dict(eager_seconds=4.4e-3, graph_seconds=1.2e-3, kernels_per_step=1500, graph_captures=1,
                            graph_replays=21, graph_uncapturable=["RuntimeError: planted"], kernels_top=[]))
    return dict(args=dict(budget_s=200, gamma=4, reps=3, rerun=True), date="2026-12-01 13:40 UTC", torch="2.11",
                transformers="5.17.0", device="NVIDIA H200", smoke=False, failures=[],
                parts=dict(profile="done in 20 s", layout="done in 3 s", equality="done in 40 s", tau="done in 20 s",
                           speed="done in 60 s"),
                layout=dict(copy_bandwidth_GBps=4100.0), profile=prof,
                kv={"1": dict(context=c, batch=1, cuda_allocated_bytes=109e6, global_bytes=100e6, ring_bytes=8.8e6,
                              all_layers_full_bytes=603e6, step_reads_bytes=108e6)},
                equality=eq, tau=tau, speed=speed, elapsed_s=150.0)


def test_merge_keeps_the_first_run_and_replaces_its_failed_and_rerun_rows(checkout, tmp_path):
    first, new = tmp_path / "first.json", tmp_path / "new.json"
    first.write_text(json.dumps(_first_run_with_failed_32k()))
    new.write_text(json.dumps(_rerun()))
    _report().main([str(new), "--root", str(checkout), "--merge", str(first)])
    res = json.loads((checkout / "benchmarks/results/gpu_gemma_long_2026-12-01.json").read_text())
    # the failed 32k rows are gone; the 32,640-token rows stand in their place
    assert not [r for n in ("equality", "tau", "speed") for r in res[n] if r["context"] == 32768]
    assert sorted({r["context"] for r in res["tau"]}) == [4096, 8192, 16384, 32640]  # 4k-16k from the first run
    assert len([r for r in res["equality"] if r["context"] == 16384]) == 5
    # a re-measured row replaces the first run's row of the same key; rows it did not re-measure stay
    b1 = [r for r in res["speed"] if r["context"] == 16384 and r["B"] == 1]
    assert sorted(r["method"] for r in b1) == ["dense", "magicdec"] and all(r.get("graph_replays") == 90 for r in b1)
    assert res["kv"]["1"]["context"] == 32640 and res["layout"]["n_global"] == 3 and res["layout"]["copy_bandwidth_GBps"] == 4100.0
    assert [r["date"] for r in res["runs"]] == ["2026-12-01 13:20 UTC", "2026-12-01 13:40 UTC"]
    md = (checkout / "benchmarks/results/gpu_gemma_long_2026-12-01.md").read_text()
    assert "| 32k (32,640) | long:prose | vegas | True | yes |" in md
    assert "| 32k (32,640) | long:code | 3.00 | 3.60 | 1.20 |" in md
    assert "| sparse (819 entries) | 4.400 ms | 1.200 ms | 1500 | 1 / 21 | RuntimeError: planted |" in md
    assert "Failed (traceback in the JSON)" not in md
    assert "16k/B=1/dense 235 → 900; 16k/B=1/magicdec 167 → 1,800." in md  # before/after of the re-measured rows
    bench = (checkout / PAGES[2]).read_text()
    assert "**32k (32,640) context**" in bench and "| dense | 4.200 ms | 1.100 ms | 1460 | 1 / 21 | none |" in bench
    models = (checkout / PAGES[1]).read_text()
    assert "32k (32,640) `long:prose`: dense, magicdec, vegas, quest equal HF `generate`" in models
    # a smoke JSON is not merged into a GPU run
    smoke = tmp_path / "smoke.json"
    smoke.write_text(json.dumps({**_rerun(), "smoke": True}))
    with pytest.raises(SystemExit, match="--smoke run"):
        _report().main([str(smoke), "--root", str(checkout), "--merge", str(first), "--allow-smoke"])
