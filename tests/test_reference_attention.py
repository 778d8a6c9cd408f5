"""The reference backend: sparse with a full index list equals dense; scores equal a direct einsum."""

import pytest
import torch

from specdec.attention.reference import ReferenceBackend, visibility_mask
from specdec.interfaces import AttentionMetadata

BE = ReferenceBackend()


def _setup(B=3, Hkv=2, G=3, T=4, L=40, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hkv * G, T, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    lengths = torch.tensor([5, 20, 33][:B])
    return q, k, v, lengths


def _naive(q, k, v, lengths, allowed=None):
    """Loop over every (b, h, t) with explicit visible sets."""
    B, H, T, D = q.shape
    Hkv = k.shape[1]
    G = H // Hkv
    out = torch.zeros_like(q)
    logit_scores = torch.zeros(B, Hkv, k.shape[2])
    for b in range(B):
        for h in range(H):
            kv = h // G
            for t in range(T):
                pos = int(lengths[b]) + t
                vis = list(range(pos + 1)) if allowed is None else [p for p in allowed[b][kv] if p <= pos]
                lg = (k[b, kv, vis] @ q[b, h, t]) * D**-0.5
                out[b, h, t] = torch.softmax(lg, 0) @ v[b, kv, vis]
                logit_scores[b, kv, vis] += lg
    return out, logit_scores


def test_dense_matches_naive_loop_and_scores():
    q, k, v, lengths = _setup()
    out, scores = BE.attend(q, k, v, AttentionMetadata(lengths, q.shape[-1] ** -0.5, score_rows=range(q.shape[2])))
    ref, ref_scores = _naive(q, k, v, lengths)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scores, ref_scores, rtol=1e-4, atol=1e-4)


def test_sparse_with_full_index_list_equals_dense():
    q, k, v, lengths = _setup()
    B, Hkv, L = k.shape[0], k.shape[1], k.shape[2]
    full = torch.arange(L).view(1, 1, L).expand(B, Hkv, L).clone()
    dense, _ = BE.attend(q, k, v, AttentionMetadata(lengths, 0.3))
    sparse, _ = BE.attend(q, k, v, AttentionMetadata(lengths, 0.3, plan_indices=full, dense_from=lengths.clone()))
    torch.testing.assert_close(sparse, dense)


def test_sparse_matches_naive_visible_sets():
    q, k, v, lengths = _setup(seed=1)
    B, Hkv = k.shape[0], k.shape[1]
    g = torch.Generator().manual_seed(3)
    idx = torch.full((B, Hkv, 6), -1, dtype=torch.long)
    allowed = []
    for b in range(B):
        per = []
        for h in range(Hkv):
            sel = torch.randperm(int(lengths[b]), generator=g)[:4]
            idx[b, h, : len(sel)] = sel
            per.append(sorted(set(sel.tolist()) | set(range(int(lengths[b]), 64))))
        allowed.append(per)
    out, _ = BE.attend(q, k, v, AttentionMetadata(lengths, q.shape[-1] ** -0.5, plan_indices=idx, dense_from=lengths.clone()))
    ref, _ = _naive(q, k, v, lengths, allowed)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["logits", "softmax"])
def test_collected_rows_scores_equal_einsum(kind):
    q, k, v, lengths = _setup(seed=2)
    B, H, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = H // Hkv
    rows = [0, T - 1]
    heads = [0, 4]
    _, s = BE.attend(q, k, v, AttentionMetadata(lengths, D**-0.5, score_rows=rows, score_kind=kind, score_heads=heads))
    kk = k.repeat_interleave(G, dim=1)
    lg = torch.einsum("bhtd,bhld->bhtl", q, kk) * D**-0.5
    mask = visibility_mask(lengths, T, L)  # (B,1,T,L)
    lg = lg.masked_fill(~mask, float("-inf"))
    src = lg if kind == "logits" else torch.softmax(lg, -1)
    src = src.masked_fill(~mask, 0.0)[:, :, rows]
    keep = torch.zeros(H)
    keep[heads] = 1
    expect = (src * keep.view(1, H, 1, 1)).sum(2).view(B, Hkv, G, L).sum(2)
    torch.testing.assert_close(s, expect, rtol=1e-5, atol=1e-5)


def test_bf16_close_to_fp32():
    q, k, v, lengths = _setup(seed=4)
    out32, _ = BE.attend(q, k, v, AttentionMetadata(lengths, 0.35))
    out16, _ = BE.attend(q.bfloat16(), k.bfloat16(), v.bfloat16(), AttentionMetadata(lengths, 0.35))
    assert out16.dtype == torch.bfloat16
    torch.testing.assert_close(out16.float(), out32, rtol=3e-2, atol=3e-2)
