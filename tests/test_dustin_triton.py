"""Dustin's per-layer verification sets through the Triton kernels: attention (sparse plan per layer and KV head)
and the page bounds, against the reference backend and the torch page scoring (interpreter on the CPU)."""

from __future__ import annotations

import os

if os.environ.get("SPECDEC_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton", reason="the Triton kernels need the optional 'triton' package")

from specdec import PipelineConfig, build_engine  # noqa: E402
from specdec.cuda.triton_backend import TritonBackend, TritonConfig  # noqa: E402

from conftest import make_tiny  # noqa: E402

PROMPTS = [list(range(3, 45)), [5, 9, 17, 33, 2, 8] * 6]


@pytest.mark.skipif(os.environ.get("SPECDEC_TEST_DEVICE", "cpu") != "cpu", reason="the tiny model runs on the CPU")
def test_layer_sets_triton_attention_and_page_kernels_match_reference():
    model = make_tiny("qwen2", seed=2, num_hidden_layers=2)

    def run(kernels):
        cfg = PipelineConfig.make(method="dustin", gamma=3, budget=20, sinks=2, recent=4,
                                  options=dict(layer_share=0.5, page_size=4, page_kernels=kernels, margin=0))
        eng = build_engine(model, cfg, eos_token_id=-1)
        margins = []
        inner = eng.verifier._margin_valve

        def valve(*a, **k):
            out = inner(*a, **k)
            margins.append(eng.verifier.last_margin.clone())
            return out

        eng.verifier._margin_valve = valve
        return eng.generate(PROMPTS, max_new_tokens=4).tokens, torch.stack(margins)

    ref_tokens, ref_m = run("torch")
    with model.using_backend(TritonBackend(TritonConfig(block_n=16, num_splits=3))):
        tri_tokens, tri_m = run("triton")
    assert tri_tokens == ref_tokens
    torch.testing.assert_close(tri_m, ref_m, atol=1e-3, rtol=1e-4)  # the sparse logits themselves agree
