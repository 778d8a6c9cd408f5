"""The attention metadata object, declared capabilities and the one score-recording mechanism."""

import pytest
import torch

from specdec import AttentionMetadata, ScoreRequest, SparsePlan, SpecdecError
from specdec.attention.recording import head_attention
from specdec.attention.reference import ReferenceBackend

from conftest import make_tiny


class NoSparse(ReferenceBackend):
    name = "no-sparse"
    supports_sparse = False


class NoPerRow(ReferenceBackend):
    name = "no-per-row"
    supports_per_row_scores = False


@pytest.fixture(scope="module")
def tiny():
    return make_tiny("llama", seed=1)


def _plan(B, K=3):
    return SparsePlan(indices=torch.arange(K).view(1, 1, 1, K).expand(1, B, 1, K).clone(), dense_from=torch.full((B,), 6))


def test_missing_capability_is_refused_by_name(tiny):
    ids, lens = torch.tensor([[1, 2]]), torch.tensor([6])
    cache = tiny.new_cache(1, 16)
    with tiny.using_backend(NoSparse()):
        tiny.forward(ids, cache, lens)  # dense: fine
        with pytest.raises(SpecdecError, match=r"'no-sparse' attention backend .* lacks supports_sparse"):
            tiny.forward(ids, cache, lens, plan=_plan(1))
    with tiny.using_backend(NoPerRow()):
        tiny.forward(ids, cache, lens, scores=ScoreRequest(rows=[0, 1]))
        with pytest.raises(SpecdecError, match="lacks supports_per_row_scores"):
            tiny.forward(ids, cache, lens, scores=ScoreRequest(rows=[0, 1], per_row=True))
    assert "capture_safe" in ReferenceBackend().refusal(["capture_safe"])
    assert ReferenceBackend().refusal(["supports_sparse", "supports_scores"]) is None


def test_capture_safety_follows_the_options():
    from specdec import BACKENDS

    assert not BACKENDS.build("torch").capture_safe and BACKENDS.build("torch", static=True).capture_safe
    assert type(BACKENDS.build("torch")).capture_safe is False  # the class default; static=True sets it per instance


def test_metadata_carries_each_layer_and_the_score_request(tiny):
    seen = []

    class Spy(ReferenceBackend):
        def attend(self, q, k_cache, v_cache, meta):
            seen.append(meta)
            return super().attend(q, k_cache, v_cache, meta)

    cache = tiny.new_cache(2, 16)
    req = ScoreRequest(rows=[0, 2], kind="softmax", layers=[1], query_heads={1: [3]})
    with tiny.using_backend(Spy()):
        tiny.forward(torch.tensor([[1, 2, 3], [4, 5, 6]]), cache, torch.tensor([0, 4]), plan=_plan(2), scores=req)
    assert [m.layer for m in seen] == [0, 1]
    assert seen[0].score_rows is None and list(seen[1].score_rows) == [0, 2]
    assert seen[1].score_kind == "softmax" and list(seen[1].score_heads) == [3]
    assert all(m.sparse and m.scale == pytest.approx(16 ** -0.5) for m in seen)
    assert list(req.scores) == [1] and req.scores[1].shape == (2, 2, 16)


def test_context_request_records_dense_heads_beside_a_sparse_forward(tiny):
    """source='context': every head's dense attention over the whole context, whatever the plan."""
    qs = {}

    class Spy(ReferenceBackend):
        def attend(self, q, k_cache, v_cache, meta):
            qs[meta.layer] = (q, k_cache.clone(), meta)
            return super().attend(q, k_cache, v_cache, meta)

    cache = tiny.new_cache(1, 16)
    tiny.forward(torch.tensor([[5, 6, 7, 8, 9, 10, 11]]), cache, torch.tensor([0]))
    each = ScoreRequest(rows=[0, 1], kind="softmax", heads="each", source="context")
    group = ScoreRequest(rows=[0, 1], kind="softmax", heads="group", source="context", query_heads={0: [1, 2], 1: [0]})
    with tiny.using_backend(Spy()):
        tiny.forward(torch.tensor([[1, 2]]), cache, torch.tensor([7]), plan=_plan(1), scores=[each, group])
    for layer, (q, k, meta) in qs.items():
        want = head_attention(q, k, meta.lengths, range(4), meta.scale, rows=[0, 1])  # (1, 4, 16)
        torch.testing.assert_close(each.scores[layer], want)
        assert float(want[..., 5].sum()) > 0  # outside the plan (0..2) and before dense_from (6): still recorded
    g = group.scores
    torch.testing.assert_close(g[0], torch.stack([each.scores[0][:, 1], each.scores[0][:, 2]], 1))
    torch.testing.assert_close(g[1][:, 0], each.scores[1][:, 0]) and torch.testing.assert_close(g[1][:, 1], torch.zeros_like(g[1][:, 1]))


def test_bad_requests_say_what_to_change():
    with pytest.raises(ValueError, match="kind='softmax'"):
        ScoreRequest(rows=[0], source="context")
    with pytest.raises(ValueError, match="source='context'"):
        ScoreRequest(rows=[0], heads="each")
    m = AttentionMetadata(torch.tensor([3]), 0.5, score_rows=[0], score_per_row=True)
    assert m.needs() == ["supports_scores", "supports_per_row_scores"]
    assert m.without_scores().needs() == [] and m.replace(window=4).window == 4
