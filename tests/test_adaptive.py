"""Speculation that never loses: adaptive γ, dense fall-back, acceptance traces, ``bench --shape``."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import PipelineConfig, build_engine
from specdec.adaptive import AcceptanceReplay, SpeculationController, save_trace
from specdec.errors import SpecdecError

from conftest import make_tiny

PROMPTS = [list(range(3, 40)), [5, 9, 17, 33, 2, 8] * 6]


def _engine(model, method, adaptive=True, gamma=3, **kw):
    cfg = PipelineConfig.make(method=method, gamma=gamma, budget=12, sinks=2, recent=4, adaptive=adaptive, **kw)
    return build_engine(model, cfg, eos_token_id=-1)


# -- the controller against injected step costs (a fake clock; deterministic) ------------------------
def test_gamma_ladder():
    from specdec.adaptive import gamma_ladder

    assert gamma_ladder(4) == (1, 2, 4) and gamma_ladder(6) == (1, 2, 3, 6) and gamma_ladder(1) == (1,)


class FakeClock:
    """An engine with injected costs: a dense step takes ``t_dense``, a round of γ drafts ``t_round(γ)``
    (``+ stale_extra`` when it re-plans after dense steps); each of ``B`` sequences keeps draft ``i``
    with probability ``alpha(iteration)`` given the ones before (``stale_alpha`` on a stale plan; the
    batch is ``groups`` distinct sequences, like ``specdec bench``'s copies of one prompt);
    times get ``±noise`` jitter; the first iteration of each kind is a capture (``None``). Every call
    replays the same acceptance draws, as ``specdec bench`` decodes the same prompt each time."""

    def __init__(self, t_dense, t_round, alpha, B=1, groups=1, stale_extra=0.0, stale_alpha=None, noise=0.0, seed=0,
                 slow_first=(0, 1.0), capture=0.0, by_token=False, captured=(), blocks=True, hidden=0.0, host=0.0):
        import random

        # seconds of timing and controller work per observation, in the observed time (a block of dense steps pays it
        # once, a dense step observed on its own every step); only where a controller runs
        self.host = host

        self.hidden = hidden  # seconds per round the controller does not see (the call's time has them)

        self.blocks = blocks  # committed dense steps in blocks (SpeculationController.dense_run), as the engine does

        # by_token: alpha(tokens this sequence emitted in this call) instead of alpha(iteration) — the same text
        # every call, acceptance by position in it; captured: shapes already captured (by other engines of the model)
        self.by_token = by_token

        # slow_first = (n, f): the first n timed iterations of each speculative γ of this engine take f times
        # their cost without being captures (a fresh engine's first launches); capture: a capture's wall time
        self.slow_first, self.capture, self.timed = slow_first, capture, {}

        self.t_dense, self.t_round, self.alpha, self.B, self.groups = t_dense, t_round, alpha, B, groups
        self.stale_extra, self.stale_alpha, self.noise = stale_extra, stale_alpha, noise
        self.seed, self.jitter = seed, random.Random(seed + 1000)
        self.seen, self.it = set(captured), 0

    def call(self, ctrl, new_tokens=64):
        """One ``generate`` call: ``(seconds, tokens per sequence emitted, kinds)``."""
        import random

        if ctrl is not None:
            ctrl.start_run(self.B, 8000)
        self.rng = random.Random(self.seed)  # the same prompt every call: the same draws (greedy on one text)
        left = [new_tokens - 1] * self.groups  # the prefill emits the first token
        seconds, kinds, last_dense = 0.0, [], False
        while any(n > 0 for n in left):
            g = ctrl.next_gamma() if ctrl is not None else self.fixed
            active = [b for b in range(self.groups) if left[b] > 0]
            jitter = 1.0 + self.noise * (2 * self.jitter.random() - 1)
            steps = 1
            run = getattr(ctrl, "dense_run", None) if self.blocks else None
            if g == 0 and run is not None:  # the engine (Pacing): committed dense steps as one block
                steps = max(1, min(run(), min(left[b] for b in active)))
            kinds += [g] * steps
            if g == 0:
                t = self.t_dense * jitter * steps + (self.host if ctrl is not None else 0.0)
                for b in active:
                    left[b] -= steps
            else:
                t = self.t_round(g) * jitter + (self.stale_extra if last_dense else 0.0) + (self.host if ctrl is not None else 0.0)
                if g in self.seen:
                    self.timed[g] = self.timed.get(g, 0) + 1
                    if self.timed[g] <= self.slow_first[0]:
                        t *= self.slow_first[1]
                stale = last_dense and self.stale_alpha is not None
                kept = []
                for b in active:
                    pos = new_tokens - 1 - left[b]
                    a = self.stale_alpha if stale else self.alpha(pos if self.by_token else self.it)
                    n = 0
                    while n < g and self.rng.random() < a:
                        n += 1
                    kept.append(n)
                    left[b] -= n + 1
                profile = [sum(k > i for k in kept) / len(kept) for i in range(g)]
            warm = g not in self.seen
            if warm:
                t += self.capture
            seconds += t + (self.hidden if g else 0.0)
            self.seen.add(g)
            if ctrl is not None:
                if g == 0:
                    if steps == 1:
                        ctrl.observe_dense(None if warm else t, wall=t)
                    else:
                        ctrl.observe_dense(None if warm else t, wall=t, steps=steps)
                else:
                    ctrl.observe_round(g, sum(kept) / len(kept), None if warm else t, profile=profile, wall=t)
            last_dense = g == 0
            self.it += steps
        return seconds, new_tokens - 1, kinds

    def bench(self, ctrl=None, fixed=None, calls=4, new_tokens=64):
        """Like ``specdec bench``: one warm-up call, then tokens/s per sequence of each timed call."""
        self.fixed = fixed
        out = []
        for i in range(calls):
            s, n, _ = self.call(ctrl, new_tokens)
            if i:
                out.append(n / s)
        return out


def _rate(clock_args, ctrl=None, fixed=None, **kw):
    import statistics

    return statistics.median(FakeClock(**clock_args).bench(ctrl, fixed, **kw))


def _alpha(a):
    return lambda it: a


B1_VEGAS = dict(t_dense=1.0, t_round=lambda g: 1.64 + 0.8 * g, alpha=_alpha(0.95), stale_extra=0.3, stale_alpha=0.5)
B1_TINY = dict(t_dense=1.0, t_round=lambda g: 1.2 + 1.0 * g, alpha=_alpha(0.8), stale_extra=0.3, stale_alpha=0.4)
B64 = dict(t_dense=1.0, t_round=lambda g: 1.3 + 0.3 * g, alpha=_alpha(0.83), B=64, groups=4, noise=0.03,
           stale_alpha=0.6)


@pytest.mark.parametrize("costs", [B1_VEGAS, B1_TINY], ids=["vegas-like", "tiny"])
def test_b1_where_a_draft_step_costs_a_dense_step_dense_wins(costs):
    """B = 1 on the embedded model: fixed γ is 0.93x (vegas) or less; adaptive must be >= 0.97x dense."""
    dense = _rate(costs, fixed=0)
    fixed = _rate(costs, fixed=4)
    assert fixed < 0.94 * dense  # the premise: speculation loses here
    c = SpeculationController(4)
    got = _rate(costs, c)
    assert got >= 0.97 * dense, (got / dense, c.current, c.explorations)
    assert c.dense_mode


def test_committed_dense_steps_do_not_recompute_the_arms_predictions(monkeypatch):
    """B = 1 ssl.py on the H200: the controller committed to dense in the warm-up call and ran every timed step
    dense at 0.970x the dense method's tokens/s, with device phases equal to 0.3 %: host time. Each dense step
    (~1.2 ms) re-derived every arm's predicted tokens from the per-position acceptance (~20 µs of Python per
    step); those change only with a fresh round, so committed dense steps must not recompute them."""
    import specdec.adaptive as ad

    calls = {"n": 0}
    value = ad._Ratio.value

    def counting(self):
        calls["n"] += 1
        return value(self)

    monkeypatch.setattr(ad._Ratio, "value", counting)
    clock, c = FakeClock(**B1_TINY), SpeculationController(4)
    clock.fixed = None
    clock.call(c)  # the warm-up call: rounds, the probe, the dense commit
    assert c.dense_mode
    calls["n"], steps = 0, c.dense_steps
    for _ in range(3):  # the timed calls
        clock.call(c)
    assert c.dense_mode and c.dense_steps - steps >= 3 * 60  # the same decisions: every timed step dense
    # not once per step and arm: committed dense steps run in blocks (dense_run); each block prices the next
    # exploration once
    assert calls["n"] <= (c.dense_steps - steps) // 8, calls["n"]


def _committed_dense(gamma=4):
    """A controller committed to dense with its samples (B = 1 after its warm-up call)."""
    c = SpeculationController(gamma)
    c.start_run(1, 8000)
    c.current, c._probed = 0, True
    for _ in range(c.window):
        c.observe_dense(1.2e-3)
    c._last_regret = {g: 5e-3 for g in c.arms if g}  # the last explorations' regret: the next one is far off
    return c


def test_committed_dense_steps_are_timed_as_blocks(monkeypatch):
    """B = 1 ssl.py on the H200 (20:03 UTC): the adaptive engine ran all 255 steps dense at 669 tok/s against the dense
    method's 694, with equal device phases (verify 0.292 vs 0.290 s): ~50 µs per step of controller and timing work
    (two clock reads, two capture counts, an observation and a decision per step). Committed to dense, the engine
    must consult, time and count only once per block of steps."""
    import specdec.adaptive as ad

    n = {"events": 0, "observe": 0, "decide": 0}
    monkeypatch.setattr(ad, "warm_up_events", lambda: n.__setitem__("events", n["events"] + 1) or 0)
    c = _committed_dense()
    observe, next_gamma = c.observe_dense, c.next_gamma
    monkeypatch.setattr(c, "observe_dense",
                        lambda *a, **k: n.__setitem__("observe", n["observe"] + 1) or observe(*a, **k))
    monkeypatch.setattr(c, "next_gamma", lambda: n.__setitem__("decide", n["decide"] + 1) or next_gamma())
    pace, before = ad.Pacing(c, 4, batch=1, context=8000), c.dense_steps
    for _ in range(255):
        assert pace.next_gamma() == 0
        pace.dense_done()
    pace.finish()
    assert c.dense_steps - before == 255 and pace.dense_steps == 255  # every step counted, the cut block too
    assert max(n.values()) <= 255 // 16, n
    assert c.t(0) == pytest.approx(c.t(0))  # still measured


def test_dense_blocks_in_the_engine_keep_output_and_counts():
    """A block cut short by the end of generation is reported (``Pacing.finish``); output equals dense."""
    m = make_tiny("llama")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=21).tokens
    eng = _engine(m, "magicdec", gamma=4)
    c = _committed_dense()
    c._run_key = (len(PROMPTS), max(len(p) for p in PROMPTS).bit_length())
    eng._controllers[4] = c
    assert c.dense_run() > 1
    before = c.dense_steps
    res = eng.generate(PROMPTS, max_new_tokens=21)
    assert res.tokens == want
    assert res.stats.dense_steps == res.stats.iterations == 20 == c.dense_steps - before


# B = 16: γ = 4 a few % over dense on most texts (the H200: 1.06x magicdec, 1.09x vegas)
B16 = dict(t_dense=1.0, t_round=lambda g: 1.07 + 0.7 * g, alpha=_alpha(0.9), B=16, noise=0.03, stale_alpha=0.6,
           stale_extra=0.2)


@pytest.mark.parametrize("seed", [0, 1, 4, 25])
@pytest.mark.parametrize("batch", ["B64", "B16"])
def test_where_speculation_pays_it_stays_at_fixed_gamma(batch, seed):
    """B = 64 (γ = 4 is 1.3x dense) and B = 16 (a few %): adaptive within 2 % of fixed γ, timing noise ±3 %.
    The risk is committing to dense on the few rounds of the warm-up call: it would stick."""
    costs = dict(B64 if batch == "B64" else B16, seed=seed)
    fixed = _rate(costs, fixed=4)
    if batch == "B64":
        assert fixed > 1.05 * _rate(costs, fixed=0)  # the premise
    c = SpeculationController(4)
    got = _rate(costs, c)
    assert got >= 0.98 * fixed, (got / fixed, c.current, c.explorations, c.switches)


# The H200 run of 2026-12-01 15:41 (gpu_adaptive_2026-12-01c_run2.json, SmolLM2 8k, prose, 256 tokens), in ms of
# wall time per iteration (call time / iterations): dense 4096 / 6,987 tok/s / 255 = 2.30 ms at B = 16 and
# 1 / 680 = 1.47 ms at B = 1; magicdec γ = 4: 8.21 ms (B = 16, τ 3.82) and 7.60 ms (B = 1, τ 3.88), of which
# 1.29 ms per draft step (draft phase / draft steps). The adaptive engine's warm-up call ran 240 dense steps and
# 9 rounds in 748 ms: ~23 ms per round against 8.2 ms steady — its first rounds were ~2.5x slow without
# capturing (the engines share the model's graphs). Acceptance 0.9 per position: τ 3.8-4.3 over 256 tokens (seeds).
PROSE_B16 = dict(t_dense=2.30, t_round=lambda g: 3.05 + 1.29 * g, alpha=_alpha(0.9), B=16, noise=0.05,
                 stale_alpha=0.6, stale_extra=0.5, slow_first=(8, 2.5), capture=40.0)
PROSE_B1 = dict(PROSE_B16, t_dense=1.47, t_round=lambda g: 2.44 + 1.29 * g, B=1)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_prose_b16_slow_first_rounds_do_not_commit_to_dense(seed):
    """prose B = 16 on the H200: adaptive ran 183-255 of 256 tokens dense (0.93x / 0.88x of fixed γ) because
    its γ = 4 estimate came from the first rounds of a fresh engine (~2.5x slow, not captures) and, once dense
    was committed, each re-exploration added one sample to a window of slow ones. The controller must
    re-measure before it leaves the committed arm and measure an explored arm afresh."""
    costs = dict(PROSE_B16, seed=seed)
    fixed = _rate(costs, fixed=4, calls=6, new_tokens=256)
    assert fixed > 1.04 * _rate(costs, fixed=0, calls=6, new_tokens=256)  # the premise: γ = 4 pays (1.08x)
    c = SpeculationController(4)
    got = _rate(costs, c, calls=6, new_tokens=256)
    assert got >= 0.98 * fixed, (got / fixed, c.current, c.explorations, c.switches)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_prose_b1_goes_dense(seed):
    """prose B = 1 on the H200: fixed magicdec / vegas were 0.75x / 0.81x dense; adaptive must reach >= 0.97x
    dense in the timed calls (one warm-up call, then 5 of 256 tokens)."""
    costs = dict(PROSE_B1, seed=seed)
    dense = _rate(costs, fixed=0, calls=6, new_tokens=256)
    assert _rate(costs, fixed=4, calls=6, new_tokens=256) < 0.9 * dense  # the premise
    c = SpeculationController(4)
    got = _rate(costs, c, calls=6, new_tokens=256)
    assert c.dense_mode and got >= 0.97 * dense, (got / dense, c.current, c.explorations)


# The H200 run of 2026-12-01 17:45 (gpu_adaptive_2026-12-01d.json, prose, B = 64, 256 tokens), ms per iteration:
# dense 64 * 256 / 14,303 tok/s / 255 = 4.49; magicdec γ = 4: 64 * 256 / 21,799 / 67 = 11.2, of which 1.52 per draft
# step (draft phase 0.407 s / 268 steps). Every adaptive warm-up call (B = 1, 16, 64 alike) ran 13 rounds of γ = 4
# for 24 tokens (τ 1.85) and committed to dense; fixed γ = 4 made the other 232 tokens in 54 rounds (τ 4.3):
# acceptance ~0.45 per draft over the first 24 tokens of the text, ~0.92 after. The first γ = 2 round (call 1)
# captured its graphs: verify phase 1.725 s against 0.93 s, ~0.8 s of wall time.
PROSE_B64 = dict(t_dense=4.49, t_round=lambda g: 5.14 + 1.52 * g, alpha=lambda pos: 0.45 if pos < 24 else 0.92,
                 by_token=True, B=64, noise=0.03, capture=800.0, captured=(0, 4))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("block", [1, 8])
def test_prose_b64_a_hard_start_does_not_keep_it_dense(seed, block):
    """prose B = 64 on the H200: adaptive magicdec ran 240-255 of 255 steps dense in every timed call (0.68x of
    fixed γ; vegas stuck at γ = 2, 0.78x). The dense commit on the text's hard first 24 tokens was right there;
    staying was not: (1) an exploration of γ = 4 from dense added 2 fresh rounds to a 64-round acceptance window
    of the hard ones, so it kept predicting τ ~2; (2) the 0.8 s capture of γ = 2 met while exploring was charged
    as exploration regret, 1 % of 80 s of decoding: no exploration for the rest of the run.
    ``block`` 1: dense measured step by step, as then, so that the warm-up commits to dense on the hard start and the
    way back is what is tested; 8 (the default): the probe's blocks span the hard start, no dense commit."""
    costs = dict(PROSE_B64, seed=seed)
    fixed = _rate(costs, fixed=4, calls=6, new_tokens=256)
    assert fixed > 1.35 * _rate(costs, fixed=0, calls=6, new_tokens=256)  # the premise: γ = 4 is 1.4-1.5x dense
    c = SpeculationController(4, measure_block=block)
    clock = FakeClock(**costs)
    clock.fixed = None
    rates = []
    for _ in range(6):  # one warm-up call, then 5 timed; a call's rate without the captures met in it
        w = c.warm_up
        s, n, _ = clock.call(c, 256)
        rates.append(n / (s - (c.warm_up - w)))
    assert c.current == 4, (c.current, c.explorations, c.regret)
    # back at γ = 4 for the whole last call (old controller: dense or γ = 2 to the end). The first γ = 2 and γ = 1
    # rounds capture (0.8 s each, a call is 0.75 s) once per rung, wherever the first exploration of a rung falls:
    # in the warm-up call while a hard start kept it dense, in a timed one (seed 3: the last) since the dense probe is
    # timed in blocks and no longer commits to dense on the hard start. a14.py captures every rung before timing.
    assert rates[-1] >= 0.95 * fixed, ([round(r / fixed, 3) for r in rates], c.explorations)


# The H200 run of 2026-12-01 20:03 (gpu5 r1 a14.json, prose, B = 64, 256 tokens; rungs γ = 2, 1 warmed before timing),
# ms per iteration: dense 64 * 255 / 15,263 tok/s / 255 = 4.19; magicdec γ = 4: 64 * 255 / 21,199 / 67 = 11.5, of
# which 1.59 per draft step (draft phase 0.426 s / 268 steps). The adaptive warm-up call ran 231 of 244 steps dense;
# the first timed call 225 of 231 (its 6 rounds: τ 5.0), then 67, 4, 2, 0: the estimates carry over between calls.
PROSE_B64_R1 = dict(t_dense=4.19, t_round=lambda g: 5.14 + 1.59 * g, alpha=lambda pos: 0.45 if pos < 24 else 0.92,
                    by_token=True, B=64, noise=0.03, captured=(0, 1, 2, 4))


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 6])
@pytest.mark.parametrize("block", [1, 8])
def test_prose_b64_first_timed_call_is_not_dense(seed, block):
    """After a dense commit on the hard start, the first exploration waited for a budget priced on that start's
    acceptance and on unmeasured rungs emitting nothing (~12 ms at a 1 % share: ~1.2 s, a whole call), so the first
    timed call ran dense (old controller: 0.70-0.77x fixed γ in it; here every timed call must be >= 0.95x).
    ``block``: dense measured in blocks of this many steps (1: step by step, as then: a dense commit on the hard start)."""
    costs = dict(PROSE_B64_R1, seed=seed)
    fixed = _rate(costs, fixed=4, calls=6, new_tokens=256)
    c = SpeculationController(4, measure_block=block)
    rates = FakeClock(**costs).bench(c, calls=6, new_tokens=256)
    assert min(rates) >= 0.95 * fixed, [round(r / fixed, 3) for r in rates]


def test_from_dense_a_rung_is_judged_on_rounds_of_its_own():
    """From dense, the best-rated speculative rung may be one predicted from another rung's positions; with no rounds
    of its own its standard error is infinite, and the bound ``tokens - z·se`` made it -inf: no switch at all."""
    c = SpeculationController(4, min_rounds=2)
    c.start_run(64, 8000)
    for _ in range(3):
        c.observe_dense(4.2)
    c.current, c._probed = 0, True
    c._times.setdefault(2, type(c._times[0])(c.window, c.outlier))  # γ = 2 measured earlier, fast
    for x in (6.0, 6.0):
        c._times[2].add(x)
    c._forget_acceptance()
    # a stale round, then two fresh γ = 4 rounds, every draft kept: γ = 2's predicted rate (3 / 6.0) beats γ = 4's
    # (5 / 11.5)
    for _ in range(3):
        c.observe_round(4, 4.0, 11.5)
    assert c.rate(2) > c.rate(4) > 1 / 4.2
    for _ in range(c.confirm + 1):
        c.observe_dense(4.2)
    assert c.current == 4, (c.current, c._confirming)


def test_an_explored_arm_is_measured_afresh():
    """Once dense was committed on slow γ = 4 samples, an exploration of γ = 4 must replace them: one new sample
    in a window of old ones (the H200's prose B = 16) left the wrong estimate for many explorations."""
    c = SpeculationController(4, adapt_gamma=False, explore_share=0.05)
    slow = [True]
    kinds = _drive(c, lambda g: 20.0 if slow[0] else 8.2, 2.3, accepted=3.0, n=40)
    assert c.dense_mode and kinds[-10:].count(0) == 10  # committed to dense on the slow samples
    slow[0] = False
    start = c.explorations
    while c.explorations == start or c._exploring is not None:
        _drive(c, lambda g: 8.2, 2.3, accepted=3.0, n=1)
    assert c.t(4) == pytest.approx(8.2)  # the fresh samples only
    _drive(c, lambda g: 8.2, 2.3, accepted=3.0, n=20)
    assert c.current == 4


def _phases(a0, a1, at):
    return lambda it: a0 if it < at else a1


CHEAP = dict(t_dense=1.0, t_round=lambda g: 1.0 + 0.1 * g, B=16, noise=0.02)


def _tail_rate(costs, ctrl, calls, tail, fixed=None):
    """Mean tokens/s per sequence of the last ``tail`` of ``calls`` calls (``fixed``: that arm throughout)."""
    clock = FakeClock(**costs)
    clock.fixed = fixed
    rates = [n / s for s, n, _ in (clock.call(ctrl) for _ in range(calls))]
    return sum(rates[-tail:]) / tail


def test_collapsing_acceptance_shrinks_gamma():
    """Acceptance falls from 0.9 to 0.45 per draft: γ = 2 becomes the best arm (8 % over γ = 4, 4 % over
    γ = 1, where the margin may leave it)."""
    costs = dict(CHEAP, alpha=_phases(0.9, 0.45, 400))
    arms = {g: _tail_rate(costs, None, 120, 40, fixed=g) for g in (0, 1, 2, 4)}
    best = max(arms.values())
    assert arms[2] == best > 1.04 * arms[4]  # the premise
    c = SpeculationController(4)
    got = _tail_rate(costs, c, calls=120, tail=40)
    assert c.current in (1, 2), (c.current, c._times.keys())
    assert got >= 0.96 * best, (got / best, arms)  # the bound: 1 % exploration + the 3 % margin


def test_saturating_acceptance_grows_gamma():
    """Acceptance rises from 0.45 to 0.97: from γ = 2 back up to γ = 4 (36 % over γ = 2)."""
    costs = dict(CHEAP, alpha=_phases(0.45, 0.97, 1500))
    after = dict(CHEAP, alpha=_alpha(0.97))
    assert _rate(after, fixed=4, calls=10) > 1.3 * _rate(after, fixed=2, calls=10)  # the premise
    c = SpeculationController(4)
    clock = FakeClock(**costs)
    while clock.it < 1500:
        clock.call(c)
    assert c.current in (1, 2)  # it had shrunk (γ = 1 is within 5 % of γ = 2 there)
    rates = [n / s for s, n, _ in (clock.call(c) for _ in range(60))]
    assert c.current == 4
    assert sum(rates[-20:]) / 20 >= 0.97 * _rate(after, fixed=4, calls=10)


def _drive(c, t_round, t_dense, accepted, n=80, sample=None):
    """``n`` iterations with fixed costs; ``sample(i, g, t)`` may replace a round's time."""
    kinds = []
    for i in range(n):
        g = c.next_gamma()
        kinds.append(g)
        if g == 0:
            c.observe_dense(t_dense)
        else:
            t = t_round(g)
            c.observe_round(g, min(g, accepted), sample(i, g, t) if sample else t)
    return kinds


def test_capture_iterations_are_not_costs():
    """What made the first controller fall back on the H200: iterations that captured a graph or
    compiled counted as costs. Samples flagged as warm-ups (``None``) and one-off outliers must not
    move the decision."""
    c = SpeculationController(4)
    # speculation pays: (4 + 1) / 2.0 = 2.5 tokens per dense-step time; warm-ups 80x slower
    kinds = _drive(c, lambda g: 1.6 + 0.1 * g, 1.0, accepted=4.0, n=200,
                   sample=lambda i, g, t: None if i < 3 else (80.0 if i in (10, 40) else t))
    assert c.current == 4 and c.switches == 0 and kinds[-100:].count(4) >= 97
    assert c.discarded >= 5


def test_stale_rounds_after_dense_steps_are_not_costs():
    """A round right after dense steps re-plans (Vegas: selection without scores) and drafts from a
    stale plan: neither its time nor its acceptance may count for the arm."""
    c = SpeculationController(4, adapt_gamma=False)
    kinds = []
    last_dense = False
    for _ in range(300):
        g = c.next_gamma()
        kinds.append(g)
        if g == 0:
            c.observe_dense(1.0)
        else:  # steady: 4.5 tokens in 4.0 (1.12x dense); stale: 1 token in 6.0
            c.observe_round(g, 0.0 if last_dense else 3.5, 6.0 if last_dense else 4.0)
        last_dense = g == 0
    assert c.current == 4 and kinds[-100:].count(4) >= 97
    assert c.rate(4) == pytest.approx(4.5 / 4.0)


def test_hysteresis_does_not_flap_near_break_even():
    c = SpeculationController(4, adapt_gamma=False)
    ratios = [1.015, 0.985] * 150  # speculation within ±1.5 % of dense: at most one switch, no flapping
    for r in ratios:
        g = c.next_gamma()
        if g == 0:
            c.observe_dense(1.0)
        else:
            c.observe_round(g, 4.0, 5.0 / r)
    assert c.switches <= 1


def test_exploration_regret_stays_within_its_share():
    """Every exploration after the dense probe is paid from ``explore_share`` of the observed time."""
    for share in (0.01, 0.05):
        c = SpeculationController(4, explore_share=share)
        _drive(c, lambda g: 1.0 + 1.0 * g, 1.0, accepted=0.8, n=3000)  # dense wins; every rung loses
        probe = c._last_regret.get(0, 0.0) + 8.0  # the probe and one exploration in flight
        assert c.current == 0 and c.explorations > 3
        assert c.regret <= share * c.elapsed + probe


def test_estimates_carry_over_between_calls_of_one_shape():
    """Speculation loses by 30 % per token at every rung (γ = 2 at par was explored at once: a free exploration)."""
    c = SpeculationController(4)
    c.start_run(1, 8000)
    _drive(c, lambda g: (g + 1) * 1.3, 1.0, accepted=2.0, n=20)
    assert c.dense_mode
    c.start_run(1, 8100)  # same batch, same context scale: it still knows dense wins
    assert c.dense_mode
    assert _drive(c, lambda g: (g + 1) * 1.3, 1.0, accepted=2.0, n=16).count(0) == 16
    c.start_run(16, 8000)  # another batch: start over, speculate first
    assert not c.dense_mode and c.next_gamma() == 4


def test_pacing_discards_iterations_that_captured(monkeypatch):
    import specdec.adaptive as adaptive
    from specdec.adaptive import Pacing

    events = [0]
    monkeypatch.setattr(adaptive, "warm_up_events", lambda: events[0])
    seen, walls = [], []

    class Rec:
        def next_gamma(self):
            return 4

        def observe_round(self, g, a, t, profile=None, wall=None):
            seen.append(t)
            walls.append(wall)

    p = Pacing(Rec(), 4)
    p.next_gamma()
    events[0] += 1  # a capture during the iteration
    p.round_done(4, 3.0)
    p.next_gamma()
    p.round_done(4, 3.0)
    assert seen[0] is None and seen[1] is not None and seen[1] >= 0
    assert walls[0] is not None and walls[0] >= 0  # a capture's time still comes (the controller's warm_up)


def test_one_switch_for_the_default():
    from specdec import PipelineConfig
    from specdec.adaptive import ADAPTIVE_DEFAULT

    assert PipelineConfig.make(method="vegas").adaptive is ADAPTIVE_DEFAULT
    m = make_tiny("llama")
    assert build_engine(m, PipelineConfig.make(method="vegas")).adaptive is ADAPTIVE_DEFAULT


# -- the engine: greedy output unchanged, fall-back only where it may run ---------------------------
@pytest.mark.parametrize("method", ["magicdec", "vegas", "quest"])
def test_adaptive_greedy_output_equals_dense(method):
    m = make_tiny("llama")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=24).tokens
    res = _engine(m, method, adaptive=True).generate(PROMPTS, max_new_tokens=24)
    assert res.tokens == want
    assert len(res.stats.gamma_per_round) + res.stats.dense_steps == res.stats.iterations


class _Script:
    """A controller that follows a fixed script of γ_t (0 = dense) and records what it saw."""

    def __init__(self, script):
        self.script, self.i, self.seen = script, 0, []

    def next_gamma(self):
        g = self.script[self.i % len(self.script)]
        self.i += 1
        return g

    def observe_round(self, g, a, t, profile=None, wall=None):
        self.seen.append(("round", g))

    def observe_dense(self, t, wall=None):
        self.seen.append(("dense", 0))


@pytest.mark.parametrize("method", ["magicdec", "vegas"])
def test_dense_steps_and_varying_gamma_keep_greedy_output(monkeypatch, method):
    m = make_tiny("qwen3")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=20).tokens
    eng = _engine(m, method, gamma=4)
    script = _Script([0, 0, 4, 1, 0, 3, 2])
    monkeypatch.setattr(eng, "_controller", lambda gamma: script)
    res = eng.generate(PROMPTS, max_new_tokens=20)
    assert res.tokens == want
    assert res.stats.dense_steps == sum(1 for k, _ in script.seen if k == "dense") > 0
    assert set(res.stats.gamma_per_round) == {1, 2, 3, 4}


def test_fall_back_only_for_drafters_on_the_targets_cache():
    m = make_tiny("llama")
    assert _engine(m, "vegas")._controller(3).fall_back
    assert _engine(m, "vegas", adaptive=False)._controller(3) is None
    assert _engine(m, "dense")._controller(3) is None
    dustin = _engine(m, "vegas")
    dustin.lossless = False  # near-lossless (sparse verification): its output depends on γ, which must not follow the batch
    assert dustin._controller(3) is None
    from specdec.drafters import ModelDrafter, SparseSelfDrafter

    assert SparseSelfDrafter.dense_steps_ok
    assert not ModelDrafter.dense_steps_ok  # a draft model keeps its own cache: no dense steps


def test_dense_steps_when_sampling_are_the_dense_engines_samples():
    """A self-speculative engine that only takes dense steps samples exactly what the dense engine samples."""
    m = make_tiny("llama")
    sampling = dict(temperature=1.0, seed=3)
    want = _engine(m, "dense", sampling=sampling).generate(PROMPTS, max_new_tokens=10).tokens
    eng = _engine(m, "magicdec", gamma=4, sampling=sampling)
    eng._controller = lambda gamma: _Script([0])
    res = eng.generate(PROMPTS, max_new_tokens=10)
    assert res.tokens == want and res.stats.dense_steps == res.stats.iterations


# -- acceptance traces ----------------------------------------------------------------------------
def test_record_and_replay_acceptance(tmp_path):
    m = make_tiny("llama")
    eng = _engine(m, "vegas", adaptive=False)
    eng.record_acceptance = True
    res = eng.generate(PROMPTS, max_new_tokens=16)
    trace = res.stats.acceptance_trace
    assert len(trace) == len(res.stats.gamma_per_round) and all(len(r) == 2 for r in trace)
    kept = [n for r in trace for n in r if n >= 0]
    assert res.stats.mean_accepted_length == pytest.approx(1 + sum(kept) / len(kept))
    path = tmp_path / "trace.json"
    save_trace(path, res.stats, model="tiny")
    assert json.loads(path.read_text())["method"] == "vegas"
    # another model (its own drafts would be accepted differently) replays the recorded lengths exactly
    other = _engine(make_tiny("llama", seed=5), "vegas", adaptive=False)
    other.replay = AcceptanceReplay.load(path)
    other.record_acceptance = True
    got = other.generate(PROMPTS, max_new_tokens=16)
    assert got.stats.replayed and not res.stats.replayed
    assert got.stats.acceptance_trace == trace
    assert [len(t) for t in got.tokens] == [16, 16]


def test_a_bad_trace_is_one_clear_error(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{}")
    with pytest.raises(SpecdecError, match="cannot read acceptance trace .*--record-acceptance"):
        AcceptanceReplay.load(bad)
    with pytest.raises(ValueError, match="no rounds"):
        AcceptanceReplay([[-1, -1]])


# -- bench: shapes, repeats, documents as files ---------------------------------------------------------
def test_bench_shape_replay_repeats_and_files(tmp_path):
    from specdec.bench import run_bench

    m = make_tiny("llama")
    eng = _engine(m, "vegas", adaptive=False)
    eng.record_acceptance = True
    save_trace(tmp_path / "tr.json", eng.generate(PROMPTS, max_new_tokens=12).stats)
    rows = run_bench(["dense", "vegas"], [48], [2], ["ignored"], 8, 16, None, 3, "x", "reference", "float32", "cpu",
                     False, tmp_path, "s", repeats=3, shape="tiny", acceptance_trace=tmp_path / "tr.json")
    dense, vegas = rows
    assert dense["repeats"] == 3 and dense["tokens_per_second_min"] <= dense["tokens_per_second"] <= dense["tokens_per_second_max"]
    assert vegas["replayed"] and not dense["replayed"] and "same_tokens_as_dense" not in vegas
    md = (tmp_path / "s.md").read_text()
    assert "vegas (replayed)" in md and "median of 3" in md
    with pytest.raises(SpecdecError, match="unknown model shape 'llama-9b'; known: llama-3.1-8b"):
        run_bench(["dense"], [48], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path, "s",
                  shape="llama-9b")
    with pytest.raises(SpecdecError, match="unknown document .*no/such.txt.*not an existing file"):
        run_bench(["dense"], [48], [1], [str(tmp_path / "no/such.txt")], 4, 16, None, 3, "x", "reference",
                  "float32", "cpu", False, tmp_path, "s")


def test_random_shape_configs_match_the_published_sizes():
    from transformers import AutoModelForCausalLM

    from specdec.shapes import shape_config

    with torch.device("meta"):
        n = {s: sum(p.numel() for p in AutoModelForCausalLM.from_config(shape_config(s)).parameters())
             for s in ("llama-3.1-8b", "qwen3-8b", "smollm2-135m")}
    assert round(n["llama-3.1-8b"] / 1e9, 2) == 8.03
    assert round(n["qwen3-8b"] / 1e9, 2) == 8.19
    assert round(n["smollm2-135m"] / 1e6) == 135


def test_compile_is_skipped_with_a_message_above_the_size_limit(tmp_path, monkeypatch, capsys):
    """torch.compile at the 8B shape did not finish in 4 minutes (limit: 2): skipped there, with one line."""
    import specdec.shapes as shapes
    from specdec.bench import run_bench
    from specdec.loading import load_model

    why = shapes.compile_skip_reason("llama-3.1-8b")
    assert why.startswith("torch.compile skipped at shape llama-3.1-8b (8.0B parameters > 2B")
    assert shapes.compile_skip_reason("tiny") is None and shapes.compile_skip_reason("smollm2-135m") is None
    monkeypatch.setattr(shapes, "COMPILE_MAX_PARAMS", 1e3)  # "tiny" over the limit: nothing is compiled
    m = load_model("x", "float32", "cpu", "reference", compile=True, shape="tiny")
    assert m._compiled is None and m.compile_skipped.startswith("torch.compile skipped at shape tiny")
    assert "note: torch.compile skipped at shape tiny" in capsys.readouterr().err
    run_bench(["dense"], [32], [1], ["x"], 4, 16, None, 3, "x", "reference", "float32", "cpu", False, tmp_path, "c",
              compile=True, shape="tiny")
    meta = json.loads((tmp_path / "c.json").read_text())["meta"]
    assert meta["compile"] is False and meta["compile_skipped"].startswith("torch.compile skipped")
    assert "- torch.compile skipped at shape tiny" in (tmp_path / "c.md").read_text()


@pytest.mark.parametrize("args,expect", [
    (["--shape", "llama-9b"], "unknown model shape 'llama-9b'; known: llama-3.1-8b"),
    (["--acceptance-trace", "vegas="], "--acceptance-trace takes FILE or method=FILE"),
    (["--acceptance-trace", "{missing}"], "cannot read acceptance trace"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--documents", "{missing}"], "not an existing file"),
])
def test_bench_cli_bad_input_is_one_error_line(tmp_path, args, expect):
    from typer.testing import CliRunner

    from specdec.cli import app

    args = [a.format(missing=tmp_path / "nope.json") for a in args]
    res = CliRunner().invoke(app, ["bench", "--device", "cpu", "--output-dir", str(tmp_path / "o"), *args])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


# -- plan graphs shared by the engines of one cache --------------------------------------------------------------
class _KeyedPlanCalls:
    """A stand-in for :class:`specdec.graphs.CapturedCall` on the CPU: runs the build eagerly and records the graph
    key each call would replay (:func:`specdec.graphs.call_key`, stable buffers' addresses included)."""

    def __init__(self) -> None:
        self.keys: list = []
        self.captures = self.replays = 0
        self.uncapturable: dict = {}

    def __call__(self, key, fn, *inputs, keep=None):
        from specdec.graphs import call_key

        self.keys.append(call_key(key, inputs))
        return fn(*inputs)


def test_vegas_engines_on_one_cache_share_their_plan_graphs(monkeypatch):
    """The H200's a14 run (20:03 UTC): every timed call of vegas' adaptive engine captured 2-3 CUDA graphs, the fixed
    ones 2 every other call, magicdec's 0-1 — plan graphs. Each Vegas selector owned its score buffer, whose address
    is part of the plan graph's key (the graph reads it in place), and ``_gamma`` None vs set split the first plan from
    the re-plan after dense steps: three engines on one cache needed 6-9 graphs; the planner kept 4 (oldest evicted
    first). Now the buffer is the cache's: the engines replay the same 2 plan graphs (with and without scores)."""
    from specdec.graphs import PlanGraphs
    from specdec.planner import _PLANNERS

    calls = _KeyedPlanCalls()
    monkeypatch.setattr(PlanGraphs, "applies", staticmethod(lambda sel, lengths: True))
    real = PlanGraphs.__init__

    def init(self, max_graphs=8):
        real(self, max_graphs)
        self.calls = calls

    monkeypatch.setattr(PlanGraphs, "__init__", init)
    m = make_tiny("llama")
    want = _engine(m, "dense").generate(PROMPTS, max_new_tokens=16).tokens
    fixed, fixed2, adaptive = (_engine(m, "vegas", gamma=4, adaptive=False) for _ in range(3))
    script = _Script([4, 0, 0, 4, 2, 0, 4])  # rounds, dense steps, a re-plan after them, another γ
    monkeypatch.setattr(adaptive, "_controller", lambda gamma: script)
    rounds = []
    for r in range(3):
        for eng in (fixed, adaptive, fixed2):
            assert eng.generate(PROMPTS, max_new_tokens=16).tokens == want
        rounds.append(len(set(calls.keys)))
    assert len({id(c) for c in _PLANNERS}) >= 1 and len(calls.keys) > 10
    assert rounds[0] == rounds[-1] <= 2, rounds  # no new graph after the first round; one per plan kind


def test_graph_caches_evict_the_least_recently_used():
    """The graph caches evicted the oldest capture however often it replayed: with one key more than slots, every call
    recaptured. ``lru_get`` moves a hit to the end, so the front (evicted first) is the least recently used."""
    from specdec.graphs import lru_get

    graphs = {"a": 1, "b": 2, "c": 3}
    assert lru_get(graphs, "a") == 1 and lru_get(graphs, "z") is None
    assert next(iter(graphs)) == "b" and list(graphs) == ["b", "c", "a"]


def test_pacing_times_iterations_end_to_end(monkeypatch):
    """B = 1 ssl.py on the H200 (20:47 UTC): a γ = 1 round measured 3.1 ms from the controller's start to its end,
    while the calls that explored it spent ~4 ms per round; each exploration from dense cost 1.3-3x its charged
    regret (the engine loop's device read between iterations and the controller's own work were nobody's cost).
    An iteration must be timed from the end of the previous observation."""
    import specdec.adaptive as ad

    now = [0.0]
    monkeypatch.setattr(ad.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(ad, "warm_up_events", lambda: 0)
    c = SpeculationController(4, fall_back=False, adapt_gamma=False)
    pace = ad.Pacing(c, 4, batch=1, context=8000)
    for _ in range(6):
        assert pace.next_gamma() == 4
        now[0] += 3.0  # the round itself
        pace.round_done(4, 3.0)
        now[0] += 1.0  # the loop and the controller between two iterations
    assert c.t(4) == pytest.approx(4.0)
    assert c.elapsed == pytest.approx(5 * 4.0 + 3.0)  # the first iteration: from the call's start


# The H200 run of 2026-12-01 20:47 (gpu5 r2 a14.json, ssl.py, B = 1, 160 new tokens), ms per iteration as the
# controller measured them: dense 1.32; γ = 1, 2, 4 rounds 3.03, 4.17, 7.12 (τ 4.18 at γ = 4); the calls that explored
# spent ~0.7 ms per round more than that (``hidden``: what the controller did not see, before end-to-end timing).
SSL_B1_R2 = dict(t_dense=1.32, t_round=lambda g: 1.67 + 1.36 * g, alpha=_alpha(0.93), stale_extra=0.3, stale_alpha=0.9,
                 noise=0.02, hidden=0.7, captured=(0, 1, 2, 4))


@pytest.mark.parametrize("seed", range(8))
def test_ssl_b1_explorations_from_dense_back_off(seed):
    """ssl.py B = 1 on the H200: committed to dense (every rung 15-30 % slower), the controller explored once or
    twice in most 160-token calls, paid from the 1 % share: 3-4 % of each such call; adaptive was 0.964-0.969x
    dense. Blind probes from dense that keep losing must come ever more rarely."""
    import statistics

    costs = dict(SSL_B1_R2, seed=seed)
    dense = _rate(costs, fixed=0, calls=8, new_tokens=160)
    assert _rate(costs, fixed=4, calls=8, new_tokens=160) < 0.8 * dense  # the premise
    c, clock = SpeculationController(4), FakeClock(**costs)
    clock.fixed = None
    rates, explored = [], []
    for _ in range(8):  # one warm-up call, then 7 timed
        e = c.explorations
        s, n, _ = clock.call(c, 160)
        rates.append(n / s)
        explored.append(c.explorations - e)
    assert c.dense_mode
    # old controller: 8-10 explorations in the 7 timed calls for 6 of these 8 seeds, 5-6 in the last 4 calls
    assert sum(explored[1:]) <= 3 and sum(explored[-4:]) <= 2, explored
    assert statistics.median(rates[1:]) >= 0.985 * dense, [round(r / dense, 3) for r in rates]


# The H200 run of 2026-12-01 21:06 (gpu5 r3 a14.json, prose, B = 1, 160 new tokens), ms per iteration: dense 1.337 in the
# dense method's calls (0.2126 s / 159) and in the adaptive engine's committed dense blocks (its t(0) fell to 1.333),
# but 1.48 where dense steps were observed one by one (the probe, the re-check: t(0) 1.480 after round 0, 1.479 after
# round 1): ~0.14 ms of timing and controller work per observation (``host``). magicdec γ = 4: 6.29 per round in the
# fixed calls (0.2203 s / 35, τ 4.54), 1.157 per draft step (draft phase 0.162 s / 140 steps).
PROSE_B1_R3 = dict(t_dense=1.337, t_round=lambda g: 1.66 + 1.157 * g, alpha=_alpha(0.95), stale_extra=0.3,
                   stale_alpha=0.6, noise=0.02, host=0.143, captured=(0, 1, 2, 4))


@pytest.mark.parametrize("seed", range(6))
def test_prose_b1_dense_is_measured_as_it_runs(seed):
    """prose B = 1 on the H200 (21:06 UTC): fixed γ = 4 is 0.967x dense; adaptive magicdec was 0.964x (bar 0.97). Its
    dense probe timed two dense steps one by one (1.48 ms each) while committed dense runs as blocks (1.337 ms): γ = 4
    (4.54 tokens / 6.56 ms) looked faster than dense, so it speculated through the warm-up and settling calls and
    into the first timed one. Dense must be measured the way it will run."""
    import statistics

    costs = dict(PROSE_B1_R3, seed=seed)
    dense = _rate(costs, fixed=0, calls=7, new_tokens=160)
    assert _rate(costs, fixed=4, calls=7, new_tokens=160) < 0.98 * dense  # the premise: γ = 4 a few % below dense
    c, clock = SpeculationController(4), FakeClock(**costs)
    clock.fixed = None
    rates = [n / s for s, n, _ in (clock.call(c, 160) for _ in range(7))]  # warm-up, settling, 5 timed
    assert c.dense_mode
    assert statistics.median(rates[2:]) >= 0.975 * dense, [round(r / dense, 3) for r in rates]


def test_dense_is_probed_and_rechecked_in_blocks():
    """The probe and the re-check of a dense commit run as blocks of ``measure_block`` steps (one sample each, its mean
    step), and the probe's regret is charged for every step of its blocks."""
    c = SpeculationController(4, measure_block=8)
    c.start_run(1, 8000)
    for _ in range(2):  # γ = 4: 4 tokens in 6.0
        assert c.next_gamma() == 4 and c.dense_run() == 0
        c.observe_round(4, 3.0, 6.0)
    regret = c.regret
    for _ in range(2):  # the probe
        assert c.next_gamma() == 0 and c.dense_run() == 8
        c.observe_dense(8 * 2.0, steps=8)
    assert c.t(0) == pytest.approx(2.0) and c.dense_steps == 16
    assert c.regret - regret == pytest.approx(2 * (16.0 - 8 * 6.0 / 4))
    c.current = 0
    c._times[0].clear(need=c.confirm)  # re-checking the dense commit
    assert c.next_gamma() == 0 and c.dense_run() == 8


def test_warm_up_script_visits_every_arm_after_a_verification_and_after_dense_steps():
    from specdec.adaptive import warm_up_script

    assert warm_up_script((4, 2, 1, 0)) == [4, 4, 0, 4, 2, 2, 0, 2, 1, 1, 0, 1, 0]
    assert warm_up_script((4, 2, 1)) == [4, 4, 2, 2, 1, 1]  # no dense arm: no dense step
    assert warm_up_script((4,)) == [4, 4]


def test_warm_up_runs_every_step_kind_without_the_controller_seeing_it():
    """``engine.warm_up``: each γ rung drafts after a verification and after a dense step (whose re-plan without
    scores runs first), dense steps run; the controller observes none of it; later calls still emit dense's tokens.
    Without a controller it is one plain call."""
    m = make_tiny("llama", seed=1)
    prompts = [list(range(3, 45)), [5, 9, 17, 33, 2, 8] * 6]
    dense = build_engine(m, PipelineConfig.make(method="dense"), eos_token_id=-1).generate(prompts, 8).tokens
    eng = build_engine(m, PipelineConfig.make(method="vegas", gamma=4, budget=16, sinks=2, recent=4),
                       eos_token_id=-1)
    assert eng.adaptive
    events = []
    draft, on_verify, dense_step = eng.drafter.draft, eng.drafter.on_verify, eng._dense_step
    eng.drafter.draft = lambda st, g: (events.append(g), draft(st, g))[1]
    eng.drafter.on_verify = lambda st, sc: (events.append("verified" if sc is not None else "re-plan"), on_verify(st, sc))[1]
    eng._dense_step = lambda st, run: (events.append(0), dense_step(st, run))[1]
    calls = []
    generate = eng.generate
    eng.generate = lambda *a, **k: (calls.append(1), generate(*a, **k))[1]
    assert eng.warm_up(prompts, 8) == 0  # no CUDA graphs here: nothing captured
    drafted = [e for e in events if isinstance(e, int) and e > 0]
    assert sorted(set(drafted)) == [1, 2, 4] and 0 in events
    for g in (4, 2, 1):  # each rung drafts right after a dense step's re-plan
        assert any(events[i:i + 2] == ["re-plan", g] and events[i - 1] == 0 for i in range(1, len(events) - 1)), events
    assert len(calls) > 1  # 8 tokens per call: the script spans several calls
    c = eng._controller(4)
    assert c.iteration == 0 and c.elapsed == 0.0  # the controller saw nothing
    assert eng._script is None
    del eng.generate
    assert eng.generate(prompts, 8).tokens == dense
    eng.adaptive = False  # no controller: one plain call
    calls.clear()
    eng.generate = lambda *a, **k: (calls.append(1), generate(*a, **k))[1]
    eng.warm_up(prompts, 8)
    assert len(calls) == 1
