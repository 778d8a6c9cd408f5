"""The shared test matrix: every registered drafting selector runs through the same pipeline tests.

A new selector (built-in or an entry-point plugin) gets these for free: its greedy speculative
output must equal dense decoding, in a ragged batch equal to each prompt alone, at several budgets.
Selectors that guide verification instead of drafting (``role = "verify"``) are excluded here.
"""

import pytest
import torch

from specdec import SELECTORS, SparseSelfDrafter, SpeculativeEngine

from conftest import make_tiny

PROMPTS = [list(range(3, 60)), [7, 1, 4, 9, 22, 31] * 8]


def drafting_selectors() -> list[str]:
    return [n for n in SELECTORS.names() if getattr(SELECTORS.get(n).cls, "role", "draft") == "draft"]


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
    eng = SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=3, eos_token_id=-1)
    res = eng.generate(PROMPTS, max_new_tokens=14)
    assert res.tokens == dense_ref
    alone = eng.generate(PROMPTS[1:], max_new_tokens=14)
    assert alone.tokens[0] == res.tokens[1]


@pytest.mark.parametrize("name", drafting_selectors())
def test_plan_respects_budget(name, model):
    selector = SELECTORS.build(name, budget=16, sinks=2, recent=4)
    cache = model.new_cache(2, 128)
    lengths = torch.tensor([40, 90])
    eng = SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=3, eos_token_id=-1)
    eng.generate([list(range(40)), list(range(90))], max_new_tokens=2)  # exercise reset/on_verify
    selector.reset(cache)
    selector.on_verify(None, lengths)
    plan = selector.plan(cache, lengths)
    valid = plan.indices >= 0
    assert int(valid.sum(-1).max()) <= 16
    for b, L in enumerate(lengths.tolist()):
        idx = plan.indices[:, b][valid[:, b]]
        assert int(idx.max()) < L and len(set(plan.indices[0, b, 0][valid[0, b, 0]].tolist())) == int(valid[0, b, 0].sum())
