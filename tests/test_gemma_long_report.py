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
