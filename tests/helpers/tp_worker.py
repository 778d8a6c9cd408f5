"""Generate with every lossless self-speculative method on one rank of a tensor-parallel group.

Run under torchrun by tests/test_parallel.py::

    torchrun --nproc-per-node N tests/helpers/tp_worker.py OUT.json MODEL [FAIL_AT]

MODEL: ``tiny-llama`` | ``tiny-llama-kv3`` | ``tiny-qwen3`` | ``smollm2-135m``. Rank 0 writes ``{"tokens": {method: ...}}``
to OUT.json. ``TP_DEVICE=cuda``: NCCL, rank ``r`` on ``cuda:r``, the Triton backend with fused projections and CUDA
graphs (:func:`to_gpu`; tests/test_parallel_gpu.py); ``TP_STACKS_AFTER=S``: every thread's stack after S seconds, then
exit. With FAIL_AT, rank 1 raises inside its forward after that many forwards (a rank failing mid-generation). :func:`run` is also called in-process (one rank) for the reference tokens.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

METHODS = ("dense", "magicdec", "vegas", "quest")


def build(model_name: str):
    """``(model, prompts)`` — the same weights and prompts on every rank."""
    if model_name.startswith("tiny-"):
        from conftest import make_tiny

        parts = model_name.split("-")  # tiny-<family>[-kv3]: kv3 = 6 query / 3 KV heads, split 2 + 1 over 2 ranks
        over = dict(num_attention_heads=6, num_key_value_heads=3, hidden_size=96) if parts[2:] == ["kv3"] else {}
        model = make_tiny(parts[1], seed=0, **over)
        prompts = [[(7 * i + 3 * j) % 90 + 1 for i in range(48)] for j in range(2)]
        return model, prompts
    from conftest import real_prompts

    from specdec import SpecdecModel

    model = SpecdecModel.from_pretrained(model_name, dtype="float32")
    return model, real_prompts(model.tokenizer, 192, count=2)


def to_gpu(model):
    """``model`` on the current CUDA device with the Triton backend, fused projections and CUDA graphs."""
    from specdec.registry import BACKENDS

    model.hf.cuda()
    model.backend = BACKENDS.build("triton")
    model.fuse_projections()
    model.enable_cuda_graphs()
    return model


def run(model, prompts, methods=METHODS, new_tokens: int = 16) -> dict[str, list[list[int]]]:
    from specdec import PipelineConfig, build_engine

    out = {}
    for method in methods:
        cfg = PipelineConfig(method=method, gamma=3, budget=24, sinks=2, recent=4)
        res = build_engine(model, cfg).generate(prompts, max_new_tokens=new_tokens)
        out[method] = [list(map(int, t)) for t in res.tokens]
    return out


def main() -> None:
    out_path, model_name = sys.argv[1], sys.argv[2]
    fail_at = int(sys.argv[3]) if len(sys.argv) > 3 else None
    methods = tuple(os.environ.get("TP_METHODS", ",".join(METHODS)).split(","))
    torch.set_num_threads(1)
    from specdec.parallel import init_tensor_parallel, shard_model

    if os.environ.get("TP_STACKS_AFTER"):  # each thread's stack to stderr, then exit, if still running then
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["TP_STACKS_AFTER"]), exit=True)
    device = os.environ.get("TP_DEVICE", "cpu")
    tp = init_tensor_parallel(device, timeout_s=60 if device == "cpu" else 300)
    model, prompts = build(model_name)
    shard_model(model, tp)
    if device == "cuda":
        to_gpu(model)
    if fail_at is not None and tp.rank == 1:
        calls = {"n": 0}
        inner = model.forward

        def failing(*a, **k):
            calls["n"] += 1
            if calls["n"] > fail_at:
                raise RuntimeError("planted failure on rank 1")
            return inner(*a, **k)

        model.forward = failing
    tokens = run(model, prompts, methods)
    if os.environ.get("TP_STACKS_AFTER"):
        print(f"rank {tp.rank}: generated", file=sys.stderr, flush=True)
    if tp.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"world": tp.world, "kv_heads": model.dims.n_kv_heads, "tokens": tokens}, f)
    # Both ranks reach here, then leave together and skip the interpreter's teardown. On the loaded 2-core CI box
    # rank 0 aborted twice with nothing but ``terminate called without an active exception`` (exit -6, no Python
    # traceback), once even with the process group destroyed at exit: gloo / store threads outliving the
    # interpreter is our reading, not reproduced. What is tested -- the tokens, written above -- is unaffected;
    # a rank that fails earlier still exits with its error.
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
