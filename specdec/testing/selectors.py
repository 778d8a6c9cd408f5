"""Selector conformance: what the draft attention reads, and lossless greedy output end to end.

The plan checks look at what every layer's attention *reads* at every draft step (through
``plan.indices_for``, where query-aware plans such as Quest pick their entries), not only at
``plan.indices``. (The recording helpers follow the stronger selector matrix written for issue 12.)
"""

from __future__ import annotations

from typing import Callable

import torch

from specdec.interfaces import KVSelector

#: ragged prompts (57 and 48 tokens): sequences of a batch must not see each other's lengths
PROMPTS = [list(range(3, 60)), [7, 1, 4, 9, 22, 31] * 8]
NEW_TOKENS = 14
GAMMA = 3


def drafting_selectors() -> list[str]:
    """Registered selectors that plan draft steps (``role`` other than ``"verify"``), plugins included."""
    from specdec.registry import SELECTORS

    return [n for n in SELECTORS.names() if getattr(SELECTORS.get(n).cls, "role", "draft") == "draft"]


def record_visible_sets(selector: KVSelector) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """Make every plan of ``selector`` record what the attention route reads from it.

    Returns the (growing) list of ``(layer, lengths (B,), indices (B, H_kv or 1, K))``, one entry per
    ``plan.indices_for`` call, i.e. per layer and draft step.
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


def check_visible_set(selector: KVSelector, lengths: torch.Tensor, idx: torch.Tensor, n_kv_heads: int,
                      where: str = "") -> None:
    """One layer's read ``idx`` ``(B, H_kv or 1, K)`` for verified ``lengths`` ``(B,)``: per sequence and
    KV head every entry is a verified position, none repeats, there are exactly ``min(budget, length)``
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
            assert set(range(s)) <= set(vis), f"{at}: the {s} sinks are not all kept"
            assert set(range(L - r, L)) <= set(vis), f"{at}: the {r} recent tokens are not all kept"
            assert len(vis) == k, f"{at}: plan holds {len(vis)} entries, the budget is {k}"


def check_recorded(selector: KVSelector, seen, n_layers: int, n_kv_heads: int) -> None:
    """Every recorded read is a valid visible set, and every layer read a plan at every draft step."""
    assert seen, "the drafter never read a plan"
    layers = [layer for layer, _, _ in seen]
    assert len(layers) % n_layers == 0 and all(layers.count(i) == len(layers) // n_layers for i in range(n_layers)), \
        "not every layer read the plan at every draft step"
    for layer, lengths, idx in seen:
        check_visible_set(selector, lengths, idx, n_kv_heads, where=f"layer {layer}")


def check_scores(selector: KVSelector, cache, lengths: torch.Tensor) -> None:
    """A :class:`~specdec.selectors.base.BudgetSelector`'s ``score()`` holds no NaN at a verified position: top-k
    of NaN scores is a valid plan of arbitrary positions (the plan checks pass, the selection means nothing)."""
    from specdec.selectors.base import BudgetSelector

    if not isinstance(selector, BudgetSelector) or type(selector).score is BudgetSelector.score:
        return  # not a scoring selector (Quest plans pages itself)
    s = selector.score(cache, lengths)
    for b in range(lengths.shape[0]):
        nan = torch.isnan(s[:, min(b, s.shape[1] - 1), :, : int(lengths[b])].float())
        if bool(nan.any()):
            pos = int(nan.nonzero()[0, -1])
            raise AssertionError(f"{type(selector).__name__}.score() is NaN for sequence {b} at position {pos} "
                                 f"({int(nan.sum())} NaN of {nan.numel()} verified scores); return numbers: top-k "
                                 "over NaN picks arbitrary positions")


def check_selector(make: Callable[[int], KVSelector] | str, model=None, budgets=(8, 24, 10_000)) -> None:
    """The selector conformance matrix; raises ``AssertionError`` naming the first broken rule.

    Args:
        make: ``budget -> selector`` (``sinks=2, recent=4`` recommended), or a registered selector name.
        model: a :class:`~specdec.models.SpecdecModel` (default: :func:`~specdec.testing.tiny_model`).
        budgets: budgets to run; one should cover the whole context (every draft is then accepted).
    """
    from specdec.drafters import SparseSelfDrafter
    from specdec.engine import SpeculativeEngine
    from specdec.testing.models import tiny_model

    if isinstance(make, str):
        from specdec.registry import SELECTORS

        name = make
        make = lambda budget: SELECTORS.build(name, budget=budget, sinks=2, recent=4)  # noqa: E731
    model = model or tiny_model("qwen2")
    d = model.dims
    dense = SpeculativeEngine(model, eos_token_id=-1).generate(PROMPTS, max_new_tokens=NEW_TOKENS).tokens
    for budget in budgets:
        selector = make(budget)
        seen = record_visible_sets(selector)
        # γ fixed (adaptive=False): a full budget must accept every one of the GAMMA drafts of every round; the
        # adaptive controller (on by default) may draft fewer or run dense steps, decided on wall time
        eng = SpeculativeEngine(model, SparseSelfDrafter(model, selector), gamma=GAMMA, eos_token_id=-1,
                                adaptive=False)
        res = eng.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
        assert res.tokens == dense, f"budget {budget}: greedy speculative output differs from dense decoding"
        check_recorded(selector, seen, d.n_global, d.n_kv_heads)
        if budget >= max(map(len, PROMPTS)) + NEW_TOKENS:  # the draft sees everything: it is the dense model
            acc = res.stats.acceptance_per_position
            assert acc == [1.0] * GAMMA, f"budget {budget} covers the context but drafts were rejected: {acc}"
        alone = eng.generate(PROMPTS[1:], max_new_tokens=NEW_TOKENS)
        assert alone.tokens[0] == res.tokens[1], f"budget {budget}: a sequence differs in a batch and alone"
    # a plan made outside the engine, read by every layer with random queries (ragged lengths)
    selector = make(16)
    seen = record_visible_sets(selector)
    cache = model.new_cache(2, 128)
    torch.manual_seed(0)
    cache.k.normal_()
    cache.v.normal_()
    lengths = torch.tensor([40, 90], device=model.device)
    selector.reset(cache)
    selector.on_verify(None, lengths)
    check_scores(selector, cache, lengths)
    plan = selector.plan(cache, lengths)
    q = torch.randn(2, d.n_heads, 1, d.head_dim, generator=torch.Generator().manual_seed(0)).to(model.device)
    for layer in range(d.n_global):
        plan.indices_for(layer, q)
    check_recorded(selector, seen, d.n_global, d.n_kv_heads)
