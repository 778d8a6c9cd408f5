"""Rejection sampling preserves the target distribution; warping matches its definition."""

import pytest
import torch
from scipy import stats

from specdec.sampling import SamplingConfig, accept, warp


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    n = counts.sum()
    assert counts[~keep].sum() == 0, "sampled a token with zero target probability"
    expected = probs[keep].double() / probs[keep].double().sum() * n
    return stats.chisquare(counts[keep].double().numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("cfg", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.8),
                                 SamplingConfig(temperature=1.3, top_k=4)])
def test_first_token_follows_target(cfg):
    """Batch of N independent copies: the first emitted token must be distributed as p_0."""
    V, gamma, N = 8, 3, 40000
    g = torch.Generator().manual_seed(0)
    t_logits = torch.randn(1, gamma + 1, V, generator=g) * 2
    d_logits = torch.randn(1, gamma, V, generator=g) * 2
    q = warp(d_logits, cfg).expand(N, gamma, V)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(N, gamma)
    acc = accept(drafts, t_logits.expand(N, -1, -1), cfg, q, g)
    first = torch.where(acc.n_accepted > 0, drafts[:, 0], acc.next_token)
    p0 = warp(t_logits[0, 0], cfg)
    p = _chi2(torch.bincount(first, minlength=V), p0)
    assert p > 1e-3, p


def test_second_token_follows_target_conditional():
    """Given the first token, the second must follow p_1 (the target row after that token)."""
    cfg = SamplingConfig(temperature=1.0)
    V, gamma, N = 6, 2, 60000
    g = torch.Generator().manual_seed(1)
    t_logits = torch.randn(1, gamma + 1, V, generator=g)
    q = warp(torch.randn(1, gamma, V, generator=g), cfg).expand(N, gamma, V)
    # condition on draft 0 being token 2 (the target rows then describe the continuation of 2)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(N, gamma)
    drafts[:, 0] = 2
    q = q.clone()
    q[:, 0] = torch.nn.functional.one_hot(torch.tensor(2), V).float()
    acc = accept(drafts, t_logits.expand(N, -1, -1), cfg, q, g)
    ok = acc.n_accepted >= 1  # first token was 2 (accepted with prob p_0(2))
    second = torch.where(acc.n_accepted[ok] >= 2, drafts[ok, 1], acc.next_token[ok])
    assert abs(ok.float().mean() - warp(t_logits[0, 0], cfg)[2]) < 0.01
    assert _chi2(torch.bincount(second, minlength=V), warp(t_logits[0, 1], cfg)) > 1e-3


def test_greedy_accepts_longest_matching_prefix():
    V = 5
    target = torch.full((2, 4, V), -5.0)
    best = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 1]])
    target.scatter_(2, best.unsqueeze(-1), 5.0)
    drafts = torch.tensor([[1, 2, 0], [1, 0, 1]])
    acc = accept(drafts, target, SamplingConfig())
    assert acc.n_accepted.tolist() == [2, 0]
    assert acc.next_token.tolist() == [3, 0]


def test_top_p_keeps_smallest_prefix():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    p = warp(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(p, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    p = warp(logits, SamplingConfig(temperature=1.0, top_k=3))
    torch.testing.assert_close(p, torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
