"""ModelDrafter / EarlyExitDrafter: own cache, catch-up and rollback; drafts equal the draft's own greedy decoding."""

import pytest
import torch

from specdec import SpeculativeEngine
from specdec.drafters import EarlyExitDrafter, ModelDrafter, truncated_model
from specdec.errors import SpecdecError

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 9]


@pytest.fixture(scope="module")
def target():
    return make_tiny("llama", seed=0, num_hidden_layers=3)


@pytest.fixture(scope="module")
def draft():
    return make_tiny("llama", seed=1)


class Recording(ModelDrafter):
    """Records (prefix incl. pending, drafts) of every draft call."""

    calls: list

    def draft(self, state, gamma):
        tokens, q = super().draft(state, gamma)
        for b in range(tokens.shape[0]):
            if bool(state.active[b]):
                self.calls.append((list(state.tokens[b]), tokens[b].tolist()))
        return tokens, q


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_model_drafter_drafts_equal_its_own_greedy_decoding(target, draft, gamma):
    d = Recording(draft)
    d.calls = []
    res = SpeculativeEngine(target, d, gamma=gamma, eos_token_id=-1).generate(PROMPTS, max_new_tokens=14)
    dense = SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=14).tokens
    assert res.tokens == dense  # full verification stays lossless
    assert len(d.calls) >= 4
    for prefix, drafts in d.calls:
        # the drafted tokens continue the prefix exactly as the draft model alone would (after rollbacks)
        assert drafts == _continue(draft, prefix, gamma)


def _continue(model, prefix_with_pending, gamma):
    """Greedy continuation of ``prefix_with_pending`` (its last token is fed, not predicted)."""
    out = SpeculativeEngine(model, eos_token_id=-1).generate([prefix_with_pending], max_new_tokens=gamma).tokens[0]
    return out


def test_self_drafting_accepts_everything_and_catches_up(draft):
    # draft == target: every draft is accepted, so the drafter must catch up on the last draft each time
    # (γ fixed: τ = γ + 1 is the fixed-γ mechanics checked here; the adaptive controller could shrink γ on timing)
    res = SpeculativeEngine(draft, ModelDrafter(draft), gamma=3, eos_token_id=-1,
                            adaptive=False).generate(PROMPTS, max_new_tokens=13)
    assert res.tokens == SpeculativeEngine(draft, eos_token_id=-1).generate(PROMPTS, max_new_tokens=13).tokens
    assert res.stats.mean_accepted_length == pytest.approx(4.0)


def test_model_drafter_ragged_batch_equals_alone(target, draft):
    eng = SpeculativeEngine(target, ModelDrafter(draft), gamma=3, eos_token_id=-1)
    batch = eng.generate(PROMPTS, max_new_tokens=10).tokens
    assert batch == [eng.generate([p], max_new_tokens=10).tokens[0] for p in PROMPTS]


def test_early_exit_shares_weights_and_is_lossless_with_full_verification(target):
    view = truncated_model(target, 2)
    assert view.dims.n_layers == 2 and target.dims.n_layers == 3
    assert view.hf.get_input_embeddings().weight.data_ptr() == target.hf.get_input_embeddings().weight.data_ptr()
    ee = EarlyExitDrafter(target, 2)
    res = SpeculativeEngine(target, ee, gamma=3, eos_token_id=-1).generate(PROMPTS, max_new_tokens=12)
    assert res.tokens == SpeculativeEngine(target, eos_token_id=-1).generate(PROMPTS, max_new_tokens=12).tokens
    assert target.dims.n_layers == 3  # the target itself is untouched


def test_early_exit_drafts_equal_truncated_model_greedy(target):
    d = EarlyExitDrafter(target, 1)
    calls = []
    orig = d.draft

    def rec(state, gamma):
        toks, q = orig(state, gamma)
        calls.append((list(state.tokens[0]), toks[0].tolist()))
        return toks, q

    d.draft = rec
    SpeculativeEngine(target, d, gamma=3, eos_token_id=-1).generate(PROMPTS[:1], max_new_tokens=10)
    for prefix, drafts in calls:
        assert drafts == _continue(truncated_model(target, 1), prefix, 3)


def test_lookahead_signal_is_the_draft_heads_attention(target, draft):
    d = ModelDrafter(draft, heads={1: [0, 3]})
    eng = SpeculativeEngine(target, d, gamma=3, eos_token_id=-1)
    eng.generate(PROMPTS, max_new_tokens=4)
    la = d.lookahead
    assert la.shape[0] == 2 and la.dtype == torch.float32
    # softmax rows sum to 1: γ rows × 2 heads
    assert la.sum(1).tolist() == pytest.approx([3 * 2.0] * 2, rel=1e-4)


def test_bad_drafter_input_is_one_clear_error(target, draft):
    with pytest.raises(SpecdecError, match="draft_layers"):
        EarlyExitDrafter(target, 3)
    with pytest.raises(SpecdecError, match="profile-srh"):
        ModelDrafter(draft).set_heads({7: [0]})
