"""A selector plugin's wrong output is one error naming what it returned and what it must return — not a raw
``torch.cat`` / ``topk`` / indexing error from deep inside a plan or a backend (a new user's report, 2026-12-05)."""

from __future__ import annotations

import pytest
import torch

from specdec import BudgetConfig, BudgetSelector
from specdec.errors import SpecdecError
from specdec.interfaces import SparsePlan


def _selector(score):
    cls = type("BadScores", (BudgetSelector,), {"Config": BudgetConfig, "score": lambda self, cache, lengths:
                                                 score(lengths)})
    return cls(BudgetConfig(budget=8, sinks=1, recent=2))


@pytest.mark.parametrize("score, said", [
    (lambda n: torch.rand(2, 40), "of shape (2, 40)"),                 # (B, L) instead of 4-D
    (lambda n: torch.rand(1, 3, 1, 40), "of shape (1, 3, 1, 40)"),     # another batch size
    (lambda n: None, "returned NoneType"),
    (lambda n: torch.ones(1, 2, 1, 40, dtype=torch.bool), "torch.bool"),
])
def test_a_score_of_the_wrong_shape_is_one_error_naming_the_selector(score, said):
    sel = _selector(score)
    with pytest.raises(SpecdecError, match=r"^BadScores\.score\(\) returned .*") as e:
        sel.plan(None, torch.tensor([30, 40]))
    msg = str(e.value)
    assert said in msg and "(N or 1, B=2, H_kv or 1, L)" in msg and "\n" not in msg


def test_a_good_score_still_plans():
    plan = _selector(lambda n: torch.rand(1, 2, 1, 40)).plan(None, torch.tensor([30, 40]))
    assert plan.indices.shape[:3] == (1, 2, 1)


def test_a_plan_of_the_wrong_shape_is_refused_where_it_is_made():
    with pytest.raises(SpecdecError, match=r"indices must be an integer tensor .* got a torch.int64 tensor of shape "
                                           r"\(2, 8\)"):
        SparsePlan(indices=torch.zeros(2, 8, dtype=torch.long), dense_from=torch.tensor([30, 40]))
    with pytest.raises(SpecdecError, match="got a torch.float32 tensor"):
        SparsePlan(indices=torch.zeros(1, 2, 1, 8), dense_from=torch.tensor([30, 40]))
    with pytest.raises(SpecdecError, match=r"dense_from must be a \(B,\) tensor with B = 2 .* got shape \(3,\)"):
        SparsePlan(indices=torch.zeros(1, 2, 1, 8, dtype=torch.long), dense_from=torch.tensor([1, 2, 3]))
    SparsePlan(indices=torch.zeros(1, 2, 1, 8, dtype=torch.int32), dense_from=torch.tensor([30, 40]))


def test_parts_of_the_wrong_kind_are_refused_when_the_engine_is_built():
    """A selector passed as the drafter, a selector's name passed to the drafter, or ``gamma="4"`` failed only inside
    the first ``generate`` (``AttributeError`` / ``TypeError``); each is one error at construction now."""
    from conftest import make_tiny

    from specdec import SparseSelfDrafter, SpeculativeEngine
    from specdec.registry import SELECTORS

    model = make_tiny("llama")
    sel = SELECTORS.build("sliding_window", budget=16)
    with pytest.raises(SpecdecError, match=r"^drafter must be a specdec Drafter .* got SlidingWindow: use "
                                           r"drafter=SparseSelfDrafter\(model, selector\)\.$"):
        SpeculativeEngine(model, drafter=sel)
    with pytest.raises(SpecdecError, match=r"^verifier must be a specdec Verifier .* got str"):
        SpeculativeEngine(model, drafter=SparseSelfDrafter(model, sel), verifier="full")
    with pytest.raises(SpecdecError, match=r"got str: use e\.g\. SELECTORS\.build\('sliding_window', budget=256\)\.$"):
        SparseSelfDrafter(model, "sliding_window")
    for bad in ("4", 4.0, True):
        with pytest.raises(SpecdecError, match=r"^gamma must be an int \(got "):
            SpeculativeEngine(model, drafter=SparseSelfDrafter(model, sel), gamma=bad)
    import numpy as np

    assert SpeculativeEngine(model, drafter=SparseSelfDrafter(model, sel), gamma=np.int64(3)).gamma == 3


def test_a_selector_takes_its_config_fields_as_keywords():
    """``SlidingWindow(budget=64)`` (the natural guess) was a ``TypeError``; every registered selector now takes its
    config's fields as keywords, the same config as ``SELECTORS.build``; a bad field is one line naming it."""
    from specdec import SlidingWindow
    from specdec.registry import SELECTORS

    for name in SELECTORS.names():
        built = SELECTORS.build(name, budget=32, sinks=2)
        assert type(built)(budget=32, sinks=2).config == built.config, name
    with pytest.raises(SpecdecError, match=r"^SlidingWindow config: field 'budget' input should be greater than 0"):
        SlidingWindow(budget=0)
    with pytest.raises(SpecdecError, match=r"^SlidingWindow config: unknown field 'bugdet'; known: budget, "):
        SlidingWindow(bugdet=64)
    with pytest.raises(SpecdecError, match=r"pass a config or its fields as keywords \(budget\), not both"):
        SlidingWindow(SlidingWindow.Config(budget=8), budget=64)


def test_explicit_sinks_and_recent_beyond_an_explicit_budget_are_refused_not_clamped():
    """``SlidingWindow(budget=8, sinks=32)`` kept 8 sinks and no window without a word (the plan clamps sinks and
    recent to each sequence's budget); a selector config now refuses what ``PipelineConfig`` refused, and the
    pipeline hands a selector only the budget fields it was given, so its defaults (4 + 16) still shrink to a
    small budget (``--budget 8``) as they do to a short sequence's ratio budget."""
    from specdec import SlidingWindow
    from specdec.presets import PipelineConfig
    from specdec.registry import SELECTORS

    with pytest.raises(SpecdecError, match=r"^SlidingWindow config: sinks 32 exceeds the budget 8; use sinks \+ "
                                           r"recent <= budget"):
        SlidingWindow(budget=8, sinks=32)
    with pytest.raises(SpecdecError, match=r"sinks 4 \+ recent 6 exceed the budget 8"):
        SlidingWindow(budget=8, sinks=4, recent=6)
    assert SlidingWindow(budget=8).config.sinks == 4  # the defaults: no error, the plan shrinks them
    assert SlidingWindow(budget=8, sinks=2).config.recent == 16  # a default beside a given value shrinks as well
    assert SlidingWindow(budget=20, sinks=4, recent=16).config.budget == 20  # exactly the budget: fine
    assert SlidingWindow(budget_ratio=0.01, sinks=32).config.sinks == 32  # a ratio budget varies per sequence
    with pytest.raises(SpecdecError, match=r"^pipeline config: sinks 32 exceeds the budget 8"):
        PipelineConfig.make(method="magicdec", budget=8, sinks=32)
    cfg = PipelineConfig.make(method="vegas", budget=8)
    assert cfg.budget_kwargs() == {"budget": 8}
    for name in SELECTORS.names():  # every built-in selector builds from a small pipeline budget
        SELECTORS.build(name, **cfg.budget_kwargs())
    ratio = PipelineConfig.make(method="vegas")
    assert SELECTORS.build("sliding_window", **ratio.budget_kwargs()).config.budget_ratio == ratio.budget_ratio == 0.05


def test_a_hand_composed_engine_names_its_parts_in_the_stats():
    """``stats.method`` of ``SpeculativeEngine(model, SparseSelfDrafter(model, SlidingWindow(...)))`` was
    ``"SparseSelfDrafter"`` whatever the selector; it names the selector (and a verifier other than the full one)."""
    from specdec import SlidingWindow, SparseSelfDrafter, SpeculativeEngine
    from specdec.testing import tiny_model
    from specdec.verifiers import SparseVerifier

    m = tiny_model("qwen2")
    eng = SpeculativeEngine(m, SparseSelfDrafter(m, SlidingWindow(budget=16)), gamma=2, eos_token_id=-1)
    assert eng.generate([list(range(3, 40))], max_new_tokens=3).stats.method == "SparseSelfDrafter(SlidingWindow)"
    from specdec.registry import SELECTORS
    hybrid = SELECTORS.build("hybrid_srh", budget=24, target_heads=[(0, 0)], draft_heads=[], layer_map=[])
    sparse = SpeculativeEngine(m, SparseSelfDrafter(m, SlidingWindow(budget=16)), SparseVerifier(m, hybrid))
    assert sparse.method == "SparseSelfDrafter(SlidingWindow)+SparseVerifier(HybridSRHSelector)"
    # a plain selector is not a sparse verifier's (it failed at the first pass with AttributeError 'check_heads')
    with pytest.raises(SpecdecError, match=r"^SparseVerifier needs Dustin's hybrid selector .*SlidingWindow has no "
                                           r"check_heads, .*SELECTORS.build\('hybrid_srh'"):
        SparseVerifier(m, SlidingWindow(budget=24))
    assert SpeculativeEngine(m).method == "dense"
    assert SpeculativeEngine(m, SparseSelfDrafter(m, SlidingWindow(budget=16)), method="mine").method == "mine"
