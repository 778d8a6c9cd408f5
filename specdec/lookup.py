"""Prompt-lookup drafting combined with another drafter (Dustin's ``lookup`` option).

Prompt lookup decoding (Saxena, 2023; vLLM's ``ngram`` speculator, SGLang's lookahead): the draft is what
followed the most recent earlier occurrence of the sequence's last ``n`` tokens in its own context (prompt +
emitted tokens), trying ``n = max_n .. min_n``. Code and greedy text repeat themselves, so the continuation
of a match is often exactly what the target writes next, at no model cost.

Combined policy, per sequence and iteration: **a match → its continuation, else the inner drafter's
drafts** (an EAGLE head, a layer-skipping draft, ...). The inner drafter always runs (its state, e.g. the
EAGLE head's cache, stays in step, and a batch keeps one fixed-shape draft forward); only its proposed
tokens are replaced. When the continuation is shorter than γ (the match ends near the end of the context)
it is extended periodically (the repetition it found goes on), so a match always gives γ tokens.

Lossless either way: a lookup draft is a deterministic proposal, ``q = one-hot`` in rejection sampling
(:func:`specdec.sampling.accept` then accepts with probability ``p(x)`` and resamples from ``p`` without ``x``).
With sparse verification (Dustin), the lookahead signal still comes from the inner drafter's attention.

Host cost: per sequence one dict per ``n`` mapping an n-gram to the end of its latest occurrence, built at
prefill and extended with the tokens emitted since the last draft (the engine reads them anyway).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.errors import SpecdecError
from specdec.interfaces import Drafter, ScoreRequest


def check_lookup(min_n: int, max_n: int) -> None:
    """``1 <= min_n <= max_n``, or one line naming the fix."""
    if not 1 <= min_n <= max_n:
        raise SpecdecError(f"prompt lookup needs 1 <= lookup_min <= lookup_max (got lookup_min={min_n}, "
                           f"lookup_max={max_n}); set lookup_min=0 to turn it off.")


class NgramIndex:
    """For one token list: ``n``-gram → end index of its latest occurrence that is not the list's suffix."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.ns = range(max_n, min_n - 1, -1)
        self.maps: dict[int, dict[tuple, int]] = {n: {} for n in self.ns}
        self.done = 0  # end indices < done are indexed

    def update(self, toks: list[int]) -> None:
        """Index every n-gram ending at ``done .. len(toks) - 2`` (the last position is the query's end)."""
        for n, mp in self.maps.items():
            for e in range(max(self.done, n - 1), len(toks) - 1):
                mp[tuple(toks[e - n + 1 : e + 1])] = e
        self.done = max(self.done, len(toks) - 1)

    def propose(self, toks: list[int], gamma: int) -> tuple[list[int], int]:
        """Up to ``gamma`` tokens after the latest earlier occurrence of the longest matching suffix, and
        that suffix's length ``n`` (``([], 0)``: no match)."""
        self.update(toks)
        L = len(toks)
        for n in self.ns:
            if L < n + 1:
                continue
            e = self.maps[n].get(tuple(toks[L - n :]))
            if e is not None:
                out = []
                for i in range(gamma):  # periodic extension past the end: toks[L + m] = toks[e + 1 + m]
                    j = e + 1 + i
                    out.append(toks[j] if j < L else out[j - L])
                return out, n
        return [], 0

    def copy(self) -> "NgramIndex":
        c = NgramIndex.__new__(NgramIndex)
        c.ns, c.maps, c.done = self.ns, {n: dict(m) for n, m in self.maps.items()}, self.done
        return c


class LookupDrafter(Drafter):
    """Prompt lookup (n-gram from the context) first, ``inner`` where no n-gram matches.

    Args:
        inner: the drafter used where the context has no match (its other attributes are forwarded).
        min_n: shortest n-gram tried.
        max_n: longest n-gram tried (first).
        trust_n: a match of at least ``trust_n`` tokens is taken as is; a shorter one only where its first
            token equals the inner drafter's first draft (checked on the device, no host read), so a chance
            short match does not replace a draft the inner drafter is sure of. ``trust_n <= min_n``: always.
    """

    def __init__(self, inner: Drafter, min_n: int = 2, max_n: int = 4, trust_n: int | None = None) -> None:
        check_lookup(min_n, max_n)
        self.inner, self.min_n, self.max_n = inner, min_n, max_n
        self.trust_n = min_n if trust_n is None else trust_n
        self._index: list[NgramIndex] = []
        #: per round: sequences drafting, sequences whose drafts came from the context (``stats()``)
        self.rounds = 0
        self._matched: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:  # draft_model, lookahead, heads, n_layers, layer_map, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def dense_steps_ok(self) -> bool:  # type: ignore[override]
        return self.inner.dense_steps_ok

    def prefill(self, state) -> None:
        self.inner.prefill(state)
        memo: dict[tuple, NgramIndex] = {}
        self._index = []
        for toks in state.tokens:  # equal prompts (a benchmark's batch) are indexed once
            key = tuple(toks)
            if key not in memo:
                memo[key] = NgramIndex(self.min_n, self.max_n)
                memo[key].update(toks)
            self._index.append(memo[key].copy())

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        drafts, q = self.inner.draft(state, gamma)  # (B, γ), (B, γ, V) or None
        B = drafts.shape[0]
        # host lists, then one tensor each: per-sequence tensor writes cost ~4 small torch calls per sequence
        # (B = 64, 2 of 3 sequences matching: 0.56-0.89 ms -> 0.11 ms of host time per draft on the dev CPU)
        look_l, mask_l, trusted_l = [], [], []
        for b in range(B):
            prop, n = self._index[b].propose(state.tokens[b], gamma)
            look_l.append(prop + [0] * (gamma - len(prop)))
            mask_l.append([True] * len(prop) + [False] * (gamma - len(prop)))
            trusted_l.append([bool(prop) and n >= self.trust_n])
        self.rounds += B
        if not any(row[0] for row in mask_l):
            return drafts, q
        dev = drafts.device
        pin = dev.type == "cuda"
        look, mask, trusted = (torch.tensor(x, dtype=dt, pin_memory=pin).to(dev, non_blocking=True)
                               for x, dt in ((look_l, torch.long), (mask_l, torch.bool), (trusted_l, torch.bool)))
        mask = mask & (trusted | (look[:, :1] == drafts[:, :1]))  # (B, γ)
        self._matched = mask[:, 0].sum() + (self._matched if self._matched is not None else 0)  # device: no read
        drafts = torch.where(mask, look, drafts)
        self.inner.drafts_replaced(state, drafts, mask)
        if q is not None:  # a lookup draft is deterministic: q = one-hot
            one = torch.nn.functional.one_hot(look, q.shape[-1]).to(q.dtype)
            q = torch.where(mask.unsqueeze(-1), one, q)
        return drafts, q

    def score_request(self, gamma: int) -> ScoreRequest | None:
        return self.inner.score_request(gamma)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.inner.on_verify(state, scores)

    def stats(self, reset: bool = False) -> dict:
        """Share of (sequence, round) drafts taken from the context (one host read)."""
        out = dict(rounds=self.rounds, matched=int(self._matched) if self._matched is not None else 0)
        out["matched_share"] = out["matched"] / max(self.rounds, 1)
        if reset:
            self.rounds, self._matched = 0, None
        return out


def base_drafter(drafter: Drafter) -> Drafter:
    """The draft model's drafter under a :class:`LookupDrafter` (``drafter`` itself if not wrapped)."""
    return drafter.inner if isinstance(drafter, LookupDrafter) else drafter
