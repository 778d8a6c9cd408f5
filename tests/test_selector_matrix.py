"""The shared selector matrix: every registered drafting selector (built-in or entry-point plugin)
runs through :func:`specdec.testing.check_selector` — the same kit a plugin author runs from the
installed wheel (``pytest --pyargs specdec.testing``).

It checks what the draft attention reads per layer, sequence, KV head and draft step (inside the
verified tokens, no duplicates, exactly the budget, sinks and recent kept) and that greedy
speculative output equals dense decoding (ragged batch = each prompt alone; a full budget accepts
every draft). Selectors that guide verification (``role = "verify"``) are excluded.
"""

import pytest
import torch

from specdec import SlidingWindow
from specdec.selectors.base import BudgetConfig
from specdec.testing import check_selector, drafting_selectors, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("qwen2", seed=3)


@pytest.mark.parametrize("name", drafting_selectors())
def test_selector_conformance(name, model):
    check_selector(name, model)


class _DropsASink(SlidingWindow):
    def plan(self, cache, lengths):
        p = super().plan(cache, lengths)
        p.indices = torch.where(p.indices == 0, torch.full_like(p.indices, -1), p.indices)
        return p


class _Duplicates(SlidingWindow):
    def plan(self, cache, lengths):
        p = super().plan(cache, lengths)
        p.indices[..., -1] = p.indices[..., -2]
        return p


class _OneShort(SlidingWindow):
    def plan(self, cache, lengths):
        p = super().plan(cache, lengths)
        p.indices[..., -1] = -1  # the last selected (not sink, not recent) entry dropped: the budget is not used
        return p


class _PeeksAhead(SlidingWindow):
    def plan(self, cache, lengths):
        p = super().plan(cache, lengths)
        p.indices[..., -1] = lengths.view(1, -1, 1)  # the first unverified position
        return p


class _NaNScores(SlidingWindow):
    def score(self, cache, lengths):  # a plugin dividing by a zero norm: every plan is still a valid set
        s = super().score(cache, lengths).clone()
        s[..., 5] = float("nan")
        return s


@pytest.mark.parametrize("cls, match", [
    (_DropsASink, "sinks"), (_Duplicates, "twice"), (_PeeksAhead, "outside"), (_OneShort, "the budget is"),
    (_NaNScores, r"_NaNScores.score\(\) is NaN for sequence 0 at position 5 \(1 NaN of 40"),
])
def test_the_matrix_catches_broken_selectors(cls, match, model):
    with pytest.raises(AssertionError, match=match):
        check_selector(lambda b: cls(BudgetConfig(budget=b, sinks=2, recent=4)), model, budgets=(8,))
