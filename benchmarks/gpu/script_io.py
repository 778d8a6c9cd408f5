"""What the GPU scripts of ``benchmarks/gpu`` share: a result record with its log and save functions, and the
documents of their end-to-end parts (``prose:<package>`` written to a file)."""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch


def record(out: Path, name: str, args, dev: torch.device, markdown, t0: float):
    """``(res, log, save)``: ``res`` starts with the date, command, GPU and arguments; ``log(msg)`` prints a line with
    the seconds since ``t0`` and appends it to ``<out>/log.txt``; ``save()`` writes ``<out>/<name>.json`` and
    ``markdown(res)`` to ``<out>/<name>.md``."""
    out.mkdir(parents=True, exist_ok=True)
    res = dict(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), argv=" ".join(sys.argv),
               gpu=torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", args=vars(args))
    logf = open(out / "log.txt", "a")

    def log(msg):
        line = f"[{time.perf_counter() - t0:6.1f}s] {msg}"
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    def save():
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        (out / f"{name}.md").write_text(markdown(res))

    return res, log, save


def document(spec: str, out: Path) -> str:
    """What ``run_bench`` reads for ``spec``: a built-in name or a path as given; ``prose:<package>`` (the package's
    docstrings, ``vegas_sweep.document_text``) written to a file under ``out``."""
    if not spec.startswith("prose:"):
        return spec
    from vegas_sweep import document_text

    path = Path(out) / f"{spec.replace(':', '_')}.txt"
    path.write_text(document_text(spec))
    return str(path)


def e2e_settings(gguf: str, dev: torch.device, smoke: bool, batch: int = 64, output_dir: Path | None = None):
    """``(model, run_bench keywords)`` of the scripts' end-to-end parts: the embedded model (``gguf``), bf16, triton,
    CUDA graphs, fused, no compile, adaptive off, ``batch`` x 8k over ``min(4, batch)`` windows 1,000 tokens apart,
    γ 8, 5 %, 128 new tokens, warm-up + median of 3; ``smoke``: float32 on the reference backend, B 2 x 160, 8
    tokens, one run. ``output_dir``: where ``run_bench`` writes its files (default: a temporary folder)."""
    import tempfile

    from specdec.loading import load_model

    m = load_model("smollm2-135m" if smoke else gguf, "float32" if smoke else "bfloat16", dev.type,
                   "reference" if smoke else "triton", not smoke, False, True)
    common = dict(contexts=[160 if smoke else 8000], budget=None, budget_ratio=0.05 if not smoke else 0.3,
                  gamma=8, model=m, backend="reference" if smoke else "triton",
                  dtype="float32" if smoke else "bfloat16", device=dev.type,
                  output_dir=Path(output_dir) if output_dir is not None else Path(tempfile.mkdtemp()),
                  cuda_graphs=not smoke, fuse=True, warmup=True, repeats=1 if smoke else 3, hf_baseline=False,
                  adaptive=False, max_new_tokens=8 if smoke else 128, windows=2 if smoke else min(4, batch),
                  window_stride=20 if smoke else 1000, batch_sizes=[2 if smoke else batch])
    return m, common


def fresh_graphs(common: dict) -> None:
    """Before each arm of an e2e comparison: one model (``e2e_settings``) serves every arm, so drop the CUDA graphs an
    earlier arm captured (its kernels and switches are baked into them; same shapes would replay them) and let this
    arm capture its own. No-op without graphs (``--smoke``)."""
    if common["cuda_graphs"]:
        common["model"].enable_cuda_graphs()


def timed(fn, reps: int, dev: torch.device, warmup: int = 2) -> float:
    """Median ms of ``reps`` calls after ``warmup`` calls (CUDA events on a GPU, wall clock on the CPU)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def graphed(fn, dev: torch.device, failures: dict | None = None, name: str = ""):
    """``fn`` captured as one CUDA graph (returns its replay; on the CPU ``fn`` itself): launch cost out of the
    comparison of two ways to compute the same thing. A capture that fails is recorded in ``failures[name]`` and
    ``fn`` is timed eagerly (its row is then marked ``[eager]`` by the caller: ``replay.eager``)."""
    if dev.type != "cuda":
        return fn
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
    except Exception:  # the eager call then fails again inside one() (recorded there) or is timed eagerly
        if failures is not None:
            failures[f"capture {name}"] = traceback.format_exc()
        fn.eager = True
        return fn
    return g.replay
