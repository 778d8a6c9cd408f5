"""Dustin's per-layer verification sets through the Triton kernels: attention (sparse plan per layer and KV head)
and the page bounds, against the reference backend and the torch page scoring (interpreter on the CPU)."""

from __future__ import annotations

import os

if os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the Triton kernels need the optional 'triton' package")

from specdec import PipelineConfig, build_engine  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402

from conftest import make_tiny  # noqa: E402

PROMPTS = [list(range(3, 45)), [5, 9, 17, 33, 2, 8] * 6]


@pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu", reason="the tiny model runs on the CPU")
def test_layer_sets_triton_attention_and_page_kernels_match_reference():
    model = make_tiny("qwen2", seed=2, num_hidden_layers=2)

    def run(kernels):
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=20, sinks=2, recent=4,
                                  options=dict(layer_share=0.5, page_size=4, page_kernels=kernels, margin=0))
        eng = build_engine(model, cfg, eos_token_id=-1)
        margins = []
        inner = eng.verifier._margin_valve

        def valve(*a, **k):
            out = inner(*a, **k)
            margins.append(eng.verifier.last_margin.clone())
            return out

        eng.verifier._margin_valve = valve
        return eng.generate(PROMPTS, max_new_tokens=4).tokens, torch.stack(margins)

    ref_tokens, ref_m = run("torch")
    with model.using_backend(TritonBackend(TritonConfig(block_n=16, num_splits=3))):
        tri_tokens, tri_m = run("triton")
    assert tri_tokens == ref_tokens
    torch.testing.assert_close(tri_m, ref_m, atol=1e-3, rtol=1e-4)  # the sparse logits themselves agree


@pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu", reason="the tiny model runs on the CPU")
def test_key_rank_layer_sets_through_the_triton_attention_match_reference():
    """``layer_scores="keys"``: the plan kind's own torch ranking, executed by the Triton backend's attention (a
    query-aware plan per layer and KV head), gives the reference backend's tokens and margins."""
    model = make_tiny("qwen2", seed=2, num_hidden_layers=2)

    def run():
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=20, sinks=2, recent=4,
                                  options=dict(layer_share=1.0, layer_scores="keys", key_rank=4, margin=0))
        eng = build_engine(model, cfg, eos_token_id=-1)
        out = eng.generate(PROMPTS, max_new_tokens=4).tokens
        return out, eng.verifier.last_margin.clone()

    ref_tokens, ref_m = run()
    with model.using_backend(TritonBackend(TritonConfig(block_n=16, num_splits=3))):
        tri_tokens, tri_m = run()
    assert tri_tokens == ref_tokens
    torch.testing.assert_close(tri_m, ref_m, atol=1e-3, rtol=1e-4)


@pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu", reason="the tiny model runs on the CPU")
def test_key_rank_triton_ranking_matches_the_torch_ranking(monkeypatch):
    """``layer_scores="keys"`` with ``page_kernels="triton"``: the ranking's own kernels (the low-rank mass and the
    per-row top ``room``) and the Triton attention give the torch ranking's tokens and margins on the reference."""
    from specdec.cuda import triton_keyrank

    calls = []
    kernel = triton_keyrank.lowrank_mass
    monkeypatch.setattr(triton_keyrank, "lowrank_mass", lambda *a: calls.append(1) or kernel(*a))
    model = make_tiny("qwen2", seed=2, num_hidden_layers=2)

    def run(kernels):
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=20, sinks=2, recent=4,
                                  options=dict(layer_share=1.0, layer_scores="keys", key_rank=4, margin=0,
                                               page_kernels=kernels))
        eng = build_engine(model, cfg, eos_token_id=-1)
        out = eng.generate(PROMPTS, max_new_tokens=4).tokens
        return out, eng.verifier.last_margin.clone()

    ref_tokens, ref_m = run("torch")
    with model.using_backend(TritonBackend(TritonConfig(block_n=16, num_splits=3))):
        tri_tokens, tri_m = run("triton")
    assert calls  # the kernels ranked (not the torch path)
    assert tri_tokens == ref_tokens
    torch.testing.assert_close(tri_m, ref_m, atol=1e-3, rtol=1e-4)


def _key_rank_case(seed, B=3, H=2, G=3, T=5, C=150, r=8, D=16, k_sel=40, finished=False):
    from specdec.selectors.key_rank import KeyRankPlan

    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([C, C - 37, 61][:B])
    new = torch.rand(B, C, generator=g) < 0.7
    new &= torch.arange(C).view(1, C) < lengths.view(B, 1)
    room = torch.minimum(torch.tensor([k_sel, 25, 40][:B]), new.sum(1))
    if finished:  # sequence 1 finished: its plan ranks nothing (length 0) and picks nothing (as _layer_plan makes it)
        lengths[1], room[1] = 0, 0
    plan = KeyRankPlan(indices=torch.tensor([[0, 1, -1]] * B).view(1, B, 1, 3), dense_from=lengths.clone(),
                       lengths=lengths, room=room, basis=torch.randn(1, B, H, D, r, generator=g),
                       keys=torch.randn(1, B, H, C, r, generator=g), new=new, k_sel=k_sel)
    q = torch.randn(B, H * G, T, D, generator=g)
    return plan, q


@pytest.mark.parametrize("seed,chunk,finished", [(0, 256, False), (1, 32, False), (2, 16, False), (3, 32, True),
                                                 (4, 256, True)])
def test_lowrank_mass_kernel_equals_the_definition(seed, chunk, finished):
    """The kernel's mass = Σ over the group's rows of the softmax (over the cached positions) of the low-rank logits,
    -inf off ``new``; its picks through ``select_top`` = the torch path's set per (sequence, KV head). ``chunk`` below
    the capacity (150) splits each row over programs: lengths end inside a chunk, and later chunks hold none;
    ``finished``: a sequence of length 0 and no room (a finished one) reads -inf everywhere and picks nothing."""
    import dataclasses

    from specdec.cuda.triton_keyrank import lowrank_mass

    plan, q = _key_rank_case(seed, finished=finished)
    B, H, C, r = plan.keys[0].shape
    D = q.shape[-1]
    qr = torch.einsum("bhgtd,bhdr->bhgtr", q.view(B, H, -1, q.shape[2], D), plan.basis[0]) * D ** -0.5
    dev = torch.device("cuda" if os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cuda" else "cpu")
    got = lowrank_mass(qr.reshape(B, H, -1, r).contiguous().to(dev), plan.keys[0].to(dev), plan.lengths.to(dev),
                       plan.new.to(dev), chunk).cpu()
    want = torch.full((B, H, C), float("-inf"))
    for b in range(B):
        L = int(plan.lengths[b])
        logits = torch.einsum("htr,hcr->htc", qr[b].reshape(H, -1, r), plan.keys[0, b, :, :L])
        mass = torch.softmax(logits.double(), -1).sum(1).float()
        want[b, :, :L] = torch.where(plan.new[b, :L], mass, torch.full_like(mass, float("-inf")))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if dev.type != "cpu":  # (the plan's tensors below are on the CPU)
        return
    ref = plan.indices_for(0, q)
    tri = dataclasses.replace(plan, use_triton=True).indices_for(0, q)
    assert tri.shape == ref.shape
    for b in range(B):
        for h in range(H):
            assert set(tri[b, h].tolist()) == set(ref[b, h].tolist())
            assert (tri[b, h] >= 0).sum() == 2 + int(plan.room[b])


@pytest.mark.parametrize("chunk", [32, None])  # None: the default launch (blocks of 128 positions on bfloat16 keys)
@pytest.mark.parametrize("split,tol", [(3, 2e-6), (2, 1e-4), (0, 2e-6)])
def test_lowrank_mass_with_bf16_keys_equals_the_definition(split, tol, chunk):
    """bfloat16 projected keys (the GPU's cache dtype): the rows as ``split`` bfloat16 pieces (3: the float32 rows
    whole, every product exact; 2: their first 16 bits) or three TF32 products (0) give the float64 definition's mass
    on those keys; 3 pieces as closely as float32 itself."""
    from specdec.cuda.triton_keyrank import lowrank_mass

    g = torch.Generator().manual_seed(3)
    B, H, R, r, C = 2, 2, 15, 16, 100
    keys = (torch.randn(B, H, C, r, generator=g) * 2).to(torch.bfloat16)
    qr = (torch.randn(B, H, R, r, generator=g) * 0.3).contiguous()
    lengths = torch.tensor([C, 71])
    new = torch.rand(B, C, generator=g) < 0.8
    got = lowrank_mass(qr, keys, lengths, new, chunk, split=split)
    want = torch.full((B, H, C), float("-inf"), dtype=torch.float64)
    for b in range(B):
        L = int(lengths[b])
        mass = torch.softmax(torch.einsum("htr,hcr->htc", qr[b].double(), keys[b, :, :L].double()), -1).sum(1)
        want[b, :, :L] = torch.where(new[b, :L], mass, torch.full_like(mass, float("-inf")))
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin)
    err = ((got.double() - want).abs()[fin] / want[fin]).max().item()
    assert err < tol, err


def test_lowrank_mass_refuses_bad_inputs_in_one_line():
    from specdec.cuda.triton_keyrank import lowrank_mass

    with pytest.raises(ValueError, match="want float32 contiguous qr") as e:
        lowrank_mass(torch.zeros(1, 2, 5, 4, dtype=torch.float64), torch.zeros(1, 2, 9, 4), torch.tensor([9]),
                     torch.ones(1, 9, dtype=torch.bool))
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="split must be 0, or 2 or 3 with bfloat16 keys") as e:
        lowrank_mass(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 9, 4), torch.tensor([9]),
                     torch.ones(1, 9, dtype=torch.bool), split=3)
    assert "\n" not in str(e.value)


def _brute_pages(page, new, room, fixed, k_sel, ps):
    """The definition: per (sequence, KV head) the room[b] new tokens ranked by their page's score, ties by position."""
    B, Hkv, P = page.shape
    W = new.shape[1]
    out = torch.full((B, Hkv, fixed.shape[1] + k_sel), -1, dtype=torch.long)
    for b in range(B):
        for h in range(Hkv):
            toks = [p for p in range(W) if new[b, p]]
            toks.sort(key=lambda p: (-(float(page[b, h, p // ps]) + 0.0), p))
            picked = sorted(toks[: int(room[b])])
            out[b, h, : fixed.shape[1]] = fixed[b]
            out[b, h, fixed.shape[1]: fixed.shape[1] + len(picked)] = torch.tensor(picked, dtype=torch.long)
    return out


def _page_case(seed, B=3, Hkv=2, P=70, ps=4, levels=None, k_sel=40, F=6, rooms=None):
    g = torch.Generator().manual_seed(seed)
    W = P * ps - 3  # a partial last page
    page = torch.randn(B, Hkv, P, generator=g)
    if levels:  # few distinct scores: many ties across pages; and both zeros
        page = torch.randint(0, levels, (B, Hkv, P), generator=g).float() - 1
        page[page == 0] = torch.tensor([0.0, -0.0])[torch.randint(0, 2, (int((page == 0).sum()),), generator=g)]
    new = (torch.rand(B, W, generator=g) < 0.7).to(torch.uint8)
    new[0, : 2 * ps] = 0  # whole pages without a new token
    fixed = torch.randint(0, W, (B, F), generator=g)
    fixed[:, -1] = -1  # the shared part's padding is copied as it is
    room = torch.tensor(rooms or [k_sel, k_sel // 2, 0][:B])
    counts = torch.stack([torch.tensor([int(new[b, p * ps:(p + 1) * ps].sum()) for p in range(P)]) for b in range(B)])
    return page, counts.int(), new, room, fixed, k_sel, ps


@pytest.mark.parametrize("case", [
    dict(seed=0), dict(seed=1, levels=3), dict(seed=2, ps=3, levels=4), dict(seed=3, ps=5, P=9, k_sel=40),
    dict(seed=4, P=150, ps=2, levels=2, k_sel=64, rooms=[64, 1, 63]),
])
def test_select_pages_kernel_equals_the_reference_and_the_definition(case):
    """One layer's per-layer part: the Triton kernel (interpreter), the PyTorch reference and a brute-force ranking
    give the same indices — with ties across pages, -0.0 vs 0.0, pages without new tokens, room 0, a room larger than
    the row's new tokens (case 3: 9 pages of 5), a page size that is no power of two and several tiles of pages."""
    from specdec.cuda.triton_select import select_pages
    from specdec.selectors.quest import select_pages_torch

    page, counts, new, room, fixed, k_sel, ps = _page_case(**case)
    want = _brute_pages(page, new, room, fixed, k_sel, ps)
    assert torch.equal(select_pages_torch(page, new.bool(), room, fixed, k_sel, ps), want)
    dev = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")  # the kernel natively on a GPU, else under the interpreter
    on = [t.to(dev) if isinstance(t, torch.Tensor) else t for t in (page.contiguous(), counts, new.bool(), room, fixed)]
    for warps in (1, 4):
        assert torch.equal(select_pages(*on, k_sel, ps, warps).cpu(), want)


def test_select_pages_refuses_bad_inputs_in_one_line():
    from specdec.cuda.triton_select import select_pages

    page, counts, new, room, fixed, k_sel, ps = _page_case(0)
    new = new.bool()
    with pytest.raises(ValueError, match="counts"):
        select_pages(page, counts.long(), new, room, fixed, k_sel, ps)
    with pytest.raises(ValueError, match="bool"):
        select_pages(page, counts, new.to(torch.uint8), room, fixed, k_sel, ps)
    with pytest.raises(ValueError, match="float32"):
        select_pages(page.double(), counts, new, room, fixed, k_sel, ps)


def test_top_directions_equal_eigh_per_matrix_also_in_threads():
    """The key basis's eigenvectors (host LAPACK, chunks in threads) = ``torch.linalg.eigh`` of each matrix, in
    order, on the Gram's device and dtype float32."""
    from specdec.selectors.key_rank import top_directions

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 50, 2, 8, 12, generator=g)
    gram = x @ x.transpose(-1, -2)  # 300 matrices: more than one chunk with two threads
    want = torch.linalg.eigh(gram)[1]
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            got = top_directions(gram)
            assert got.shape == gram.shape and got.dtype == torch.float32 and got.device == gram.device
            assert torch.get_num_threads() == n  # its single-threaded chunks leave torch's setting as it was
            torch.testing.assert_close(got, want, atol=0, rtol=0)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("grow", [3, 100])
def test_key_rank_index_projects_each_new_position_once_and_exactly(grow):
    """After the first update (basis + the whole prompt), a later update projects the positions verified since: a
    few (one product over every layer) or many (a layer at a time) — the kept projected keys equal the cache's keys
    times the basis at every verified position."""
    from specdec.cache import KVCache
    from specdec.selectors.key_rank import KeyRankIndex

    g = torch.Generator().manual_seed(0)
    cache = KVCache(3, 2, 2, 160, 8)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g))
    idx = KeyRankIndex(4)
    lengths = torch.tensor([40, 33])
    idx.update(cache, lengths)
    basis = idx.basis.clone()
    lengths = lengths + grow
    idx.update(cache, lengths)
    assert torch.equal(idx.basis, basis)  # taken once per generation
    want = torch.einsum("nbhcd,nbhdr->nbhcr", cache.k, basis)
    for b, L in enumerate(lengths.tolist()):
        torch.testing.assert_close(idx.keys[:, b, :, :L], want[:, b, :, :L], atol=1e-5, rtol=1e-5)


def test_lowrank_mass_default_chunk_keeps_a_launch_full():
    """Long chunks where a launch keeps >= 512 programs (B 64 x 3 KV heads x 8k: 1,536), short ones for a small batch
    (B 1: 3 x 32 = 96 programs instead of 24)."""
    from specdec.cuda.triton_keyrank import default_chunk

    assert default_chunk(64 * 3, 8192) == 1024
    assert default_chunk(3, 8192) == 256
    assert default_chunk(64, 8192) == 1024 and default_chunk(63, 8192) == 256  # 64 x 8 = 512
