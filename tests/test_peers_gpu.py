"""The real peers (FlashAttention-4, FlashInfer) against the reference backend, on a CUDA GPU.

Runs only with ``SPECDEC_TEST_DEVICE=cuda``; a peer's tests are skipped only where its package is
absent. ``SPECDEC_REQUIRE_PEERS=1`` (set by ``benchmarks/gpu/peers.sh``) turns a missing package into
a failure, so the GPU run cannot pass by skipping.
"""

from __future__ import annotations

import os

import pytest
import torch

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_DEVICE != "cuda", reason="set SPECDEC_TEST_DEVICE=cuda")]
if _DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.cuda import peers  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

REQUIRE = os.environ.get("SPECDEC_REQUIRE_PEERS", "0") == "1"
REF = ReferenceBackend()


def _need(peer: str) -> None:
    if not peers.INSTALLED[peer]():
        if REQUIRE:
            pytest.fail(f"{peer} is not importable but SPECDEC_REQUIRE_PEERS=1")
        pytest.skip(f"{peer} is not installed")


def _case(B, H, Hkv, T, L, D, seed, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, device="cuda").to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g, device="cuda").to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g, device="cuda").to(dtype)
    lengths = torch.randint(T + 1, L - T, (B,), generator=g, device="cuda")  # ragged
    return q, k, v, lengths


def _ref(q, k, v, meta):
    out, _ = REF.attend(q.float(), k.float(), v.float(), meta)
    return out


SHAPES = [(9, 3, 64), (32, 8, 128)]  # the embedded model's heads, Llama-3.1-8B's


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_fa4_dense_matches_reference(T, H, Hkv, D):
    _need("fa4")
    q, k, v, lengths = _case(3, H, Hkv, T, 700, D, seed=T)
    meta = AttentionMetadata(lengths, D**-0.5)
    out = peers.fa4_dense(q, k, v, lengths, meta.scale)
    torch.testing.assert_close(out.float(), _ref(q, k, v, meta), rtol=0, atol=2e-2)


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_flashinfer_dense_matches_reference(T, H, Hkv, D):
    _need("flashinfer")
    q, k, v, lengths = _case(3, H, Hkv, T, 700, D, seed=10 + T)
    meta = AttentionMetadata(lengths, D**-0.5)
    out = peers.FlashInferRunner(workspace_mb=64).dense(q, k, v, lengths, meta.scale)
    torch.testing.assert_close(out.float(), _ref(q, k, v, meta), rtol=0, atol=2e-2)


@pytest.mark.parametrize("H,Hkv,D", SHAPES)
def test_flashinfer_sparse_matches_reference(H, Hkv, D):
    _need("flashinfer")
    B, L, K, TAIL = 3, 700, 40, 8
    q, k, v, _ = _case(B, H, Hkv, 1, L, D, seed=3)
    # ragged but fixed lengths: every sequence has far more than K + TAIL positions before its
    # tail, so each (sequence, KV head) really draws K distinct planned positions (random lengths
    # once left fewer than K to draw from)
    lengths = torch.tensor([L - 2, 401, 3 * K], device="cuda")
    g = torch.Generator().manual_seed(4)
    dense_from = lengths - TAIL
    idx = torch.stack([torch.randperm(int(dense_from[b]), generator=g)[:K] for b in range(B) for _ in range(Hkv)])
    assert idx.shape == (B * Hkv, K)
    idx = idx.view(B, Hkv, K).cuda()
    meta = AttentionMetadata(lengths, D**-0.5, idx, dense_from)
    out = peers.FlashInferRunner(workspace_mb=64).sparse(q, k, v, lengths, meta.scale, idx, dense_from)
    ref = _ref(q, k, v, meta)
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=2e-2)
    # not vacuous: the plan hides most of the context, so the dense answer is far from the sparse one
    dense = _ref(q, k, v, AttentionMetadata(lengths, D**-0.5))
    assert (dense - ref).abs().max() > 0.1


@pytest.mark.parametrize("peer", ["fa4", "flashinfer"])
def test_backend_routes_through_the_peer(peer):
    """``peers=<name>`` sends the dense verify call to the peer and keeps score requests ours."""
    _need(peer)
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig

    be = TritonBackend(TritonConfig(peers=peer))
    q, k, v, lengths = _case(2, 9, 3, 5, 600, 64, seed=9)
    meta = AttentionMetadata(lengths, 0.125)
    assert be.peer_for(q, k, meta) == peer
    out, s = be.attend(q, k, v, meta)
    torch.testing.assert_close(out.float(), _ref(q, k, v, meta), rtol=0, atol=2e-2)
    assert s is None
    assert be.peer_for(q, k, meta.replace(score_rows=[0, 4])) == "triton"


@pytest.mark.parametrize("peer", ["fa4", "flashinfer", "sdpa"])
@pytest.mark.parametrize("T", [1, 5])
def test_peer_captured_in_a_cuda_graph_replays_with_new_lengths(peer, T):
    """Under capture (the engine's default path): the backend's static call goes to the peer, is
    warmed up as ``GraphCache`` does (the second time with host synchronisation forbidden), captured,
    and replayed after the lengths changed (``before_replay`` re-plans FlashInfer) — matching the
    reference at the new lengths."""
    if peer != "sdpa":
        _need(peer)
    if peer == "sdpa" and T > 1:
        pytest.skip("SDPA serves one dense row")
    from specdec.cuda.triton_backend import TritonBackend, TritonConfig
    from specdec.graphs import _warm_up

    if peer == "sdpa":
        be = TritonBackend(TritonConfig(peers="auto"))
        be._graph_table = {("decode", 64): [(10**12, "sdpa")]}
    else:
        be = TritonBackend(TritonConfig(peers=peer))
    q, k, v, _ = _case(3, 9, 3, T, 640, 64, seed=30 + T)
    lens = torch.tensor([600, 17, 333], device="cuda")
    meta = AttentionMetadata(lens, 0.125, static=True)
    assert be.peer_for(q, k, meta) == peer
    be.capture_begin()
    box = {}
    _warm_up(lambda: be.attend(q, k, v, meta))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        box["out"], _ = be.attend(q, k, v, meta)
    token = be.capture_end()
    assert (token is not None) == (peer == "flashinfer")
    for new in ([600, 17, 333], [5, 630, 100]):
        lens.copy_(torch.tensor(new, device="cuda"))
        be.before_replay(token, lens)
        g.replay()
        torch.cuda.synchronize()
        ref = _ref(q, k, v, AttentionMetadata(lens.clone(), 0.125))
        torch.testing.assert_close(box["out"].float(), ref, rtol=0, atol=2e-2)
    assert be.peer_calls[(peer, "decode" if T == 1 else "verify", True)] >= 3


@pytest.mark.parametrize("peer", ["fa4", "flashinfer"])
def test_model_forward_captured_with_the_peer_equals_ours(peer):
    """Through the model and ``GraphCache`` (the engine's path): a forward captured with the peer,
    replayed at other lengths (FlashInfer re-planned by ``before_replay``), matches the same forward
    captured with our kernel — and the lengths matter (not vacuous)."""
    _need(peer)
    from conftest import make_tiny

    from specdec.cuda.triton_backend import TritonBackend, TritonConfig

    m = make_tiny("llama", seed=5, hidden_size=256)  # 4 / 2 heads of 64
    m.hf.to(device="cuda", dtype=torch.bfloat16)
    be, ours = TritonBackend(TritonConfig(peers=peer)), TritonBackend(TritonConfig(peers="off"))
    cache = m.new_cache(2, 640)
    cache.k.normal_()
    cache.v.normal_()
    m.backend = ours  # make_tiny builds the reference backend, which graphs refuse (not capture-safe)
    m.enable_cuda_graphs()
    for T in (1, 5):
        x = torch.arange(2 * T, device="cuda").view(2, T) + 11
        refs, worst = [], 0.0
        for L in ([400, 77], [12, 601], [400, 77]):
            lengths = torch.tensor(L, device="cuda")
            with m.using_backend(be):
                got = m.forward(x, cache, lengths).float()
            with m.using_backend(ours):
                ref = m.forward(x, cache, lengths).float()
            scale = ref.abs().max().item()
            torch.testing.assert_close(got, ref, rtol=0, atol=0.03 * scale)
            worst = max(worst, (got - ref).abs().max().item())
            refs.append(ref)
        # not vacuous: the second lengths change the answer by far more than the kernels differ
        assert (refs[0] - refs[1]).abs().max().item() > 10 * worst
    assert m._graphs.replays >= 4
    assert be.peer_calls[(peer, "decode", True)] > 0 and be.peer_calls[(peer, "verify", True)] > 0
