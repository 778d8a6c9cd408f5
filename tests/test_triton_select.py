"""``specdec.selectors.base.TRITON_SELECT``: the plan's top-k in one Triton launch (here under the interpreter).

Per (layer, sequence, head) row the picked positions equal ``torch.topk``'s cut to the sequence's room (as sets),
slots past the room are -1, ties at the threshold go to the lowest positions, and greedy Vegas emits dense's tokens.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
DEV = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.skipif(DEV == "cpu" and not INTERPRETED, reason="Triton on the CPU needs TRITON_INTERPRET=1")

from conftest import make_tiny  # noqa: E402
from specdec import SELECTORS, KVCache, PipelineConfig, build_engine  # noqa: E402
from specdec.cuda.triton_select import select_top  # noqa: E402
from specdec.interfaces import ScoreRequest  # noqa: E402
from specdec.selectors import base  # noqa: E402


def _plans(monkeypatch, per_kv_head: bool, lengths: list[int]):
    N, B, H, L = 3, len(lengths), 2, 200
    cache = KVCache(N, B, H, L, 8, torch.float32, torch.device(DEV))
    # spread=0: distinct random scores, so the two paths must pick the same sets (spread makes plateaus of ties)
    sel = SELECTORS.build("collect2", budget_ratio=0.3, sinks=2, recent=4, per_kv_head=per_kv_head, spread=0)
    sel.reset(cache)
    assert sel.max_selected(L) == 54  # top-k picks beyond sinks and the recent window
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    g = torch.Generator().manual_seed(3)
    req.scores = dict(enumerate(torch.rand(N, B, H, L, generator=g).to(DEV).unbind(0)))
    lens = torch.tensor(lengths, device=DEV)
    sel.on_verify(req, lens)
    out = {}
    for flag in (False, "always"):
        monkeypatch.setattr(base, "TRITON_SELECT", flag)
        out[flag] = sel.plan(cache, lens).indices
    return out


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_triton_select_picks_the_same_sets(monkeypatch, per_kv_head):
    p = _plans(monkeypatch, per_kv_head, [200, 150, 90, 37, 7])
    want, got = p[False], p["always"]
    assert want.shape == got.shape == (3, 5, 2 if per_kv_head else 1, 60)
    assert (want == -1).sum() > 0  # short sequences leave slots empty
    torch.testing.assert_close(got.sort(-1).values, want.sort(-1).values, rtol=0, atol=0)


def test_select_top_ties_and_room():
    s = torch.tensor([[1.0, 5.0, 3.0, 5.0, 3.0, 3.0, float("-inf"), 0.5]]).view(1, 1, 1, 8).to(DEV)
    room = torch.tensor([4], device=DEV)
    # 5, 5, then two of the three 3s: the lowest positions (2, 4); in position order; -1 past the room
    assert select_top(s, 6, room).view(-1).tolist() == [1, 2, 3, 4, -1, -1]
    assert select_top(s, 6, torch.tensor([0], device=DEV)).view(-1).tolist() == [-1] * 6
    assert select_top(s, 3, torch.tensor([9], device=DEV)).view(-1).tolist() == [1, 2, 3]  # room capped at k_sel
    with pytest.raises(ValueError, match="contiguous float32"):
        select_top(s.double(), 6, room)


@pytest.mark.parametrize("L,levels", [(7, 3), (100, 5), (1000, 0), (3000, 40)])
def test_select_top_equals_the_definition_on_random_rows(L, levels):
    """Per row: the room[b] largest scores (room capped at k_sel and at the row's length), ties at the threshold to
    the lowest positions, in position order, -1 after; negative scores and -inf included (levels: few distinct values,
    many ties; 0: distinct)."""
    g = torch.Generator().manual_seed(L)
    N, B, Hs, k_sel = 2, 3, 2, min(L + 5, 700)
    if levels:
        s = torch.randint(-levels, levels, (N, B, Hs, L), generator=g).float() + 0.5
    else:
        s = torch.randn(N, B, Hs, L, generator=g)
    s[torch.rand(N, B, Hs, L, generator=g) < 0.1] = float("-inf")
    room = torch.tensor([0, min(L + 5, k_sel), L // 3])
    got = select_top(s.to(DEV).contiguous(), k_sel, room.to(DEV)).cpu()
    for n in range(N):
        for b in range(B):
            for h in range(Hs):
                k = min(int(room[b]), k_sel, L)
                order = sorted(range(L), key=lambda i: (-float(s[n, b, h, i]), i))[:k]
                assert got[n, b, h, :k].tolist() == sorted(order), (n, b, h)
                assert (got[n, b, h, k:] == -1).all()


def test_triton_select_greedy_vegas_equals_dense(monkeypatch):
    m = make_tiny("llama")
    m.hf.to(DEV)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    want = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    monkeypatch.setattr(base, "TRITON_SELECT", "always")
    cfg = PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3)
    assert build_engine(m, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens == want


# -- TRITON_SELECT = "fused": the whole plan (head sum, mask, radix select, fixed positions) in one launch ---------

from specdec.cuda.triton_select import select_plan  # noqa: E402
from specdec.selectors.base import BudgetConfig, fixed_positions  # noqa: E402


def _vegas_plans(monkeypatch, scores, lengths, settings=(False, "fused-always"), **cfg):
    """Plans of collect2 over ``scores`` ``(N, B, H, L)`` (emitted per KV head) with each TRITON_SELECT setting
    (``spread=0`` unless given: distinct scores stay distinct, so the paths' sets can be compared exactly)."""
    cfg = {"spread": 0, **cfg}
    N, B, H, L = scores.shape
    cache = KVCache(N, B, H, L, 8, torch.float32, torch.device(DEV))
    lens = torch.tensor(lengths, device=DEV)
    out = {}
    for flag in settings:
        monkeypatch.setattr(base, "TRITON_SELECT", flag)
        sel = SELECTORS.build("collect2", **cfg)
        sel.reset(cache)
        req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
        req.scores = dict(enumerate(scores.to(DEV).unbind(0)))
        sel.on_verify(req, lens)  # with "fused" the selector keeps the emitted scores, unsummed
        out[flag] = sel.plan(cache, lens)
    return out


def _stable_ref(scores, lengths, k_sel, sinks, recent, sum_heads, **budget):
    """The plan with ties at the threshold to the lowest positions (a stable sort), as sorted index rows."""
    c = BudgetConfig(sinks=sinks, recent=recent, **budget)
    lens = torch.tensor(lengths)
    fixed, room = fixed_positions(lens, c.budget_for(lens), sinks, recent)
    s = scores.float().sum(2, keepdim=True) if sum_heads else scores.float()
    N, B, Hs, L = s.shape
    pos = torch.arange(L).view(1, L)
    blocked = (pos >= lens.view(B, 1)) | (pos < sinks) | (pos >= (lens - recent).view(B, 1))
    order = torch.sort(s.masked_fill(blocked.view(1, B, 1, L), float("-inf")), dim=-1, descending=True,
                       stable=True).indices[..., :k_sel]
    slot = torch.arange(k_sel).view(1, 1, 1, -1)
    top = torch.where(slot < room.view(1, B, 1, 1), order, -1)
    return torch.cat([fixed.view(1, B, 1, -1).expand(N, B, Hs, -1), top], -1).sort(-1).values


CASES = {  # budget settings x ragged lengths (incl. shorter than sinks + recent, and budgets past the length)
    "ratio": (dict(budget_ratio=0.3, sinks=2, recent=4), [200, 150, 90, 37, 7, 3]),
    "ratio+min": (dict(budget_ratio=0.05, min_budget=40, sinks=4, recent=16), [200, 61, 30, 20, 1]),
    "budget": (dict(budget=50, sinks=3, recent=5), [200, 52, 49, 9, 8, 2]),
    "no sinks": (dict(budget=30, sinks=0, recent=0), [200, 31, 12]),
}


@pytest.mark.parametrize("per_kv_head", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_plan_equals_the_torch_plan(monkeypatch, case, per_kv_head):
    """Distinct fp32 scores: the same index set per row as torch.topk's plan, the same fixed part and dense_from."""
    cfg, lengths = CASES[case]
    g = torch.Generator().manual_seed(5)
    scores = torch.rand(3, len(lengths), 3, 200, generator=g)  # (N, B, H_kv, L): per KV head, as emitted
    p = _vegas_plans(monkeypatch, scores, lengths, per_kv_head=per_kv_head, **cfg)
    want, got = p[False], p["fused-always"]
    assert got.indices.shape == want.indices.shape
    F = cfg["sinks"] + cfg["recent"]
    torch.testing.assert_close(got.indices[..., :F], want.indices[..., :F], rtol=0, atol=0)
    torch.testing.assert_close(got.indices.sort(-1).values, want.indices.sort(-1).values, rtol=0, atol=0)
    torch.testing.assert_close(got.dense_from, want.dense_from, rtol=0, atol=0)
    assert (want.indices[..., F:] == -1).any() and (want.indices[..., F:] >= 0).any()


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_fused_plan_with_spread_ranks_the_spread_scores(monkeypatch, per_kv_head):
    """``spread`` (Vegas' default): the fused path ranks the head sums (or each KV head's scores) after the forward
    max, with the plateaus' ties to the lowest positions: the stable reference on the spread scores."""
    from specdec.selectors.verification_guided import spread_forward

    cfg, lengths = CASES["ratio"]
    g = torch.Generator().manual_seed(6)
    scores = torch.rand(3, len(lengths), 3, 200, generator=g)
    plan = _vegas_plans(monkeypatch, scores, lengths, settings=("fused-always",), per_kv_head=per_kv_head, spread=5,
                        **cfg)["fused-always"]
    spread = spread_forward(scores if per_kv_head else scores.sum(2, keepdim=True), 5)
    want = _stable_ref(spread, lengths, BudgetConfig(**cfg).max_room(200), sum_heads=False, **cfg)
    torch.testing.assert_close(plan.indices.cpu().sort(-1).values, want, rtol=0, atol=0)
    plain = _stable_ref(scores if per_kv_head else scores.sum(2, keepdim=True), lengths,
                        BudgetConfig(**cfg).max_room(200), sum_heads=False, **cfg)
    assert not torch.equal(want, plain)  # the spread changes the sets here


# chunk 8192: the row in registers; 64: 4 chunks through the scratch keys
@pytest.mark.parametrize("dtype,bits,chunk", [(torch.float32, 5, 8192), (torch.float32, 5, 64), (torch.bfloat16, 8, 64),
                                              (torch.float32, 4, 8192)])
def test_fused_plan_ties_go_to_the_lowest_positions(dtype, bits, chunk):
    """Scores with many ties (a few distinct values, bf16): per row the set of a stable sort (lowest positions first)."""
    lengths = [200, 150, 90, 37, 7]
    g = torch.Generator().manual_seed(7)
    scores = (torch.randint(0, 6, (2, len(lengths), 3, 200), generator=g) / 4).to(dtype)
    cfg = dict(sinks=2, recent=4, budget_ratio=0.3)
    k_sel = BudgetConfig(**cfg).max_room(200)
    for sum_heads in (True, False):
        got, dense = select_plan(scores.to(DEV), torch.tensor(lengths, device=DEV), k_sel, sum_heads=sum_heads,
                                 chunk=chunk, radix_bits=bits, **cfg)
        want = _stable_ref(scores, lengths, k_sel, sum_heads=sum_heads, **cfg)
        torch.testing.assert_close(got.cpu().sort(-1).values, want, rtol=0, atol=0)
        assert dense.cpu().tolist() == lengths


def test_fused_plan_strided_scores_and_chunks():
    """Scores read in place through strides (one layer's slice of a larger buffer); many chunks = one chunk."""
    g = torch.Generator().manual_seed(9)
    big = torch.rand(2, 4, 3, 300, generator=g)
    scores = big[:, :, :, :250]  # not contiguous: the rows are 300 apart
    lens = torch.tensor([250, 100, 40, 21], device=DEV)
    cfg = dict(sinks=4, recent=16, budget_ratio=0.2)
    k_sel = BudgetConfig(**cfg).max_room(250)
    one, _ = select_plan(scores.to(DEV), lens, k_sel, sum_heads=True, **cfg)
    many, _ = select_plan(scores.contiguous().to(DEV), lens, k_sel, sum_heads=True, chunk=32, **cfg)
    torch.testing.assert_close(one, many, rtol=0, atol=0)  # both in position order
    want = _stable_ref(scores, lens.cpu().tolist(), k_sel, 4, 16, True, budget_ratio=0.2)
    torch.testing.assert_close(one.cpu().sort(-1).values, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="exactly one of budget and budget_ratio"):
        select_plan(scores, lens, k_sel, sinks=4, recent=16)


def test_fused_setting_is_checked_and_skips_the_plan_graph(monkeypatch):
    sel = SELECTORS.build("collect2", budget_ratio=0.3)
    lens = torch.tensor([10], device=DEV)
    monkeypatch.setattr(base, "TRITON_SELECT", "fused-always")
    assert sel.plans_in_one_launch(lens)
    monkeypatch.setattr(base, "TRITON_SELECT", "fused")  # CUDA only
    assert sel.plans_in_one_launch(lens) == (DEV == "cuda")
    monkeypatch.setattr(base, "TRITON_SELECT", "fast")
    with pytest.raises(ValueError, match="TRITON_SELECT is 'fast'; use one of"):
        sel.plans_in_one_launch(lens)


def test_fused_select_greedy_vegas_equals_dense(monkeypatch):
    m = make_tiny("llama")
    m.hf.to(DEV)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    want = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    monkeypatch.setattr(base, "TRITON_SELECT", "fused-always")
    for opts in ({}, {"per_kv_head": True}):
        cfg = PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3, options=opts)
        assert build_engine(m, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens == want


def test_fused_plan_low_bits_and_signed_zeros():
    """Scores that differ only in their last mantissa bits (every radix pass counts), and -0.0 == +0.0 (a tie)."""
    L = 300
    g = torch.Generator().manual_seed(11)
    bits = torch.tensor([1.0]).view(torch.int32) + torch.randperm(L, generator=g).to(torch.int32)
    scores = bits.view(torch.float32).view(1, 1, 1, L).repeat(2, 1, 1, 1)
    scores[1] = -scores[1]  # negative scores too
    lens = torch.tensor([L], device=DEV)
    cfg = dict(sinks=0, recent=0, budget=37)
    want = _stable_ref(scores, [L], 37, 0, 0, False, budget=37)
    for bits in (4, 5, 6, 7, 8):  # 8, 7, 6, 5 and 4 passes (the last one narrower where bits do not divide 32)
        got, _ = select_plan(scores.to(DEV), lens, 37, sum_heads=False, radix_bits=bits, chunk=64 if bits == 6 else 8192,
                             **cfg)
        torch.testing.assert_close(got.cpu().sort(-1).values, want, rtol=0, atol=0)
    z = torch.full((1, 1, 1, 8), -1.0)
    z[..., 2], z[..., 3], z[..., 5] = -0.0, -0.0, 0.0  # three equal zeros: the two lowest positions win
    got, _ = select_plan(z.to(DEV), torch.tensor([8], device=DEV), 2, sum_heads=False, **cfg)
    assert got.view(-1).tolist() == [2, 3]


def test_plan_graph_keys_repeat_across_generate_calls(monkeypatch):
    """Every plan-graph key of a second ``generate`` was seen in the first (the warm-up), so a timed call captures no
    plan graph. Vegas once kept its score buffer as a tensor attribute across ``reset``: the second call's first plan
    (recency, no scores yet) had a key of its own and was captured inside the timed call (the end-to-end select
    phase of benchmarks/results/gpu_gemm_splits_2026-12-01d.md timed warm-up + 1 call)."""
    from specdec.graphs import PlanGraphs
    from specdec.planner import Planner

    m = make_tiny("llama")
    m.hf.to(DEV)
    seen: list = []
    plan = Planner.plan

    def record(self, selector, lengths):
        seen.append(PlanGraphs.key(selector, self.cache, lengths))
        return plan(self, selector, lengths)

    monkeypatch.setattr(Planner, "plan", record)
    eng = build_engine(m, PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3), eos_token_id=-1)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    eng.generate(prompts, max_new_tokens=8)
    first = set(seen)
    seen.clear()
    eng.generate(prompts, max_new_tokens=8)
    assert len(first) == 2 and set(seen) <= first  # recency (before the first scores), then the scores' plan


# -- TRITON_SELECT = "radix16": 16-bit keys, rows split over several programs (4 launches) -------------------------

from specdec.cuda.triton_select import select_plan16  # noqa: E402


def _key16(s: torch.Tensor) -> torch.Tensor:
    """The top 16 bits of the order-preserving int32 key of fp32 ``s`` (what select_plan16 ranks), as int32."""
    bits = s.float().contiguous().view(torch.int32)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return key >> 16


def _ref16(scores, lengths, k_sel, sinks, recent, sum_heads, **budget):
    """select_plan16's documented set: positions by 16-bit key, the boundary bucket to the lowest positions (a
    stable sort of the keys), as sorted index rows; plus the boundary key per row and the exact fp32 row."""
    c = BudgetConfig(sinks=sinks, recent=recent, **budget)
    lens = torch.tensor(lengths)
    fixed, room = fixed_positions(lens, c.budget_for(lens), sinks, recent)
    s = scores.float().sum(2, keepdim=True) if sum_heads else scores.float()
    N, B, Hs, L = s.shape
    pos = torch.arange(L).view(1, L)
    blocked = ((pos >= lens.view(B, 1)) | (pos < sinks) | (pos >= (lens - recent).view(B, 1))).view(1, B, 1, L)
    k = _key16(s).masked_fill(blocked, -(2 ** 20))
    order = torch.sort(k, dim=-1, descending=True, stable=True).indices[..., :k_sel]
    slot = torch.arange(k_sel).view(1, 1, 1, -1)
    top = torch.where(slot < room.view(1, B, 1, 1), order, -1)
    return torch.cat([fixed.view(1, B, 1, -1).expand(N, B, Hs, -1), top], -1).sort(-1).values, k, room


# block 256: 3 chunks of a 700-position row (and a padded last chunk); 1024: the row in one chunk
@pytest.mark.parametrize("case,dtype,block", [(c, torch.float32, 256) for c in sorted(CASES)]
                         + [("ratio", torch.bfloat16, 256), ("budget", torch.float32, 1024)])
def test_radix16_plan_is_its_documented_set(case, dtype, block):
    """Exactly the documented set (16-bit keys, boundary bucket to the lowest positions) for every budget case,
    ragged lengths, both head modes; the fixed part and dense_from as the torch plan's; -1 exactly past the room;
    and the picks outside the boundary bucket are exactly torch.topk's, the count is the room."""
    cfg, lengths = CASES[case]
    L = 700
    lengths = [min(x * 3, L) for x in lengths]
    g = torch.Generator().manual_seed(21)
    scores = torch.rand(2, len(lengths), 3, L, generator=g).to(dtype)
    sk = {k: v for k, v in cfg.items() if k in ("sinks", "recent")}
    k_sel = BudgetConfig(**cfg).max_room(L)
    F = sk["sinks"] + sk["recent"]
    for sum_heads in (True, False):
        got, dense = select_plan16(scores.to(DEV), torch.tensor(lengths, device=DEV), k_sel, sum_heads=sum_heads,
                                   block=block, **cfg)
        got = got.cpu()
        want, key, room = _ref16(scores, lengths, k_sel, sum_heads=sum_heads, **cfg)
        torch.testing.assert_close(got.sort(-1).values, want, rtol=0, atol=0)
        assert dense.cpu().tolist() == lengths
        ref_fixed, _ = fixed_positions(torch.tensor(lengths), BudgetConfig(**cfg).budget_for(torch.tensor(lengths)),
                                       **sk)
        torch.testing.assert_close(got[..., :F], ref_fixed.view(1, len(lengths), 1, F).expand_as(got[..., :F]), rtol=0, atol=0)
        picks = got[..., F:]
        n = (picks >= 0).sum(-1)  # (N, B, Hs)
        assert torch.equal(n, room.view(1, -1, 1).expand_as(n))  # the right count
        assert (picks[..., :-1][picks[..., 1:] >= 0] < picks[..., 1:][picks[..., 1:] >= 0]).all()  # position order
        slot = torch.arange(k_sel).view(1, 1, 1, -1)
        assert torch.equal(picks >= 0, (slot < room.view(1, -1, 1, 1)).expand_as(picks))  # -1 exactly past the room
        # against torch.topk of the exact fp32 scores: the same picks above the boundary key, none below it
        s = scores.float().sum(2, keepdim=True) if sum_heads else scores.float()
        N, B, Hs, _ = s.shape
        blocked = key == -(2 ** 20)
        exact = torch.topk(s.masked_fill(blocked, float("-inf")), k_sel, dim=-1).indices
        for n_, b_, h_ in [(a, b, c) for a in range(N) for b in range(B) for c in range(Hs)]:
            r = int(room[b_])
            if r == 0:
                continue
            mine, ref = set(picks[n_, b_, h_, :r].tolist()), set(exact[n_, b_, h_, :r].tolist())
            kr = key[n_, b_, h_]
            t = min(int(kr[p]) for p in mine)  # the boundary key
            assert {p for p in mine if kr[p] > t} == {p for p in ref if kr[p] > t}
            assert all(kr[p] >= t for p in ref) and all(kr[p] >= t for p in mine)


def test_radix16_boundary_bucket_and_determinism():
    """Many equal keys (scores in a narrow band: one boundary bucket spans chunks): the lowest positions of the
    bucket win across chunk borders, identical output on a second call, one-chunk == many-chunk output."""
    L = 1000
    g = torch.Generator().manual_seed(4)
    scores = 1.0 + torch.randint(0, 3, (1, 2, 1, L), generator=g).float() * 2 ** -6  # 3 keys, each ~333 times
    scores[0, 1, 0, 600:] = 2.0  # row 1: 400 top keys after position 600; the room (500) spills into bucket 1.03
    lens = torch.tensor([L, L], device=DEV)
    cfg = dict(sinks=0, recent=0, budget=500)
    a, _ = select_plan16(scores.to(DEV), lens, 500, block=256, **cfg)
    b, _ = select_plan16(scores.to(DEV), lens, 500, block=256, **cfg)
    c, _ = select_plan16(scores.to(DEV), lens, 500, block=1024, **cfg)
    assert torch.equal(a, b) and torch.equal(a, c)
    want, _, _ = _ref16(scores, [L, L], 500, 0, 0, False, budget=500)
    torch.testing.assert_close(a.cpu().sort(-1).values, want, rtol=0, atol=0)
    row1 = a[0, 1, 0].cpu().tolist()
    assert row1[:100] == [p for p in range(600) if scores[0, 1, 0, p] == scores[0, 1, 0, :600].max()][:100]


def test_radix16_setting_plans_like_torch_and_vegas_stays_lossless(monkeypatch):
    """Through the selector: "radix16-always" plans (distinct 16-bit keys: the same sets as the torch plan), skips
    the plan graph ("radix16-graph" keeps it), and greedy Vegas with it emits dense's tokens."""
    cfg, lengths = CASES["ratio"]
    L = 200
    scores = torch.zeros(2, len(lengths), 3, L)  # head sums = distinct integers < 256: distinct 16-bit keys
    scores[:, :, 0] = torch.stack([torch.randperm(L, generator=torch.Generator().manual_seed(i)).float()
                                   for i in range(2 * len(lengths))]).view(2, len(lengths), L)  # integers < 256
    p = _vegas_plans(monkeypatch, scores, lengths, settings=(False, "radix16-always"), **cfg)
    torch.testing.assert_close(p["radix16-always"].indices.sort(-1).values, p[False].indices.sort(-1).values,
                               rtol=0, atol=0)
    lens = torch.tensor([10], device=DEV)
    sel = SELECTORS.build("collect2", budget_ratio=0.3)
    monkeypatch.setattr(base, "TRITON_SELECT", "radix16-always")
    assert sel.plans_in_one_launch(lens)
    monkeypatch.setattr(base, "TRITON_SELECT", "radix16-graph")
    assert not sel.plans_in_one_launch(lens)
    m = make_tiny("llama")
    m.hf.to(DEV)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    want = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    monkeypatch.setattr(base, "TRITON_SELECT", "radix16-always")
    for opts in ({}, {"per_kv_head": True}):
        cfg = PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3, options=opts)
        assert build_engine(m, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens == want


def test_radix16_refuses_bad_arguments():
    s = torch.rand(1, 1, 1, 100)
    lens = torch.tensor([100])
    with pytest.raises(ValueError, match="exactly one of budget and budget_ratio"):
        select_plan16(s, lens, 10, sinks=0, recent=0)
    with pytest.raises(ValueError, match="block must be a power of two >= 256"):
        select_plan16(s, lens, 10, sinks=0, recent=0, budget=10, block=300)


# -- TRITON_SELECT = "auto": radix16 eager for large score tensors, in the plan graph below, torch where it can't run --

from specdec.cuda import triton_select  # noqa: E402

#: (name, layers x B x KV heads x capacity, documented path): the H200 shapes the threshold was measured at
AUTO_SIZES = [("smol B64 x 8k", 30 * 64 * 3 * 8016, "radix16"), ("8b B16 x 32k", 32 * 16 * 8 * 32784, "radix16"),
              ("smol B16 x 8k", 30 * 16 * 3 * 8016, "radix16-graph"), ("smol B1 x 8k", 30 * 1 * 3 * 8016, "radix16-graph")]


@pytest.mark.parametrize("name,elements,path", AUTO_SIZES)
def test_auto_path_of_the_measured_sizes(monkeypatch, name, elements, path):
    """Each measured size takes its documented path on CUDA and under the interpreter; the torch path on a CPU
    without the interpreter and for scores / slots the kernel refuses (shapes on the meta device: nothing allocated)."""
    for dev in ("cuda", "cpu"):  # the CPU only under the interpreter (a GPU run of this file has none: torch there)
        want = path if dev == "cuda" or INTERPRETED else "torch"
        assert base.auto_path(torch.device(dev), elements=elements) == want, (name, dev)
    assert base.auto_path(torch.device("cuda")) == "radix16-graph"  # size unknown before the plan: the graph
    meta = torch.empty(30, 64, 3, 8016, device="meta")
    assert base.auto_path(torch.device("cuda"), meta, 400, elements) == path
    assert base.auto_path(torch.device("cuda"), meta.double(), 400, elements) == "torch"  # dtype refused
    assert base.auto_path(torch.device("cuda"), meta, triton_select.R16_MAX_BLOCK + 1, elements) == "torch"
    long = torch.empty(1, 1, 1, triton_select.R16_MAX_CHUNKS * triton_select.R16_MAX_BLOCK + 1, device="meta")
    assert base.auto_path(torch.device("cuda"), long, 400, elements) == "torch"  # rows too long
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert base.auto_path(torch.device("cpu"), elements=elements) == "torch"
    assert base.auto_path(torch.device("cuda"), elements=elements) == path


def _auto_plan(monkeypatch, threshold: int | None = None):
    """A collect2 plan under "auto" of ragged scores (N 2, B 3, 3 KV heads, L 200) with a spy on select_plan16:
    (plan indices, select_plan16 calls, plans_in_one_launch, whether on_verify kept the emitted scores)."""
    cfg, lengths = CASES["ratio"]
    lengths = lengths[:3]
    scores = torch.rand(2, 3, 3, 200, generator=torch.Generator().manual_seed(8))
    calls = []
    real = triton_select.select_plan16

    def spy(*args, **kw):
        calls.append(tuple(args[0].shape))
        return real(*args, **kw)

    monkeypatch.setattr(triton_select, "select_plan16", spy)
    if threshold is not None:
        monkeypatch.setattr(base, "AUTO_EAGER_ELEMENTS", threshold)
    cache = KVCache(2, 3, 3, 200, 8, torch.float32, torch.device(DEV))
    lens = torch.tensor(lengths, device=DEV)
    monkeypatch.setattr(base, "TRITON_SELECT", "auto")
    sel = SELECTORS.build("collect2", spread=0, **cfg)  # spread=0: on_verify keeps the emitted scores for the kernel
    sel.reset(cache)
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    req.scores = dict(enumerate(scores.to(DEV).unbind(0)))
    sel.on_verify(req, lens)
    one_launch = sel.plans_in_one_launch(lens)
    idx = sel.plan(cache, lens).indices
    monkeypatch.setattr(base, "TRITON_SELECT", False)
    ref = sel.plan(cache, lens).indices  # the torch plan of the same scores (score() sums the kept ones)
    monkeypatch.setattr(base, "TRITON_SELECT", "radix16-always")
    r16 = sel.plan(cache, lens).indices if calls else None  # (only where auto ran radix16: it raises where refused)
    monkeypatch.setattr(base, "TRITON_SELECT", "auto")
    return dict(idx=idx, ref=ref, r16=r16, calls=calls, one_launch=one_launch, kept=sel._raw is not None,
                elements=2 * 3 * 3 * 200)


def test_auto_takes_each_documented_path_through_the_selector(monkeypatch):
    """At / above the threshold: eager radix16 (one select_plan16 call of the unsummed scores, no plan graph); below:
    the same launches, plan graph kept; no interpreter on the CPU, or rows the kernel refuses: torch.topk's plan."""
    n = 2 * 3 * 3 * 200
    eager = _auto_plan(monkeypatch, threshold=n)
    assert eager["one_launch"] and eager["kept"] and eager["calls"][0] == (2, 3, 3, 200)
    assert len(eager["calls"]) == 2  # auto's plan, then radix16-always's (the same launches)
    assert torch.equal(eager["idx"], eager["r16"])
    monkeypatch.undo()
    graph = _auto_plan(monkeypatch, threshold=n + 1)
    assert not graph["one_launch"] and graph["kept"] and len(graph["calls"]) == 2
    assert torch.equal(graph["idx"], graph["r16"])
    assert graph["idx"].shape == graph["ref"].shape and torch.equal(graph["idx"][..., :6], graph["ref"][..., :6])
    monkeypatch.undo()
    monkeypatch.setattr(triton_select, "R16_MAX_BLOCK", 8)  # rows of 200 > 16 chunks x 8: refused at on_verify
    refused = _auto_plan(monkeypatch, threshold=1)
    assert not refused["kept"] and refused["calls"] == [] and not refused["one_launch"]
    assert torch.equal(refused["idx"], refused["ref"])
    monkeypatch.undo()
    monkeypatch.setattr(triton_select, "R16_MAX_BLOCK", 16)  # rows pass (200 <= 256), 54 slots > 16: refused at plan
    slots = _auto_plan(monkeypatch, threshold=1)
    assert slots["kept"] and slots["calls"] == [] and torch.equal(slots["idx"], slots["ref"])
    monkeypatch.undo()
    if DEV == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET")
        plain = _auto_plan(monkeypatch, threshold=1)
        assert not plain["kept"] and plain["calls"] == [] and not plain["one_launch"]
        assert torch.equal(plain["idx"], plain["ref"])


def test_auto_greedy_vegas_equals_dense(monkeypatch):
    m = make_tiny("llama")
    m.hf.to(DEV)
    prompts = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]
    want = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens
    monkeypatch.setattr(base, "TRITON_SELECT", "auto")
    calls = []
    real = triton_select.select_plan16
    monkeypatch.setattr(triton_select, "select_plan16", lambda *a, **k: calls.append(1) or real(*a, **k))
    cfg = PipelineConfig.make(method="vegas", gamma=3, budget=12, sinks=2, recent=3)
    assert build_engine(m, cfg, eos_token_id=-1).generate(prompts, max_new_tokens=8).tokens == want
    assert calls  # the plans went through radix16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [0, 1, 8])
def test_spread_scores_equal_the_torch_spread(dtype, n):
    """``spread_scores`` (Vegas' head sum + forward max; one launch, two, or the size's pick) = ``spread_forward`` of
    the fp32 head sums, exactly: rows longer than one program's block (1,100 positions), per layer and per KV head."""
    from specdec.cuda.triton_select import spread_scores
    from specdec.selectors.verification_guided import spread_forward

    g = torch.Generator().manual_seed(11)
    s = torch.randn(2, 3, 3, 1100, generator=g).to(dtype)
    s[:, :, :, 1050:] = 0.0  # the kernel's zero tail past the length
    want = spread_forward(s.sum(2, keepdim=True, dtype=torch.float32), n)
    for passes in (1, 2, None):
        got = spread_scores(s.to(DEV), n, sum_heads=True, passes=passes)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    want_h = spread_forward(s.float(), n)
    out = torch.full((2, 3, 3, 1100), 7.0, device=DEV)  # written in place, every element
    assert spread_scores(s.to(DEV), n, sum_heads=False, out=out) is out
    torch.testing.assert_close(out.cpu(), want_h, rtol=0, atol=0)


def test_spread_scores_refuses_bad_buffers():
    from specdec.cuda.triton_select import spread_scores

    s = torch.rand(1, 2, 3, 40, device=DEV)
    with pytest.raises(ValueError, match="out must be contiguous float32"):
        spread_scores(s, 4, sum_heads=True, out=torch.empty(1, 2, 3, 40, device=DEV))
    with pytest.raises(ValueError, match="n >= 0"):
        spread_scores(s, -1, sum_heads=True)
    with pytest.raises(ValueError, match="passes must be 1, 2 or None"):
        spread_scores(s, 4, sum_heads=True, passes=3)


@pytest.mark.parametrize("per_kv_head", [False, True])
def test_vegas_plan_with_the_spread_launch(monkeypatch, per_kv_head):
    """``TRITON_SPREAD``: the selector's kept scores (and so its plan) are the same through the launch as through
    PyTorch."""
    from specdec.selectors import verification_guided as vg

    N, B, H, L = 3, 4, 3, 300
    cache = KVCache(N, B, H, L, 8, torch.float32, torch.device(DEV))
    g = torch.Generator().manual_seed(12)
    req = ScoreRequest(rows=[0, 4], kind="sink_softmax", heads="group")
    req.scores = dict(enumerate(torch.rand(N, B, H, L, generator=g).to(DEV).unbind(0)))
    lens = torch.tensor([300, 250, 120, 40], device=DEV)
    kept, plans = {}, {}
    for flag in (False, "always"):
        monkeypatch.setattr(vg, "TRITON_SPREAD", flag)
        sel = SELECTORS.build("collect2", budget_ratio=0.2, per_kv_head=per_kv_head, spread=8)
        sel.reset(cache)
        sel.on_verify(req, lens)
        kept[flag] = sel.score(cache, lens).clone()
        plans[flag] = sel.plan(cache, lens).indices
    torch.testing.assert_close(kept["always"], kept[False], rtol=0, atol=0)
    torch.testing.assert_close(plans["always"], plans[False], rtol=0, atol=0)
    monkeypatch.setattr(vg, "TRITON_SPREAD", "sometimes")
    with pytest.raises(ValueError, match="TRITON_SPREAD"):
        vg._spread_launch(req.scores[0])
