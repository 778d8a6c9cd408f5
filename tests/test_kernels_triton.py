"""Parity of the Triton backend with the reference backend.

On the CPU these run under Triton's interpreter (``TRITON_INTERPRET=1``, set below before triton is
imported) at small sizes; on a CUDA machine (``SPECDEC_TEST_DEVICE=cuda``) the same tests compile
the kernels for real, with a few larger shapes added.
"""

from __future__ import annotations

import os

_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if _DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the triton backend needs the optional 'triton' package")
pytest.importorskip("pydantic", reason="backend configs need pydantic")

from specdec.attention.reference import ReferenceBackend  # noqa: E402
from specdec.cuda.triton_attention import LaunchConfig, choose_splits, reduce_scores, splitk_attention  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402
from specdec.interfaces import AttentionMetadata  # noqa: E402

if _DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("SPECDEC_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)

DEV = torch.device(_DEVICE)
ON_GPU = DEV.type == "cuda"
# block_n small on the CPU so that short caches still span several tiles and splits
SMALL = TritonConfig(block_n=16, num_splits=3)
AUTO = TritonConfig(block_n=16 if not ON_GPU else 64)

# (atol, rtol) of the attention output and of the scores, against the fp32 reference run on the
# same (rounded) inputs. bf16/fp16: P is rounded to the input dtype before P·V, as in every
# flash kernel; scores are accumulated in fp32 from the same products.
TOL_OUT = {torch.float32: (2e-5, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
TOL_SCORE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}
if ON_GPU:  # GPU fp32 logits come from tensor-core-free FMA paths with another summation order
    TOL_SCORE[torch.float32] = (2e-4, 2e-4)

REF = ReferenceBackend()


def make_case(B, Hkv, G, T, D, L, dtype, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    H = Hkv * G
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lens = torch.tensor(lengths, dtype=torch.long)
    return q.to(DEV), k.to(DEV), v.to(DEV), lens.to(DEV)


def make_plan(B, Hkv, K, lengths, T, seed=1, pad=2, dense_back=3):
    """Unique plan positions below each sequence's end, some -1 padding; dense tail of ``dense_back``."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.full((B, Hkv, K), -1, dtype=torch.long)
    for b, n in enumerate(lengths):
        for h in range(Hkv):
            avail = n + T  # may include future/tail positions: the kernel must mask/dedupe them
            take = min(K - pad, avail)
            idx[b, h, :take] = torch.randperm(avail, generator=g)[:take]
            idx[b, h] = idx[b, h][torch.randperm(K, generator=g)]  # padding anywhere
    dense_from = torch.tensor([max(0, n - dense_back) for n in lengths], dtype=torch.long)
    return idx.to(DEV), dense_from.to(DEV)


def check(cfg, q, k, v, lens, **kw):
    dtype = q.dtype
    scale = q.shape[-1] ** -0.5
    o_ref, s_ref = REF.attend(q, k, v, AttentionMetadata(lens, scale, **kw))
    o, s = TritonBackend(cfg).attend(q, k, v, AttentionMetadata(lens, scale, **kw))
    assert o.shape == o_ref.shape and o.dtype == dtype
    assert torch.isfinite(o.float()).all()
    atol, rtol = TOL_OUT[dtype]
    # a row that sees no position at all: the reference yields NaN, the kernel guards it to 0
    blind = torch.isnan(o_ref.float())
    assert (o.float()[blind] == 0).all()
    torch.testing.assert_close(o.float()[~blind], o_ref.float()[~blind], atol=atol, rtol=rtol)
    if s_ref is None:
        assert s is None
    else:
        assert s is not None and s.shape == s_ref.shape and s.dtype == torch.float32
        atol, rtol = TOL_SCORE[dtype]
        if kw.get("score_kind", "logits") == "logits":
            atol = atol * q.shape[1]  # a sum of up to H*R logits of size ~sqrt(D)*scale
        torch.testing.assert_close(s, s_ref, atol=atol, rtol=rtol)


SHAPES = [(1, 1), (2, 3), (2, 4)]  # (H_kv, G)


@pytest.mark.parametrize("hkv,G", SHAPES)
@pytest.mark.parametrize("D", [16, 64])
@pytest.mark.parametrize("T", [1, 3, 5])
def test_dense_matches_reference(hkv, G, D, T):
    lengths = [37, 0, 90] if not ON_GPU else [1000, 0, 3001]
    L = max(lengths) + T + 5
    q, k, v, lens = make_case(3, hkv, G, T, D, L, torch.float32, lengths, seed=T * 10 + D)
    check(SMALL, q, k, v, lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["logits", "softmax"])
@pytest.mark.parametrize("T,rows", [(1, [0]), (5, [0, 4]), (3, [1])])
def test_dense_scores_dtypes(dtype, kind, T, rows):
    lengths = [50, 13] if not ON_GPU else [4000, 777]
    q, k, v, lens = make_case(2, 2, 3, T, 64, max(lengths) + T, dtype, lengths, seed=7)
    check(SMALL, q, k, v, lens, score_rows=rows, score_kind=kind)


@pytest.mark.parametrize("kind", ["logits", "softmax"])
@pytest.mark.parametrize("heads", [[0], [1, 5], [], None])
def test_score_heads(kind, heads):
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 70, torch.float32, [40, 64], seed=3)
    check(SMALL, q, k, v, lens, score_rows=[0, 4], score_kind=kind, score_heads=heads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("budget", [4, 24, 64])
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("hkv,G", [(2, 3), (1, 4)])
def test_sparse_matches_reference(dtype, budget, T, hkv, G):
    lengths = [70, 33, 5] if not ON_GPU else [6000, 2500, 5]
    L = max(lengths) + T + 3
    q, k, v, lens = make_case(3, hkv, G, T, 64, L, dtype, lengths, seed=budget + T)
    idx, df = make_plan(3, hkv, budget, lengths, T)
    check(SMALL, q, k, v, lens, plan_indices=idx, dense_from=df)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("tree,hkv,G", [("default", 1, 3), ("lookup", 2, 3), ("wide", 1, 4)])
@pytest.mark.parametrize("cfg", ["small", "auto", "rows16_bits", "rows32"])
def test_draft_tree_rows_match_reference(dtype, sparse, tree, hkv, G, cfg):
    """Draft-tree rows (a tree mask among the new rows) in the split-K kernel: dense and sparse, one split and several,
    with and without the fast loop's unmasked tiles, in one tile of packed rows or in row blocks of 16 / 32, the mask
    as bit words (the default) or bytes ("small"); a row that saw its later siblings would differ."""
    from specdec.tree import DraftTree

    t = {"default": DraftTree.default(), "lookup": DraftTree([(0,), (1,), (0, 0)], lookup=3),
         "wide": DraftTree([(r,) for r in range(6)] + [(0, 0), (0, 0, 0)])}[tree]
    T = t.nodes + 1
    lengths = [70, 33, 0] if not ON_GPU else [6000, 2500, 0]
    q, k, v, lens = make_case(3, hkv, G, T, 64, max(lengths) + T + 3, dtype, lengths, seed=T)
    kw = dict(tree=t.mask.to(DEV))
    if sparse:
        kw["plan_indices"], kw["dense_from"] = make_plan(3, hkv, 24, lengths, T)
    cfgs = {"small": TritonConfig(block_n=16, num_splits=3, tree_bits=False), "auto": AUTO, "rows16_bits": TritonConfig(block_n=16, num_splits=3, row_block=16,
                                                                     tree_bits=True),
            "rows32": TritonConfig(block_n=16, num_splits=1, row_block=32)}
    check(cfgs[cfg], q, k, v, lens, **kw)


def test_row_block_must_be_a_power_of_two():
    """A row block that is no tile size is refused when the config is made, whatever the calls' row counts."""
    with pytest.raises(ValueError, match="row_block must be 0 .* power of two >= 16"):
        TritonConfig(row_block=20)
    with pytest.raises(ValueError, match="row_block must be 0 .* power of two >= 16"):
        TritonConfig(row_block=8)
    assert TritonConfig(row_block=32).row_block == 32 and TritonConfig(row_block=0).row_block == 0


def test_draft_tree_rows_past_one_tile_and_with_scores():
    """More rows than a packed tile, or scores asked: the torch backend's SDPA with the mask, the reference's
    scores; the kernel itself refuses scores with a tree and a mask of the wrong shape."""
    from specdec.tree import DraftTree

    t = DraftTree([(r,) for r in range(20)])  # 21 rows x G 4 > 64
    q, k, v, lens = make_case(2, 1, 4, 21, 16, 60, torch.float32, [30, 7], seed=2)
    check(SMALL, q, k, v, lens, tree=t.mask.to(DEV))
    t = DraftTree.default()
    q, k, v, lens = make_case(2, 1, 3, 17, 16, 60, torch.float32, [30, 7], seed=3)
    check(SMALL, q, k, v, lens, tree=t.mask.to(DEV), score_rows=[0], score_kind="softmax")
    meta = AttentionMetadata(lens, 0.25)
    with pytest.raises(ValueError, match="take no scores"):
        splitk_attention(q, k, v, meta, row_weights=torch.ones(3, 17, device=DEV), tree=t.mask.to(DEV))
    with pytest.raises(ValueError, match=r"is \(17, 17\)"):
        splitk_attention(q, k, v, meta, tree=t.mask[:5, :5].to(DEV))


@pytest.mark.parametrize("kind", ["logits", "softmax"])
def test_sparse_with_scores(kind):
    lengths = [60, 21]
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 70, torch.float32, lengths, seed=11)
    idx, df = make_plan(2, 2, 12, lengths, 5)
    check(SMALL, q, k, v, lens, plan_indices=idx, dense_from=df, score_rows=[0, 4], score_kind=kind)


@pytest.mark.parametrize("kind", ["logits", "softmax"])
@pytest.mark.parametrize("sparse", [False, True])
def test_scores_per_row_and_shared_plan(kind, sparse):
    """``score_per_row=True`` keeps the rows apart; a ``(B, 1, K)`` plan is shared by the KV heads."""
    lengths = [40, 17]
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 48, torch.float32, lengths, seed=8)
    kw = dict(score_rows=[4, 0, 4], score_kind=kind, score_per_row=True)
    if sparse:
        idx, df = make_plan(2, 2, 10, lengths, 5)
        kw.update(plan_indices=idx[:, :1], dense_from=df)
    check(SMALL, q, k, v, lens, **kw)


def test_sparse_edge_plans():
    """All-padding plan, dense_from past the rows (plan only), dense_from 0 (all dense), overlaps."""
    lengths = [30, 45, 20]
    q, k, v, lens = make_case(3, 2, 2, 3, 16, 50, torch.float32, lengths, seed=5)
    idx = torch.full((3, 2, 8), -1, dtype=torch.long)
    idx[1, :, :5] = torch.tensor([0, 44, 46, 47, 10])  # 46, 47: the new rows' own positions
    idx[2, 0, :4] = torch.tensor([19, 20, 22, 49])  # 49: beyond every row (never visible)
    # seq 0: everything dense; seq 1: no tail; seq 2 / KV head 1: row 0 sees nothing at all
    df = torch.tensor([0, 10**6, 21], dtype=torch.long)
    check(SMALL, q, k, v, lens, plan_indices=idx.to(DEV), dense_from=df.to(DEV))
    check(SMALL, q, k, v, lens, plan_indices=idx.to(DEV), dense_from=df.to(DEV), score_rows=[0, 2])


@pytest.mark.parametrize("splits", [1, 7, 40])
def test_split_counts(splits):
    """More splits than tiles leaves empty chunks: the combine must ignore them."""
    q, k, v, lens = make_case(2, 1, 3, 5, 16, 80, torch.float32, [3, 70], seed=splits)
    check(TritonConfig(block_n=16, num_splits=splits), q, k, v, lens, score_rows=[0, 4])


SCORE_VARIANTS = {
    "none": {},
    "logits": dict(score_rows=[0, 2]),  # fused sum (SCORE_MODE 1)
    "logits_row": dict(score_rows=[2, 0], score_per_row=True),  # per row in the kernel (SCORE_MODE 3)
    "softmax": dict(score_rows=[0, 2], score_kind="softmax"),  # raw logits + reduce (SCORE_MODE 2)
    "softmax_row": dict(score_rows=[1], score_kind="softmax", score_per_row=True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("score", sorted(SCORE_VARIANTS))
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("splits", [1, 3])
def test_one_split_direct_out_vs_split_combine(splits, sparse, score, dtype):
    """One split writes out/lse from the split kernel (no combine); more splits go through the combine.
    Both must match the reference for dense and sparse, with every score kind, on ragged lengths."""
    lengths = [29, 0, 41]
    T = 3
    q, k, v, lens = make_case(3, 2, 2, T, 16, 48, dtype, lengths, seed=splits + 7 * sparse)
    kw = dict(SCORE_VARIANTS[score])
    if sparse:
        kw["plan_indices"], kw["dense_from"] = make_plan(3, 2, 10, lengths, T)
    check(TritonConfig(block_n=16, num_splits=splits), q, k, v, lens, **kw)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("score", ["logits", "logits_row", "softmax"])
def test_buffers_fully_written_without_fill(monkeypatch, sparse, score):
    """Output, LSE and dense score buffers come from ``torch.empty``: the kernels must write every
    element (poisoned with NaN here); a dense score position no requested row sees reads 0."""
    real_empty = torch.empty

    def nan_empty(*a, **kw):
        t = real_empty(*a, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    lengths = [20, 3]
    T = 3
    q, k, v, lens = make_case(2, 2, 2, T, 16, 40, torch.float32, lengths, seed=13)
    kw = dict(SCORE_VARIANTS[score])
    if sparse:
        kw["plan_indices"], kw["dense_from"] = make_plan(2, 2, 8, lengths, T)
    monkeypatch.setattr(torch, "empty", nan_empty)
    for splits in (1, 2):
        check(TritonConfig(block_n=16, num_splits=splits), q, k, v, lens, **kw)


def test_sparse_auto_single_split_and_forced_old_path():
    """Enough (sequence, KV head) programs: a sparse plan runs in one split; ``sparse_single_split_at
    =None`` (or a fixed ``num_splits``) keeps the split + combine path. Same results either way."""
    cpu = torch.device("cpu")  # counts 4 "SMs" off the GPU
    cfg = LaunchConfig(block_n=64, ctas_per_sm=4)
    assert choose_splits(4, 10_000, cpu, cfg, sparse=True) == 1
    assert choose_splits(3, 10_000, cpu, cfg, sparse=True) == 6  # too few programs: split
    assert choose_splits(4, 10_000, cpu, cfg, sparse=False) == 4  # dense: unchanged
    old = LaunchConfig(block_n=64, ctas_per_sm=4, sparse_single_split_at=None)
    assert choose_splits(64, 10_000, cpu, old, sparse=True) == 1  # 64 programs already fill 4 "SMs"
    assert choose_splits(4, 10_000, cpu, old, sparse=True) == 4
    assert choose_splits(4, 10_000, cpu, LaunchConfig(num_splits=2), sparse=True) == 2
    lengths = [50, 33, 12]
    q, k, v, lens = make_case(3, 2, 3, 1, 16, 60, torch.bfloat16, lengths, seed=17)
    idx, df = make_plan(3, 2, 24, lengths, 1)
    outs = []
    for c in (LaunchConfig(block_n=16), LaunchConfig(block_n=16, sparse_single_split_at=None)):
        outs.append(splitk_attention(q, k, v, AttentionMetadata(lens, 0.25, idx, df), cfg=c)[:2])
    check(TritonConfig(block_n=16), q, k, v, lens, plan_indices=idx, dense_from=df)
    torch.testing.assert_close(outs[0][0].float(), outs[1][0].float(), atol=1.6e-2, rtol=1.6e-2)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)


def test_auto_splits():
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 80, torch.float32, [3, 70], seed=1)
    check(AUTO, q, k, v, lens)


def test_full_cache_and_strided_views():
    """Rows ending at the last cache slot, a layer view of a 5-D cache, HF-style transposed q."""
    B, Hkv, G, T, D, L = 2, 2, 3, 4, 16, 48
    q, k, v, lens = make_case(B, Hkv, G, T, D, L, torch.float32, [L - T, 17], seed=9)
    big_k = torch.randn(3, B, Hkv, L, D, device=DEV)
    big_v = torch.randn(3, B, Hkv, L, D, device=DEV)
    big_k[1], big_v[1] = k, v
    q_t = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, T, D) view with strides of (B, T, H, D)
    check(SMALL, q_t, big_k[1], big_v[1], lens, score_rows=[0, 3])


@pytest.mark.parametrize("kw", [{}, {"score_rows": [0, 6, 11]}, {"sparse": True},
                                {"score_rows": [0, 11], "score_kind": "sink_softmax"},
                                {"score_rows": [0, 6, 11], "score_kind": "softmax"},
                                {"score_rows": [0, 6, 11], "score_kind": "softmax", "score_per_row": True}])
def test_many_rows_prefill_chunks(kw):
    """Forwards with more rows than one tile packs (prefill chunks) are cut into row chunks; summed scores of
    every kind come through the chunks (a Vegas verify at γ 16 on a GQA-4 model, 17 x 4 rows > 64, raised for the
    default ``sink_softmax``), per-row scores too."""
    lengths = [0, 9]
    q, k, v, lens = make_case(2, 2, 3, 12, 16, 24, torch.float32, lengths, seed=4)
    kw = dict(kw)
    if kw.pop("sparse", False):
        kw["plan_indices"], kw["dense_from"] = make_plan(2, 2, 6, lengths, 12)
    check(TritonConfig(block_n=16, num_splits=2, max_packed_rows=16), q, k, v, lens, **kw)


def test_many_rows_past_the_split_k_bound():
    """More rows than ``MANY_ROWS_SPLITK_MAX_T`` (a prefill chunk): on a GPU the dense no-score forward goes to
    masked SDPA, up to the bound (a long verify) to the split-K chunks; both against the reference."""
    from specdec.cuda.triton_backend import MANY_ROWS_SPLITK_MAX_T

    T = MANY_ROWS_SPLITK_MAX_T + 6
    lengths = [0, 9]
    q, k, v, lens = make_case(2, 2, 3, T, 16, T + 12, torch.float32, lengths, seed=6)
    check(TritonConfig(block_n=16, num_splits=2, max_packed_rows=16), q, k, v, lens)


def test_launcher_returns_lse():
    q, k, v, lens = make_case(2, 1, 2, 2, 16, 40, torch.float32, [10, 30], seed=2)
    out, lse, s, raw = splitk_attention(q, k, v, AttentionMetadata(lens, 0.25), cfg=LaunchConfig(block_n=16, num_splits=2))
    assert s is None and raw is None
    pos = torch.arange(40, device=DEV)
    for b in range(2):
        for t in range(2):
            logits = torch.einsum("hd,ld->hl", q[b, :, t].float(), k[b, 0].float()) * 0.25
            logits[:, pos > int(lens[b]) + t] = float("-inf")
            torch.testing.assert_close(lse[b, :, t], torch.logsumexp(logits, dim=-1), atol=1e-5, rtol=1e-5)


def test_choose_splits_fills_gpu_without_empty_tiles():
    cfg = LaunchConfig(block_n=64, ctas_per_sm=4)
    cpu = torch.device("cpu")  # counts 4 "SMs" off the GPU
    assert choose_splits(1, 10_000, cpu, cfg) == 16
    assert choose_splits(64, 10_000, cpu, cfg) == 1
    assert choose_splits(1, 100, cpu, cfg) == 2  # never more chunks than tiles


def test_registry_and_validate():
    from specdec.registry import BACKENDS

    backend = BACKENDS.build("triton", block_n=32)
    assert isinstance(backend, TritonBackend) and backend.config.block_n == 32
    assert backend.validate(DEV, torch.float32) is None
    assert "float" in backend.validate(DEV, torch.int8)


@pytest.mark.parametrize("softmax", [False, True])
def test_reduce_scores_ignores_unused_slots(softmax):
    """A KV head with fewer requested (head, row) pairs leaves slots unwritten: NaN there must not leak."""
    B, Hkv, n, L, T, H = 1, 2, 2, 8, 2, 4
    raw = torch.randn(B, Hkv, n, L, device=DEV)
    raw[:, 1] = float("nan")  # KV head 1 has no slots in use
    lse = torch.zeros(B, H, T, device=DEV)
    flat = torch.zeros(Hkv, n, dtype=torch.long, device=DEV)
    to_rows = torch.zeros(Hkv, n, 1, device=DEV)
    to_rows[0, :, 0] = 1.0
    out = reduce_scores(raw, lse, flat, to_rows, torch.tensor([L - T], device=DEV), T, dense=True, softmax=softmax)
    assert torch.isfinite(out).all() and (out[:, 1] == 0).all()
    expect = (raw[:, 0].exp() if softmax else raw[:, 0]).sum(dim=1)
    torch.testing.assert_close(out[:, 0, 0], expect)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graph capture needs a GPU")
@pytest.mark.parametrize("kind", ["logits", "softmax", "sink_softmax"])
def test_cuda_graph_capture_matches_eager(kind):
    """Verify with scores and a sparse step captured in CUDA graphs (first use inside the capture)."""
    lengths = [300, 1000]
    q, k, v, lens = make_case(2, 2, 3, 5, 64, 1100, torch.bfloat16, lengths, seed=21)
    idx, df = make_plan(2, 2, 64, lengths, 5)
    be = TritonBackend()
    assert be.capture_safe
    kw = dict(score_rows=[0, 4], score_kind=kind)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # compile the kernels outside the capture; score tables stay uncached
        TritonBackend().attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
        TritonBackend().attend(q, k, v, AttentionMetadata(lens, 0.125, plan_indices=idx, dense_from=df))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o1, s1 = be.attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
        o2, _ = be.attend(q, k, v, AttentionMetadata(lens, 0.125, plan_indices=idx, dense_from=df))
    q.copy_(torch.randn_like(q))  # replay must see the new inputs
    g.replay()
    torch.cuda.synchronize()
    r1, rs1 = TritonBackend().attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
    r2, _ = TritonBackend().attend(q, k, v, AttentionMetadata(lens, 0.125, plan_indices=idx, dense_from=df))
    torch.testing.assert_close(o1, r1)
    torch.testing.assert_close(s1, rs1)
    torch.testing.assert_close(o2, r2)


@pytest.mark.skipif(not ON_GPU, reason="the SDPA decode route is taken on CUDA only")
@pytest.mark.parametrize("lengths", [[700, 700], [700, 31]])
def test_sdpa_decode_route(lengths):
    q, k, v, lens = make_case(2, 2, 3, 1, 64, 800, torch.bfloat16, lengths, seed=5)
    check(TritonConfig(sdpa_decode=True), q, k, v, lens)
    assert not TritonBackend(TritonConfig(sdpa_decode=True)).capture_safe


def test_dense_single_split_rule(monkeypatch):
    """Dense attention runs in one split on a GPU once (sequence, KV head) programs fill the SMs, at
    head dim <= 64 only (the measured case); forced or disabled on request; never under the interpreter."""
    import specdec.cuda.triton_attention as ta

    monkeypatch.setattr(ta, "_sm_count", lambda dev: 132)
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    d64 = ta.LaunchConfig().resolve(False, 64)
    assert ta.choose_splits(64 * 3, 8000, gpu, d64) == 1  # SmolLM2 at B = 64
    assert ta.choose_splits(16 * 3, 8000, gpu, d64) > 1  # B = 16: too few programs
    assert ta.choose_splits(64 * 3, 8000, cpu, d64) > 1  # interpreter: unchanged
    assert ta.choose_splits(16 * 8, 32000, gpu, ta.LaunchConfig().resolve(False, 128)) > 1  # head dim 128: unchanged
    assert ta.choose_splits(64 * 3, 8000, gpu, ta.LaunchConfig(dense_single_split_at=None).resolve(False, 64)) > 1
    assert ta.choose_splits(16 * 3, 8000, gpu, ta.LaunchConfig(dense_single_split_at=0.25).resolve(False, 64)) == 1


@pytest.mark.parametrize("fused", [True, False])
def test_softmax_scores_of_one_dense_split_need_no_second_kernel(monkeypatch, fused):
    """Dense, one split, softmax scores summed over the rows (Vegas' request): the attention kernel
    normalises them itself (no reduce launch); ``fused_softmax_scores=False`` keeps the reduce kernel.
    Same values as the reference either way (``check``)."""
    import specdec.cuda.triton_backend as tb

    calls = []
    real = tb.reduce_scores
    monkeypatch.setattr(tb, "reduce_scores", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    q, k, v, lens = make_case(3, 2, 2, 3, 16, 48, torch.bfloat16, [29, 0, 41], seed=5)
    for rows in ([0, 2], [2, 0, 2]):  # a row listed twice counts twice (its weight)
        check(TritonConfig(block_n=16, num_splits=1, fused_softmax_scores=fused), q, k, v, lens,
              score_rows=rows, score_kind="softmax", score_heads=[0, 1, 3])
    assert (len(calls) == 0) == fused
    calls.clear()  # more splits, or kept rows: the reduce kernel
    check(TritonConfig(block_n=16, num_splits=3, fused_softmax_scores=fused), q, k, v, lens,
          score_rows=[0, 2], score_kind="softmax")
    assert len(calls) == 1


# sparse launch variants: the table's sparse row (V gathered next to K, >= 2 tiles per split), the
# previous default (V after the softmax), forced splits and wider tiles; tiles of 16/32 on the CPU so
# that short plans span several tiles, budgets that are odd and not a multiple of the tile
SPARSE_CFGS = {
    "table": TritonConfig(block_n=16),
    "legacy": TritonConfig(block_n=16, num_stages=2, v_early=False, min_tiles=1),
    "early_3splits": TritonConfig(block_n=16, v_early=True, num_splits=3),
    "bn32_2splits": TritonConfig(block_n=32, v_early=True, num_splits=2),
}


@pytest.mark.parametrize("cfg", sorted(SPARSE_CFGS))
@pytest.mark.parametrize("budget", [1, 17, 33])
@pytest.mark.parametrize("hkv,G,dtype", [(2, 4, torch.float32), (1, 8, torch.bfloat16)])
def test_sparse_launch_variants(cfg, budget, hkv, G, dtype):
    lengths = [70, 33, 5] if not ON_GPU else [6000, 2500, 5]
    T = 1
    q, k, v, lens = make_case(3, hkv, G, T, 64, max(lengths) + T + 3, dtype, lengths, seed=budget * 3 + G)
    idx, df = make_plan(3, hkv, budget, lengths, T, pad=min(2, budget - 1))
    check(SPARSE_CFGS[cfg], q, k, v, lens, plan_indices=idx, dense_from=df)


@pytest.mark.parametrize("T", [1, 5])
def test_sparse_table_default_head_dim_128(T):
    """The table's own row (no overrides) at the Llama geometry's head dim 128, GQA 4:1, B > 1, bf16."""
    lengths = [150, 77] if not ON_GPU else [30000, 7000]
    q, k, v, lens = make_case(2, 2, 4, T, 128, max(lengths) + T, torch.bfloat16, lengths, seed=21 + T)
    idx, df = make_plan(2, 2, 41 if not ON_GPU else 1501, lengths, T)
    check(TritonConfig(), q, k, v, lens, plan_indices=idx, dense_from=df)


def test_launch_table_rows():
    """Sparse calls take the rows measured on the H200 on 2026-12-01 (head dim <= 64: 128-position
    tiles, 3 stages, V early; head dim 128: the legacy row); dense rows are the measured ones of
    2026-11-29, unchanged; explicit fields win over the table."""
    from specdec.cuda.triton_attention import SPARSE_LEGACY, table_entry

    sp = LaunchConfig().resolve(True, 128)
    assert (sp.block_n, sp.num_stages, sp.v_early, sp.min_tiles) == (128, 2, False, 1)
    assert table_entry(True, 128) == SPARSE_LEGACY
    assert table_entry(True, 64) == (128, 4, 3, 4, True, 1)
    assert SPARSE_LEGACY == (128, 4, 2, 4, False, 1)
    assert table_entry(False, 64) == (128, 4, 3, 8, False, 1)
    assert table_entry(False, 128) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128, raw_scores=True) == (128, 4, 2, 4, False, 1)
    mine = LaunchConfig(block_n=32, num_stages=2, v_early=False, min_tiles=5).resolve(True, 128)
    assert (mine.block_n, mine.num_stages, mine.v_early, mine.min_tiles) == (32, 2, False, 5)


def test_launch_table_dense_few_long():
    """Dense head dim 128 with one 8B sequence (8 KV heads) over a 128k cache takes the row measured on
    the H200 on 2026-12-01 (128-position tiles, 2 stages, 4 per SM: 150.6 vs 165.7 us); B 16 x 32k, more
    pairs, shorter caches, head dim 64 and sparse plans keep their rows; explicit fields still win."""
    from specdec.cuda.triton_attention import DENSE_FEW_LONG, SPARSE_LEGACY, table_entry

    assert DENSE_FEW_LONG == (128, 4, 2, 4, False, 1)
    assert table_entry(False, 128, pairs=1 * 8, length=131072) == DENSE_FEW_LONG
    assert table_entry(False, 128, pairs=8, length=1 << 16) == DENSE_FEW_LONG
    assert table_entry(False, 128, pairs=16 * 8, length=32768) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128, pairs=16 * 8, length=131072) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128, pairs=8, length=32768) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128) == (64, 4, 2, 2, False, 1)  # batch unknown: the any-batch row
    assert table_entry(False, 64, pairs=3, length=131072) == (128, 4, 3, 8, False, 1)
    assert table_entry(True, 128, pairs=8, length=131072) == SPARSE_LEGACY
    got = LaunchConfig().resolve(False, 128, pairs=8, length=131072)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (128, 4, 2, 4)
    mine = LaunchConfig(block_n=64, ctas_per_sm=2).resolve(False, 128, pairs=8, length=131072)
    assert (mine.block_n, mine.ctas_per_sm) == (64, 2)


def test_splitk_attention_uses_few_long_row(monkeypatch):
    """``splitk_attention`` hands the call's (sequence, KV head) pairs and cache length to the table."""
    import specdec.cuda.triton_attention as ta

    seen = []
    real = ta.table_entry

    def spy(*args, **kw):
        seen.append((args, kw))
        return real(*args, **kw)

    monkeypatch.setattr(ta, "table_entry", spy)
    B, Hkv, L = 1, 2, 40
    q, k, v, lens = make_case(B, Hkv, 2, 2, 128, L, torch.float32, [L - 2], seed=0)
    ta.splitk_attention(q, k, v, AttentionMetadata(lens, 128 ** -0.5), cfg=LaunchConfig(block_n=16, num_splits=2))
    assert seen and seen[0][0][3:] == (B * Hkv, L, False, 2)  # ..., sink_scores, rows T


def test_launch_table_sink_softmax_rows():
    """Dense head dim 128 verify with ``sink_softmax`` scores takes the launches that beat the table's on
    the H200: 8B B 1 x 128k 64-position tiles, 3 stages, 2 per SM (20:42 UTC: 153.3 vs 163.1 us at 4 per SM
    with the tile anchors, 149.8 us with the pre-kernel anchors and direct stores); B 16 x 32k 128-position
    tiles, 3 stages, 2 per SM (17:42 UTC: 538.5 vs 561.3 us). The plain kernel, head dim 64, sparse plans,
    shorter caches and an unknown batch keep their rows."""
    from specdec.cuda.triton_attention import DENSE_FEW_LONG, SINK_FEW_LONG, SINK_LONG, SPARSE_LEGACY, table_entry

    assert SINK_FEW_LONG == (64, 4, 3, 2, False, 1) and SINK_LONG == (128, 4, 3, 2, False, 1)
    sink = dict(sink_scores=True)
    assert table_entry(False, 128, pairs=1 * 8, length=131072, **sink) == SINK_FEW_LONG
    assert table_entry(False, 128, pairs=16 * 8, length=32768, **sink) == SINK_LONG
    assert table_entry(False, 128, pairs=16 * 8, length=131072, **sink) == SINK_LONG
    assert table_entry(False, 128, pairs=1 * 8, length=131072) == DENSE_FEW_LONG  # plain: unchanged
    assert table_entry(False, 128, pairs=16 * 8, length=32768) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128, pairs=16 * 8, length=8192, **sink) == (64, 4, 2, 2, False, 1)
    assert table_entry(False, 128, **sink) == (64, 4, 2, 2, False, 1)  # batch and length unknown
    assert table_entry(False, 64, pairs=64 * 3, length=8192, **sink) == (128, 4, 3, 8, False, 1)
    assert table_entry(False, 64, pairs=3, length=131072, **sink) == (128, 4, 3, 8, False, 1)
    assert table_entry(True, 128, pairs=8, length=131072, **sink) == SPARSE_LEGACY
    got = LaunchConfig().resolve(False, 128, pairs=128, length=32768, sink_scores=True)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (128, 4, 3, 2)
    mine = LaunchConfig(block_n=64, ctas_per_sm=2).resolve(False, 128, pairs=128, length=32768, sink_scores=True)
    assert (mine.block_n, mine.num_stages, mine.ctas_per_sm) == (64, 3, 2)


def test_splitk_attention_keys_sink_softmax_to_the_table(monkeypatch):
    """A ``sink_softmax`` call tells the table so (the verify without scores does not); the new rows'
    launches (64 / 128-position tiles, 3 stages) give the reference's outputs and scores."""
    import specdec.cuda.triton_attention as ta

    seen = []
    real = ta.table_entry

    def spy(*args, **kw):
        seen.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(ta, "table_entry", spy)
    q, k, v, lens = make_case(1, 2, 3, 5, 128, 40, torch.float32, [30], seed=4)
    w = torch.zeros(6, 5, device=DEV)
    w[:, [0, 4]] = 1.0
    ta.splitk_attention(q, k, v, AttentionMetadata(lens, 128 ** -0.5), row_weights=w, sink_softmax=True,
                        cfg=LaunchConfig(block_n=16, num_splits=2))
    ta.splitk_attention(q, k, v, AttentionMetadata(lens, 128 ** -0.5), cfg=LaunchConfig(block_n=16, num_splits=2))
    assert [a[5] for a in seen] == [True, False]
    q, k, v, lens = make_case(2, 2, 3, 5, 128, 300, torch.float32, [290, 77], seed=5)
    for bn, warps, stages, _, _, _ in (ta.SINK_FEW_LONG, ta.SINK_LONG):
        check(TritonConfig(block_n=bn, num_warps=warps, num_stages=stages, num_splits=2), q, k, v, lens,
              score_rows=[0, 4], score_kind="sink_softmax")


def test_launch_table_plain_verify_rows():
    """Dense head dim 128 **verify** (T > 1) without scores takes the launches that beat the table's on
    the H200 (2026-12-01 17:42 UTC, ``gpu_scores_2026-12-01d.md``): 8B B 1 x 128k 64-position tiles,
    3 stages, 4 per SM (149.5 vs 152.3 us), 2 per SM since the 20:42 UTC run (141.4 vs 149.1 us,
    ``gpu_scores_2026-12-01e.md``); B 16 x 32k 128-position tiles, 3 stages, 2 per SM (502.4 vs
    516.4 us). Decode (T = 1), an unknown row count, shorter caches, head dim 64, sparse plans and
    raw-logit calls keep their rows."""
    from specdec.cuda.triton_attention import (DENSE_FEW_LONG, SINK_FEW_LONG, SINK_LONG, SPARSE_LEGACY,
                                               VERIFY_FEW_LONG, VERIFY_LONG, table_entry)

    assert VERIFY_FEW_LONG == (64, 4, 3, 2, False, 1) and VERIFY_LONG == (128, 4, 3, 2, False, 1)
    default = (64, 4, 2, 2, False, 1)
    for T in (2, 5):
        assert table_entry(False, 128, pairs=1 * 8, length=131072, rows=T) == VERIFY_FEW_LONG
        assert table_entry(False, 128, pairs=16 * 8, length=32768, rows=T) == VERIFY_LONG
        assert table_entry(False, 128, pairs=16 * 8, length=131072, rows=T) == VERIFY_LONG
        assert table_entry(False, 128, pairs=16 * 8, length=8192, rows=T) == default
        assert table_entry(False, 64, pairs=64 * 3, length=8192, rows=T) == (128, 4, 3, 8, False, 1)
        assert table_entry(True, 128, pairs=8, length=131072, rows=T) == SPARSE_LEGACY
        assert table_entry(False, 128, True, pairs=8, length=131072, rows=T) == (128, 4, 2, 4, False, 1)
    # with sink_softmax scores: the SINK_ rows (the same launches, measured with scores)
    assert table_entry(False, 128, pairs=8, length=131072, sink_scores=True, rows=5) == SINK_FEW_LONG
    assert table_entry(False, 128, pairs=128, length=32768, sink_scores=True, rows=5) == SINK_LONG
    # decode and an unknown row count: exactly the rows of before
    for T in (1, None):
        assert table_entry(False, 128, pairs=1 * 8, length=131072, rows=T) == DENSE_FEW_LONG
        assert table_entry(False, 128, pairs=16 * 8, length=32768, rows=T) == default
        assert table_entry(False, 128, pairs=16 * 8, length=131072, rows=T) == default
    got = LaunchConfig().resolve(False, 128, pairs=8, length=131072, rows=5)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (64, 4, 3, 2)
    got = LaunchConfig().resolve(False, 128, pairs=128, length=32768, rows=5)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (128, 4, 3, 2)
    got = LaunchConfig().resolve(False, 128, pairs=8, length=131072, rows=1)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (128, 4, 2, 4)
    got = LaunchConfig().resolve(False, 128, pairs=128, length=32768, rows=1)
    assert (got.block_n, got.num_warps, got.num_stages, got.ctas_per_sm) == (64, 4, 2, 2)
    mine = LaunchConfig(block_n=32, ctas_per_sm=8).resolve(False, 128, pairs=8, length=131072, rows=5)
    assert (mine.block_n, mine.num_stages, mine.ctas_per_sm) == (32, 3, 8)


def test_splitk_attention_keys_verify_rows_to_the_table(monkeypatch):
    """``splitk_attention`` tells the table the call's row count: with the verify rows' cache floor
    lowered to 0, a T = 5 call of 2 pairs takes ``VERIFY_FEW_LONG``, of 10 pairs ``VERIFY_LONG``, a decode
    call neither; and the default backend at those launches gives the reference's outputs."""
    import specdec.cuda.triton_attention as ta

    table = tuple(((k[:6] + (0,)) if v in (ta.VERIFY_FEW_LONG, ta.VERIFY_LONG) and k[4] else k, v)
                  for k, v in ta.LAUNCH_TABLE)
    assert sum(k[4] is True and k[6] == 0 for k, _ in table) == 2
    monkeypatch.setattr(ta, "LAUNCH_TABLE", table)
    seen = []
    real = ta.table_entry

    def spy(*args, **kw):
        seen.append(real(*args, **kw))
        return seen[-1]

    monkeypatch.setattr(ta, "table_entry", spy)
    for B, lengths, want in ((1, [290], ta.VERIFY_FEW_LONG), (5, [290, 77, 5, 150, 0], ta.VERIFY_LONG)):
        for T in (5, 1):
            q, k, v, lens = make_case(B, 2, 2, T, 128, 300, torch.bfloat16, lengths, seed=6 + T)
            seen.clear()
            # peers off: on a GPU the auto pick sends this decode shape to SDPA, which reads no launch row
            check(TritonConfig(peers="off"), q, k, v, lens)
            assert seen and all((e == want) == (T > 1) for e in seen), (B, T, seen)


def test_choose_splits_min_tiles():
    """``min_tiles`` caps the split count so that every split covers that many tiles."""
    cpu = torch.device("cpu")  # 4 "SMs"
    cfg = LaunchConfig(block_n=64, ctas_per_sm=8, min_tiles=2, sparse_single_split_at=None)
    assert choose_splits(1, 64 * 10, cpu, cfg, sparse=True) == 5  # 32 wanted, 10 tiles / 2
    assert choose_splits(1, 64 * 10, cpu, LaunchConfig(block_n=64, ctas_per_sm=8, min_tiles=1), sparse=True) == 10
    assert choose_splits(1, 64, cpu, cfg, sparse=True) == 1


@pytest.mark.parametrize("score", ["none", "logits", "softmax"])
@pytest.mark.parametrize("sparse", [True, False])
def test_fused_combine_matches_reference(sparse, score):
    """``fused_combine``: the last split of each (sequence, KV head) merges the partials (no combine
    launch), with ragged lengths, empty splits (7 splits of a short row) and a row that sees nothing;
    the counters are back at 0 after every launch, so a second call gives the same result."""
    from specdec.cuda import triton_attention as ta

    lengths = [29, 0, 41]
    T = 3
    q, k, v, lens = make_case(3, 2, 4, T, 32, 48, torch.bfloat16, lengths, seed=31)
    kw = dict(SCORE_VARIANTS[score])
    if sparse:
        kw["plan_indices"], kw["dense_from"] = make_plan(3, 2, 11, lengths, T)
    for splits in (2, 7):
        cfg = TritonConfig(block_n=16, num_splits=splits, fused_combine=True)
        check(cfg, q, k, v, lens, **kw)
        assert ta._SEMAPHORES and all(int(c.abs().sum()) == 0 for c in ta._SEMAPHORES.values())
    meta = AttentionMetadata(lens, 0.25, kw.get("plan_indices"), kw.get("dense_from"))
    a = splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16, num_splits=3, fused_combine=True))
    b = splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16, num_splits=3))
    torch.testing.assert_close(a[0].float(), b[0].float(), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graph capture needs a GPU")
def test_fused_combine_graph_replays():
    """``fused_combine`` captured in a CUDA graph (semaphore buffer first made inside the capture) and
    replayed several times, on many programs at once (the ordering the interpreter cannot show)."""
    from specdec.cuda import triton_attention as ta

    ta._SEMAPHORES.clear()
    lengths = [3000, 1200, 5, 2999]
    q, k, v, lens = make_case(4, 8, 4, 1, 128, 3100, torch.bfloat16, lengths, seed=41)
    idx, df = make_plan(4, 8, 300, lengths, 1)
    meta = AttentionMetadata(lens, 128 ** -0.5, plan_indices=idx, dense_from=df)
    be = TritonBackend(TritonConfig(num_splits=5, fused_combine=True))
    ref = TritonBackend(TritonConfig(num_splits=5))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # compile outside the capture
        be.attend(q, k, v, meta)
    torch.cuda.current_stream().wait_stream(s)
    ta._SEMAPHORES.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, _ = be.attend(q, k, v, meta)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        g.replay()
        torch.cuda.synchronize()
        r, _ = ref.attend(q, k, v, meta)
        torch.testing.assert_close(o, r, atol=1e-2, rtol=1e-2)
    assert ta._SEMAPHORES and all(int(c.abs().sum()) == 0 for c in ta._SEMAPHORES.values())
    check(TritonConfig(num_splits=7, fused_combine=True), q, k, v, lens, plan_indices=idx, dense_from=df)


# -- one-pass scores (issue 14 item 4): column sums of the tile, sink-relative softmax, bf16 buffers --

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind,reduce", [("logits", "colsum"), ("logits", "mma"), ("sink_softmax", "mma"),
                                         ("sink_softmax", "colsum")])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("T,rows,heads", [(5, [0, 4], None), (3, [1], [1, 5]), (1, [0], None)])
def test_onepass_scores_match_reference(dtype, kind, reduce, splits, T, rows, heads):
    """``SCORE_MODE`` 4 (a weighted column sum of the tile the kernel computes anyway, no extra MMA)
    gives the reference's logits, and with ``sink_softmax`` its ``exp(logit - logit at 0)`` sums, in
    one split (the direct-output path) and over several splits + combine."""
    lengths = [50, 13, 0] if not ON_GPU else [4000, 777, 0]
    q, k, v, lens = make_case(3, 2, 3, T, 64, max(lengths) + T + 4, dtype, lengths, seed=31 + T)
    cfg = TritonConfig(block_n=16, num_splits=splits, score_reduce=reduce)
    check(cfg, q, k, v, lens, score_rows=rows, score_kind=kind, score_heads=heads)


def test_score_reduce_default_is_colsum():
    """The column sum is the default reduce of fused logits scores (H200, 2026-12-01: +2..11 % over the
    verify without scores vs +5..24 % for the suffix-sum MMA); ``"mma"`` stays selectable."""
    assert TritonConfig().score_reduce == "colsum"
    assert TritonConfig(score_reduce="mma").score_reduce == "mma"


@pytest.mark.parametrize("kind", ["logits", "sink_softmax"])
def test_onepass_scores_sparse(kind):
    lengths = [60, 21]
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 70, torch.float32, lengths, seed=12)
    idx, df = make_plan(2, 2, 12, lengths, 5)
    check(TritonConfig(block_n=16, num_splits=3, score_reduce="colsum"), q, k, v, lens, plan_indices=idx,
          dense_from=df, score_rows=[0, 4], score_kind=kind)


def test_sink_softmax_is_softmax_times_one_factor_per_row():
    """The definition: for one requested row and one query head per KV head, ``sink_softmax`` scores
    are the softmax weights times ``exp(lse - ref)``, one constant per (sequence, KV head)."""
    q, k, v, lens = make_case(2, 2, 1, 3, 16, 40, torch.float32, [30, 17], seed=5)
    meta = lambda kind: AttentionMetadata(lens, 0.25, score_rows=[2], score_kind=kind)  # noqa: E731
    _, soft = REF.attend(q, k, v, meta("softmax"))
    _, sink = REF.attend(q, k, v, meta("sink_softmax"))
    _, got = TritonBackend(SMALL).attend(q, k, v, meta("sink_softmax"))
    vis = soft > 0
    ratio = torch.where(vis, sink / soft.clamp_min(1e-30), torch.nan)
    for b in range(2):
        for h in range(2):
            r = ratio[b, h][vis[b, h]]
            torch.testing.assert_close(r, r[:1].expand_as(r), rtol=1e-4, atol=0.0)
    torch.testing.assert_close(got, sink, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(sink, soft)  # a different scale: the test would catch a softmax path


@pytest.mark.parametrize("kind", ["logits", "sink_softmax", "softmax"])
def test_bf16_score_buffers(kind):
    q, k, v, lens = make_case(2, 2, 3, 5, 64, 60, torch.bfloat16, [50, 13], seed=9)
    kw = dict(score_rows=[0, 4], score_kind=kind)
    _, s_ref = REF.attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
    _, s = TritonBackend(TritonConfig(block_n=16, num_splits=3, score_dtype="bfloat16",
                                      score_reduce="colsum")).attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
    assert s.dtype == (torch.float32 if kind == "softmax" else torch.bfloat16)  # softmax: bf16 raw logits
    torch.testing.assert_close(s.float(), s_ref, atol=3e-2 * (6 if kind == "logits" else 1), rtol=2e-2)


def test_sink_softmax_per_row_is_refused():
    q, k, v, lens = make_case(1, 2, 3, 5, 16, 30, torch.float32, [20], seed=2)
    with pytest.raises(ValueError, match="per_row"):
        TritonBackend(SMALL).attend(q, k, v, AttentionMetadata(lens, 0.25, score_rows=[0, 4], score_kind="sink_softmax",
                                                              score_per_row=True))


# -- issue 18: variants of the sink_softmax score path (anchors once per sequence; direct score stores) --

def _anchor_ref_torch(q, k, lens, T, G, block_m):
    """``(B * H_kv, block_m)``: each packed row's log-sum-exp over the anchor positions it sees (rows
    ``m = g * T + t``; padding rows NaN, not compared)."""
    from specdec.attention.reference import SINK_ANCHORS as NA

    B, H, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    out = torch.full((B * Hkv, block_m), float("nan"))
    for b in range(B):
        n_ctx = int(lens[b]) + T
        pos = torch.arange(L)
        for h in range(Hkv):
            for g in range(G):
                for t in range(T):
                    ok = ((pos < NA) | (pos >= n_ctx - NA)) & (pos <= int(lens[b]) + t)
                    s = (k[b, h].float().cpu() @ q[b, h * G + g, t].float().cpu()) * D ** -0.5
                    out[b * Hkv + h, g * T + t] = s[ok].logsumexp(0)
    return out


@pytest.mark.parametrize("lengths", [[50, 13, 0], [3, 40]])
def test_sink_anchor_kernel_matches_reference(lengths):
    """The pre-kernel (``sink_anchors="pre"``) computes each row's anchor log-sum-exp as the reference's
    ``sink_softmax`` defines it (first and last 16 positions the row sees), short sequences included."""
    import triton

    import specdec.cuda.triton_attention as ta

    B, Hkv, G, T, D = len(lengths), 2, 3, 5, 32
    q, k, _, lens = make_case(B, Hkv, G, T, D, max(lengths) + T + 3, torch.float32, lengths, seed=41)
    block_m = max(16, triton.next_power_of_2(T * G))
    ref = torch.empty((B * Hkv, block_m), dtype=torch.float32, device=DEV)
    ta._sink_anchor_kernel[(B * Hkv,)](
        q, k, lens, ref, D ** -0.5, q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        HKV=Hkv, T=T, G=G, D=D, BLOCK_M=block_m, NA=ta.SINK_ANCHORS, DOT_PREC="ieee", UPCAST=False)
    want = _anchor_ref_torch(q, k, lens, T, G, block_m)
    rows = T * G
    torch.testing.assert_close(ref.cpu()[:, :rows], want[:, :rows], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("anchors,store", [("pre", "shared"), ("tile", "direct"), ("pre", "direct"),
                                           ("loop", "shared"), ("loop", "direct")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("T,rows,heads", [(5, [0, 4], None), (3, [1], [1, 5])])
def test_sink_score_variants_match_reference(anchors, store, dtype, splits, T, rows, heads):
    """``sink_anchors="pre"`` and ``score_store="direct"`` give the reference's ``sink_softmax`` scores
    (and outputs), in one split and over several; ``"direct"`` runs its PTX stores on a GPU only."""
    lengths = [50, 13, 0] if not ON_GPU else [4000, 777, 0]
    q, k, v, lens = make_case(3, 2, 3, T, 64, max(lengths) + T + 4, dtype, lengths, seed=51 + T)
    cfg = TritonConfig(block_n=16 if not ON_GPU else 64, num_splits=splits, sink_anchors=anchors, score_store=store)
    check(cfg, q, k, v, lens, score_rows=rows, score_kind="sink_softmax", score_heads=heads)


@pytest.mark.parametrize("anchors", ["pre", "loop"])
@pytest.mark.parametrize("store", ["shared", "direct"])
def test_sink_score_variants_bf16_buffer_and_sparse(store, anchors):
    """The variants with a bf16 score buffer (``st.global.b16`` on a GPU) and with a sparse plan."""
    q, k, v, lens = make_case(2, 2, 3, 5, 64, 60, torch.bfloat16, [50, 13], seed=9)
    kw = dict(score_rows=[0, 4], score_kind="sink_softmax")
    _, s_ref = REF.attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
    be = TritonBackend(TritonConfig(block_n=16, num_splits=3, score_dtype="bfloat16", sink_anchors=anchors,
                                    score_store=store))
    _, s = be.attend(q, k, v, AttentionMetadata(lens, 0.125, **kw))
    assert s.dtype == torch.bfloat16
    torch.testing.assert_close(s.float(), s_ref, atol=3e-2, rtol=2e-2)
    lengths = [60, 21]
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 70, torch.float32, lengths, seed=12)
    idx, df = make_plan(2, 2, 12, lengths, 5)
    check(TritonConfig(block_n=16, num_splits=3, sink_anchors=anchors, score_store=store), q, k, v, lens,
          plan_indices=idx, dense_from=df, **kw)


@pytest.mark.parametrize("anchors", ["pre", "tile", "loop"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_sink_lean_stores_match_reference(anchors, dtype, splits):
    """``score_store="lean"`` (the per-row factor with ``log2 w`` and ``ref log2 e`` folded out of the loop, the
    dense store mask one compare shorter; direct stores on a GPU) gives the reference's ``sink_softmax`` scores
    with every anchor source; row 0 is requested twice (weight 2), so the folded ``log2 w`` counts. The
    sequences end at odd and even positions."""
    lengths = [50, 14, 0] if not ON_GPU else [4000, 778, 0]
    q, k, v, lens = make_case(3, 2, 3, 5, 64, max(lengths) + 5 + 5, dtype, lengths, seed=71)
    cfg = TritonConfig(block_n=16 if not ON_GPU else 64, num_splits=splits, sink_anchors=anchors, score_store="lean")
    check(cfg, q, k, v, lens, score_rows=[0, 0, 4], score_kind="sink_softmax")


def test_sink_lean_store_with_head_subset_and_fractional_weights():
    """The folded factor with a head subset (weight 0: ``log2 0 = -inf`` must give 0, not NaN) through the
    backend, and with fractional weights (``log2 w < 0``) against the tile path's ``w * exp(...)``."""
    q, k, v, lens = make_case(2, 2, 3, 3, 32, 48, torch.float32, [40, 9], seed=73)
    check(TritonConfig(block_n=16, num_splits=3, sink_anchors="pre", score_store="lean"), q, k, v, lens,
          score_rows=[1], score_kind="sink_softmax", score_heads=[1, 5])
    w = torch.rand(6, 3, generator=torch.Generator().manual_seed(5)).to(DEV) * 1.5
    w[:, 1] = 0.0
    meta = AttentionMetadata(lens, 32 ** -0.5)
    cfg = LaunchConfig(block_n=16, num_splits=3)
    _, _, want, _ = splitk_attention(q, k, v, meta, row_weights=w, sink_softmax=True, cfg=cfg, sink_anchors="tile",
                                     score_store="shared")
    _, _, got, _ = splitk_attention(q, k, v, meta, row_weights=w, sink_softmax=True, cfg=cfg, sink_anchors="pre",
                                    score_store="lean")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


class _LaunchSpy:
    """Stands for a Triton kernel: records ``(name, grid, the kwargs named in keys)`` per launch, then launches."""

    def __init__(self, name, real, keys, launches):
        self.name, self.real, self.keys, self.launches = name, real, keys, launches

    def __getitem__(self, grid):
        def run(*a, **kw):
            self.launches.append((self.name, grid, {k: v for k, v in kw.items() if k in self.keys}))
            return self.real[grid](*a, **kw)
        return run


def _spy_sink_launches(monkeypatch, ta, keys) -> list:
    """Spy on the anchor pre-kernel ("anchor") and the split kernel ("split"); returns the launch list."""
    launches = []
    monkeypatch.setattr(ta, "_sink_anchor_kernel", _LaunchSpy("anchor", ta._sink_anchor_kernel, keys, launches))
    monkeypatch.setattr(ta, "_splitk_attn_kernel", _LaunchSpy("split", ta._splitk_attn_kernel, keys, launches))
    return launches


def test_sink_score_variants_reach_the_kernel(monkeypatch):
    """What each setting launches: ``"pre"`` runs the anchor kernel (once, one program per (sequence, KV
    head)) and tells the split kernel to load them, only with more than one split; ``"loop"`` computes them
    in the split kernel's first iteration (no extra launch); ``"direct"`` stores
    through PTX on CUDA only (the interpreter runs the plain store). Defaults: today's path."""
    import specdec.cuda.triton_attention as ta

    assert (TritonConfig().sink_anchors, TritonConfig().score_store) == (None, None)  # the table's pick
    launches = _spy_sink_launches(monkeypatch, ta, ("ANCHOR_IN", "DIRECT_STORE", "ANCHOR_LOOP"))
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 40, torch.float32, [30, 7], seed=4)
    meta = AttentionMetadata(lens, 0.25, score_rows=[0, 4], score_kind="sink_softmax")
    for anchors, store, splits in (("pre", "direct", 3), ("pre", "shared", 1), ("tile", "shared", 3),
                                   ("loop", "shared", 3)):
        launches.clear()
        TritonBackend(TritonConfig(block_n=16, num_splits=splits, sink_anchors=anchors, score_store=store)).attend(
            q, k, v, meta)
        pre = anchors == "pre" and splits > 1
        assert [n for n, _, _ in launches] == (["anchor", "split"] if pre else ["split"])
        if pre:
            assert launches[0][1] == (2 * 2,)
        assert launches[-1][2] == dict(ANCHOR_IN=pre, DIRECT_STORE=store == "direct" and ON_GPU,
                                       ANCHOR_LOOP=anchors == "loop")


def test_lean_stores_reach_the_kernel(monkeypatch):
    """``"lean"`` folds the factor (``SINK_FOLD``, also in the interpreter, dense and sparse) and stores directly
    on CUDA; ``"direct"`` and ``"shared"`` fold nothing."""
    import specdec.cuda.triton_attention as ta

    launches = _spy_sink_launches(monkeypatch, ta, ("SINK_FOLD", "DIRECT_STORE"))
    meta_kw = dict(score_rows=[0, 4], score_kind="sink_softmax")
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 41, torch.float32, [30, 7], seed=4)
    for store in ("shared", "direct", "lean"):
        launches.clear()
        cfg = TritonConfig(block_n=16, num_splits=3, sink_anchors="tile", score_store=store)
        TritonBackend(cfg).attend(q, k, v, AttentionMetadata(lens, 0.25, **meta_kw))
        assert launches[-1][2] == dict(SINK_FOLD=store == "lean", DIRECT_STORE=store != "shared" and ON_GPU), store
    idx, df = make_plan(2, 2, 12, [30, 7], 5)
    launches.clear()
    TritonBackend(TritonConfig(block_n=16, num_splits=3, score_store="lean")).attend(
        q, k, v, AttentionMetadata(lens, 0.25, plan_indices=idx, dense_from=df, **meta_kw))
    assert launches[-1][2] == dict(SINK_FOLD=True, DIRECT_STORE=ON_GPU)


def test_score_path_picks_per_shape_class():
    """The score path the table picks (H200, 2026-12-01): the tile anchors with direct stores only for dense head
    dim 128 ``sink_softmax`` calls of at most 8 (sequence, KV head) pairs over >= 64k positions (8B B 1 x 128k,
    23:12 UTC interleaved: 146.2 us vs 148.4 for the pre-kernel anchors with direct stores, the pick of the 20:42
    UTC run; 148.2 vs 151.3 at 22:53); the tile path with ``tl.store`` wherever direct stores lost or were not
    measured (8B B 16 x 32k: direct 537.2 vs 531.6 us interleaved; SmolLM2 B 64 x 8k: 123.1 vs 117.2 us), and for
    calls without ``sink_softmax`` scores. An explicit setting wins over the table."""
    from specdec.cuda.triton_attention import DEFAULT_SCORE_PATH, score_path

    assert DEFAULT_SCORE_PATH == ("tile", "shared")
    sink = dict(sink_scores=True, rows=5)
    assert score_path(False, 128, pairs=1 * 8, length=131072, **sink) == ("tile", "direct")
    assert score_path(False, 128, pairs=4, length=1 << 16, **sink) == ("tile", "direct")
    for shape in (dict(pairs=16 * 8, length=32768), dict(pairs=16 * 8, length=131072), dict(pairs=8, length=32768),
                  dict(pairs=None, length=131072)):
        assert score_path(False, 128, **shape, **sink) == ("tile", "shared"), shape
    for B in (1, 16, 64):  # SmolLM2 (head dim 64) at 8k, and at 128k
        assert score_path(False, 64, pairs=B * 3, length=8192, **sink) == ("tile", "shared")
    assert score_path(False, 64, pairs=3, length=131072, **sink) == ("tile", "shared")
    assert score_path(True, 128, pairs=8, length=131072, **sink) == ("tile", "shared")  # sparse plan
    assert score_path(False, 128, pairs=8, length=131072, rows=5) == ("tile", "shared")  # logits colsum
    got = LaunchConfig().resolve(False, 128, pairs=8, length=131072, **sink)
    assert (got.block_n, got.num_stages, got.ctas_per_sm, got.sink_anchors, got.score_store) == (64, 3, 2, "tile",
                                                                                                "direct")
    got = LaunchConfig().resolve(False, 128, pairs=128, length=32768, **sink)
    assert (got.sink_anchors, got.score_store) == ("tile", "shared")
    mine = LaunchConfig(sink_anchors="loop", score_store="shared").resolve(False, 128, pairs=8, length=131072, **sink)
    assert (mine.sink_anchors, mine.score_store) == ("loop", "shared")
    be = TritonBackend(TritonConfig(sink_anchors="tile"))
    assert (be._launch.sink_anchors, be._launch.score_store) == ("tile", None)


def test_splitk_attention_takes_the_table_score_path(monkeypatch):
    """With the ``SINK_FEW_LONG`` row's cache floor lowered to 0, a default backend's ``sink_softmax`` verify
    of one sequence (2 KV heads) resolves to the row's score path (the tile anchors, no pre-kernel, with direct
    stores: PTX on a GPU) at the row's launch, and gives the reference's outputs and scores; 5 sequences
    (10 pairs) and the same call without scores keep the default path (``tl.store``)."""
    import specdec.cuda.triton_attention as ta

    low = ta.SINK_FEW_LONG_KEY[:6] + (0,)
    monkeypatch.setattr(ta, "LAUNCH_TABLE", tuple(((low if k == ta.SINK_FEW_LONG_KEY else k), v)
                                                  for k, v in ta.LAUNCH_TABLE))
    monkeypatch.setattr(ta, "SCORE_PATHS", {low: ta.SCORE_PATHS[ta.SINK_FEW_LONG_KEY]})
    launches = _spy_sink_launches(monkeypatch, ta, ("ANCHOR_IN", "DIRECT_STORE", "ANCHOR_LOOP", "BLOCK_N"))
    resolved, real_resolve = [], ta.LaunchConfig.resolve

    def spy_resolve(self, *a, **kw):
        resolved.append(real_resolve(self, *a, **kw))
        return resolved[-1]

    monkeypatch.setattr(ta.LaunchConfig, "resolve", spy_resolve)
    sink = dict(score_rows=[0, 4], score_kind="sink_softmax")
    for B, lengths, picked in ((1, [290], True), (5, [290, 77, 5, 150, 0], False)):
        q, k, v, lens = make_case(B, 2, 2, 5, 128, 300, torch.float32, lengths, seed=61 + B)
        for kw in (sink, {}):
            launches.clear()
            resolved.clear()
            check(TritonConfig(), q, k, v, lens, **kw)
            row = picked and bool(kw)
            assert len(resolved) == 1
            assert (resolved[0].sink_anchors, resolved[0].score_store) == (("tile", "direct") if row
                                                                           else ("tile", "shared")), (B, kw)
            assert [n for n, _, _ in launches] == ["split"], (B, kw, launches)  # no anchor pre-kernel
            split = launches[-1]
            assert split[2]["ANCHOR_IN"] is False and split[2]["ANCHOR_LOOP"] is False
            assert split[2]["DIRECT_STORE"] == (row and ON_GPU)
            if row:
                assert split[2]["BLOCK_N"] == ta.SINK_FEW_LONG[0] and split[1][1] > 1  # the row's tiles, split


def test_sink_score_variant_names_are_checked():
    q, k, v, lens = make_case(1, 2, 3, 5, 16, 30, torch.float32, [20], seed=2)
    w = torch.zeros(6, 5, device=DEV)
    w[:, [0, 4]] = 1.0
    with pytest.raises(ValueError, match="sink_anchors must be 'tile', 'pre' or 'loop'"):
        splitk_attention(q, k, v, AttentionMetadata(lens, 0.25), row_weights=w, sink_softmax=True, sink_anchors="once")
    for bad in ("asm", "pair"):  # "pair" (two-column vector stores) was removed: misaligned stores on the H200
        with pytest.raises(ValueError, match=f"score_store must be 'shared', 'direct' or 'lean', not '{bad}'"):
            splitk_attention(q, k, v, AttentionMetadata(lens, 0.25), row_weights=w, sink_softmax=True,
                             score_store=bad)
    with pytest.raises(Exception, match="score_store"):
        TritonConfig(score_store="pair")
    with pytest.raises(Exception, match="sink_anchors"):
        TritonConfig(sink_anchors="once")


@pytest.mark.parametrize("store", ["direct", "lean"])
def test_direct_store_serves_logits_colsum_too(store):
    """``score_store="direct"`` / ``"lean"`` also store the fused logits column sums (``SCORE_MODE`` 4 without
    ``SCORE_EXP``)."""
    q, k, v, lens = make_case(2, 2, 3, 5, 32, 50, torch.float32, [40, 9], seed=23)
    check(TritonConfig(block_n=16, num_splits=2, score_store=store, sink_anchors="pre"), q, k, v, lens,
          score_rows=[0, 4], score_kind="logits")


#: the sparse launch rows l14 times at the Llama-3.1-8B shape (benchmarks/gpu/issue14.SPARSE_LAUNCH_VARIANTS):
#: (block_n, num_warps, num_stages, ctas_per_sm, v_early, min_tiles, fused_combine)
L14_SPARSE_ROWS = [(128, 4, 2, 4, False, 1, True), (128, 4, 2, 2, False, 1, False), (128, 4, 2, 8, False, 1, False),
                   (128, 4, 3, 4, False, 1, False), (128, 8, 2, 4, False, 1, False), (128, 4, 2, 2, False, 1, True)]


@pytest.mark.parametrize("row", L14_SPARSE_ROWS)
def test_l14_sparse_launch_rows_match_reference_and_count_launches(row):
    """Head dim 128 (the 8B shape's), a sparse plan of a decode row, B 2 x 2 KV heads (several splits on the
    interpreter's 4 "SMs"): each launch row l14 times gives the reference's output; with ``fused_combine`` the
    attention is ONE launch (the last program of each pair merges), without it the split kernel + one combine."""
    from specdec.testing.launches import count_launches

    bn, w, st, c, e, m, fc = row
    lengths = [200, 37]
    q, k, v, lens = make_case(2, 2, 4, 1, 128, 210, torch.bfloat16, lengths, seed=14)
    idx, df = make_plan(2, 2, 24, lengths, 1)
    cfg = TritonConfig(block_n=bn, num_warps=w, num_stages=st, ctas_per_sm=c, v_early=e, min_tiles=m,
                       sparse_single_split_at=None, fused_combine=fc)
    check(cfg, q, k, v, lens, plan_indices=idx, dense_from=df)
    if DEV.type != "cpu":  # count_launches sees the interpreter's launches only; on a GPU the parity above runs
        return
    be = TritonBackend(cfg)
    meta = AttentionMetadata(lens, 128 ** -0.5, plan_indices=idx, dense_from=df)
    ops = count_launches(lambda: be.attend(q, k, v, meta))
    assert ops["triton:_splitk_attn_kernel"] == 1
    assert ops["triton:_combine_kernel"] == (0 if fc else 1), dict(ops)


def test_sparse_long_row_two_per_sm_and_fused_combine_by_default():
    """Sparse head dim 128 over a cache of >= 32k positions with more than 8 (sequence, KV head) pairs takes
    ``SPARSE_LONG`` (2 programs per SM) and merges its splits in the split kernel unless told otherwise (the
    Llama-3.1-8B sparse step at B 16 x 32k: 6.05 vs 6.24 ms on an H200, 2026-12-01 20:41 UTC); one sequence
    (8 pairs), shorter caches, head dim 64 / 256 and dense calls keep their rows and the combine launch. On the
    interpreter (2 forced splits: its 4 pretend SMs would run 10 pairs in one) a 32k-position cache at B 5 x 2 KV
    heads gives the reference's output in ONE launch."""
    from specdec.cuda import triton_attention as ta
    from specdec.testing.launches import count_launches

    assert ta.SPARSE_LONG == (128, 4, 2, 2, False, 1) and ta.FUSED_COMBINE_ROWS == (ta.SPARSE_LONG,)
    assert ta.table_entry(True, 128, pairs=16 * 8, length=32768) == ta.SPARSE_LONG
    assert ta.table_entry(True, 128, pairs=16 * 8, length=32767) == ta.SPARSE_LEGACY
    assert ta.table_entry(True, 128, pairs=8, length=131072) == ta.SPARSE_LEGACY
    assert ta.table_entry(True, 256, pairs=16 * 8, length=32768) == ta.SPARSE_LEGACY
    assert ta.table_entry(True, 64, pairs=64 * 3, length=32768) == (128, 4, 3, 4, True, 1)
    on = LaunchConfig().resolve(True, 128, pairs=16 * 8, length=32768, rows=1)
    assert (on.ctas_per_sm, on.fused_combine) == (2, True)
    for off in (LaunchConfig().resolve(True, 128, pairs=16 * 8, length=8192, rows=1),
                LaunchConfig().resolve(True, 128, pairs=8, length=131072, rows=1),
                LaunchConfig().resolve(False, 128, pairs=16 * 8, length=32768, rows=1),
                LaunchConfig(fused_combine=False).resolve(True, 128, pairs=16 * 8, length=32768, rows=1)):
        assert off.fused_combine is False
    assert LaunchConfig(fused_combine=True).resolve(False, 64).fused_combine is True
    assert TritonConfig().fused_combine is None

    L = 1 << 15
    lengths = [L - 3, 4000, 29, 30000, 700]
    q, k, v, lens = make_case(5, 2, 2, 1, 128, L, torch.bfloat16, lengths, seed=15)
    idx, df = make_plan(5, 2, 24, lengths, 1)
    cfg = TritonConfig(num_splits=2)
    check(cfg, q, k, v, lens, plan_indices=idx, dense_from=df)
    if DEV.type != "cpu":  # count_launches sees the interpreter's launches only; on a GPU the parity above runs
        return
    be = TritonBackend(cfg)
    meta = AttentionMetadata(lens, 128 ** -0.5, plan_indices=idx, dense_from=df)
    ops = count_launches(lambda: be.attend(q, k, v, meta))
    assert ops["triton:_splitk_attn_kernel"] == 1
    assert ops["triton:_combine_kernel"] == 0, dict(ops)
    short_lengths = [4000, 300, 29, 1000, 70]
    short = make_case(5, 2, 2, 1, 128, 4096, torch.bfloat16, short_lengths, seed=15)
    idx_s, df_s = make_plan(5, 2, 24, short_lengths, 1)
    meta_s = AttentionMetadata(short[3], 128 ** -0.5, plan_indices=idx_s, dense_from=df_s)
    ops = count_launches(lambda: be.attend(short[0], short[1], short[2], meta_s))
    assert ops["triton:_combine_kernel"] == 1, dict(ops)  # a short cache keeps the combine launch


# the tile loop of ``fast_loop`` (log2-unit running max; dense tiles every row sees run without masks): cache
# lengths around the tile size (0, below one tile, exactly 1 and 2 tiles, one past) so that a split holds no whole
# tile, whole tiles only, or whole tiles and a masked rest; every score path the split kernel has
FAST_SCORES = [dict(), dict(score_rows=[0, 2], score_kind="logits"), dict(score_rows=[0, 2], score_kind="softmax"),
               dict(score_rows=[1], score_kind="sink_softmax"), dict(score_rows=[0, 2], score_per_row=True)]


@pytest.mark.parametrize("score,splits,dtype", [(s, n, torch.float32) for s in range(len(FAST_SCORES)) for n in (1, 3)]
                         + [(3, 3, torch.bfloat16), (0, 2, torch.bfloat16)])
def test_fast_loop_matches_masked_loop_and_reference(score, splits, dtype, monkeypatch):
    """``fast_loop=True`` (the default) and ``False`` (one masked loop in natural units) both give the reference's
    outputs and scores, and the same as each other up to rounding (fp32: 2e-6), in one split and several; the
    unmasked pass runs at every split size here (``FAST_LOOP_MIN_TILES`` 1)."""
    import specdec.cuda.triton_attention as ta

    monkeypatch.setattr(ta, "FAST_LOOP_MIN_TILES", 1)
    kw = FAST_SCORES[score]
    bn = 16 if not ON_GPU else 64
    lengths = [0, bn - 3, bn, 2 * bn + 1, 3 * bn + 7]
    q, k, v, lens = make_case(len(lengths), 2, 3, 3, 32, max(lengths) + 3 + 2, dtype, lengths, seed=81 + score)
    res = {}
    for fast in (True, False):
        cfg = TritonConfig(block_n=bn, num_splits=splits, fast_loop=fast)
        check(cfg, q, k, v, lens, **kw)
        res[fast] = TritonBackend(cfg).attend(q, k, v, AttentionMetadata(lens, 32 ** -0.5, **kw))
    if dtype == torch.float32:
        torch.testing.assert_close(res[True][0], res[False][0], atol=2e-6, rtol=2e-6)
        if kw:
            torch.testing.assert_close(res[True][1], res[False][1], atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("fast", [True, False])
def test_fast_loop_sparse_and_lse(fast):
    """A sparse plan keeps the masked loop (``fast_loop`` changes only its units there), and the log-sum-exp the
    kernel returns is in natural units with either loop (the splits' combine and the fused combine read it)."""
    lengths = [60, 21]
    q, k, v, lens = make_case(2, 2, 3, 5, 16, 70, torch.float32, lengths, seed=12)
    idx, df = make_plan(2, 2, 12, lengths, 5)
    cfg = TritonConfig(block_n=16, num_splits=3, fast_loop=fast)
    check(cfg, q, k, v, lens, plan_indices=idx, dense_from=df, score_rows=[0, 4], score_kind="sink_softmax")
    meta = AttentionMetadata(lens, 16 ** -0.5)
    _, lse, _, _ = splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16, num_splits=2, fast_loop=fast))
    for b, n in enumerate(lengths):
        logits = torch.einsum("htd,hld->htl", q[b].float(), k[b].float().repeat_interleave(3, 0)[:, :n + 5]) / 4
        causal = torch.arange(n + 5)[None, :] <= (n + torch.arange(5))[:, None]
        want = logits.masked_fill(~causal.to(DEV), float("-inf")).logsumexp(-1)
        torch.testing.assert_close(lse[b], want, atol=1e-5, rtol=1e-5)


def test_fit_shared_keeps_bf16_rows_and_shrinks_float32():
    """The table's bf16 launches stand; a float32 cache at head dim 128 drops a stage (128 x 3 stages asked for
    280 KB of shared memory on an H200), wider heads then halve the tiles; a launch never goes below 2 stages."""
    from specdec.cuda.triton_attention import SHARED_TILE_BYTES, fit_shared

    assert fit_shared(128, 3, 128, 2) == (128, 3)
    assert fit_shared(64, 3, 128, 2) == (64, 3)
    assert fit_shared(128, 3, 128, 4) == (128, 2)
    assert fit_shared(128, 3, 512, 4) == (32, 2)
    for bn, st, d, e in [(128, 4, 128, 4), (128, 3, 256, 2), (64, 2, 64, 4)]:
        b2, s2 = fit_shared(bn, st, d, e)
        assert s2 >= 2 and (s2 - 1) * 2 * b2 * d * e <= SHARED_TILE_BYTES


@pytest.mark.parametrize("splits", [None, 1, 3])
@pytest.mark.parametrize("live,bound", [([1, 0, 1, 0, 0], 2), ([1, 0, 1, 0, 0], None), ([0, 0, 0, 0, 1], 1),
                                        ([1, 1, 1, 1, 1], 5), ([1, 1, 1, 1, 1], None), ([0, 0, 0, 0, 0], 4)])
def test_few_live_programs_serve_the_live_sequences_alone(live, bound, splits):
    """A dense call with ``live_order`` (the confidence valve's re-run): the program slots (``live_bound`` of them,
    or one per sequence) serve the live sequences (ids first in the order, ``live_count`` of them), each live
    sequence's rows equal the plain launch's (and the reference's), and the other sequences' rows read 0 (their
    programs exit without writing, or do not exist)."""
    lengths = [37, 5, 61, 0, 50]
    T, B = 3, len(lengths)
    q, k, v, lens = make_case(B, 2, 3, T, 16, 72, torch.float32, lengths, seed=11)
    mask = torch.tensor(live, dtype=torch.bool, device=DEV)
    order = torch.argsort((~mask).to(torch.int8), stable=True).to(torch.int32)
    count = mask.sum().to(torch.int32).view(1)
    meta = AttentionMetadata(lens, 16 ** -0.5)
    cfg = LaunchConfig(block_n=16, num_splits=splits)
    plain, plain_lse, _, _ = splitk_attention(q, k, v, meta, cfg=cfg)
    few, few_lse, _, _ = splitk_attention(q, k, v, meta, cfg=cfg, live_order=order, live_count=count,
                                          live_bound=bound)
    o_ref, _ = REF.attend(q, k, v, meta)
    for b in range(B):
        if live[b]:
            torch.testing.assert_close(few[b], plain[b], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(few_lse[b], plain_lse[b], atol=2e-5, rtol=1e-4)
            torch.testing.assert_close(few[b], o_ref[b], atol=2e-5, rtol=1e-4)
        else:
            assert (few[b] == 0).all() and (few_lse[b] == 0).all()


def test_few_live_splits_are_sized_for_a_share_of_the_batch(monkeypatch):
    """Without a forced count, a few-live launch chooses its splits for ``live_bound`` sequences (or
    ``FEW_LIVE_SHARE`` of them), a plain one for all of them; a few-live call with scores, without its count or with
    a bound outside 1 .. B is refused in one line."""
    import specdec.cuda.triton_attention as ta

    seen = []
    real = ta.choose_splits
    monkeypatch.setattr(ta, "choose_splits", lambda bh, *a, **k: seen.append(bh) or real(bh, *a, **k))
    q, k, v, lens = make_case(16, 2, 3, 3, 16, 40, torch.float32, [20] * 16)
    meta = AttentionMetadata(lens, 0.25)
    order, count = torch.arange(16, dtype=torch.int32, device=DEV), torch.tensor([16], dtype=torch.int32, device=DEV)
    splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16))
    splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16), live_order=order, live_count=count)
    splitk_attention(q, k, v, meta, cfg=LaunchConfig(block_n=16), live_order=order, live_count=count, live_bound=4)
    assert seen == [32, 2 * 2, 4 * 2]  # 16 x 2 pairs; 1/8 of 16 sequences x 2 KV heads; 4 x 2
    with pytest.raises(ValueError, match="few-live call"):
        splitk_attention(q, k, v, meta, live_order=order)
    with pytest.raises(ValueError, match="few-live call"):
        splitk_attention(q, k, v, meta, live_order=order, live_count=count, row_weights=torch.ones(6, 3, device=DEV))
    with pytest.raises(ValueError, match="live_bound must be 1 to the batch"):
        splitk_attention(q, k, v, meta, live_order=order, live_count=count, live_bound=17)


def test_a_few_live_forward_gives_the_live_sequences_the_plain_forwards_logits():
    """Through a model (the valve's re-run): with ``cache.few_live`` set and some sequences finished, every dense layer
    call gets the live ids first and their count, the live sequences' logits equal those of the same forward without
    the flag, and the graph key tells the two forwards apart."""
    from conftest import make_tiny

    from specdec.graphs import describe_step

    m = make_tiny("llama")
    m.hf.to(DEV)
    be = TritonBackend(TritonConfig(block_n=16, num_splits=2))
    B = 4
    ids = torch.randint(0, 96, (B, 20), device=DEV)
    lens = torch.zeros(B, dtype=torch.long, device=DEV)
    seen = []
    attend = be.attend

    def spy(q, k, v, meta):
        if q.shape[2] == 4:
            seen.append(None if meta.live_order is None else (meta.live_order.tolist(), meta.live_count.tolist(),
                                                              meta.live_bound))
        return attend(q, k, v, meta)

    be.attend = spy
    logits = {}
    with m.using_backend(be):
        for few in (0, 2):
            cache = m.new_cache(B, 32)
            m.forward(ids[:, :16], cache, lens)
            cache.live = torch.tensor([False, True, False, True], device=DEV)
            cache.few_live = few
            logits[few] = m.forward(ids[:, 16:], cache, lens + 16)
            key = describe_step(m, ids[:, 16:], cache, None, (), 0)
            assert key.few_live == few
    n = m.dims.n_layers
    assert seen == [None] * n + [([1, 3, 0, 2], [2], 2)] * n
    torch.testing.assert_close(logits[2][[1, 3]], logits[0][[1, 3]], atol=1e-5, rtol=1e-5)
