"""The Triton backend's optional flash-attn dense path, tested with a *fake* ``flash_attn`` module.

Real flash-attn never ran here: it cannot be installed on this CPU machine nor on the GPU machine
(source-only build against CUDA). The fake below implements ``flash_attn_with_kvcache`` from its
documentation, independently of specdec (an explicit loop: layouts q ``(B, T, H, D)``, cache
``(B, L, H_kv, D)`` with a contiguous last dimension, ``cache_seqlens`` int32 = the visible cache
length, causal mask aligned to the bottom right, GQA head ``h`` → KV head ``h // G``), checks the
arguments specdec passes and records the calls. These tests check the glue — layouts, lengths,
the causal alignment and when the path is taken — not flash-attn itself.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

# a CPU-only test module: it must not switch Triton to its interpreter in a GPU session (pytest imports
# every module at collection, so the variable would reach the compiled GPU tests collected with it)
_GPU_SESSION = os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cuda"
if not _GPU_SESSION:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest  # noqa: E402

if _GPU_SESSION:
    pytest.skip("CPU-only test (Triton interpreter); run it without SPECDEC_TEST_DEVICE=cuda", allow_module_level=True)
import torch  # noqa: E402

pytest.importorskip("triton", reason="the triton backend needs the optional 'triton' package")

from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.cuda import triton_backend as tb  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

REF = ReferenceBackend()


def _fake_flash_attn_with_kvcache(calls):
    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                                return_softmax_lse=False):
        assert k is None and v is None, "the new rows are already in the cache: k/v must not be passed"
        assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
        assert cache_seqlens.dtype == torch.int32 and causal
        B, T, H, D = q.shape
        Hkv = k_cache.shape[2]
        assert k_cache.shape[0] == B and k_cache.shape[3] == D and H % Hkv == 0
        scale = D**-0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros(B, T, H, D, dtype=q.dtype)
        for b in range(B):
            n = int(cache_seqlens[b])
            for h in range(H):
                kv = h // (H // Hkv)
                kk = k_cache[b, :n, kv].float()  # (n, D)
                vv = v_cache[b, :n, kv].float()
                for i in range(T):
                    last = i + n - T  # bottom-right alignment: query i sees keys j <= i + n - T
                    if last < 0:
                        continue  # an all-masked row gives 0
                    logits = (kk[: last + 1] @ q[b, i, h].float()) * scale
                    out[b, i, h] = (torch.softmax(logits, 0) @ vv[: last + 1]).to(q.dtype)
        calls.append(dict(B=B, T=T, H=H, Hkv=Hkv, cache_seqlens=cache_seqlens.tolist()))
        return out

    return flash_attn_with_kvcache


@pytest.fixture
def fake_flash(monkeypatch):
    """Install a fake ``flash_attn`` module; returns the list of recorded calls."""
    calls: list[dict] = []
    mod = types.ModuleType("flash_attn")
    mod.__spec__ = importlib.machinery.ModuleSpec("flash_attn", loader=None)
    mod.flash_attn_with_kvcache = _fake_flash_attn_with_kvcache(calls)
    monkeypatch.setitem(sys.modules, "flash_attn", mod)
    return calls


@pytest.fixture
def no_flash(monkeypatch):
    """Make ``flash_attn`` unimportable whatever is installed."""
    monkeypatch.setitem(sys.modules, "flash_attn", None)


def _case(B, Hkv, G, T, L, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.randint(1, L - T, (B,), generator=g)  # ragged
    return q, k, v, lengths


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("G", [1, 4])
def test_flash_dense_equals_reference(fake_flash, T, G):
    """Layouts, ``cache_seqlens = lengths + T`` and the bottom-right causal mask give the reference's
    dense attention (ragged lengths, GQA)."""
    q, k, v, lengths = _case(3, 2, G, T, 40, 16, seed=T + G)
    out = tb._flash_dense(q, k, v, lengths, 0.3)
    ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert fake_flash == [dict(B=3, T=T, H=2 * G, Hkv=2, cache_seqlens=(lengths + T).tolist())]


DENSE = AttentionMetadata(torch.zeros(1, dtype=torch.long), 1.0)  # a dense call without scores


def test_dispatch_only_when_every_condition_holds(fake_flash):
    cuda = torch.device("cuda")  # a device object only: nothing runs on it

    def call(dtype=torch.bfloat16, device=cuda):
        return types.SimpleNamespace(dtype=dtype, device=device)

    auto = TritonBackend(TritonConfig())
    assert auto.uses_flash_attn(call(), DENSE)
    assert auto.uses_flash_attn(call(torch.float16), DENSE)
    assert not auto.uses_flash_attn(call(), DENSE.replace(plan_indices=torch.zeros(1, 1, 4, dtype=torch.long)))  # sparse plan
    assert not auto.uses_flash_attn(call(), DENSE.replace(score_rows=[0]))  # score request
    assert not auto.uses_flash_attn(call(torch.float32), DENSE)  # flash-attn is fp16/bf16 only
    assert not auto.uses_flash_attn(call(device=torch.device("cpu")), DENSE)
    assert not TritonBackend(TritonConfig(flash_attn="off")).uses_flash_attn(call(), DENSE)
    assert TritonBackend(TritonConfig(flash_attn="on")).uses_flash_attn(call(), DENSE)


def test_attend_routes_dense_calls_to_flash_attn(fake_flash, monkeypatch):
    """Through ``attend`` (the CUDA condition relaxed to the CPU for this test): dense calls reach the
    fake and give the reference's answer; a sparse plan still runs our kernel (interpreter)."""
    monkeypatch.setattr(TritonBackend, "uses_flash_attn",
                        lambda self, q, meta: self._flash and not meta.sparse and not meta.wants_scores)
    be = TritonBackend(TritonConfig(block_n=16))
    q, k, v, lengths = _case(2, 2, 3, 5, 48, 16, seed=7)
    out, s = be.attend(q, k, v, AttentionMetadata(lengths, 0.25))
    assert s is None and len(fake_flash) == 1
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.25))[0], rtol=1e-5, atol=1e-5)
    idx = torch.arange(8).view(1, 1, 8).expand(2, 2, 8).contiguous()
    out, _ = be.attend(q, k, v, AttentionMetadata(lengths, 0.25, idx, lengths - 2))
    assert len(fake_flash) == 1
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.25, idx, lengths - 2))[0], rtol=1e-4, atol=2e-5)


def test_on_without_flash_attn_is_one_clear_error(no_flash):
    with pytest.raises(SpecdecError, match=r"needs flash-attn 2.*pip install 'flash-attn>=2.6'"):
        TritonBackend(TritonConfig(flash_attn="on"))


def test_auto_without_flash_attn_falls_back_silently(no_flash, monkeypatch):
    def boom(*a, **kw):
        raise AssertionError("flash-attn path taken without flash-attn")

    monkeypatch.setattr(tb, "_flash_dense", boom)
    be = TritonBackend(TritonConfig(block_n=16))
    assert not be.uses_flash_attn(types.SimpleNamespace(dtype=torch.bfloat16, device=torch.device("cuda")), DENSE)
    q, k, v, lengths = _case(2, 1, 2, 1, 32, 16, seed=1)
    out, _ = be.attend(q, k, v, AttentionMetadata(lengths, 0.25))  # our kernel (interpreter on the CPU)
    torch.testing.assert_close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.25))[0], rtol=1e-4, atol=2e-5)


def test_off_never_looks_for_flash_attn(fake_flash):
    assert not TritonBackend(TritonConfig(flash_attn="off"))._flash
    with pytest.raises(SpecdecError, match="flash_attn"):
        from specdec.registry import BACKENDS

        BACKENDS.build("triton", flash_attn="sometimes")
