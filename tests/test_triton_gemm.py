"""Small-row GEMMs with the layer's element-wise work fused in (:mod:`specdec.cuda.triton_gemm`).

Each kernel against the torch ops it replaces (Hugging Face's RMSNorm, ``F.linear``, ``apply_rotary_pos_emb``,
the cache write, SiLU·mul), then fused models with ``fusion.FUSED_GEMM`` on against unfused ones: logits, caches,
greedy engine tokens of dense / MagicDec / Vegas, and the launches of a decode step. On the CPU the kernels run
under Triton's interpreter (``FUSED_GEMM = "always"``); on a CUDA machine (``SPECDEC_TEST_DEVICE=cuda``) they
compile for real, where ``True`` (the default) already takes them.
"""

from __future__ import annotations

import os

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if _DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton", reason="the fused GEMM kernels need the optional 'triton' package")

from specdec import PipelineConfig, build_engine, fusion  # noqa: E402
from specdec.cuda.triton_gemm import norm_gate_up_silu, norm_qkv_rope_write  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.testing.launches import count_launches  # noqa: E402

from conftest import make_tiny  # noqa: E402

if _DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

DEV = torch.device(_DEVICE)
DTYPES = [torch.float32, torch.bfloat16]


def _tol(dtype):
    if dtype == torch.float32:
        return dict(atol=1e-5, rtol=1e-5)  # the GEMM's and the RMS sum's order
    return dict(atol=3e-2, rtol=4e-2)  # a few bf16 ulps: the interpreter truncates, the sums' order differs


def _norm(n, dtype, seed):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    mod = LlamaRMSNorm(n, eps=1e-5)
    mod.weight.data = 1 + 0.3 * torch.randn(n, generator=torch.Generator().manual_seed(seed))
    return mod.to(DEV, dtype)


def _rows_in(dtype, shape, splits, seed):
    """``(x, residual, r)``: the kernel's input (partials or the activation), the residual (or ``None``) and the
    row ``r`` the norm reads, computed with torch's roundings."""
    g = torch.Generator().manual_seed(seed)
    if splits == 0:  # no residual: x itself
        x = torch.randn(shape, generator=g).to(DEV, dtype)
        return x, None, x
    res = torch.randn(shape, generator=g).to(DEV, dtype)
    if splits == 1:
        x = torch.randn(shape, generator=g).to(DEV, dtype)
        return x, res, res + x
    parts = torch.randn((splits, *shape), generator=g).to(DEV, dtype)
    return parts, res, res + parts.float().sum(0).to(dtype)


def _cache_case(dtype, B, Hkv, L, D, lens):
    from specdec.cache import KVCache

    want = KVCache(1, B, Hkv, L, D, dtype, DEV)
    want.write_impl = "torch"
    got = KVCache(1, B + 1, Hkv, L, D, dtype, DEV).rows(1, B + 1)  # a strided batch view
    return want, got, torch.tensor(lens, device=DEV)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,T,K,H,Hkv,D,splits,bias", [
    (3, 2, 96, 4, 2, 32, 0, False),  # no residual; K not a multiple of the 64-column block
    (3, 2, 96, 4, 2, 32, 2, True),  # the previous layer's split down GEMM + residual; a bias (Qwen2)
    (5, 4, 64, 2, 1, 16, 1, False),  # 20 rows: two row blocks; head dim 16 (half 8 in a 16-wide block)
    (2, 1, 160, 3, 3, 64, 3, False),
])
def test_norm_qkv_rope_write_matches_the_layer_ops(dtype, B, T, K, H, Hkv, D, splits, bias):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    L = 12
    x, res, r = _rows_in(dtype, (B, T, K), splits, seed=K + D)
    norm = _norm(K, dtype, 1)
    g = torch.Generator().manual_seed(2)
    N = (H + 2 * Hkv) * D
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(DEV, dtype)
    b = (torch.randn(N, generator=g) * 0.1).to(DEV, dtype) if bias else None
    ang = torch.randn(B, T, D // 2, generator=g) * 5
    cos = torch.cat([ang.cos()] * 2, -1).to(DEV, dtype)
    sin = torch.cat([ang.sin()] * 2, -1).to(DEV, dtype)
    lens = [0, L - 1] + [3] * (B - 2)  # the second sequence's rows after its first fall outside the cache
    want_c, got_c, lens_t = _cache_case(dtype, B, Hkv, L, D, lens)
    qkv = F.linear(norm(r), w, b)
    q, k, v = (t.reshape(B, T, -1, D).transpose(1, 2) for t in qkv.split([H * D, Hkv * D, Hkv * D], -1))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    for i in range(B):
        n = min(T, L - lens[i])
        want_c.rows(i, i + 1).write(0, want_k[i:i + 1, :, :n], v[i:i + 1, :, :n], lens_t[i:i + 1])
    got_q, got_r = norm_qkv_rope_write(x, norm.weight, 1e-5, w, b, cos, sin, got_c.k[0], got_c.v[0], lens_t, H,
                                       residual=res, splits=max(splits, 1))
    assert got_q.shape == (B, H, T, D) and got_q.is_contiguous()
    torch.testing.assert_close(got_q, want_q, **_tol(dtype))
    torch.testing.assert_close(got_c.k, want_c.k, **_tol(dtype))
    torch.testing.assert_close(got_c.v, want_c.v, **_tol(dtype))
    if res is None:
        assert got_r is None
    else:
        torch.testing.assert_close(got_r, r, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,I,splits", [((3, 2, 96), 80, 2), ((20, 64), 64, 1), ((1, 1, 160), 200, 0)])
def test_norm_gate_up_silu_matches_the_layer_ops(dtype, shape, I, splits):
    K = shape[-1]
    x, res, r = _rows_in(dtype, shape, splits, seed=I)
    norm = _norm(K, dtype, 3)
    w = (torch.randn(2 * I, K, generator=torch.Generator().manual_seed(4)) / K ** 0.5).to(DEV, dtype)
    gate, up = F.linear(norm(r), w).split(I, -1)
    want = F.silu(gate) * up
    got, got_r = norm_gate_up_silu(x, norm.weight, 1e-5, w, residual=res, splits=max(splits, 1))
    assert got.shape == (*shape[:-1], I)
    torch.testing.assert_close(got, want, **_tol(dtype))
    if res is None:
        assert got_r is None
    else:
        torch.testing.assert_close(got_r, r, **_tol(dtype))


def test_fused_gemm_kernels_refuse_bad_inputs():
    x = torch.randn(2, 1, 64, device=DEV)
    nw = torch.ones(64, device=DEV)
    w = torch.randn(2 * 40, 64, device=DEV)
    with pytest.raises(ValueError, match="2 splits need x of shape"):
        norm_gate_up_silu(x[:1], nw, 1e-5, w, residual=x[0], splits=2)
    with pytest.raises(ValueError, match="split partial sums need the residual"):
        norm_gate_up_silu(x[None].expand(2, -1, -1, -1), nw, 1e-5, w, splits=2)
    with pytest.raises(ValueError, match="does not match activations"):
        norm_gate_up_silu(x, nw, 1e-5, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="must be contiguous"):
        norm_gate_up_silu(x, nw, 1e-5, torch.randn(64, 80, device=DEV).t())
    kc = torch.zeros(2, 1, 8, 16, device=DEV)
    cs = torch.zeros(2, 1, 16, device=DEV)
    lens = torch.zeros(2, dtype=torch.long, device=DEV)
    with pytest.raises(ValueError, match=r"weight rows 80 are not \(2 \+ 2·1\) heads x 16"):
        norm_qkv_rope_write(x, nw, 1e-5, w, None, cs, cs, kc, kc.clone(), lens, 2)
    wq = torch.randn(4 * 16, 64, device=DEV)
    with pytest.raises(ValueError, match="cos/sin shapes"):
        norm_qkv_rope_write(x, nw, 1e-5, wq, None, cs[:, :, :8], cs, kc, kc.clone(), lens, 2)
    with pytest.raises(ValueError, match="is not the projection's input dim 64"):
        norm_qkv_rope_write(x[..., :32], nw, 1e-5, wq, None, cs, cs, kc, kc.clone(), lens, 2)


# -- fused models --------------------------------------------------------------------------------------
@pytest.fixture
def fused_gemm(monkeypatch):
    """``fusion.FUSED_GEMM`` on for this test, on the CPU too (the interpreter)."""
    monkeypatch.setattr(fusion, "FUSED_GEMM", "always")


def _pair(family, seed=0):
    plain, fused = make_tiny(family, seed), make_tiny(family, seed)
    for m in (plain, fused):
        m.hf.to(DEV)
    return plain, fused.fuse_projections(kernels="triton")


def _step_launches(m, B=2):
    c = m.new_cache(B, 16)
    m.forward(torch.randint(0, 96, (B, 5), device=DEV), c, torch.zeros(B, dtype=torch.long, device=DEV))
    ids, lens = torch.randint(0, 96, (B, 1), device=DEV), torch.tensor([3, 5][:B], device=DEV)
    return count_launches(lambda: m.forward(ids, c, lens))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), reason="counts launches through the interpreter")
@pytest.mark.parametrize("family,fused_layers", [("llama", 2), ("qwen2", 2), ("mistral", 2), ("qwen3", 0)])
def test_a_fused_gemm_layer_is_four_launches_and_its_attention(fused_gemm, family, fused_layers):
    """Llama/Qwen2 (bias)/Mistral layers take the fused GEMMs; Qwen3 (q/k norms) keeps the per-kernel layer."""
    n_layers = 2
    m = make_tiny(family)
    m.hf.to(DEV)  # before fusing: fusing runs a routing probe forward, with the kernels
    m.fuse_projections(kernels="triton")
    got = _step_launches(m)
    fusion.FUSED_GEMM = False
    before = _step_launches(m)
    assert got["triton:_norm_qkv_kernel"] == fused_layers and got["triton:_norm_gate_up_kernel"] == fused_layers
    if fused_layers:
        assert got["triton:_rms_kernel"] == 1 and got["triton:_rope_qkv_kernel"] == 0  # the final norm only
        assert got["triton:_silu_mul_kernel"] == 0 and got["bmm.default"] + got["mm.default"] + got["addmm.default"] \
            == before["bmm.default"] + before["mm.default"] + before["addmm.default"] - 2 * n_layers
        # per layer: norm, qkv GEMM, RoPE + write, norm, gate/up GEMM, SiLU·mul -> 2 kernels
        assert sum(got.values()) == sum(before.values()) - 4 * n_layers, (dict(got), dict(before))
    else:
        assert got == before
    fusion.FUSED_GEMM = "always"
    fusion.FUSED_GEMM_MAX_ROWS, saved = 1, fusion.FUSED_GEMM_MAX_ROWS  # 2 rows per step: over the limit
    try:
        assert _step_launches(m) == before
    finally:
        fusion.FUSED_GEMM_MAX_ROWS = saved


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_gemm_logits_and_caches_match_unfused(fused_gemm, family):
    plain, fused = _pair(family)
    ids = torch.randint(0, 96, (3, 7), generator=torch.Generator().manual_seed(1)).to(DEV)
    caches = [m.new_cache(3, 24) for m in (plain, fused)]
    for step, (sl, lens) in enumerate([(slice(0, 5), [0, 3, 7]), (slice(5, 6), [5, 8, 12]), (slice(6, 7), [6, 9, 13])]):
        lens = torch.tensor(lens, device=DEV)
        outs = [m.forward(ids[:, sl], c, lens) for m, c in zip((plain, fused), caches)]
        torch.testing.assert_close(outs[1], outs[0], atol=1e-4, rtol=1e-5, msg=f"step {step}")
    torch.testing.assert_close(caches[1].k, caches[0].k, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[1].v, caches[0].v, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # runs in the main pass; the transformers-5.17 pass of scripts/test.sh leaves it out
def test_fused_gemm_greedy_engine_is_identical(fused_gemm):
    plain, fused = _pair("llama")
    prompts = [list(range(3, 17)), [5, 9, 17, 33, 2, 8] * 3]
    for method in ("dense", "magicdec", "vegas"):
        cfg = PipelineConfig.make(method=method, gamma=3, budget=8, sinks=2, recent=3)
        want = build_engine(plain, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=6).tokens
        assert build_engine(fused, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=6).tokens == want, method


def test_fused_gemm_switch_refuses_a_bad_value(monkeypatch):
    m = make_tiny("llama")
    m.hf.to(DEV)
    m.fuse_projections(kernels="triton")
    monkeypatch.setattr(fusion, "FUSED_GEMM", "yes")
    with pytest.raises(SpecdecError, match="FUSED_GEMM is 'yes'; set True"):
        _step_launches(m)
    # set before fusing: the fuse says so itself (not as a routing failure of the model)
    m2 = make_tiny("llama")
    m2.hf.to(DEV)
    with pytest.raises(SpecdecError, match=r"^specdec.fusion.FUSED_GEMM is 'yes'; set True"):
        m2.fuse_projections(kernels="triton")
