"""Drafters: the target itself with sparse attention (self-speculation)."""

from __future__ import annotations

import torch

from specdec.interfaces import Drafter, KVSelector, ScoreRequest
from specdec.models import SpecdecModel
from specdec.sampling import check_finite, choose


class SparseSelfDrafter(Drafter):
    """Draft with the target model attending only to a :class:`KVSelector`'s plan.

    The plan is built once per iteration (``select`` phase) and reused by all γ draft steps;
    tokens drafted in this iteration are always visible (``plan.dense_from``). Draft K/V are
    written into the target's cache and overwritten by the verification pass.
    """

    def __init__(self, model: SpecdecModel, selector: KVSelector) -> None:
        self.model = model
        self.selector = selector

    def prefill(self, state) -> None:
        self.selector.reset(state.cache)
        self.selector.on_verify(None, state.lengths)

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        B = state.lengths.shape[0]
        with state.timer("select"):
            plan = self.selector.plan(state.cache, state.lengths)
        tokens, probs = [], []
        cur = state.pending
        for i in range(gamma):
            logits = self.model.forward(cur.view(B, 1), state.cache, state.lengths + i, plan=plan)[:, -1]
            check_finite(logits, "drafter")
            cur, p = choose(logits, state.sampling, state.generator)
            tokens.append(cur)
            probs.append(p)
        q = torch.stack(probs, dim=1) if probs[0] is not None else None
        return torch.stack(tokens, dim=1), q

    def score_request(self, gamma: int) -> ScoreRequest | None:
        return self.selector.score_request(gamma)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.selector.on_verify(scores, state.lengths)
