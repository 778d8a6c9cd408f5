"""Fused projections (``SpecdecModel.fuse_projections``): same logits and the same greedy tokens as unfused."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from specdec import PipelineConfig, SpecdecModel, build_engine
from specdec.errors import SpecdecError
from specdec.fusion import FusedAttention, FusedMLP, fuse_projections

from conftest import make_tiny, tiny_config

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9, [11] * 20]
# fp32 logits of the tiny models are O(10): a GEMM over concatenated weights may sum in another order
ATOL, RTOL = 1e-4, 1e-5

VARIANTS = {
    "llama": ("llama", {}),
    "llama_bias": ("llama", dict(attention_bias=True, mlp_bias=True)),
    "qwen2": ("qwen2", {}),  # q/k/v biases
    "qwen3": ("qwen3", {}),  # per-head q/k norms
    "mistral": ("mistral", {}),
}


def pair(name, seed=0):
    family, over = VARIANTS[name]
    plain = make_tiny(family, seed, **over)
    fused = make_tiny(family, seed, **over).fuse_projections()
    return plain, fused


def engine(model, method):
    cfg = PipelineConfig.make(method=method, gamma=3, budget=12, sinks=2, recent=4)
    return build_engine(model, cfg, eos_token_id=-1)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fused_logits_match_unfused(name):
    plain, fused = pair(name)
    layers = fused.hf.model.layers
    assert all(isinstance(l.self_attn, FusedAttention) and isinstance(l.mlp, FusedMLP) for l in layers)
    assert not any(hasattr(l.self_attn, "q_proj") or hasattr(l.mlp, "gate_proj") for l in layers)
    if name == "qwen2":
        assert layers[0].self_attn.qkv_proj.bias is not None
    ids = torch.randint(0, 96, (3, 9), generator=torch.Generator().manual_seed(1))
    caches = [m.new_cache(3, 32) for m in (plain, fused)]
    for step, (sl, lens) in enumerate([(slice(0, 6), [0, 3, 7]), (slice(6, 7), [6, 9, 13]), (slice(7, 9), [7, 10, 14])]):
        outs = [m.forward(ids[:, sl], c, torch.tensor(lens)) for m, c in zip((plain, fused), caches)]
        torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=RTOL, msg=f"step {step}")
    torch.testing.assert_close(caches[1].k, caches[0].k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[1].v, caches[0].v, atol=1e-5, rtol=1e-5)
    # outside a specdec forward (Hugging Face's own call, SDPA with its mask) as well
    a = plain.hf(input_ids=ids, use_cache=False).logits
    b = fused.hf(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_greedy_generation_is_identical(name):
    plain, fused = pair(name)
    for method in ("dense", "magicdec"):
        want = engine(plain, method).generate(PROMPTS, max_new_tokens=12).tokens
        got = engine(fused, method).generate(PROMPTS, max_new_tokens=12).tokens
        assert got == want, method


def test_fused_with_triton_backend_and_triton_cache_writes():
    """The fused QKV hands strided key/value slices to the cache write and the kernels (interpreter on the CPU)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        pytest.skip("needs TRITON_INTERPRET=1 on the CPU")
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig

    plain, fused = pair("qwen2")
    be = TritonBackend(TritonConfig(block_n=16))
    ids = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(2))
    outs, caches = [], []
    for m, impl in ((plain, "torch"), (fused, "triton")):
        c = m.new_cache(2, 16)
        c.write_impl = impl
        lens = torch.tensor([0, 4])
        with m.using_backend(be):
            m.forward(ids[:, :4], c, lens)
            outs.append(m.forward(ids, c, lens + 4))
        caches.append(c)
    torch.testing.assert_close(outs[1], outs[0], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(caches[1].k, caches[0].k, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "mistral"])
def test_hf_generate_with_its_kv_cache_is_unchanged_by_fusion(name):
    """Hugging Face ``generate`` (its own KV cache, attached or detached) gives the same tokens fused."""
    plain, fused = pair(name)
    x = torch.tensor([PROMPTS[1]])
    kw = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    want = plain.hf.generate(x, **kw)
    assert torch.equal(fused.hf.generate(x, **kw), want)
    fused.detach()
    assert torch.equal(fused.hf.generate(x, **kw), want)


def test_fuse_is_idempotent_survives_detach_and_option():
    m = make_tiny("llama")
    m.fuse_projections()
    qkv = m.hf.model.layers[0].self_attn.qkv_proj
    m.fuse_projections()
    assert m.hf.model.layers[0].self_attn.qkv_proj is qkv
    assert fuse_projections(m.hf) == 0
    m.detach()  # not restored: the fused modules now call SDPA
    out = m.hf.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape[1] == len(PROMPTS[0]) + 3
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config("mistral"), dtype=torch.float32).eval()
    m2 = SpecdecModel(hf, fuse=True)
    assert isinstance(m2.hf.model.layers[1].mlp, FusedMLP)


def test_unsupported_architectures_are_refused_unchanged():
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(SpecdecError, match="cannot fuse model type 'gpt2'"):
        fuse_projections(gpt2)
    m = make_tiny("llama")
    mlp0 = m.hf.model.layers[0].mlp
    m.hf.model.layers[1].mlp = torch.nn.Identity()  # a layer of a shape fusion does not know
    with pytest.raises(SpecdecError, match="layer 1 .*Identity"):
        m.fuse_projections()
    assert m.hf.model.layers[0].mlp is mlp0 and hasattr(m.hf.model.layers[0].self_attn, "q_proj")


def test_fuse_after_compile_is_refused():
    m = make_tiny("llama")
    m.enable_compile()
    with pytest.raises(SpecdecError, match="before enable_compile"):
        m.fuse_projections()


@pytest.mark.slow  # runs in the main pass; the transformers-5.17 pass of scripts/test.sh leaves it out
def test_fused_compiled_forward_matches_eager():
    """torch.compile (inductor on the CPU) of the fused model: same logits as the eager fused model.

    Only a missing C++ compiler (inductor's CPU back end needs one) skips it, checked up front: an error
    from compiling or running the fused forward is a failure, not a skip.
    """
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")):
        pytest.skip("torch.compile on the CPU needs a C++ compiler (g++ or clang++); none is on PATH")
    _, fused = pair("qwen3")
    ids = torch.randint(0, 96, (2, 3), generator=torch.Generator().manual_seed(3))
    cache = fused.new_cache(2, 16)
    lens = torch.tensor([0, 2])
    fused.forward(ids, cache, lens)
    want = fused.forward(ids[:, :1], cache, lens + 3)
    fused.enable_compile(max_rows=1)
    got = fused.forward(ids[:, :1], cache, lens + 3)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
