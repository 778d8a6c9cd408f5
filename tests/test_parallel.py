"""Tensor parallelism (specdec.parallel): 2 gloo ranks give exactly the single-process tokens.

Each multi-rank case runs ``torchrun`` (``python -m torch.distributed.run``) on
``tests/helpers/tp_worker.py`` in a subprocess with a wall-clock limit, so a hang fails the test
instead of stalling CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.parallel import TensorParallel, shard_model

HERE = Path(__file__).parent
WORKER = HERE / "helpers" / "tp_worker.py"
sys.path.insert(0, str(HERE / "helpers"))


def _torchrun(out: Path, model: str, *extra: str, methods: str | None = None, timeout: int = 420):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    if methods:
        env["TP_METHODS"] = methods
    # --standalone: a rendezvous on a free port of this machine (parallel test workers run several at once)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), str(out),
           model, *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def test_shard_blocks_cover_every_item_once():
    for world in (1, 2, 3, 4):
        for n in (1, 3, 7, 8):
            if n < world:
                continue
            blocks = [TensorParallel(rank=r, world=world).shard(n) for r in range(world)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            assert max(e - s for s, e in blocks) - min(e - s for s, e in blocks) <= 1


def test_one_rank_is_a_no_op_and_more_ranks_than_kv_heads_is_refused():
    from conftest import make_tiny

    m = make_tiny("llama")  # 2 KV heads
    before = m.dims
    shard_model(m, TensorParallel(rank=0, world=1))
    assert m.dims == before
    m2 = make_tiny("llama")
    with pytest.raises(SpecdecError, match="needs at least 3 KV heads.*--tp 2 or fewer"):
        shard_model(m2, TensorParallel(rank=0, world=3))


def test_sharded_rank_sees_its_heads_and_a_smaller_cache():
    from conftest import make_tiny

    m = make_tiny("qwen3")  # 4 query heads, 2 KV heads, q/k norms replicated
    shard_model(m, TensorParallel(rank=1, world=2))
    assert (m.dims.n_heads, m.dims.n_kv_heads) == (2, 1)
    assert m.new_cache(1, 8).k.shape[2] == 1
    with pytest.raises(SpecdecError, match="already sharded"):
        shard_model(m, TensorParallel(rank=1, world=2))


def test_a_vocab_parallel_embedding_in_the_plan_stays_whole():
    """transformers 5.1x (the H200 machine's 5.17) puts ``"embed_tokens": "embedding_rowwise"`` into the plan of every
    model with tied embeddings; specdec keeps the embedding whole on each rank (found: the embedded model's ``--tp 2``
    failed there with "not a Linear"). Any other non-Linear module the plan names is still refused."""
    from conftest import make_tiny

    m = make_tiny("llama")
    m.hf.config.base_model_tp_plan = {**m.hf.config.base_model_tp_plan, "embed_tokens": "embedding_rowwise"}
    emb = m.hf.model.embed_tokens
    shard_model(m, TensorParallel(rank=0, world=2))
    assert m.hf.model.embed_tokens is emb and m.dims.n_kv_heads == 1
    m2 = make_tiny("llama")
    m2.hf.config.base_model_tp_plan = {**m2.hf.config.base_model_tp_plan, "norm": "colwise"}
    with pytest.raises(SpecdecError, match="plan names norm .*which is not a Linear"):
        shard_model(m2, TensorParallel(rank=0, world=2))


# "slow" leaves the transformers-5.17 pass of scripts/test.sh, which keeps one two-rank run (the uneven split)
@pytest.mark.parametrize("name,kv_heads_rank0", [pytest.param("tiny-llama", 1, marks=pytest.mark.slow),
                                                 pytest.param("tiny-qwen3", 1, marks=pytest.mark.slow),
                                                 ("tiny-llama-kv3", 2)])
def test_two_ranks_equal_one_process_tiny(tmp_path, name, kv_heads_rank0):
    """Llama and Qwen3 (q/k norms replicated); 3 KV heads split unevenly (2 + 1)."""
    from tp_worker import build, run

    model, prompts = build(name)
    ref = run(model, prompts)
    out = tmp_path / "tp.json"
    proc = _torchrun(out, name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["world"] == 2 and got["kv_heads"] == kv_heads_rank0
    assert got["tokens"] == ref  # every method, every sequence, token for token


@pytest.mark.slow
def test_torchrun_cli_on_the_embedded_model_equals_one_process(tmp_path, smol):
    """``torchrun --nproc-per-node 2 -m specdec generate ... --tp 2``: SmolLM2's 3 KV heads split 2 + 1,
    the same tokens as one process, one output file (rank 0's)."""
    from specdec import PipelineConfig, build_engine
    from specdec.data import load_document
    from specdec.prompts import encode_text

    prompt = tmp_path / "prompt.txt"
    prompt.write_text(load_document("stdlib:argparse")[20000:24000])
    ids = encode_text(smol.tokenizer, prompt.read_text(), False)[-192:]
    ref = build_engine(smol, PipelineConfig(method="vegas", gamma=3, budget=24, sinks=2, recent=4)).generate(
        [ids], max_new_tokens=16)
    out = tmp_path / "out.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "specdec",
           "generate", "--prompt-file", str(prompt), "--context-tokens", "192",
           "--max-new-tokens", "16", "--method", "vegas", "--gamma", "3", "--budget", "24", "--device", "cpu",
           "--backend", "reference", "--dtype", "float32", "--output-json", str(out), "--tp", "2"]
    config = tmp_path / "cfg.json"
    config.write_text('{"sinks": 2, "recent": 4}')
    cmd += ["--config", str(config)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["tensor_parallel"] == 2
    assert got["tokens"] == ref.tokens
    assert proc.stdout.count("vegas:") == 1  # rank 0 reports, rank 1 stays quiet


def test_cli_tp_without_torchrun_and_unsupported_methods_are_one_line_errors(tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("hello world")
    base = [sys.executable, "-m", "specdec", "generate", "--prompt-file", str(prompt), "--max-new-tokens", "2",
            "--device", "cpu", "--output-json", str(tmp_path / "o.json")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(base + ["--tp", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --tp 2 needs 2 processes, found 1; launch it with `torchrun --nproc-per-node 2 -m specdec ... --tp 2`."]
    proc = subprocess.run(base + ["--tp", "2", "--method", "dustin"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "method 'dustin' does not run with --tp yet" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_rank_failing_mid_generation_ends_every_rank(tmp_path):
    out = tmp_path / "tp.json"
    proc = _torchrun(out, "tiny-llama", "5", methods="magicdec", timeout=240)
    assert proc.returncode != 0
    assert "planted failure on rank 1" in proc.stderr
    assert not out.exists()  # rank 0 never finished


def test_rowwise_projection_sums_partial_products_once_with_the_bias():
    """A one-rank RowParallelLinear over a column block equals that block's share of the full GEMM."""
    from specdec.parallel import RowParallelLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5, bias=True)
    x = torch.randn(3, 8)
    halves = [RowParallelLinear(lin, a, b, TensorParallel(rank=0, world=1)) for a, b in ((0, 4), (4, 8))]
    parts = [h(x[:, a:b]) - lin.bias for h, (a, b) in zip(halves, ((0, 4), (4, 8)))]
    torch.testing.assert_close(parts[0] + parts[1] + lin.bias, lin(x))


def test_the_process_group_is_destroyed_at_exit():
    """A group that ``init_tensor_parallel`` created is destroyed by an exit hook (left to the interpreter's
    teardown, a gloo group can abort a rank after its work: exit code -6 on a busy machine). atexit runs hooks
    last-registered first, so the probe registered before the group sees it gone."""
    code = (
        "import atexit, torch.distributed as dist\n"
        "atexit.register(lambda: print('at exit initialized:', dist.is_initialized()))\n"
        "from specdec.parallel import init_tensor_parallel\n"
        "tp = init_tensor_parallel('cpu', timeout_s=30)\n"
        "print('world', tp.world, 'initialized:', dist.is_initialized())\n"
    )
    # one rank: its store listens on any free port (MASTER_PORT=0), so parallel test workers never collide
    env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="0", PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "world 1 initialized: True" in proc.stdout and "at exit initialized: False" in proc.stdout, proc.stdout


def test_torchrun_bench_at_a_random_shape_equals_one_process(tmp_path):
    """``torchrun --nproc-per-node 2 -m specdec bench --shape tiny --tp 2``: each rank's random cache is its KV heads'
    share of one process's, so every row emits the one-process row's tokens; rank 0 alone writes and reports."""
    from specdec.bench import run_bench

    common = ["--methods", "dense,magicdec,vegas", "--contexts", "96", "--batch-sizes", "2", "--max-new-tokens", "8",
              "--budget", "24", "--gamma", "3", "--repeats", "1", "--shape", "tiny", "--device", "cpu",
              "--backend", "reference", "--dtype", "float32", "--no-adaptive"]
    ref = run_bench(["dense", "magicdec", "vegas"], [96], [2], ["random"], 8, 24, None, 3, "x", "reference",
                    "float32", "cpu", False, tmp_path / "one", "one", repeats=1, shape="tiny", adaptive=False)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "specdec",
           "bench", *common, "--output-dir", str(tmp_path / "tp"), "--tag", "tp", "--tp", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads((tmp_path / "tp" / "tp.json").read_text())
    assert got["meta"]["tensor_parallel"] == 2
    assert "tensor parallel: the model split over 2 ranks" in (tmp_path / "tp" / "tp.md").read_text()
    assert [r["method"] for r in got["rows"]] == ["dense", "magicdec", "vegas"]
    assert [r["tokens"] for r in got["rows"]] == [r["tokens"] for r in ref]
    assert all(r["same_tokens_as_dense"] for r in got["rows"][1:])
    assert sorted(p.name for p in (tmp_path / "tp").iterdir()) == ["tp.json", "tp.md"]
    assert proc.stdout.count("wrote ") == 1  # rank 1 stays quiet


def test_bench_tp_refuses_hf_baselines_and_methods_that_cannot_shard(tmp_path):
    from specdec.bench import run_bench

    args = ([40], [1], ["random"], 4, 16, None, 3, "x", "reference", "float32", "cpu")
    with pytest.raises(SpecdecError, match="method 'dustin' does not run with --tp yet"):
        run_bench(["dense", "dustin"], *args, False, tmp_path, "t", shape="tiny", tp=2)
    with pytest.raises(SpecdecError, match="--hf-baseline does not run with --tp"):
        run_bench(["dense"], *args, True, tmp_path, "t", tp=2)
    with pytest.raises(SpecdecError, match="--tp must be >= 1"):
        run_bench(["dense"], *args, False, tmp_path, "t", shape="tiny", tp=0)
