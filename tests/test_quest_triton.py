"""Quest's Triton kernels (page scoring, incremental page min/max) against the torch implementation.

On the CPU these run under Triton's interpreter (``TRITON_INTERPRET=1``, set below before triton is
imported) at small sizes; ``SPECDEC_TEST_DEVICE=cuda`` compiles them for real on a GPU.
"""

from __future__ import annotations

import os
import random

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if _DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the Quest kernels need the optional 'triton' package")

from specdec.cache import KVCache  # noqa: E402
from specdec.cuda.triton_quest import quest_page_scores, quest_token_scores, quest_update_minmax  # noqa: E402
from specdec.selectors.quest import Quest, QuestConfig  # noqa: E402

if _DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

DEV = torch.device(_DEVICE)


def _torch_scores(q, kmin, kmax):
    return Quest(QuestConfig(kernels="torch")).page_scores(q, kmin, kmax)


def _bounds(B, Hkv, P, D, g):
    a = torch.randn(B, Hkv, P, D, generator=g)
    b = torch.randn(B, Hkv, P, D, generator=g)
    return torch.minimum(a, b).to(DEV), torch.maximum(a, b).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Hkv,G,T,D,P", [(1, 1, 1, 8, 5), (3, 3, 1, 64, 37), (2, 4, 3, 16, 300), (2, 2, 1, 24, 9)])
def test_page_scores_match_torch_and_pick_the_same_pages(dtype, Hkv, G, T, D, P):
    g = torch.Generator().manual_seed(P + D)
    B = 2
    q = torch.randn(B, Hkv * G, T, D, generator=g).to(dtype).to(DEV)
    kmin, kmax = _bounds(B, Hkv, P, D, g)
    ref = _torch_scores(q, kmin, kmax)
    got = quest_page_scores(q, kmin, kmax)
    assert got.shape == (B, Hkv, P) and got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5)
    k = max(1, P // 3)
    assert torch.equal(torch.topk(got, k, dim=-1).indices, torch.topk(ref, k, dim=-1).indices)


@pytest.mark.parametrize("ps,L", [(16, 70), (5, 41), (4, 64)])
def test_token_scores_equal_torch_expansion(ps, L):
    """Fused expansion: each token carries its page's bound, blocked tokens are -inf, as the torch path."""
    g = torch.Generator().manual_seed(ps * L)
    B, Hkv, G, D, sinks, recent = 3, 2, 3, 16, 2, 5
    P = -(-(L + 9) // ps)  # the capacity can exceed the longest sequence
    q = torch.randn(B, Hkv * G, 1, D, generator=g).to(DEV)
    kmin, kmax = _bounds(B, Hkv, P, D, g)
    lengths = torch.tensor([L, 3, L - 7], device=DEV)
    sel = Quest(QuestConfig(page_size=ps, sinks=sinks, recent=recent, kernels="torch"))
    ref = sel.page_scores(q, kmin, kmax).repeat_interleave(ps, dim=-1)[..., :L]
    ref = ref.masked_fill(sel.blocked(lengths, L).view(B, 1, L), float("-inf"))
    got = quest_token_scores(q, kmin, kmax, lengths, L, ps, sinks, recent)
    assert got.shape == ref.shape
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5)
    k = 12
    a, b = torch.topk(got, k, dim=-1), torch.topk(ref, k, dim=-1)
    torch.testing.assert_close(a.values, b.values, atol=1e-4, rtol=1e-5)
    # the tokens of a page tie: compare how many tokens of each page are picked (finite picks only)
    fin = torch.isfinite(a.values).view(-1, k)
    for row in range(B * Hkv):
        f = fin[row]
        pa = sorted(x // ps for x in a.indices.view(-1, k)[row][f].tolist())
        pb = sorted(x // ps for x in b.indices.view(-1, k)[row][f].tolist())
        assert pa == pb


def test_page_scores_strided_inputs():
    """A layer slice of ``(N, B, H_kv, P, D)`` bounds and an HF-style transposed query view."""
    g = torch.Generator().manual_seed(3)
    N, B, Hkv, G, T, D, P = 3, 2, 2, 3, 2, 16, 21
    kmin, kmax = _bounds(N * B, Hkv, P, D, g)
    kmin, kmax = kmin.view(N, B, Hkv, P, D), kmax.view(N, B, Hkv, P, D)
    q = torch.randn(B, T, Hkv * G, D, generator=g).to(DEV).transpose(1, 2)  # (B, H, T, D) view
    torch.testing.assert_close(quest_page_scores(q, kmin[1], kmax[1]), _torch_scores(q, kmin[1], kmax[1]),
                               atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ps", [4, 16, 5])
def test_update_minmax_equals_torch_after_random_append_rollback(dtype, ps):
    """The kernel keeps the bounds bit-identical to the torch path (and so to a recomputation), in the keys' dtype.
    Each path has a cache of its own: the page bounds are buffers of the cache's planner, so two selectors on one
    cache would compare a tensor with itself."""
    rng = random.Random(ps)
    N, B, H, L, D = 2, 3, 2, 70, 8
    cache = KVCache(N, B, H, L, D, dtype=dtype, device=DEV)
    twin = KVCache(N, B, H, L, D, dtype=dtype, device=DEV)
    cache.k.normal_()
    sel_t = Quest(QuestConfig(budget=12, sinks=1, recent=2, page_size=ps, kernels="torch"))
    sel_k = Quest(QuestConfig(budget=12, sinks=1, recent=2, page_size=ps, kernels="triton"))
    lengths = torch.tensor([5, 0, 17], device=DEV)
    for step in range(25):
        T = rng.randint(1, 6)
        if int(lengths.max()) + T + 3 >= L:
            lengths = torch.tensor([rng.randint(0, 20) for _ in range(B)], device=DEV)
        else:
            for b in range(B):
                n = int(lengths[b])
                cache.k[:, b, :, n : n + T] = torch.randn(N, H, T, D, device=DEV).to(dtype)
            acc = torch.tensor([rng.randint(0, T) for _ in range(B)], device=DEV)
            if rng.random() < 0.2:
                acc = -torch.tensor([rng.randint(0, 2 * ps) for _ in range(B)], device=DEV)
            lengths = (lengths + acc).clamp(min=0)
        twin.k.copy_(cache.k)
        sel_t.update(twin, lengths)
        sel_k.update(cache, lengths)
        assert sel_k.kmin is not sel_t.kmin and sel_k.kmin.dtype == dtype
        ks = cache.k.float()
        for b, n in enumerate(lengths.tolist()):  # a min of keys is a key: exact in their dtype
            for pg in range(-(-n // ps)):
                want = ks[:, b, :, pg * ps: min((pg + 1) * ps, n)].amin(dim=2)
                assert torch.equal(sel_k.kmin[:, b, :, pg].float(), want), (step, b, pg)
        torch.testing.assert_close(sel_k.kmin, sel_t.kmin, rtol=0, atol=0, msg=f"kmin at step {step}")
        torch.testing.assert_close(sel_k.kmax, sel_t.kmax, rtol=0, atol=0, msg=f"kmax at step {step}")


def test_update_minmax_function_unchanged_lengths_is_noop():
    N, B, H, L, D, ps = 1, 2, 1, 20, 4, 4
    k = torch.randn(N, B, H, L, D, device=DEV)
    kmin = torch.full((N, B, H, 5, D), 7.0, device=DEV)
    kmax = kmin.clone()
    lens = torch.tensor([9, 0], device=DEV)
    quest_update_minmax(k, kmin, kmax, lens, lens.clone(), ps)
    assert (kmin == 7).all() and (kmax == 7).all()


def test_plan_indices_equal_between_paths():
    """The whole query-aware plan: same fixed + selected positions from both paths."""
    torch.manual_seed(0)
    N, B, Hkv, G, L, D, ps = 2, 3, 2, 3, 96, 16, 8
    cache = KVCache(N, B, Hkv, L, D, device=DEV)
    cache.k.normal_()
    lengths = torch.tensor([90, 41, 7], device=DEV)
    plans = []
    for kernels in ("torch", "triton"):
        sel = Quest(QuestConfig(budget=40, sinks=2, recent=4, page_size=ps, kernels=kernels))
        sel.reset(cache)
        plans.append(sel.plan(cache, lengths))
    q = torch.randn(B, Hkv * G, 1, D, device=DEV)
    for layer in range(N):
        a, b = plans[0].indices_for(layer, q), plans[1].indices_for(layer, q)
        assert torch.equal(a.sort(dim=-1).values, b.sort(dim=-1).values)


def test_kernels_switch():
    cpu = torch.device("cpu")
    assert not Quest(QuestConfig()).use_triton(cpu)  # auto: CUDA only
    assert not Quest(QuestConfig(kernels="torch")).use_triton(cpu)
    assert Quest(QuestConfig(kernels="triton")).use_triton(cpu)
    assert Quest(QuestConfig()).use_triton(torch.device("cuda")) is True


@pytest.mark.skipif(_DEVICE != "cpu", reason="the tiny model runs on the CPU")
def test_quest_lossless_with_triton_kernels():
    """Greedy output with the Triton Quest kernels equals plain greedy (tiny model, interpreter)."""
    from conftest import make_tiny

    from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine

    model = make_tiny("qwen3", seed=2)
    prompts = [list(range(2, 75)), [9, 3, 8, 1] * 12]
    ref = SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    sel = SELECTORS.build("quest", budget=20, sinks=2, recent=4, page_size=8, kernels="triton")
    res = SpeculativeEngine(model, SparseSelfDrafter(model, sel), gamma=4, eos_token_id=-1).generate(
        prompts, max_new_tokens=8)
    assert res.tokens == ref
