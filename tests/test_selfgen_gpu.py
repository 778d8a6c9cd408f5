"""Recipe v4/v6's generated rows on a GPU (skipped only where no CUDA device is present): :func:`self_generate` runs
the target's forwards as CUDA graphs there, and its rows equal the same loop run eagerly, with every step captured
(none refused) and replayed."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytestmark = [pytest.mark.gpu]
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from specdec import BACKENDS, train_eagle  # noqa: E402

from conftest import make_tiny  # noqa: E402


def test_generated_rows_replay_graphs_and_equal_eager(monkeypatch):
    m = make_tiny("llama", seed=3, num_hidden_layers=3)
    m.hf.cuda()
    torch.manual_seed(1)
    ids = torch.randint(0, m.hf.config.vocab_size, (5, 48))
    seen = []
    enable = type(m).enable_cuda_graphs

    def spy(self, *a, **k):
        enable(self, *a, **k)
        seen.append(self._graphs)

    monkeypatch.setattr(type(m), "enable_cuda_graphs", spy)
    captured, done = train_eagle.self_generate(m, ids, 16, 5, 2)
    assert done == 5 and len(seen) == 1
    g = seen[0]
    assert g.captures >= 2 and g.replays > 20 and not g.uncapturable, (g.captures, g.replays, g.uncapturable)
    assert m._graphs is None  # switched off again after the rows
    monkeypatch.setattr(train_eagle, "_generation_mode", lambda sm: contextlib.nullcontext())
    with m.using_backend(BACKENDS.build("triton")):  # the same attention, not captured
        eager, _ = train_eagle.self_generate(m, ids, 16, 5, 2)
    assert torch.equal(captured, eager)
