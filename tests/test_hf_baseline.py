"""The Hugging Face baselines of ``specdec bench`` run HF as a transformers user would (issue 14)."""

from __future__ import annotations

import specdec.models as models
from specdec.bench import hf_generate_tps

from conftest import make_tiny


def test_hf_generate_runs_detached_from_the_specdec_route(monkeypatch):
    """Through specdec's route every layer's attention is a ``torch.compiler.disable`` call (a graph
    break per layer in HF's compiled static-cache step): the baseline must not go through it, and the
    model must be routed again afterwards."""
    m = make_tiny("llama")
    assert m.hf.config._attn_implementation == "specdec"
    calls = []
    real = models._specdec_attention
    monkeypatch.setattr(models, "_specdec_attention",
                        lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    from transformers import AttentionInterface

    import torch

    AttentionInterface.register("specdec", models._specdec_attention)  # the wrapper above is what HF would call
    seen = []
    gen = m.hf.generate

    def generate(*a, **k):
        n = len(calls)
        out = gen(*a, **k)
        seen.append((m.hf.config._attn_implementation, len(calls) - n))
        return out

    m.hf.generate = generate
    try:
        r = hf_generate_tps(m, list(range(3, 20)), batch=2, max_new_tokens=4, repeats=1)
    finally:
        del m.hf.generate
        AttentionInterface.register("specdec", torch.compiler.disable(real))  # as register_attention() does
    assert len(seen) == 4 and all(impl != "specdec" and n == 0 for impl, n in seen), seen
    assert r["attn_implementation"] != "specdec" and {"median", "min", "max"} <= set(r)  # (timing: not tested)
    assert m.hf.config._attn_implementation == "specdec"  # attached again: specdec forwards still route
    out = m.forward(torch.tensor([[3, 4]]), m.new_cache(1, 8), torch.zeros(1, dtype=torch.long))
    assert out.shape[-1] == m.dims.vocab_size


def test_hf_generate_continues_the_benchmarks_windows(monkeypatch):
    """``bench --windows K --hf-baseline``: Hugging Face's batch is the same K windows the methods continue (sequence b
    continues window b mod K), not B copies of the first; prompts of different lengths are refused in one line."""
    import pytest
    import torch

    from specdec.errors import SpecdecError

    m = make_tiny("llama")
    wins = [list(range(3, 12)), list(range(20, 29)), list(range(40, 49))]
    batches = []
    gen = m.hf.generate

    def generate(x, **k):
        batches.append(x.tolist())
        return gen(x, **k)

    m.hf.generate = generate
    try:
        hf_generate_tps(m, wins, batch=5, max_new_tokens=2, repeats=1)
        hf_generate_tps(m, wins[0], batch=2, max_new_tokens=2, repeats=1)  # one prompt: every sequence continues it
    finally:
        del m.hf.generate
    assert batches[0] == [wins[0], wins[1], wins[2], wins[0], wins[1]] and len(batches) == 8
    assert batches[-1] == [wins[0], wins[0]]
    with pytest.raises(SpecdecError, match="different lengths"):
        hf_generate_tps(m, [wins[0], wins[1][:5]], batch=2, max_new_tokens=2, repeats=1)
    assert torch.is_tensor(m.forward(torch.tensor([[3]]), m.new_cache(1, 4), torch.zeros(1, dtype=torch.long)))
