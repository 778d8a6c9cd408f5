"""The one-launch Triton KV-cache write (``KVCache.write(impl="triton")``) against the torch indexing path.

Bit-identical cache contents over dtypes, shapes, ragged lengths, GQA layouts, strided inputs and
:meth:`KVCache.rows` views. On the CPU the kernel runs under Triton's interpreter; on a CUDA machine
(``SPECDEC_TEST_DEVICE=cuda``) it compiles for real, and ``"auto"`` must pick it.
"""

from __future__ import annotations

import os

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if _DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the Triton cache write needs the optional 'triton' package")

from specdec.cache import KVCache  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402

if _DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

DEV = torch.device(_DEVICE)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _pair(n_layers, B, Hkv, L, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = KVCache(n_layers, B, Hkv, L, D, dtype, DEV)
    a.k.copy_(torch.randn(a.k.shape, generator=g).to(dtype))
    a.v.copy_(torch.randn(a.v.shape, generator=g).to(dtype))
    b = KVCache._from(a.k.clone(), a.v.clone())
    return a, b


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bit-identical (compares the raw bytes, so -0.0 vs 0.0 or NaN payloads would count)."""
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(
        x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,Hkv,T,D,L", [(1, 1, 1, 64, 16), (3, 2, 1, 16, 20), (4, 3, 5, 64, 24),
                                         (2, 4, 37, 24, 48), (5, 1, 2, 128, 9)])
def test_triton_write_is_bit_identical_to_torch(dtype, B, Hkv, T, D, L):
    a, b = _pair(2, B, Hkv, L, D, dtype)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, L - T + 1, (B,), generator=g).to(DEV)  # ragged
    key = torch.randn(B, Hkv, T, D, generator=g).to(DEV, dtype)
    val = torch.randn(B, Hkv, T, D, generator=g).to(DEV, dtype)
    a.write(1, key, val, lengths, impl="torch")
    b.write(1, key, val, lengths, impl="triton")
    assert _same(a.k, b.k) and _same(a.v, b.v)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_conversion_to_the_cache_dtype_rounds_like_torch(cache_dtype):
    a, b = _pair(1, 3, 2, 12, 32, cache_dtype)
    g = torch.Generator().manual_seed(2)
    key = (torch.randn(3, 2, 4, 32, generator=g) * 1e3).to(DEV)  # fp32 new entries, many rounding cases
    val = torch.randn(3, 2, 4, 32, generator=g).to(DEV) / 7
    lengths = torch.tensor([0, 8, 3], device=DEV)
    a.write(0, key, val, lengths, impl="torch")
    b.write(0, key, val, lengths, impl="triton")
    assert _same(a.k, b.k) and _same(a.v, b.v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_inputs_from_a_fused_projection(dtype):
    """Key/value as slices of one fused QKV output (``(B, T, H + 2 H_kv, D)`` transposed): not contiguous."""
    B, T, H, Hkv, D = 3, 4, 4, 2, 16
    a, b = _pair(1, B, Hkv, 16, D, dtype)
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, H + 2 * Hkv, D, generator=g).to(DEV, dtype)
    key = qkv[:, :, H:H + Hkv].transpose(1, 2)
    val = qkv[:, :, H + Hkv:].transpose(1, 2)
    assert not key.is_contiguous() and not val.is_contiguous()
    lengths = torch.tensor([5, 0, 12], device=DEV)
    a.write(0, key, val, lengths, impl="torch")
    b.write(0, key, val, lengths, impl="triton")
    assert _same(a.k, b.k) and _same(a.v, b.v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_view_writes_only_its_rows(dtype):
    a, b = _pair(2, 5, 2, 16, 16, dtype)
    va, vb = a.rows(1, 3), b.rows(1, 3)
    assert not vb.k.is_contiguous() and vb.k[1].data_ptr() != b.k[1].data_ptr()  # offset batch slice
    g = torch.Generator().manual_seed(4)
    key = torch.randn(2, 2, 3, 16, generator=g).to(DEV, dtype)
    val = torch.randn(2, 2, 3, 16, generator=g).to(DEV, dtype)
    lengths = torch.tensor([7, 2], device=DEV)
    va.write(1, key, val, lengths, impl="torch")
    vb.write(1, key, val, lengths, impl="triton")
    assert _same(a.k, b.k) and _same(a.v, b.v)  # the whole parent caches: other rows untouched


def test_int32_lengths_and_write_impl_attribute():
    a, b = _pair(1, 2, 1, 8, 8, torch.float32)
    b.write_impl = "triton"
    assert b.rows(0, 1).write_impl == "triton"  # views keep an instance's choice
    key, val = torch.randn(2, 1, 2, 8, device=DEV), torch.randn(2, 1, 2, 8, device=DEV)
    a.write(0, key, val, torch.tensor([1, 5], device=DEV), impl="torch")
    b.write(0, key, val, torch.tensor([1, 5], dtype=torch.int32, device=DEV))
    assert _same(a.k, b.k) and _same(a.v, b.v)


def test_capacity_check_and_out_of_range_rows():
    _, b = _pair(1, 2, 1, 8, 4, torch.float32)
    key = torch.ones(2, 1, 3, 4, device=DEV)
    with pytest.raises(ValueError, match="overflow"):
        b.write(0, key, key, torch.tensor([0, 6], device=DEV), impl="triton")
    before = b.k.clone()
    # unchecked (static forwards): rows past the capacity are dropped, nothing else is touched
    b.write(0, key, -key, torch.tensor([0, 6], device=DEV), check=False, impl="triton")
    want = before.clone()
    want[0, 0, 0, 0:3] = 1.0
    want[0, 1, 0, 6:8] = 1.0
    assert _same(b.k, want)


def test_bad_impl_is_one_clear_error():
    c = KVCache(1, 1, 1, 4, 2, device=DEV)
    with pytest.raises(SpecdecError, match="write implementation"):
        c.write(0, torch.zeros(1, 1, 1, 2, device=DEV), torch.zeros(1, 1, 1, 2, device=DEV),
                torch.zeros(1, dtype=torch.long, device=DEV), impl="cuda")


def test_auto_picks_triton_on_cuda_only(monkeypatch):
    import specdec.cuda.triton_cache as tc

    calls = []
    real = tc.kv_write
    monkeypatch.setattr(tc, "kv_write", lambda *a: (calls.append(1), real(*a)))
    import specdec.cache as cache_mod

    monkeypatch.setattr(cache_mod, "_KV_WRITE", [tc.kv_write])
    c = KVCache(1, 1, 1, 4, 2, device=DEV)
    c.write(0, torch.ones(1, 1, 1, 2, device=DEV), torch.ones(1, 1, 1, 2, device=DEV),
            torch.zeros(1, dtype=torch.long, device=DEV))
    assert len(calls) == (1 if DEV.type == "cuda" else 0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_model_forward_with_triton_writes_equals_torch_writes(family):
    from conftest import make_tiny

    m = make_tiny(family)
    m.hf.to(DEV)
    ids = torch.randint(0, 96, (3, 6), device=DEV)
    caches, outs = [], []
    for impl in ("torch", "triton"):
        c = m.new_cache(3, 32)
        c.write_impl = impl
        lengths = torch.tensor([0, 4, 9], device=DEV)
        outs.append(m.forward(ids, c, lengths))
        outs.append(m.forward(ids[:, :1], c, lengths + 6))
        caches.append(c)
    assert _same(caches[0].k, caches[1].k) and _same(caches[0].v, caches[1].v)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
