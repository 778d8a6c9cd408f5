"""The shared test matrix: every registered drafting selector runs through the same pipeline tests.

A new selector (built-in or an entry-point plugin) gets these for free: its greedy speculative
output must equal dense decoding, in a ragged batch equal to each prompt alone, at several budgets.
Because verification is dense, that alone passes for *any* plan, so the matrix also checks what the
drafter's attention actually reads (:func:`record_visible_sets`): per layer, sequence and KV head,
inside the verified tokens, no position twice, exactly the budget, sinks and recent window included;
and with a budget covering the context every draft is accepted (the draft is the dense model).
Selectors that guide verification instead of drafting (``role = "verify"``) are excluded here.

The helpers (:func:`record_visible_sets`, :func:`check_visible_set`) take only a selector and tensors,
so they can move into a shipped conformance module unchanged.
"""

import pytest
import torch

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine

from conftest import make_tiny

PROMPTS = [list(range(3, 60)), [7, 1, 4, 9, 22, 31] * 8]


def drafting_selectors() -> list[str]:
    return [n for n in SELECTORS.names() if getattr(SELECTORS.get(n).cls, "role", "draft") == "draft"]


def record_visible_sets(selector) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Make every plan of ``selector`` record what the attention route reads from it.

    Returns the (growing) list of ``(layer, lengths (B,), indices (B, H_kv or 1, K))``, one entry per
    ``plan.indices_for`` call, i.e. per layer and draft step (query-aware plans such as Quest's pick
    their entries there, so ``plan.indices`` alone would show only sinks + recent).
    """
    seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    build = selector.plan

    def plan(cache, lengths):
        p = build(cache, lengths)
        pick = p.indices_for

        def indices_for(layer, q):
            idx = pick(layer, q)
            seen.append((layer, p.dense_from.detach().cpu().clone(), idx.detach().cpu().clone()))
            return idx

        p.indices_for = indices_for
        return p

    selector.plan = plan
    return seen


def check_visible_set(selector, lengths: torch.Tensor, idx: torch.Tensor, n_kv_heads: int, where: str = "") -> None:
    """One layer's plan ``idx`` ``(B, H_kv or 1, K)`` for verified ``lengths`` ``(B,)``: per sequence and
    KV head, every entry is a verified position, none repeats, there are exactly ``min(budget, length)``
    of them, and the sinks and the recent window are among them."""
    c = selector.config
    budget = c.budget_for(lengths)
    B, Hs, _ = idx.shape
    assert Hs in (1, n_kv_heads), f"{where}: plan has {Hs} head lists for {n_kv_heads} KV heads"
    for b in range(B):
        L, k = int(lengths[b]), int(budget[b])
        s = min(c.sinks, k)
        r = min(c.recent, k - s)
        for h in range(Hs):
            row = idx[b, h]
            vis = row[row >= 0].tolist()
            at = f"{where} sequence {b} KV head {h}"
            assert len(set(vis)) == len(vis), f"{at}: a position appears twice in the plan"
            assert all(0 <= t < L for t in vis), f"{at}: plan entry outside the {L} verified tokens"
            assert len(vis) == k, f"{at}: plan holds {len(vis)} entries, budget is {k}"
            assert set(range(s)) <= set(vis), f"{at}: sinks missing"
            assert set(range(L - r, L)) <= set(vis), f"{at}: recent window missing"


def check_recorded(selector, seen, n_layers: int, n_kv_heads: int) -> None:
    """Every recorded read is a valid visible set, and every layer read a plan at every draft step."""
    assert seen, "the drafter never read a plan"
    layers = [layer for layer, _, _ in seen]
    assert len(layers) % n_layers == 0 and all(layers.count(i) == len(layers) // n_layers for i in range(n_layers)), \
        "not every layer read the plan at every draft step"
    for layer, lengths, idx in seen:
        check_visible_set(selector, lengths, idx, n_kv_heads, where=f"layer {layer}")


@pytest.fixture(scope="module")
def model():
    return make_tiny("qwen2", seed=3)


@pytest.fixture(scope="module")
def dense_ref(model):
    return SpeculativeEngine(model, eos_token_id=-1).generate(PROMPTS, max_new_tokens=14).tokens


@pytest.mark.parametrize("name", drafting_selectors())
@pytest.mark.parametrize("budget", [8, 24, 10_000])
def test_selector_pipeline_is_lossless(name, budget, model, dense_ref):
    selector = SELECTORS.build(name, budget=budget, sinks=2, recent=4)
    seen = record_visible_sets(selector)
    eng = SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=3, eos_token_id=-1)
    res = eng.generate(PROMPTS, max_new_tokens=14)
    assert res.tokens == dense_ref
    check_recorded(selector, seen, model.dims.n_layers, model.dims.n_kv_heads)
    if budget >= max(map(len, PROMPTS)) + 14:  # the draft sees everything: it is the dense model
        assert res.stats.acceptance_per_position == [1.0] * 3, res.stats.acceptance_per_position
    alone = eng.generate(PROMPTS[1:], max_new_tokens=14)
    assert alone.tokens[0] == res.tokens[1]


@pytest.mark.parametrize("name", drafting_selectors())
def test_plan_respects_budget(name, model):
    selector = SELECTORS.build(name, budget=16, sinks=2, recent=4)
    seen = record_visible_sets(selector)
    prompts = [list(range(40)), list(range(90))]
    eng = SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=3, eos_token_id=-1)
    res = eng.generate(prompts, max_new_tokens=2)  # exercises reset/on_verify
    assert res.tokens == SpeculativeEngine(model, eos_token_id=-1).generate(prompts, max_new_tokens=2).tokens
    check_recorded(selector, seen, model.dims.n_layers, model.dims.n_kv_heads)
    # a plan made outside the engine, read by every layer with random queries
    cache = model.new_cache(2, 128)
    lengths = torch.tensor([40, 90])
    selector.reset(cache)
    selector.on_verify(None, lengths)
    seen.clear()
    plan = selector.plan(cache, lengths)
    d = model.dims
    q = torch.randn(2, d.n_heads, 1, d.head_dim, generator=torch.Generator().manual_seed(0))
    for layer in range(d.n_layers):
        plan.indices_for(layer, q)
    check_recorded(selector, seen, d.n_layers, d.n_kv_heads)
