"""Tensor parallelism on two GPUs (NCCL): the CUDA-graph path per rank gives one GPU's tokens.

Skipped unless two CUDA devices are visible (``nvidia-h200-x2``); the CPU twin is tests/test_parallel.py (gloo).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
WORKER = HERE / "helpers" / "tp_worker.py"
sys.path.insert(0, str(HERE / "helpers"))

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


# one model: 3 KV heads split 2 + 1 (the uneven case); on the H200 machine the first call of both models with
# Triton's JIT and each engine's captures ran past 200 s (no verdict), so the even split is left to the CPU test
@pytest.mark.parametrize("name", ["tiny-llama-kv3"])
def test_two_gpus_with_graphs_equal_one_gpu(tmp_path, name):
    """A float32 tiny model: Triton backend, fused projections, CUDA graphs captured per rank with the all-reduces
    inside; every lossless method gives one GPU's tokens, token for token."""
    from tp_worker import build, run, to_gpu

    model, prompts = build(name)
    ref = run(to_gpu(model), prompts)
    assert all(ref[m] == ref["dense"] for m in ref)  # lossless on one GPU first
    out = tmp_path / "tp.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", TP_DEVICE="cuda",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
           str(out), name]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world"] == 2
    assert got["tokens"] == ref  # every method, every sequence
