"""Sinks + a recent window: StreamingLLM's attention, MagicDec-Stream's drafter."""

from __future__ import annotations

import torch

from specdec.cache import KVCache
from specdec.registry import SELECTORS
from specdec.selectors.base import BudgetConfig, BudgetSelector


class SlidingWindowConfig(BudgetConfig):
    """Budget = sinks + window; the window is whatever the budget leaves after the sinks."""


@SELECTORS.register("sliding_window", SlidingWindowConfig)
class SlidingWindow(BudgetSelector):
    """Keep the first ``sinks`` tokens and the most recent ``budget - sinks`` (Xiao et al., 2023;
    MagicDec, Chen et al., 2024). Query-agnostic: the score of a position is the position itself.
    """

    Config = SlidingWindowConfig

    def score(self, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        return recency(cache, lengths)


def recency(cache: KVCache | None, lengths: torch.Tensor) -> torch.Tensor:
    """``(1, B, 1, L)`` score = the position itself, over the cache capacity (no host read), or over
    the longest sequence when there is no cache."""
    L = cache.capacity if cache is not None else int(lengths.max())
    pos = torch.arange(L, device=lengths.device, dtype=torch.float32)
    return pos.view(1, 1, 1, L).expand(1, lengths.shape[0], 1, L)
