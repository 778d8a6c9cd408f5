"""Numerics: fully masked rows, -inf / +inf / NaN logits, fp16/bf16 overflow in attention scores, NaN in a
model's output. Every case either computes the right thing or fails with a clear error — never a
silent wrong token.
"""

from __future__ import annotations

import os

import pytest
import torch

from specdec import BACKENDS, PipelineConfig, SpeculativeEngine, build_engine, method_names
from specdec.attention.reference import ReferenceBackend
from specdec.sampling import SamplingConfig, accept, check_finite, choose, warp
from specdec.interfaces import AttentionMetadata

from conftest import make_tiny

PROMPT = list(range(3, 25))


def runnable_backends(dtype: torch.dtype) -> list[str]:
    """Backends that run ``dtype`` on the CPU. Building one must not fail: the test extras install every
    optional dependency, so a backend that breaks at build time fails collection loudly instead of dropping
    out of these tests; a backend that declines a dtype says why (``validate``), checked in test_validation."""
    return [name for name in BACKENDS.names() if BACKENDS.build(name).validate(torch.device("cpu"), dtype) is None]


def dense_attention(q, k, v, lengths, scale):
    """float64 causal attention over the cache, the ground truth."""
    B, H, T, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = H // Hkv
    kk = k.double().repeat_interleave(G, dim=1)
    vv = v.double().repeat_interleave(G, dim=1)
    logits = torch.einsum("bhtd,bhld->bhtl", q.double(), kk) * scale
    pos = torch.arange(L)
    row = lengths.view(B, 1, 1, 1) + torch.arange(T).view(1, 1, T, 1)
    logits = logits.masked_fill(pos.view(1, 1, 1, L) > row, float("-inf"))
    return torch.einsum("bhtl,bhld->bhtd", torch.softmax(logits, -1), vv)


# -- fully masked rows ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", runnable_backends(torch.float32))
def test_fully_masked_row_gives_zeros_not_nan(name):
    """A row whose plan is empty and whose dense_from lies beyond it sees nothing: output 0."""
    if name == "triton" and not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("triton needs a GPU or TRITON_INTERPRET=1")
    be = BACKENDS.build(name)
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D, L = 2, 4, 2, 1, 16, 32
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    lengths = torch.tensor([10, 20])
    plan = torch.full((B, Hkv, 4), -1, dtype=torch.long)
    plan[1] = torch.tensor([0, 1, 2, 3])  # sequence 1 sees four entries; sequence 0 nothing at all
    out, scores = be.attend(q, k, v, AttentionMetadata(lengths, D ** -0.5, plan_indices=plan, dense_from=torch.tensor([L, L]), score_rows=[0]))
    assert torch.isfinite(out).all(), f"{name}: NaN/inf for a fully masked row"
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.isfinite(scores).all() and float(scores[0].abs().sum()) == 0.0


# -- overflow in low precision -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_scores_beyond_the_dtype_range_do_not_overflow(dtype):
    """q·k of 40·40·64 = 102,400 overflows fp16 (max 65,504): backends accumulate scores in fp32."""
    names = runnable_backends(dtype)
    if not names:
        pytest.skip(f"no backend runs {dtype} on the CPU")
    g = torch.Generator().manual_seed(1)
    B, H, Hkv, T, D, L = 1, 4, 2, 3, 64, 24
    q = (40 + torch.rand(B, H, T, D, generator=g)).to(dtype)
    k = (40 + torch.rand(B, Hkv, L, D, generator=g)).to(dtype)
    v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
    lengths = torch.tensor([L - T])
    ref = dense_attention(q, k, v, lengths, 1.0)  # scale 1: the logits themselves exceed the range
    for name in names:
        if name == "triton" and not os.environ.get("TRITON_INTERPRET"):
            continue
        out, scores = BACKENDS.build(name).attend(q, k, v, AttentionMetadata(lengths, 1.0, score_rows=[0, T - 1], score_kind="logits"))
        assert out.dtype == dtype
        assert torch.isfinite(out).all(), f"{name}: overflow in {dtype}"
        torch.testing.assert_close(out.double(), ref, atol=3e-2, rtol=3e-2, msg=f"{name} in {dtype}")
        assert scores.dtype == torch.float32 and torch.isfinite(scores).all()
        assert float(scores.max()) > 65504  # the logits really are beyond fp16


# -- -inf / +inf / NaN logits ------------------------------------------------------------------
def test_minus_inf_logits_are_masked_tokens():
    logits = torch.tensor([[0.5, float("-inf"), 2.0, float("-inf"), 1.0]])
    check_finite(logits, "test")  # legitimate
    for cfg in (SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.5, top_p=0.9),
                SamplingConfig(temperature=2.0, top_k=2)):
        p = warp(logits, cfg)
        assert torch.isfinite(p).all() and float(p[0, 1]) == 0.0 and float(p[0, 3]) == 0.0
        g = torch.Generator().manual_seed(0)
        toks = torch.multinomial(p.expand(2000, -1), 1, replacement=True, generator=g).flatten()
        assert not ((toks == 1) | (toks == 3)).any()
    assert int(choose(logits, SamplingConfig(), None)[0]) == 2


@pytest.mark.parametrize("bad", ["nan", "posinf", "all-neginf"])
def test_unusable_logits_raise(bad):
    logits = torch.randn(3, 7)
    if bad == "nan":
        logits[1, 2] = float("nan")
    elif bad == "posinf":
        logits[2, 0] = float("inf")
    else:
        logits[0] = float("-inf")
    with pytest.raises(FloatingPointError, match="logits") as exc:
        check_finite(logits, "verifier")
    assert "\n" not in str(exc.value) and str(exc.value).startswith("verifier ")


def test_draft_of_a_minus_inf_target_token_is_always_rejected():
    V, gamma, B = 6, 3, 500
    g = torch.Generator().manual_seed(2)
    t = torch.randn(1, gamma + 1, V, generator=g).expand(B, -1, -1).clone()
    t[:, 0, 4] = float("-inf")
    drafts = torch.full((B, gamma), 4)
    q = torch.nn.functional.one_hot(drafts, V).float()
    acc = accept(drafts, t, SamplingConfig(temperature=1.0), q, g)
    assert int(acc.n_accepted.max()) == 0 and not (acc.next_token == 4).any()
    acc = accept(drafts, t, SamplingConfig())
    assert int(acc.n_accepted.max()) == 0


# -- NaN / inf in a model ----------------------------------------------------------------------
def nan_model(where: str):
    m = make_tiny("llama", seed=4)
    with torch.no_grad():
        if where == "mlp":
            m.hf.model.layers[1].mlp.down_proj.weight[3, 5] = float("nan")
        elif where == "head":
            m.hf.lm_head.weight[7, 0] = float("inf")
        elif where == "embedding":  # only one token's row is bad: the error comes when that token is fed
            m.hf.model.embed_tokens.weight[PROMPT[-1]] = float("nan")
    return m


@pytest.mark.parametrize("where", ["mlp", "head", "embedding"])
def test_nan_in_the_model_is_a_clear_error_for_every_method(where):
    m = nan_model(where)
    for method in method_names():
        eng = build_engine(m, PipelineConfig.make(method=method, budget=8), eos_token_id=-1)
        with pytest.raises(FloatingPointError, match="NaN or \\+inf logits") as exc:
            eng.generate([PROMPT], max_new_tokens=6)
        assert "\n" not in str(exc.value)


def test_nan_reached_only_during_decoding_is_caught():
    """The prompt is clean; the model emits a token whose embedding is NaN → the next step must fail."""
    m = make_tiny("llama", seed=4)
    first = SpeculativeEngine(m, eos_token_id=-1).generate([PROMPT], max_new_tokens=3).tokens[0]
    bad = first[1]
    assert bad not in PROMPT
    with torch.no_grad():
        m.hf.model.embed_tokens.weight[bad] = float("nan")
    for method in method_names():
        eng = build_engine(m, PipelineConfig.make(method=method, budget=8), eos_token_id=-1)
        with pytest.raises(FloatingPointError):
            eng.generate([PROMPT], max_new_tokens=6)


def test_bfloat16_model_runs_finite():
    m = make_tiny("qwen2", seed=6)
    m.hf.to(torch.bfloat16)
    for method in method_names():
        res = build_engine(m, PipelineConfig.make(method=method, budget=8), eos_token_id=-1).generate(
            [PROMPT, PROMPT[:9]], max_new_tokens=5)
        assert [len(t) for t in res.tokens] == [5, 5]


def test_reference_backend_large_magnitude_softmax_scores_are_probabilities():
    """softmax scores of huge logits stay in [0, 1] per row (no inf/inf)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 2, 8, generator=g) * 1e4
    k = torch.randn(1, 1, 10, 8, generator=g) * 1e4
    v = torch.randn(1, 1, 10, 8, generator=g)
    _, s = ReferenceBackend().attend(q, k, v, AttentionMetadata(torch.tensor([8]), 1.0, score_rows=[0], score_kind="softmax"))
    assert torch.isfinite(s).all() and float(s.min()) >= 0 and float(s.sum()) == pytest.approx(2.0, abs=1e-4)


def test_greedy_self_draft_flags_nonfinite_logits_and_raises_after_the_iteration():
    """Greedy sparse self-drafting (MagicDec, Vegas, Quest) reads no flag between its draft steps: non-finite draft
    logits are flagged on the device and raised by ``on_verify`` (after the engine's host read), naming the drafter;
    sampling still refuses them at once."""
    from specdec.drafters import SparseSelfDrafter
    from specdec import SlidingWindow

    m = make_tiny("llama", seed=4)
    for greedy in (True, False):
        eng = SpeculativeEngine(m, SparseSelfDrafter(m, SlidingWindow(SlidingWindow.Config(budget=8, sinks=2))),
                                sampling=SamplingConfig() if greedy else SamplingConfig(temperature=1.0, seed=1),
                                eos_token_id=-1, adaptive=False)
        state, _ = eng._start([PROMPT], 6, None)
        real = m.forward
        m.forward = lambda *a, **k: real(*a, **k) * float("nan")
        try:
            if greedy:
                eng.drafter.draft(state, 3)  # no error, no host read: flagged
                with pytest.raises(FloatingPointError, match="drafter produced NaN or \\+inf logits"):
                    eng.drafter.on_verify(state, None)
                eng.drafter.on_verify(state, None)  # read once: the next iteration starts clean
            else:
                with pytest.raises(FloatingPointError, match="drafter produced NaN"):
                    eng.drafter.draft(state, 3)
        finally:
            m.forward = real


@pytest.mark.parametrize("dev", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nonfinite_flags_match_the_definition(dev, dtype):
    """``nonfinite_flags`` (one max per row) against the definition (NaN or +inf anywhere; a row -inf everywhere) on
    rows with a NaN, a +inf, both, legitimate -inf entries, a dead row, and clean rows."""
    from specdec.sampling import nonfinite_flags

    g = torch.Generator().manual_seed(7)
    inf, nan = float("inf"), float("nan")
    cases = {"clean": {}, "nan": {(1, 3): nan}, "posinf": {(0, 5): inf}, "both": {(2, 1): nan, (2, 7): inf},
             "masked": {(1, 0): -inf, (1, 2): -inf}, "nan at a masked row's max": {(3, 4): nan, (3, 0): -inf}}
    for name, cells in cases.items():
        for dead in (False, True):
            x = torch.randn(4, 9, generator=g)
            for (r, c), v in cells.items():
                x[r, c] = v
            if dead:
                x[0] = -inf
            x = x.to(dev, dtype)
            want = [bool(torch.isnan(x).any() | torch.isposinf(x).any()), bool((x == -inf).all(-1).any())]
            assert nonfinite_flags(x).tolist() == want, (name, dead)
