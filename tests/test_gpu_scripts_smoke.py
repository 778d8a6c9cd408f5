"""The GPU scripts of this round, run with --smoke (the embedded model on the CPU): benchmarks/gpu/sync_timing.py (the
phase timer's three modes give the same tokens) and benchmarks/gpu/lookup_search_ab.py (host and device prompt lookup
give the same tokens) and benchmarks/gpu/code_ab.py (two checkouts, each in its own process); the kernel of benchmarks/gpu/mega14.py
under the interpreter."""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name):
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sync_timing_modes_give_the_same_tokens(tmp_path):
    assert _script("sync_timing").main(["--smoke", "--out", str(tmp_path), "--documents", "pydoc",
                                        "--methods", "dense,dustin"]) == 0
    rows = json.loads((tmp_path / "sync_timing.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["dense", "dustin", "dustin (dense's text)"]
    for r in rows:
        assert r["same_tokens_every_run"] is True
        assert all(r[m]["median"] > 0 and r[m]["ms_per_iteration"]["verify"] > 0 for m in ("sync", "events", "none"))
    assert "LookupDrafter.draft" in rows[1]["host_ms_per_iteration"]
    assert "| pydoc | dustin (dense's text) |" in (tmp_path / "sync_timing.md").read_text()


def test_lookup_search_ab_gives_the_same_tokens(tmp_path):
    assert _script("lookup_search_ab").main(["--smoke", "--out", str(tmp_path), "--documents", "pydoc"]) == 0
    rows = json.loads((tmp_path / "lookup_search.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == ["dense", "dustin 5%", "dustin 5% (dense's text)"]
    for r in rows[1:]:
        assert r["same_tokens_every_run"] is True
        assert r["host"]["median"] > 0 and r["device"]["median"] > 0
        assert r["device"]["host_ms_per_iteration"]["LookupDrafter._tokens_on"] > 0  # the device search ran
        assert "LookupDrafter._tokens_on" not in r["host"]["host_ms_per_iteration"]  # and the host one did not


def test_trace_idle_charges_gpu_gaps_to_the_host_range_open():
    """benchmarks/gpu/trace_idle.py on a synthetic trace: busy = merged kernel time, a gap goes to the innermost host
    range open at its midpoint, gaps under 5 µs are counted apart."""
    idle = _script("trace_idle")
    ev = []
    for i in range(8):  # iterations of 100 µs: draft range 0-40 (EagleDrafter.draft 0-20), verify 40-100
        t = 100 * i
        ev += [dict(cat="user_annotation", name="phase:draft", ts=t, dur=40),
               dict(cat="user_annotation", name="EagleDrafter.draft", ts=t, dur=20),
               dict(cat="user_annotation", name="phase:verify", ts=t + 40, dur=60),
               dict(cat="kernel", name="k", ts=t + 20, dur=30),  # idle 0-20 while the host is in EagleDrafter.draft
               dict(cat="kernel", name="k", ts=t + 52, dur=48),  # idle 50-52 (under 5 µs)
               dict(cat="gpu_memcpy", name="c", ts=t + 60, dur=10)]  # inside the kernel: merged
    r = idle.idle_report(dict(traceEvents=ev), skip=1, iterations=5)
    assert r["iterations"] == 5 and r["us_per_iteration"] == dict(span=100.0, gpu_busy=78.0, gpu_idle=22.0)
    assert r["idle_us_per_iteration_by_host_range"] == {"phase:draft > EagleDrafter.draft": 20.0}
    assert r["gaps_under_5us"] == dict(count_per_iteration=1.0, us_per_iteration=2.0)


def test_code_ab_runs_each_tree_in_its_own_process(tmp_path):
    """Two trees (this checkout and a copy of its package) in ABBA order: one row per method, every tree's runs, the
    same tokens; each process imported its own tree (the child asserts it; a tree without a package is refused in one line)."""
    ab = _script("code_ab")
    shutil.copytree(ROOT / "specdec", tmp_path / "copy" / "specdec", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "out"
    assert ab.main(["--smoke", "--trees", f"this={ROOT},copy={tmp_path / 'copy'}", "--out", str(out), "--documents",
                    "pydoc", "--methods", "dense", "--rounds", "2"]) == 0
    res = json.loads((out / "code_ab.json").read_text())
    [row] = res["rows"]
    assert row["method"] == "dense" and row["same_tokens_every_run"] is True
    assert set(row["trees"]) == {"this", "copy"} and row["trees"]["this"]["ratio"] == 1.0
    assert res["meta"]["device"].startswith("CPU") and res["meta"]["torch"] and res["meta"]["date"].endswith("UTC")
    assert "| pydoc | dense |" in (out / "code_ab.md").read_text()
    assert "Machine: CPU" in (out / "code_ab.md").read_text()
    try:
        ab.main(["--smoke", "--trees", f"this={ROOT},nothing={tmp_path}", "--out", str(out), "--documents", "pydoc"])
    except SystemExit as e:
        assert "nothing" in str(e) and "specdec/__init__.py" in str(e)
    else:
        raise AssertionError("a tree without a package was accepted")


def test_mega14_kernel_computes_the_mlp_half_in_the_interpreter(monkeypatch):
    """benchmarks/gpu/mega14_kernel.py (the one-launch MLP half, timed on the GPU by mega14.py) as its two-launch form
    under Triton's interpreter, float32: r = residual + sum(partials), out = r + down(silu(gate(n)) * up(n)) with
    n = rmsnorm(r); with down splits, the partials add up to out - r."""
    import torch
    import torch.nn.functional as F

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    mk = _script("mega14_kernel")
    g = torch.Generator().manual_seed(0)
    K, I = 48, 80
    for rows, splits, down_splits in ((3, 1, 1), (5, 2, 4)):
        x = torch.randn(*((splits,) if splits > 1 else ()), rows, K, generator=g)
        res = torch.randn(rows, K, generator=g)
        nw = 1 + 0.1 * torch.randn(K, generator=g)
        wgu = torch.randn(2 * I, K, generator=g) / K ** 0.5
        wd = torch.randn(K, I, generator=g) / I ** 0.5
        out, r = mk.mlp_one_launch(x, nw, 1e-5, wgu, wd, res, splits=splits, down_splits=down_splits)
        rr = res + (x.sum(0) if splits > 1 else x)
        n = rr * torch.rsqrt(rr.pow(2).mean(-1, keepdim=True) + 1e-5) * nw
        gu = n @ wgu.T
        want = rr + (F.silu(gu[:, :I]) * gu[:, I:]) @ wd.T
        got = out.sum(0) + r if down_splits > 1 else out
        assert out.shape == ((down_splits, rows, K) if down_splits > 1 else (rows, K))
        torch.testing.assert_close(r, rr)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
