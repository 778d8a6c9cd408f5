"""KeyNorm: keep the cached keys with the smallest L2 norm (kvpress' KnormPress idea)."""

from __future__ import annotations

import torch
from pydantic import Field

from specdec.cache import KVCache
from specdec.selectors.base import BudgetConfig, BudgetSelector


class KeyNormConfig(BudgetConfig):
    """The shared budget fields plus one option."""

    per_layer: bool = Field(default=True, description="a plan per layer (else one for all layers)")


class KeyNormSelector(BudgetSelector):
    """Low-norm keys draw much of the attention mass (Devoto et al., 2024)."""

    Config = KeyNormConfig

    def score(self, cache: KVCache, lengths: torch.Tensor) -> torch.Tensor:
        L = int(lengths.max())
        norms = cache.k[:, :, :, :L].float().norm(dim=-1)  # (N, B, H_kv, L)
        if not self.config.per_layer:
            norms = norms.mean(dim=0, keepdim=True)  # (1, B, H_kv, L): one plan for all layers
        return -norms  # small norm = important
