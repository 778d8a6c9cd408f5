"""GPU-only checks of the launch-count reductions under CUDA graphs and torch.compile.

The one-launch Triton KV-cache write (automatic on CUDA), the (B, T, H, D) attention output and the
fused projections must be capturable and give what the eager, unfused, torch-indexing path gives.
"""

import pytest
import torch

from specdec import BACKENDS, PipelineConfig, SparsePlan, build_engine
from specdec.cache import KVCache

from conftest import make_tiny

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model(backend: str, fuse: bool, family: str = "qwen2"):
    m = make_tiny(family, seed=5)
    m.hf.cuda()
    m.backend = BACKENDS.build(backend, **({"static": True} if backend == "torch" else {}))
    if fuse:
        m.fuse_projections()
    return m


def _steps(B=2):
    L = torch.tensor([40, 70][:B], device="cuda")
    plan = SparsePlan(indices=torch.randint(0, 39, (1, B, 1, 10), device="cuda"), dense_from=L.clone())
    return L, [({}, 1), ({"plan": plan}, 1), ({}, 5)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_triton_cache_write_under_graphs_equals_eager_torch_writes(backend):
    torch.manual_seed(0)
    m = _model(backend, fuse=False)
    L, steps = _steps()
    for kw, T in steps:
        x = torch.randint(0, 96, (2, T), device="cuda")
        caches, outs = [], []
        for impl, graphs in (("torch", False), ("auto", True)):
            c = m.new_cache(2, 96)
            torch.manual_seed(1)
            c.k.normal_()
            c.v.normal_()
            c.write_impl = impl
            if graphs:
                m.enable_cuda_graphs()
                m.forward(x, c, L, **kw)  # capture
            outs.append(m.forward(x, c, L, **kw))  # replay
            if graphs:
                assert not m._graphs.uncapturable and m._graphs.replays >= 1
                m.disable_cuda_graphs()
            caches.append(c)
        # the kernel itself is bit-identical (tests/test_kv_write.py on CUDA); eager vs captured
        # projections may round differently, hence a tolerance here
        torch.testing.assert_close(caches[1].k, caches[0].k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(caches[1].v, caches[0].v, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_fused_compiled_graphs_equal_unfused_eager(family):
    ref, fused = _model("triton", False, family), _model("triton", True, family)
    L, steps = _steps()
    fused.enable_compile()
    fused.enable_cuda_graphs()
    for kw, T in steps:
        x = torch.randint(0, 96, (2, T), device="cuda")
        c0, c1 = ref.new_cache(2, 96), fused.new_cache(2, 96)
        for c in (c0, c1):
            torch.manual_seed(1)
            c.k.normal_()
            c.v.normal_()
        c0.write_impl = "torch"
        want = ref.forward(x, c0, L, **kw)
        fused.forward(x, c1, L, **kw)
        got = fused.forward(x, c1, L, **kw)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(c1.k, c0.k, rtol=1e-4, atol=1e-4)
    assert not fused._graphs.uncapturable and fused._graphs.replays >= 3


def test_fused_greedy_engine_with_graphs_equals_unfused():
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    cfg = PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=4)
    ref = build_engine(_model("triton", False), cfg, eos_token_id=-1).generate(prompts, 16).tokens
    fused = _model("triton", True)
    fused.enable_compile()
    fused.enable_cuda_graphs()
    assert build_engine(fused, cfg, eos_token_id=-1).generate(prompts, 16).tokens == ref


def test_auto_write_uses_the_kernel_on_cuda(monkeypatch):
    import specdec.cache as cache_mod

    calls = []
    real = cache_mod._triton_kv_write()
    monkeypatch.setattr(cache_mod, "_KV_WRITE", [lambda *a: (calls.append(1), real(*a))])
    c = KVCache(1, 2, 1, 8, 16, device="cuda")
    x = torch.ones(2, 1, 3, 16, device="cuda")
    c.write(0, x, -x, torch.tensor([0, 5], device="cuda"))
    assert calls and c.k[0, 1, 0, 5:8].eq(1).all() and c.v[0, 0, 0, :3].eq(-1).all()
