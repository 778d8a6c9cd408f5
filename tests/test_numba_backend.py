"""Parity of the numba CPU backend with the reference backend (skipped when numba is not installed)."""

import sys

import pytest
import torch

numba = pytest.importorskip("numba")

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine  # noqa: E402
from specdec.attention.numba_backend import NumbaBackend  # noqa: E402
from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.errors import SpecdecError  # noqa: E402
from specdec.registry import BACKENDS  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

from conftest import make_tiny  # noqa: E402

REF = ReferenceBackend()
NB = NumbaBackend(NumbaBackend.Config(dense="on"))


def _case(B, Hkv, G, T, L, D, K, dtype, seed, shared=False, tail=(0, 4)):
    """Ragged lengths; per-(sequence, KV head) distinct positions below ``dense_from``, ``-1``-padded."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.randint(K + 4, L - T - 1, (B,), generator=g)
    dense_from = lengths - torch.randint(tail[0], tail[1], (B,), generator=g)  # tail: tokens drafted since the plan
    Hp = 1 if shared else Hkv
    idx = torch.full((B, Hp, K), -1, dtype=torch.long)
    for b in range(B):
        for h in range(Hp):
            n = int(torch.randint(1, K + 1, (1,), generator=g))
            idx[b, h, :n] = torch.randperm(int(dense_from[b]), generator=g)[:n]
    return q, k, v, lengths, dense_from, idx


def _close(out, ref, dtype):
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: both sides round the same fp32 result once
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("G", [1, 3, 4])
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_matches_reference(D, G, T, dtype):
    B, Hkv, L, K = 3, 2, 150, 24
    q, k, v, lengths, dense_from, idx = _case(B, Hkv, G, T, L, D, K, dtype, seed=D + 10 * G + T)
    scale = D**-0.5
    ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, scale, idx, dense_from))
    out, s = NB.attend(q, k, v, AttentionMetadata(lengths, scale, idx, dense_from))
    assert s is None and out.dtype == dtype and out.shape == q.shape
    _close(out, ref, dtype)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_kernel_matches_reference(T, dtype):
    q, k, v, lengths, _, _ = _case(3, 3, 3, T, 120, 64, 8, dtype, seed=T)
    ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.125))
    out = NB.numba_attend(q, k, v, lengths, 0.125)
    _close(out, ref, dtype)


def test_shared_plan_no_dense_from_and_plan_reaching_the_new_rows():
    """A ``(B, 1, K)`` plan shared by the KV heads; ``dense_from=None`` (plan entries only); plan entries
    at or past ``lengths`` (visible only to the later rows of a verify pass)."""
    q, k, v, lengths, dense_from, idx = _case(2, 3, 2, 5, 90, 64, 12, torch.float32, seed=3, shared=True)
    idx[:, :, -1] = lengths.view(2, 1) + 2  # the third new row's own position
    for df in (dense_from, None, torch.full_like(lengths, -5), lengths + 100):
        ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.2, idx, df))
        out, _ = NB.attend(q, k, v, AttentionMetadata(lengths, 0.2, idx, df))
        _close(out, ref, torch.float32)


def test_duplicates_and_out_of_range_entries_count_once_like_the_reference():
    q, k, v, lengths, dense_from, idx = _case(2, 2, 3, 5, 80, 64, 10, torch.float32, seed=9)
    idx[..., 5:] = idx[..., :5]  # every selected position twice
    idx[..., 0] = 10_000  # past the cache: ignored, like padding
    ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from))
    out, _ = NB.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from))
    _close(out, ref, torch.float32)


def test_rows_that_see_nothing_give_zero():
    q, k, v, lengths, _, idx = _case(2, 2, 2, 1, 60, 64, 6, torch.float32, seed=1)
    idx.fill_(-1)
    ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, None))
    out, _ = NB.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, None))
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(ref, torch.zeros_like(ref))


def test_thread_pool_path_matches_serial():
    """``threads=2`` runs the parallel entry point with split-K chunks combined by log-sum-exp."""
    par = NumbaBackend(NumbaBackend.Config(threads=2, min_chunk=8, dense="on"))
    q, k, v, lengths, dense_from, idx = _case(1, 2, 3, 5, 200, 64, 40, torch.float32, seed=4)
    for kw in ({}, dict(plan_indices=idx, dense_from=dense_from)):
        ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.125, **kw))
        out, _ = par.attend(q, k, v, AttentionMetadata(lengths, 0.125, **kw))
        _close(out, ref, torch.float32)


def test_delegation_scores_dense_prefill_and_other_dtypes():
    """Whatever the kernel does not take still gives the reference's answer."""
    q, k, v, lengths, dense_from, idx = _case(2, 2, 2, 5, 70, 16, 8, torch.float32, seed=2)
    default = BACKENDS.build("numba")
    assert not default.handles(q, k, None, None)  # dense with T > 1 goes to torch's SDPA by default
    assert default.handles(q[:, :, :1], k, None, None)  # a dense decode row stays in the numba kernel
    assert not BACKENDS.build("numba", dense="off").handles(q[:, :, :1], k, None, None)
    out, _ = default.attend(q[:, :, :1], k, v, AttentionMetadata(lengths, 0.3))
    _close(out, REF.attend(q[:, :, :1], k, v, AttentionMetadata(lengths, 0.3))[0], torch.float32)
    assert default.handles(q, k, idx, None) and not default.handles(q, k, idx, [0])
    out, _ = default.attend(q, k, v, AttentionMetadata(lengths, 0.3))
    _close(out, REF.attend(q, k, v, AttentionMetadata(lengths, 0.3))[0], torch.float32)
    # scores: computed by the reference (the definition)
    out, s = default.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from, score_rows=[0, 4]))
    ref, s_ref = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from, score_rows=[0, 4]))
    torch.testing.assert_close(s, s_ref)
    _close(out, ref, torch.float32)
    # more rows than max_rows (prefill) and float64 go to the torch backend
    small = NumbaBackend(NumbaBackend.Config(max_rows=2))
    assert not small.handles(q, k, idx, None)
    _close(small.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from))[0], REF.attend(q, k, v, AttentionMetadata(lengths, 0.3, idx, dense_from))[0],
           torch.float32)
    q64, k64, v64 = q.double(), k.double(), v.double()
    assert not default.handles(q64, k64, idx, None)
    out, _ = default.attend(q64, k64, v64, AttentionMetadata(lengths, 0.3, idx, dense_from))
    assert out.dtype == torch.float64
    _close(out, REF.attend(q64, k64, v64, AttentionMetadata(lengths, 0.3, idx, dense_from))[0], torch.float32)  # the reference computes in fp32


def test_registered_and_validates_everywhere():
    assert "numba" in BACKENDS.names()
    be = BACKENDS.build("numba", threads=1)
    assert be.name == "numba" and be.validate(torch.device("cpu"), torch.bfloat16) is None
    with pytest.raises(SpecdecError, match="threads"):
        BACKENDS.build("numba", threads=0)


def test_missing_numba_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    with pytest.raises(SpecdecError, match=r"pip install 'specdec\[cpu\]'"):
        NumbaBackend()


def test_engine_sliding_window_with_numba_equals_dense_greedy():
    """SparseSelfDrafter + SlidingWindow through the numba backend: greedy output == dense greedy."""
    prompts = [list(range(3, 50)), [4, 8, 15, 16, 23, 42] * 6]
    m = make_tiny("llama", seed=11)
    be = m.backend = BACKENDS.build("numba")
    calls, kernel = [], be.numba_attend
    be.numba_attend = lambda *a, **kw: calls.append(a[0].shape[2]) or kernel(*a, **kw)
    sel = SELECTORS.build("sliding_window", budget=10, sinks=2, recent=2)
    spec = SpeculativeEngine(m, SparseSelfDrafter(m, sel), gamma=3, eos_token_id=-1).generate(prompts, 12)
    m.backend = REF
    from specdec import PipelineConfig, build_engine

    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 12)
    assert spec.tokens == dense.tokens
    assert calls and set(calls) == {1}  # every sparse draft step went through the numba kernel
