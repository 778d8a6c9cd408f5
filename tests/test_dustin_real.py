"""Dustin on the embedded SmolLM2-135M (real prompt, early-exit drafter): full budget == dense; SRH artifact identity."""

import pytest

from specdec import EarlyExitDrafter, PipelineConfig, SpeculativeEngine, build_engine
from specdec.errors import SpecdecError
from specdec.srh import load_srh, model_identity, save_srh

from conftest import real_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prompt(smol):
    return real_prompts(smol.tokenizer, 256, count=1)


def test_full_budget_equals_dense_on_the_embedded_model(smol, prompt):
    dense = SpeculativeEngine(smol, method="dense")
    pre = dense.prefill(prompt)
    ref = dense.generate(prompt, max_new_tokens=8, prefilled=pre).tokens
    cfg = PipelineConfig.make(method="dustin", gamma=3, budget=4096, options=dict(draft_layers=9))
    res = build_engine(smol, cfg).generate(prompt, max_new_tokens=8, prefilled=pre)
    assert res.tokens == ref and res.stats.lossless is False


def test_srh_artifact_is_bound_to_the_draft_depth(tmp_path, smol):
    d9, d6 = EarlyExitDrafter(smol, 9), EarlyExitDrafter(smol, 6)
    path = save_srh(tmp_path / "srh.json", dict(target=model_identity(smol), draft=d9.identity(), target_heads=[[20, 0]],
                                                draft_heads=[[8, 1]], layer_map=d9.layer_map(30), m_ratio=0.5))
    assert load_srh(path, smol, d9)["draft"]["early_exit_layers"] == 9
    with pytest.raises(SpecdecError, match="early exit at 9"):
        load_srh(path, smol, d6)
