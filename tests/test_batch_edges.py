"""Batch edge cases: each batch output equals the same prompts run alone (and, for lossless methods, dense).

Ragged prompt lengths, sequences hitting EOS at different iterations (one finishing while the others
continue), a batch where every draft is rejected, budgets of 1, ``max_new_tokens = 1`` — over every
method in ``method_names()``. Near-lossless methods (``RunStats.lossless`` False) must still be
batch-invariant; only the equality with dense decoding is skipped for them.
"""

from __future__ import annotations

import pytest
import torch

from specdec import Drafter, PipelineConfig, SpeculativeEngine, build_engine, method_names

from conftest import make_tiny

PROMPTS = [list(range(3, 8)), [5, 9, 17, 33, 2, 8] * 7, [11, 4] * 30, [60]]  # 5, 42, 60, 1 tokens
N_NEW = 10


@pytest.fixture(scope="module")
def model():
    return make_tiny("qwen3", seed=7)


@pytest.fixture(scope="module")
def dense(model):
    eng = SpeculativeEngine(model, eos_token_id=-1)
    return [eng.generate([p], max_new_tokens=N_NEW).tokens[0] for p in PROMPTS]


def make(model, method, eos=-1, **kw):
    cfg = PipelineConfig.make(method=method, gamma=kw.pop("gamma", 3), budget=kw.pop("budget", 8),
                              sinks=kw.pop("sinks", 1), recent=kw.pop("recent", 2))
    return build_engine(model, cfg, eos_token_id=eos)


def check(model, method, dense_ref, eos=-1, n_new=N_NEW, prompts=PROMPTS, **kw):
    eng = make(model, method, eos=eos, **kw)
    batch = eng.generate(prompts, max_new_tokens=n_new)
    alone = [eng.generate([p], max_new_tokens=n_new).tokens[0] for p in prompts]
    assert batch.tokens == alone, f"{method}: batch != alone"
    if batch.stats.lossless:
        assert batch.tokens == dense_ref, f"{method}: != dense"
    return batch


def cut_at(seq: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(seq):
        if t in eos:
            return seq[: i + 1]
    return seq


def eos_tokens(dense) -> list[int]:
    """Two tokens that end the sequences at different steps (some never), so one finishes first."""
    firsts: dict[int, dict[int, int]] = {}
    for b, seq in enumerate(dense):
        for i, t in enumerate(seq):
            firsts.setdefault(t, {}).setdefault(b, i)
    # prefer a token some sequences never emit, then the earliest one
    cands = sorted(firsts, key=lambda t: (len(firsts[t]) == len(dense), min(firsts[t].values())))
    return cands[:2]


@pytest.mark.parametrize("method", method_names())
def test_ragged_batch_with_eos_at_different_iterations(model, dense, method):
    """Ragged prompts (1 to 60 tokens); sequences end at different iterations, the others continue;
    the batch equals each prompt alone (and dense decoding for lossless methods)."""
    eos = eos_tokens(dense)
    ref = [cut_at(d, set(eos)) for d in dense]
    lengths = [len(r) for r in ref]
    assert len(set(lengths)) > 1 and max(lengths) == N_NEW, "the fixture must finish sequences at different steps"
    res = check(model, method, ref, eos=eos)
    for out in res.tokens:
        assert len(out) == N_NEW or out[-1] in eos  # stops exactly at EOS, nothing after it


@pytest.mark.parametrize("method", method_names())
def test_max_new_tokens_one_and_budget_one(model, dense, method):
    """max_new_tokens = 1 gives the target's first token; the smallest budget (one cached entry
    visible to the drafter, plus its own drafts) is still exact."""
    one = make(model, method).generate(PROMPTS, max_new_tokens=1)
    assert one.tokens == [d[:1] for d in dense]
    res = make(model, method, budget=1, sinks=0, recent=1).generate(PROMPTS, max_new_tokens=N_NEW)
    if res.stats.lossless:
        assert res.tokens == dense
    else:
        assert [len(t) for t in res.tokens] == [N_NEW] * len(PROMPTS)


def test_eos_as_the_very_first_token(model, dense):
    """A sequence whose first token is EOS ends at once; the others go on."""
    eos = dense[0][0]
    ref = [cut_at(d, {eos}) for d in dense]
    for method in method_names():
        res = make(model, method, eos=eos).generate(PROMPTS, max_new_tokens=6)
        assert res.tokens[0] == [eos]
        if res.stats.lossless:
            assert res.tokens == [r[:6] for r in ref], method


class WrongDrafter(Drafter):
    """Always proposes a token the target never emits: every draft is rejected."""

    def __init__(self, token: int) -> None:
        self.token = token

    def draft(self, state, gamma):
        B = state.lengths.shape[0]
        tokens = torch.full((B, gamma), self.token, dtype=torch.long, device=state.lengths.device)
        if state.sampling.greedy:
            return tokens, None
        V = state.model.dims.vocab_size
        q = torch.nn.functional.one_hot(tokens, V).float()
        return tokens, q


def test_every_draft_rejected(model, dense):
    never = next(t for t in range(model.dims.vocab_size) if all(t not in d for d in dense))
    eng = SpeculativeEngine(model, WrongDrafter(never), gamma=4, eos_token_id=-1)
    res = eng.generate(PROMPTS, max_new_tokens=N_NEW)
    assert res.tokens == dense
    assert res.stats.mean_accepted_length == 1.0
    assert res.stats.acceptance_per_position == [0.0] * 4
    assert res.stats.iterations == N_NEW - 1  # one token per iteration, after the prefill's first


def test_every_draft_rejected_when_sampling(model, dense):
    """Rejection sampling with a one-hot q on a token of zero target probability never accepts it.

    top-k = 1 makes the warped target one-hot on its argmax, so the token that never is the argmax
    on the dense path has probability 0 at every step: each draft must be rejected and the output
    must be the dense one.
    """
    from specdec.sampling import SamplingConfig

    cfg = SamplingConfig(temperature=1.0, top_k=1, seed=0)
    never = next(t for t in range(model.dims.vocab_size) if all(t not in d for d in dense))
    eng = SpeculativeEngine(model, WrongDrafter(never), gamma=3, sampling=cfg, eos_token_id=-1)
    res = eng.generate(PROMPTS, max_new_tokens=N_NEW)
    assert res.stats.mean_accepted_length == 1.0
    assert res.tokens == dense


def test_identical_prompts_in_a_batch_agree(model, dense):
    """Copies of one prompt give the same greedy output in every row (no cross-row leakage)."""
    for method in method_names():
        res = make(model, method).generate([PROMPTS[1], PROMPTS[1], PROMPTS[2]], max_new_tokens=6)
        assert res.tokens[0] == res.tokens[1]
        if res.stats.lossless:
            assert res.tokens[0] == dense[1][:6] and res.tokens[2] == dense[2][:6]
