"""Verifiers: the target model scoring γ+1 rows with full attention (lossless)."""

from __future__ import annotations

import torch

from specdec.interfaces import ScoreRequest, Verifier
from specdec.models import SpecdecModel


class FullVerifier(Verifier):
    """Dense attention over the whole cache; emits the requested scores in the same pass."""

    lossless = True

    def __init__(self, model: SpecdecModel) -> None:
        self.model = model

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        return self.model.forward(tokens, state.cache, state.lengths, scores=scores)
