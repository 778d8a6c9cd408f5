"""The embedded SmolLM2-135M on real long prompts: magicdec == dense == HF generate, token for token."""

import pytest
import torch

from specdec import PipelineConfig, build_engine

from conftest import real_prompts

pytestmark = pytest.mark.slow
N_NEW = 24


@pytest.fixture(scope="module")
def prompts(smol):
    return real_prompts(smol.tokenizer, 1024, count=2)


@pytest.fixture(scope="module")
def hf_ref(smol, prompts):
    outs = []
    for p in prompts:
        o = smol.hf.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False)
        outs.append(o[0, len(p):].tolist())
    return outs


def test_dense_engine_equals_hf_generate(smol, prompts, hf_ref):
    res = build_engine(smol, PipelineConfig.make(method="dense")).generate(prompts, max_new_tokens=N_NEW)
    assert res.tokens == hf_ref


@pytest.mark.parametrize("budget_ratio", [0.05, 0.1])
def test_magicdec_equals_hf_generate_batch_and_alone(smol, prompts, hf_ref, budget_ratio):
    cfg = PipelineConfig.make(method="magicdec", gamma=4, budget_ratio=budget_ratio)
    eng = build_engine(smol, cfg)
    ragged = [prompts[0], prompts[1][:700]]
    batch = eng.generate(ragged, max_new_tokens=N_NEW)
    assert batch.tokens[0] == hf_ref[0]
    alone = eng.generate([ragged[1]], max_new_tokens=N_NEW)
    assert batch.tokens[1] == alone.tokens[0]
    assert batch.stats.mean_accepted_length > 1.0
