"""Parity of the pure-PyTorch fast backend (gather-then-attend) with the reference backend."""

import pytest
import torch

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine
from specdec.attention.reference import ReferenceBackend
from specdec.attention.torch_backend import TorchBackend
from specdec.interfaces import AttentionMetadata

from conftest import make_tiny

REF, FAST = ReferenceBackend(), TorchBackend()


def _case(B, Hkv, G, T, L, D, K, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.randint(K + 1, L - T - 4, (B,), generator=g)
    dense_from = lengths - torch.randint(0, 4, (B,), generator=g)  # tail includes some drafted tokens
    idx = torch.full((B, Hkv, K), -1, dtype=torch.long)
    for b in range(B):
        for h in range(Hkv):
            n = int(torch.randint(1, K + 1, (1,), generator=g))
            idx[b, h, :n] = torch.randperm(int(dense_from[b]), generator=g)[:n]
    return q, k, v, lengths, dense_from, idx


@pytest.mark.parametrize("B,Hkv,G,T,L,D,K", [(1, 1, 1, 1, 32, 8, 4), (3, 2, 3, 5, 80, 16, 12), (2, 3, 3, 1, 200, 64, 30)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_sparse_and_dense_match_reference(B, Hkv, G, T, L, D, K, dtype, tol):
    q, k, v, lengths, dense_from, idx = _case(B, Hkv, G, T, L, D, K, dtype, seed=B * 7 + T)
    scale = D**-0.5
    for kw in ({}, dict(plan_indices=idx, dense_from=dense_from)):
        ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, scale, **kw))
        out, _ = FAST.attend(q, k, v, AttentionMetadata(lengths, scale, **kw))
        torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol)


def test_scores_equal_reference():
    q, k, v, lengths, dense_from, idx = _case(2, 2, 2, 4, 60, 8, 6, torch.float32, seed=5)
    _, s_ref = REF.attend(q, k, v, AttentionMetadata(lengths, 0.3, score_rows=[0, 3]))
    _, s = FAST.attend(q, k, v, AttentionMetadata(lengths, 0.3, score_rows=[0, 3]))
    torch.testing.assert_close(s, s_ref)


def test_engine_with_torch_backend_equals_reference_engine():
    prompts = [list(range(3, 50)), [4, 8, 15, 16, 23, 42] * 6]
    outs = []
    for be in (REF, FAST):
        m = make_tiny("llama", seed=11)
        m.backend = be
        sel = SELECTORS.build("sliding_window", budget=10, sinks=2, recent=2)
        outs.append(SpeculativeEngine(m, SparseSelfDrafter(m, sel), gamma=3, eos_token_id=-1).generate(prompts, 12).tokens)
    assert outs[0] == outs[1]


@pytest.mark.parametrize("T", [1, 5])
def test_static_mode_matches_reference(T):
    """The CUDA-graph (static-shape) mode gives the same result as the dynamic one."""
    static = TorchBackend(TorchBackend.Config(static=True, max_draft=8))
    assert static.capture_safe and not FAST.capture_safe
    q, k, v, lengths, dense_from, idx = _case(2, 2, 3, T, 90, 16, 10, torch.float32, seed=T)
    for kw in ({}, dict(plan_indices=idx, dense_from=dense_from)):
        ref, _ = REF.attend(q, k, v, AttentionMetadata(lengths, 0.25, **kw))
        out, _ = static.attend(q, k, v, AttentionMetadata(lengths, 0.25, **kw))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_cuda_graphs_need_cuda_and_a_capture_safe_backend():
    from specdec.errors import SpecdecError

    m = make_tiny("llama")
    with pytest.raises(SpecdecError, match="CUDA"):
        m.enable_cuda_graphs()
