"""Greedy drafts as one chain (:meth:`SpecdecModel.greedy_steps`, :func:`specdec.graphs.greedy_chain_steps`).

On a GPU with CUDA graphs a greedy sparse draft's γ steps replay as one graph whose body is
:func:`~specdec.graphs.greedy_chain_steps` (the capture itself is checked in ``tests/test_gpu_graphs.py``). Here, on
the CPU: that body gives the tokens and flags of stepping through :meth:`SpecdecModel.forward`, with and without a plan,
and the self-speculative drafter's greedy path goes through ``greedy_steps``."""

import pytest
import torch

from specdec import BACKENDS, PipelineConfig, SparsePlan, build_engine
from specdec.graphs import greedy_chain_steps

from conftest import make_tiny


def _model():
    m = make_tiny("llama", seed=11)
    m.backend = BACKENDS.build("torch", static=True)
    return m


def _stepped(m, first, cache, L, gamma, plan):
    """The per-step loop the drafter ran before: forward, argmax, feed back."""
    cur, out = first, []
    for i in range(gamma):
        cur = m.forward(cur.view(-1, 1), cache, L + i, plan=plan)[:, -1].argmax(-1)
        out.append(cur)
    return torch.stack(out, 1)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("gamma", [1, 4])
def test_chain_body_equals_stepping(sparse, gamma):
    m = _model()
    cache = m.new_cache(2, 96)
    cache.k.normal_(generator=torch.Generator().manual_seed(1))
    cache.v.normal_(generator=torch.Generator().manual_seed(2))
    L = torch.tensor([40, 70])
    plan = SparsePlan(indices=torch.randint(0, 39, (1, 2, 1, 10), generator=torch.Generator().manual_seed(3)),
                      dense_from=L.clone()) if sparse else None
    first = torch.tensor([5, 9])
    ref = _stepped(m, first, cache, L, gamma, plan)
    body, flags = greedy_chain_steps(lambda x, at: m._eager_forward(x, cache, at, plan, (), 0, static=True),
                                     first.view(2, 1), L, gamma)
    tokens, flags2 = m.greedy_steps(first, cache, L, gamma, plan=plan)
    assert body.shape == (2, gamma) and torch.equal(body, ref) and torch.equal(tokens, ref)
    assert flags.tolist() == flags2.tolist() == [False, False]


@pytest.mark.parametrize("gamma", [0, -1, 2.0, True])
def test_greedy_steps_refuses_a_bad_gamma_in_one_line(gamma):
    from specdec.errors import SpecdecError

    m = _model()
    with pytest.raises(SpecdecError, match=r"^greedy_steps needs gamma >= 1 steps \(got .*\); use gamma=4 or so\.$"):
        m.greedy_steps(torch.tensor([1]), m.new_cache(1, 32), torch.tensor([4]), gamma)


def test_chain_flags_nonfinite_logits():
    """A NaN in the weights reaches the flags of both paths (the engine raises from them at its one read)."""
    m = _model()
    with torch.no_grad():
        m.hf.lm_head.weight[3, 0] = float("nan")
    cache = m.new_cache(1, 32)
    L = torch.tensor([4])
    _, flags = greedy_chain_steps(lambda x, at: m._eager_forward(x, cache, at, None, (), 0, static=True),
                                  torch.tensor([[1]]), L, 2)
    _, flags2 = m.greedy_steps(torch.tensor([1]), cache, L, 2)
    assert flags.tolist() == flags2.tolist() == [True, False]


def test_greedy_self_draft_goes_through_greedy_steps(monkeypatch):
    """MagicDec's greedy drafts are ``greedy_steps`` calls, and the output is still dense's. With γ fixed the next
    draft starts ahead (after the drafter's ``on_verify``, before the host emits): one draft per iteration plus the
    one queued after the last; without the early start one per iteration, and the same tokens."""
    m = _model()
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 16).tokens
    calls = []
    real = type(m).greedy_steps

    def spy(self, *a, **kw):
        calls.append(a[3] if len(a) > 3 else kw["gamma"])
        return real(self, *a, **kw)

    monkeypatch.setattr(type(m), "greedy_steps", spy)
    cfg = PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=4, adaptive=False)
    for ahead in (True, False):
        calls.clear()
        eng = build_engine(m, cfg, eos_token_id=-1)
        eng.drafter.drafts_ahead = ahead
        out = eng.generate(prompts, 16)
        assert out.tokens == dense
        assert set(calls) == {3} and len(calls) == out.stats.iterations + ahead


def test_the_next_plan_is_built_in_on_verify(monkeypatch):
    """The self-speculative drafter builds the next draft's plan in ``on_verify`` (queued before the host waits for
    the iteration's transfer); ``draft`` builds one only when it has none (the first draft after the prefill)."""
    from specdec.planner import Planner

    m = _model()
    prompts = [list(range(3, 60)), [4, 8, 15, 16, 23, 42] * 7]
    cfg = PipelineConfig.make(method="magicdec", gamma=3, budget=12, sinks=2, recent=4, adaptive=False)
    eng = build_engine(m, cfg, eos_token_id=-1)
    eng.drafter.drafts_ahead = False  # (the early draft would put the draft inside on_verify's window too)
    where, built = [None], []
    real_plan = Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, *a: (built.append(where[0]), real_plan(self, *a))[1])
    for hook in ("on_verify", "draft"):
        real = getattr(eng.drafter, hook)

        def spy(*a, _real=real, _hook=hook):
            where[0] = _hook
            try:
                return _real(*a)
            finally:
                where[0] = None

        setattr(eng.drafter, hook, spy)
    out = eng.generate(prompts, 16)
    assert out.tokens == build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(
        prompts, 16).tokens
    assert built.count("draft") == 1 and built.count("on_verify") == out.stats.iterations
