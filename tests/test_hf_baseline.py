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
