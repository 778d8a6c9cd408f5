"""Losslessness, statistically: sampled outputs of every lossless method follow the target distribution.

On a tiny random model with a 12-token vocabulary the exact (warped) target probability of every
3-token continuation is computed by enumeration (1 + 12 + 144 forwards); thousands of sequences are
then sampled in one batch (``N`` copies of the prompt, one ``generate`` call, fixed seed) and compared
with a chi-square goodness-of-fit test (cells with expected count < 5 pooled) and the total-variation
distance. A negative control (samples at another temperature) shows the test has the power to fail.
Greedy equality with dense decoding on real prompts runs on the embedded model.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy import stats

from specdec import PipelineConfig, build_engine, method_names
from specdec.engine import Prefilled
from specdec.presets import get_method
from specdec.sampling import SamplingConfig, warp

from conftest import make_tiny, real_prompts

V = 12  # vocabulary
K = 3  # generated tokens whose joint law is checked
N = 2000  # sampled sequences per (method, setting)
PROMPT = [3, 7, 1, 9, 4, 4, 10, 2, 8, 5, 11, 0] * 3
SETTINGS = {
    "T1": dict(temperature=1.0),
    "T0.7-top_p0.8": dict(temperature=0.7, top_p=0.8),
    "T1.3-top_k5": dict(temperature=1.3, top_k=5),
}


def lossless_methods() -> list[str]:
    return [m for m in method_names() if get_method(m).lossless]


@pytest.fixture(scope="module")
def model():
    m = make_tiny("llama", seed=5, vocab_size=V)
    with torch.no_grad():
        # a target with a few likely tokens per step (entropy ≈ 1.8 nats of ln 12 ≈ 2.5) and peaked
        # attention, so a sparse draft really differs from it (τ ≈ 2 of 4): rejections are exercised
        m.hf.lm_head.weight.mul_(4.0)
        for layer in m.hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(3.0)
            layer.self_attn.k_proj.weight.mul_(3.0)
    return m


@pytest.fixture(scope="module")
def next_logits(model):
    """``{prefix: logits (V,)}`` for every prefix of up to K-1 generated tokens (HF forward, no cache)."""
    out = {}
    for k in range(K):
        prefixes = list(itertools.product(range(V), repeat=k))
        ids = torch.tensor([PROMPT + list(p) for p in prefixes])
        with torch.no_grad():
            logits = model.hf(input_ids=ids).logits[:, -1].float()
        out.update({p: logits[i] for i, p in enumerate(prefixes)})
    return out


def exact_joint(next_logits, cfg: SamplingConfig) -> torch.Tensor:
    """``(V,) * K`` float64 probability of each K-token continuation under the warped target."""
    joint = torch.zeros((V,) * K, dtype=torch.float64)
    for seq in itertools.product(range(V), repeat=K):
        p = 1.0
        for k in range(K):
            p *= float(warp(next_logits[seq[:k]], cfg)[seq[k]])
            if p == 0.0:
                break
        joint[seq] = p
    return joint / joint.sum()


@pytest.fixture(scope="module")
def prefilled(model):
    """One prefill of the prompt, shared by the N copies (the cache rows are identical)."""
    from specdec import SpeculativeEngine

    one = SpeculativeEngine(model).prefill([PROMPT])
    return Prefilled(ids=[PROMPT] * N, k=one.k.expand(-1, N, -1, -1, -1), v=one.v.expand(-1, N, -1, -1, -1),
                     last_logits=one.last_logits.expand(N, -1))


def sample_counts(model, prefilled, method: str, cfg: SamplingConfig) -> torch.Tensor:
    pc = PipelineConfig.make(method=method, gamma=3, budget=6, sinks=1, recent=1, sampling=cfg)
    eng = build_engine(model, pc, eos_token_id=-1)
    res = eng.generate([PROMPT] * N, max_new_tokens=K, prefilled=prefilled)
    assert all(len(t) == K for t in res.tokens)
    seqs = torch.tensor(res.tokens)
    flat = (seqs * torch.tensor([V ** (K - 1 - k) for k in range(K)])).sum(1)
    return torch.bincount(flat, minlength=V ** K).double().view((V,) * K), res.stats


def goodness_of_fit(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float, int]:
    """Chi-square p-value (cells with expected < 5 pooled into one), TV distance, number of cells."""
    c, p = counts.flatten(), probs.flatten()
    n = float(c.sum())
    assert float(c[p == 0].sum()) == 0, "a continuation with zero target probability was sampled"
    exp = p * n
    big = exp >= 5
    obs_cells = torch.cat([c[big], c[~big & (p > 0)].sum().view(1)])
    exp_cells = torch.cat([exp[big], exp[~big & (p > 0)].sum().view(1)])
    if float(exp_cells[-1]) < 5:  # fold a tiny pooled cell into the smallest big one
        obs_cells[-2 if len(obs_cells) > 1 else 0] += obs_cells[-1]
        exp_cells[-2 if len(exp_cells) > 1 else 0] += exp_cells[-1]
        obs_cells, exp_cells = obs_cells[:-1], exp_cells[:-1]
    pval = float(stats.chisquare(obs_cells.numpy(), exp_cells.numpy() * obs_cells.sum().item() / exp_cells.sum().item()).pvalue)
    tv = 0.5 * float((c / n - p).abs().sum())
    return pval, tv, len(obs_cells)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("method", lossless_methods())
def test_sampled_continuations_follow_the_target(model, next_logits, prefilled, method, setting):
    cfg = SamplingConfig(**SETTINGS[setting], seed=1234)
    probs = exact_joint(next_logits, cfg)
    counts, st = sample_counts(model, prefilled, method, cfg)
    pval, tv, cells = goodness_of_fit(counts, probs)
    # the first token alone, where the cells are large and TV is tight
    p1, tv1, _ = goodness_of_fit(counts.sum(dim=(1, 2)), probs.sum(dim=(1, 2)))
    print(f"\nSTAT {method:12s} {setting:15s} N={N} cells={cells} p={pval:.3g} TV={tv:.3f} "
          f"first-token p={p1:.3g} TV={tv1:.3f} tau={st.mean_accepted_length:.2f}")
    assert pval > 1e-3 and p1 > 1e-3, (pval, p1)
    assert tv1 < 0.03
    if method != "dense":  # drafts were really rejected, so the rejection-sampling path was exercised
        assert st.mean_accepted_length < 3.5, st.mean_accepted_length


class _Scripted:
    """An adaptive controller that follows a fixed script of γ_t per iteration (0 = a dense step)."""

    def __init__(self, script):
        self.script, self.i = script, 0

    def next_gamma(self):
        self.i += 1
        return self.script[(self.i - 1) % len(self.script)]

    def observe_round(self, *a, **kw):
        pass

    def observe_dense(self, *a, **kw):
        pass


@pytest.mark.parametrize("script", [[0], [1, 0], [2], [0, 1]], ids=str)
def test_adaptive_gamma_and_dense_steps_follow_the_target(model, next_logits, prefilled, script):
    """Rounds of a varying γ and dense fall-back steps (specdec.adaptive) still sample the target's law."""
    cfg = SamplingConfig(**SETTINGS[list(SETTINGS)[0]], seed=99)
    pc = PipelineConfig.make(method="magicdec", gamma=3, budget=6, sinks=1, recent=1, sampling=cfg)
    eng = build_engine(model, pc, eos_token_id=-1)
    eng._controller = lambda gamma: _Scripted(script)
    res = eng.generate([PROMPT] * N, max_new_tokens=K, prefilled=prefilled)
    seqs = torch.tensor(res.tokens)
    flat = (seqs * torch.tensor([V ** (K - 1 - k) for k in range(K)])).sum(1)
    counts = torch.bincount(flat, minlength=V ** K).double().view((V,) * K)
    pval, tv, _ = goodness_of_fit(counts, exact_joint(next_logits, cfg))
    print(f"\nSTAT adaptive script={script} p={pval:.3g} TV={tv:.3f} dense_steps={res.stats.dense_steps}")
    assert pval > 1e-3, pval
    assert (res.stats.dense_steps > 0) == (0 in script)


def test_negative_control_detects_a_wrong_distribution(model, next_logits, prefilled):
    """Samples at temperature 1.0 checked against the T=0.8 law must fail: the test has power."""
    counts, _ = sample_counts(model, prefilled, "dense", SamplingConfig(temperature=1.0, seed=7))
    pval, tv, _ = goodness_of_fit(counts, exact_joint(next_logits, SamplingConfig(temperature=0.8)))
    print(f"\nSTAT negative-control (T=1.0 samples vs T=0.8 law) p={pval:.3g} TV={tv:.3f}")
    assert pval < 1e-6


# -- greedy equality on real prompts (embedded model) --------------------------------------------
@pytest.mark.slow
def test_every_lossless_method_equals_dense_on_real_prompts(smol):
    prompts = real_prompts(smol.tokenizer, 384, count=2)
    prompts[1] = prompts[1][:200]  # ragged
    dense = build_engine(smol, PipelineConfig.make(method="dense"))
    pre = dense.prefill(prompts)
    ref = dense.generate(prompts, max_new_tokens=24, prefilled=pre).tokens
    for method in lossless_methods():
        cfg = PipelineConfig.make(method=method, gamma=4, budget_ratio=0.1)
        res = build_engine(smol, cfg).generate(prompts, max_new_tokens=24, prefilled=pre)
        assert res.tokens == ref, method
