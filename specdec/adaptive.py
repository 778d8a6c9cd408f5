"""Speculation that never loses: an adaptive γ per iteration and dense fall-back.

:class:`SpeculationController` decides, before each iteration of :meth:`SpeculativeEngine.generate`,
how many tokens to draft — γ_t on a ladder ``γ, ⌈γ/2⌉, …, 1`` (the configured γ is the ceiling:
caches and plans are sized for it; the ladder keeps the verify shapes, hence CUDA-graph captures,
to a few) — or ``0``: one plain dense step instead of a draft/verify round. It is an
explore-then-commit bandit over these choices:

- **Arms.** The ladder's rungs and, where dense steps may run, dense (``0``). The controller commits to
  one arm — at first the configured γ, so with no evidence it is fixed-γ speculation — and switches
  only to an arm whose measured rate beats it by ``margin`` (3 %: hysteresis, no flapping).
- **Rate = tokens per sequence / steady-state iteration time**, per arm: the median of the arm's own
  last ``window`` samples (the engine reads the device back once per iteration, so these are real
  end-to-end costs, selection and score emission included). A sample is discarded when a CUDA-graph
  capture or a ``torch.compile`` compilation happened during its iteration
  (:func:`specdec.graphs.capture_events`, dynamo's graph count), when it is ``outlier``× its arm's
  median (an unseen warm-up), and for the round right after dense steps (it re-plans and drafts
  from a stale plan). Tokens come from the per-position acceptance of every fresh round (a
  self-speculative draft at position ``i`` does not depend on γ), so every rung's tokens are
  predicted from whatever rung runs: acceptance that collapses makes a smaller measured rung win at
  once; acceptance that saturates the last position explores the next larger rung first.
- **Bounded exploration.** Dense is probed once, when the committed arm has its samples (in blocks of
  ``measure_block`` steps, timed as committed dense steps are); any later
  exploration of another arm must fit, with its expected regret (time beyond what the committed arm
  needs for the same tokens), in ``explore_share`` of the observed time. Against the best arm it loses
  at most the probe, ``explore_share``, ``margin`` and one capture per rung (a capture met while exploring
  is counted apart, in ``warm_up``: charged as regret, one 0.8 s capture at B = 64 blocked every later
  exploration). Speculation explored from a dense commit is judged on its own fresh rounds' acceptance
  (acceptance changes along a text: prose opened at 1.85 tokens per γ = 4 round, then 4.3). From a dense commit
  each exploration that leaves it committed makes the next wait 4x longer (``min_gap`` up to ``max_gap``
  iterations): at B = 1 on the H200 (ssl.py) the share alone meant one or two explorations in most 160-token calls,
  3-4 % of each. Iterations are timed end to end (from the previous observation's end), so the engine loop's and
  the controller's own work are in the arms' costs and the regret. The first
  controller (probes every 16–128 dense steps, dense re-measured every 64 rounds) lost 7 % at B = 1
  (vegas) and 14 % at B = 64 (magicdec) on the H200.
- **Steady state across calls.** The engine keeps its controller between ``generate`` calls of the
  same batch size and context scale (:meth:`SpeculationController.start_run`), so a warmed-up
  engine decides from its first iteration.

Both decisions change only *how* tokens are produced: dense steps and verified rounds each emit
exactly the target's tokens (greedy) or samples of its distribution (rejection sampling), so the
output is unchanged. Only lossless methods adapt: a near-lossless one (Dustin's sparse verification)
emits what its γ gives, and γ_t follows the whole batch's acceptance, so adapting would make a
sequence's output depend on its batch mates. A seeded sampling run keeps γ too: γ_t follows wall time and an
iteration's random draws depend on its γ, so the same seed would give other tokens run to run. Fall-back needs a drafter that drafts from the target's own cache
(``Drafter.dense_steps_ok``) and the full verifier; otherwise only γ adapts.

:data:`ADAPTIVE_DEFAULT` is the one switch for the default (``PipelineConfig.adaptive``, ``SpeculativeEngine(adaptive=None)``,
``specdec generate``, ``bench`` and ``eval`` without ``--adaptive/--no-adaptive``): on. Per run, ``--no-adaptive``,
``PipelineConfig(adaptive=False)``, ``build_engine(..., adaptive=False)`` or ``engine.adaptive = False`` fix γ.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque

import torch

#: whether adaptive γ / dense fall-back is on by default (PipelineConfig.adaptive, engine.adaptive, ``--adaptive`` /
#: ``--no-adaptive`` of generate, bench and eval). On since ``benchmarks/gpu/a14.py`` on an H200 (2026-12-01 22:55 and
#: 22:58 UTC, benchmarks/results/gpu_adaptive_2026-12-01h.md) printed never-loses for every (document, B): B = 1
#: >= 0.97x dense, B = 16 / 64 >= 0.98x fixed γ, same tokens. Set it to False to make fixed γ the default again.
ADAPTIVE_DEFAULT = True


def gamma_ladder(gamma_max: int) -> tuple[int, ...]:
    """The draft lengths γ_t may take: ``γ, ⌈γ/2⌉, ⌈γ/4⌉, …, 1`` (ascending)."""
    out, g = {gamma_max}, gamma_max
    while g > 1:
        g = -(-g // 2)
        out.add(g)
    return tuple(sorted(out))


def warm_up_events() -> int:
    """Captures (:func:`specdec.graphs.capture_events`) plus graphs compiled by ``torch.compile`` so far."""
    from specdec.graphs import capture_events

    n = capture_events()
    utils = sys.modules.get("torch._dynamo.utils")  # never imported here: only counted when compile ran
    if utils is not None:
        n += int(utils.counters["stats"].get("unique_graphs", 0))
    return n


class _Samples:
    """The last ``window`` steady-state samples of one cost; drops outliers (warm-ups it could not see)."""

    def __init__(self, window: int, outlier: float) -> None:
        self.values: deque[float] = deque(maxlen=window)
        self.outlier = outlier
        self.need = 0  # samples the committed arm must give again before a decision (confirmation)
        self._rejected = 0
        self._median: float | None = None

    def clear(self, need: int = 0) -> None:
        """Forget the samples (a re-measurement from scratch); ``need``: how many it must give before use."""
        self.values.clear()
        self._median = None
        self.need = need

    def add(self, x: float) -> bool:
        if len(self.values) >= 2 and x > self.outlier * self.median():
            self._rejected += 1
            if self._rejected < 3:
                return False
            self.values.clear()  # three in a row: the cost really changed
        self._rejected = 0
        self.values.append(x)
        self._median = None
        return True

    def median(self) -> float:
        if self._median is None:  # cached: the controller asks every iteration
            self._median = statistics.median(self.values)
        return self._median

    def __len__(self) -> int:
        return len(self.values)


class _Ratio:
    """Conditional acceptance of one draft position over the last ``window`` fresh rounds (running sums)."""

    def __init__(self, window: int) -> None:
        self.pairs: deque[tuple[float, float]] = deque()
        self.window = window
        self.num = self.den = 0.0

    def add(self, num: float, den: float) -> None:
        if len(self.pairs) == self.window:
            n, d = self.pairs.popleft()
            self.num -= n
            self.den -= d
        self.pairs.append((num, den))
        self.num += num
        self.den += den

    def value(self) -> float | None:
        if not self.pairs:
            return None
        return self.num / self.den if self.den > 1e-12 else 0.0


class SpeculationController:
    """Chooses γ_t (``0`` = a dense step) per iteration: explore-then-commit over measured arms.

    The *arms* are the γ ladder's rungs and, with ``fall_back``, dense (``0``). The controller
    commits to one arm (at first the configured γ: with no evidence it is fixed-γ speculation) and
    leaves it only for an arm measured faster by ``margin``:

    - **Cost per emitted token, per arm.** An arm's rate is its tokens per sequence and iteration
      over the median of its steady-state iteration times (``1 / T`` for dense). Only samples of the
      arm itself count (its own captured shapes), never an iteration that captured a graph or compiled
      (``seconds=None``), an outlier (``outlier``× its median: a warm-up it could not see), nor a
      round right after dense steps (its plan predates them: stale).
    - **Acceptance from every round.** Rounds report the share of sequences that accepted at least
      ``i + 1`` drafts; the conditional acceptance per draft position (sums over the last rounds that
      reached it) predicts the tokens of *every* rung without running it — a self-speculative draft
      of position ``i`` does not depend on γ. When acceptance collapses, a smaller rung measured
      earlier wins at once (shrink); when the last position keeps being accepted (``≥ saturate``),
      the next larger rung is explored first (grow).
    - **Bounded exploration.** Running another arm than the committed one is exploration; its regret
      is the time it took beyond what the committed arm needed for the same tokens. Dense is explored
      once as soon as the committed arm has ``min_samples`` samples (the *probe*); later explorations
      start only while the regret so far plus the arm's last exploration regret stays within
      ``explore_share`` of the time observed, at least ``min_gap`` iterations apart (from a dense commit, where
      explorations are blind probes, the gap grows 4x with each one that leaves dense committed, up to
      ``max_gap``; a switch resets it). So, against the
      best arm, the controller loses at most the probe, ``explore_share`` of the time, ``margin``
      (hysteresis, which also keeps it from flapping) and one capture per rung (captures and compilations
      met while exploring go to :attr:`warm_up`, not to the regret: paid once, they must not stop later
      explorations). An exploration of speculation from a dense commit forgets the acceptance of past
      rounds: the rounds that made dense win may belong to a stretch of the text long gone.
    - **Steady state across calls.** The engine keeps its controller between ``generate`` calls of the
      same batch size and context scale (:meth:`start_run`), so a warmed-up engine decides from its
      first iteration.

    Args:
        gamma_max: the configured γ (upper bound: caches and plans are sized for it).
        adapt_gamma: explore the ladder's smaller rungs (``False``: γ is ``gamma_max`` or dense).
        fall_back: dense is an arm (the drafter drafts from the target's cache).
        window: steady-state time samples kept per arm (their median is its cost).
        min_samples: samples an arm needs before it can be chosen.
        margin: switch to an arm only when its rate beats the committed one's by this much (hysteresis).
        explore_share: the most exploration regret, as a share of the observed time.
        min_gap: iterations between two explorations.
        max_gap: from a dense commit, the gap before an arm's next exploration doubles with each exploration of it
            that did not switch, up to this many iterations.
        measure_block: dense steps per sample while dense is measured (the probe, its explorations, a re-check of a
            dense commit): timed as a block, as committed dense steps are (:meth:`dense_run`), not one by one.
        saturate: conditional acceptance of the last draft position that triggers growing.
        outlier: a sample this many times its arm's median is a warm-up, not a cost.
        margin_dense: leave speculation for dense when dense's rate beats it by this much (after the
            checks below); at par by default, so a B = 1 loss shows at once.
        z: speculation's tokens are taken ``z`` standard errors high when compared with dense.
        min_rounds: fresh rounds of the committed γ before dense may replace it (a dense commit
            sticks: dense steps say nothing about acceptance).
        accept_window: fresh rounds per draft position kept for its acceptance (one sequence's
            accept/reject is a coin flip: a short window would make the arms' order noise).
        confirm: before leaving the committed arm, its samples are dropped and this many fresh ones
            measured (it keeps running meanwhile, so this costs nothing); the switch happens only if the
            other arm still wins against them. Early samples of a fresh engine (first launches, allocator
            growth, caches) are slow without being captures; this keeps them from deciding.
    """

    def __init__(self, gamma_max: int, adapt_gamma: bool = True, fall_back: bool = True, window: int = 8,
                 min_samples: int = 2, margin: float = 0.03, explore_share: float = 0.01, min_gap: int = 16,
                 saturate: float = 0.7, outlier: float = 4.0, accept_window: int = 64, margin_dense: float = 0.0,
                 z: float = 0.5, min_rounds: int = 8, confirm: int = 4, max_gap: int = 1024,
                 measure_block: int = 8) -> None:
        if gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1 (got {gamma_max})")
        self.gamma_max = gamma_max
        self.ladder = gamma_ladder(gamma_max)
        self.adapt_gamma = adapt_gamma
        self.fall_back = fall_back
        spec = tuple(reversed(self.ladder)) if adapt_gamma else (gamma_max,)
        self.arms = spec + ((0,) if fall_back else ())  # γ descending, then dense
        self.window = window
        self.min_samples = min_samples
        self.margin = margin
        self.explore_share = explore_share
        self.min_gap = min_gap
        self.saturate = saturate
        self.outlier = outlier
        self.accept_window = accept_window
        self.margin_dense = margin_dense
        self.z = z
        self.min_rounds = min_rounds
        self.confirm = confirm
        self.max_gap = max_gap
        self.measure_block = measure_block
        self._run_key = None
        self.reset()

    def reset(self) -> None:
        """Forget every estimate (a new batch size or context scale)."""
        self.current = self.gamma_max  # the committed arm
        self._times: dict[int, _Samples] = {}  # arm → steady-state iteration times
        # per draft position i: (share accepting >= i+1, share accepting >= i) of recent fresh rounds
        self._pos = [_Ratio(self.accept_window) for _ in range(self.gamma_max)]
        self._emitted: dict[int, deque] = {}  # γ → tokens per sequence of its recent fresh rounds
        # tokens(arm) and _tokens_se(arm) change only with a fresh round: cached per acceptance version, so
        # a dense step (B = 1: ~1.2 ms on the H200) does not recompute every arm's prediction (~20 µs)
        self._acc_version = 0
        self._tok_cache: dict[int, tuple[int, float | None]] = {}
        self._se_cache: dict[int, tuple[int, float]] = {}
        self.rounds = 0
        self.dense_steps = 0
        self.discarded = 0  # samples dropped (captures, compilations, outliers, stale rounds)
        self.switches = 0  # changes of the committed arm
        self.explorations = 0
        self.iteration = 0
        self.elapsed = 0.0  # seconds of the observed (timed) iterations
        self.regret = 0.0  # seconds spent exploring beyond the committed arm's cost for the same tokens
        # seconds of iterations that captured or compiled: one-time, so neither regret (they would block every later
        # exploration: one 0.8 s capture of γ = 2 at B = 64 is 1 % of 80 s of decoding) nor observed time
        self.warm_up = 0.0
        self._probed = not self.fall_back  # the initial dense probe is done
        self._exploring: int | None = None  # the arm under exploration
        self._explore_need = 0  # steady samples it still has to give
        self._explore_left = 0  # iterations it may still take
        self._explore_regret = 0.0
        self._charge_next = False  # the round after a dense exploration is stale: charged to it
        self._last_regret: dict[int, float] = {}  # arm → regret of its last exploration
        self._explored_at: dict[int, int] = {}  # arm → iteration its last exploration ended
        self._last_end = -10 ** 9
        # iterations from the end of the last exploration before the next one from a dense commit: doubles (up to
        # max_gap) with each exploration that leaves dense committed, back to min_gap at a switch
        self._dense_gap = self.min_gap
        self._last_dense = False
        self._confirming: int | None = None  # the arm that beat the committed one: re-measuring the latter

    def start_run(self, batch: int, context: int) -> None:
        """A ``generate`` call of ``batch`` sequences of about ``context`` tokens begins: estimates from
        earlier calls carry over when both match (same batch, context within a factor of 2)."""
        key = (int(batch), max(1, int(context)).bit_length())
        if key != self._run_key:
            self.reset()
            self._run_key = key
        self._last_dense = False  # the drafter plans afresh after the prefill
        self._charge_next = False

    # -- estimates ---------------------------------------------------------------------------
    @property
    def dense_mode(self) -> bool:
        """Whether the committed arm is dense."""
        return self.current == 0

    @property
    def gamma(self) -> int:
        """The committed γ (``0``: dense)."""
        return self.current

    def t(self, arm: int) -> float | None:
        """Median steady-state seconds of one iteration of ``arm``, or ``None`` (too few samples)."""
        s = self._times.get(arm)
        return s.median() if s is not None and len(s) >= self.min_samples else None

    def accept_rate(self, i: int) -> float | None:
        """Conditional acceptance of draft position ``i`` (0-based) over recent fresh rounds."""
        return self._pos[i].value()

    def tokens(self, arm: int) -> float | None:
        """Predicted tokens per sequence of one iteration of ``arm`` (``1 + E[min(accepted, γ)]``)."""
        hit = self._tok_cache.get(arm)
        if hit is not None and hit[0] == self._acc_version:
            return hit[1]
        out, p = 1.0, 1.0
        for i in range(arm):
            c = self.accept_rate(i)
            if c is None:
                out = None
                break
            p *= c
            out += p
        self._tok_cache[arm] = (self._acc_version, out)
        return out

    def rate(self, arm: int) -> float | None:
        """Tokens per second per sequence of ``arm``, or ``None`` (not measured yet)."""
        t, n = self.t(arm), self.tokens(arm)
        return None if t is None or n is None or t <= 0 else n / t

    # compatibility with the first controller's names
    @property
    def t_dense(self) -> float | None:
        return self.t(0)

    def dense_rate(self) -> float | None:
        return self.rate(0)

    def rate_spec(self, gamma: int | None = None) -> float | None:
        return self.rate(self.current if gamma is None else gamma)

    # -- decision ------------------------------------------------------------------------------
    def next_gamma(self) -> int:
        """γ for the coming iteration, ``0`` for a dense step."""
        if self._exploring is None:
            arm = self._explore_candidate()
            if arm is not None:
                self._exploring = arm
                old = self._times.get(arm)
                if old is not None:  # re-measured from scratch: one stale estimate must not outlive it
                    old.clear()
                if self.current == 0 and arm != 0:
                    self._forget_acceptance()
                self._explore_need = self.min_samples
                # a capture, and the stale round after dense steps, may come first
                self._explore_left = self._explore_need + 2
                self._explore_regret = 0.0
                self.explorations += 1
        return self.current if self._exploring is None else self._exploring

    def _explore_candidate(self) -> int | None:
        if len(self.arms) == 1 or self.t(self.current) is None:
            return None
        if not self._probed:  # the probe: dense, once the committed arm has its samples
            self._probed = True
            return 0
        if self._gap_left() > 0 or self.regret >= self.explore_share * self.elapsed:
            return None
        others = [a for a in self.arms if a != self.current]
        grow = [a for a in others if a > self.current]
        c = self.accept_rate(self.current - 1) if self.current > 0 else None
        if self.current == 0:
            # from dense: the speculative rung whose exploration is expected to cost least (then the least
            # recently measured, then the largest). γ = 1 measures the first position's acceptance for a
            # fraction of γ = 4's round; if it wins, the ladder grows from there (saturation). Picking the
            # largest first made the first exploration after a dense commit on a hard stretch (prose B = 64 on
            # the H200) wait ~2 s of decoding for its budget: a whole timed call at 225 of 231 steps dense.
            pick = min(others, key=lambda a: (self._explore_estimate(a), self._explored_at.get(a, -1), -a))
        elif grow and c is not None and c >= self.saturate:  # the last position keeps being accepted: grow
            pick = min(grow)
        else:  # the arm measured longest ago (never measured: first)
            pick = min(others, key=lambda a: (self._explored_at.get(a, -1), -a))
        if self.regret + self._explore_estimate(pick) > self.explore_share * self.elapsed:
            return None
        return pick

    def _gap_left(self) -> int:
        """Iterations until the next exploration may start (``<= 0``: now). From dense no round tells how
        speculation would do, so explorations are blind probes; where they keep losing (B = 1 on the H200: every
        rung 15-25 % slower than a dense step) each one waits twice as long as the last (up to ``max_gap``), so
        their cost falls well below ``explore_share`` while a text that turns easy is still found (a switch resets
        the gap). On the H200 (ssl.py, B = 1) the share alone gave one or two explorations in most 160-token calls,
        3-4 % of each such call."""
        gap = self._dense_gap if self.current == 0 else self.min_gap
        return self._last_end + gap - self.iteration

    def _explore_estimate(self, pick: int) -> float:
        """Expected regret of exploring ``pick`` now: its last exploration's, else predicted from its measured
        time and the current acceptance (``min_samples`` rounds plus the first one, which re-plans after dense
        steps and is no sample), else as if its iterations emitted nothing."""
        est = self._last_regret.get(pick)
        if est is not None:
            return est
        t_pick, n_pick, cur = self.t(pick), self._tokens_guess(pick), self.rate(self.current)
        if t_pick is None and pick > self.current:
            # never measured, and larger than the committed arm (from dense, or growing on saturated acceptance):
            # a round is a verify plus γ draft steps, linear in γ. A smaller rung keeps the pessimistic price below:
            # where the committed γ pays, exploring down early costs a few % of a short call
            t_pick = self._interpolated_t(pick)
        if t_pick is not None and n_pick is not None and cur:
            rounds = self.min_samples + (1 if self.current == 0 else 0)
            return rounds * max(0.0, t_pick - n_pick / cur)
        return (self.min_samples + 1) * (self.t(self.current) or 0.0)

    def _tokens_guess(self, arm: int) -> float | None:
        """:meth:`tokens`, with positions no recent round reached taken at the last known position's acceptance
        (for the exploration budget only: growing from γ = 1 must not be priced as if it emitted nothing)."""
        out, p, c = 1.0, 1.0, None
        for i in range(arm):
            c = self.accept_rate(i) if self._pos[i].pairs else c
            if c is None:
                return None
            p *= c
            out += p
        return out

    def _interpolated_t(self, gamma: int) -> float | None:
        """A rung's round time from dense's step and the nearest measured rung's round, linear in γ (an
        estimate for the exploration budget only: the regret actually charged is measured). Without it, an
        unmeasured rung was priced as ``min_samples + 1`` iterations emitting nothing: ~12 ms at B = 64, 1.2 s
        of decoding at a 1 % share before the first exploration of γ = 1 or 2 from a dense commit."""
        t0 = self.t(0)
        known = [g for g in self.arms if g > 0 and self.t(g) is not None]
        if t0 is None or not known:
            return None
        g = min(known, key=lambda k: abs(k - gamma))
        return t0 + gamma * max(0.0, self.t(g) - t0) / g

    def _decide(self) -> None:
        own = self._times.get(self.current)
        if own is not None and len(own) < own.need:
            return  # confirming: the committed arm's fresh samples are still coming
        cur = self.rate(self.current)
        if cur is None:
            return
        best, rb = self.current, cur
        for a in self.arms:
            if self.current == 0 and a != 0 and self._tokens_se(a) == math.inf:
                # from dense, speculation is judged on rounds of its own (the bound below needs their spread):
                # a rung predicted from another's positions would give -inf and block the switch for good
                continue
            r = self.rate(a)
            if r is not None and r > rb:
                best, rb = a, r
        if best == self.current:
            return
        # speculation against dense: a few rounds' acceptance is uncertain (one sequence keeps a draft
        # or not); decide on the bound that favours the committed arm (± one standard error of its tokens)
        margin = self.margin
        if self.current == 0:
            rb = (self.tokens(best) - self.z * self._tokens_se(best)) / self.t(best)
        elif best == 0:
            if len(self._emitted.get(self.current, ())) < self.min_rounds:
                return  # too few rounds to know the acceptance: a wrong dense commit would stick
            cur = (self.tokens(self.current) + self.z * self._tokens_se(self.current)) / self.t(self.current)
            margin = self.margin_dense
        if rb > (1.0 + margin) * cur:
            if self.confirm and self._confirming != best:  # re-measure the committed arm before leaving it
                self._confirming = best
                own = self._times.get(self.current)
                if own is not None:
                    own.clear(need=self.confirm)
                return
            self._confirming = None
            self.current = best
            self.switches += 1
            self._dense_gap = self.min_gap
        else:
            self._confirming = None

    def _forget_acceptance(self) -> None:
        """Drop the acceptance of past rounds: speculation explored from a dense commit is judged on its own
        fresh rounds. The rounds that made dense win may be a stretch of the text long gone (prose on the
        H200: 1.85 tokens per γ = 4 round over the first 24 tokens, 4.3 after); a window of 64 such rounds
        outvoted two fresh rounds per exploration for hundreds of tokens."""
        self._pos = [_Ratio(self.accept_window) for _ in range(self.gamma_max)]
        self._emitted.clear()
        self._acc_version += 1

    def _tokens_se(self, arm: int) -> float:
        """Standard error of the mean tokens per fresh round of ``arm`` (infinite below two rounds)."""
        hit = self._se_cache.get(arm)
        if hit is not None and hit[0] == self._acc_version:
            return hit[1]
        q = self._emitted.get(arm)
        se = math.inf if q is None or len(q) < 2 else statistics.stdev(q) / math.sqrt(len(q))
        self._se_cache[arm] = (self._acc_version, se)
        return se

    # -- observations --------------------------------------------------------------------------
    def observe_round(self, gamma: int, mean_accepted: float, seconds: float | None,
                      profile=None, wall: float | None = None) -> None:
        """A speculative round of ``gamma`` drafts took ``seconds`` (``None``: a warm-up, not a cost);
        ``mean_accepted`` drafts were kept per active sequence; ``profile[i]``: the share of active
        sequences that kept at least ``i + 1`` drafts (default: from ``mean_accepted``, as if every
        sequence kept the same). ``wall``: the iteration's wall time even when it is no cost sample (a
        capture during an exploration is counted in :attr:`warm_up`, not as regret: it is paid once)."""
        self.rounds += 1
        stale = self._last_dense
        self._last_dense = False
        if profile is None:
            profile = [min(1.0, max(0.0, mean_accepted - i)) for i in range(gamma)]
        if not stale:
            self._acc_version += 1  # every arm's predicted tokens change
            self._emitted.setdefault(gamma, deque(maxlen=self.accept_window)).append(1.0 + float(mean_accepted))
            prev = 1.0
            for i in range(min(gamma, self.gamma_max)):
                p = float(profile[i])
                self._pos[i].add(p, prev)
                prev = p
        self._observe(gamma, seconds, 1.0 + float(mean_accepted), stale, wall)

    def observe_dense(self, seconds: float | None, wall: float | None = None, steps: int = 1) -> None:
        """``steps`` dense steps took ``seconds`` together (``None``: a warm-up, not a cost; ``wall``: their time
        anyway); a block of several (:meth:`dense_run`) gives one sample, their mean."""
        self.dense_steps += steps
        self._observe(0, seconds, float(steps), False, wall, steps)
        self._last_dense = True

    def dense_run(self, cap: int = 64) -> int:
        """How many dense steps, the coming one included, the engine may take before it consults the controller
        again (``0``: the coming iteration is not a committed dense step; then every iteration is observed).

        Committed to dense, nothing can change until an exploration may start (``min_gap`` iterations after the
        last one, and its expected regret within ``explore_share`` of the observed time): the steps until then
        need no decision and no timing of their own, so the engine times them as one block. Per-step bookkeeping
        cost ~50 µs of a 1.4 ms dense step at B = 1 on the H200 (0.96x the dense method's tokens/s with every
        step dense). While dense is being (re-)measured (the probe, an exploration, fewer than ``min_samples`` or
        ``confirm`` samples), blocks of ``measure_block`` steps, one sample each: measured one by one, dense steps
        carried the per-step timing and controller work that committed blocks do not (prose B = 1 on the H200:
        1.48 ms against 1.337 ms), so γ = 4 at 0.967x dense looked faster than dense."""
        if len(self.arms) == 1 or self._exploring not in (None, 0) or (self.current != 0 and self._exploring is None):
            return 0
        own = self._times.get(0)
        if self._exploring == 0 or own is None or len(own) < max(own.need, self.min_samples):
            return self.measure_block  # (re-)measuring dense: as blocks too, as committed dense steps will run
        gap = self._gap_left()
        t0 = own.median()
        est = min(self._explore_estimate(a) for a in self.arms if a != 0)
        short = (self.regret + est) / self.explore_share - self.elapsed if self.explore_share > 0 else math.inf
        budget = math.ceil(short / t0) if t0 > 0 and short > 0 else 0
        return int(max(1, min(cap, max(gap, budget))))

    def _observe(self, arm: int, seconds: float | None, tokens: float, stale: bool,
                 wall: float | None = None, steps: int = 1) -> None:
        self.iteration += steps
        timed = seconds is not None and seconds > 0
        spent = seconds if timed else (wall if wall is not None and wall > 0 else None)
        exploring = self._exploring is not None
        charged = exploring or (self._charge_next and stale)
        self._charge_next = False
        if spent is not None and not timed:
            # a capture / compilation: paid once per shape, whichever arm met it first; warm-up, neither a cost
            # nor observed time (which would widen the exploration budget)
            self.warm_up += spent
        elif spent is not None:
            self.elapsed += spent
        if charged and spent is not None and timed:
            cur = self.rate(self.current)
            r = max(0.0, spent - tokens / cur) if cur else 0.0
            self.regret += r
            if exploring:
                self._explore_regret += r
            elif self._last_regret.get(0) is not None:
                self._last_regret[0] += r
        steady = False
        if not timed or stale:
            self.discarded += 1
        else:
            steady = self._times.setdefault(arm, _Samples(self.window, self.outlier)).add(float(seconds) / steps)
            if not steady:
                self.discarded += 1
        if exploring:
            self._explore_left -= 1
            if steady and arm == self._exploring:
                self._explore_need -= 1
            if self._explore_need <= 0 or self._explore_left <= 0:
                done = self._exploring
                self._exploring = None
                self._last_regret[done] = self._explore_regret
                self._explored_at[done] = self._last_end = self.iteration
                if self.current == 0 and done != 0:  # a blind probe from dense: the next one waits longer
                    self._dense_gap = min(self.max_gap, 4 * self._dense_gap)
                self._charge_next = done == 0 and self.current != 0  # the stale round after it
        if self._exploring is None:
            self._decide()


class Pacing:
    """The engine's side of a controller: γ_t per iteration, timed observations, dense-step bookkeeping.

    :meth:`~specdec.engine.SpeculativeEngine.generate` calls :meth:`next_gamma` at the start of each
    iteration and :meth:`dense_done` or :meth:`round_done` at its end. The controller's observation is the
    wall time from the end of the previous observation (the call's first iteration: from its start) to the
    iteration's end, so the loop's work between iterations and the controller's own are in it; ``None`` when a
    capture or compilation happened in between. ``controller``
    ``None`` (adaptation off, the dense method, a replay, a near-lossless method): every iteration has
    the fixed ``gamma`` (``0`` for the dense method).
    """

    def __init__(self, controller, gamma: int, batch: int | None = None, context: int | None = None) -> None:
        self.controller = controller
        self.gamma = gamma
        self.dense_steps = 0  # dense steps chosen by the controller
        self._stale_plan = False  # dense steps ran since the last verification
        self._t0 = 0.0
        self._events = 0
        # the end of the last observation (perf_counter, capture count): an iteration is timed from there, not from
        # its own start, so the engine loop's work between iterations (its device read of ``active``) and the
        # controller's own bookkeeping are charged to the iterations. Timed from ``next_gamma`` only, a γ = 1 round
        # on the H200 (B = 1, ssl.py) measured 3.1 ms while the calls that explored it spent ~4 ms per round: each
        # exploration from dense cost ~1.3-3x its charged regret, so the 1 % exploration share cost 2-4 % per call.
        self._mark: float | None = None
        self._mark_events = 0
        self._block = 0  # dense steps of the current block (SpeculationController.dense_run); 0: no block
        self._left = 0  # steps of it still to hand out
        self._done = 0  # steps of it done
        self._run = getattr(controller, "dense_run", None)
        start = getattr(controller, "start_run", None)
        if start is not None and batch is not None:
            start(batch, context or 1)

    @property
    def fixed_gamma(self) -> int:
        """The coming iteration's γ when it is known before the current one ends (no controller: every iteration
        has the fixed ``gamma``), else ``0``."""
        return self.gamma if self.controller is None and not self._left else 0

    def next_gamma(self) -> int:
        """γ_t of the coming iteration, ``0`` for a dense step."""
        if self._left:  # inside a block of committed dense steps: no timing, no decision
            self._left -= 1
            return 0
        if self.controller is None:
            return self.gamma
        if self._mark is None:  # the call's first iteration
            self._events = warm_up_events()
            self._t0 = time.perf_counter()
        else:
            self._events, self._t0 = self._mark_events, self._mark
        g = self.controller.next_gamma()
        if g == 0 and self._run is not None:
            n = self._run()
            if n > 1:
                self._block, self._left, self._done = n, n - 1, 0
        return g

    def _seconds(self) -> tuple[float | None, float]:
        """(the iteration's time as a cost sample, ``None`` if it captured or compiled; its wall time)"""
        t = time.perf_counter() - self._t0
        self._mark_events = warm_up_events()
        return (None if self._mark_events != self._events else t), t

    def _observed(self) -> None:
        """The controller has its observation: the next iteration's time starts now."""
        self._mark = time.perf_counter()

    def dense_done(self) -> None:
        """A dense step ended."""
        if self.controller is None:
            return
        self.dense_steps += 1
        self._stale_plan = True
        if self._block:
            self._done += 1
            if self._done == self._block:
                self.finish()
            return
        t, wall = self._seconds()
        self.controller.observe_dense(t, wall=wall)
        self._observed()

    def finish(self) -> None:
        """Report the dense steps of an unfinished block (the engine calls this when generation ends)."""
        if self._done:
            t, wall = self._seconds()
            self.controller.observe_dense(t, wall=wall, steps=self._done)
            self._observed()
        self._block = self._left = self._done = 0

    def take_stale_plan(self) -> bool:
        """Whether dense steps ran since the last verification (the draft plan predates them): the
        drafter re-plans without scores (sinks + recent) before the next draft. Reading clears it."""
        stale, self._stale_plan = self._stale_plan, False
        return stale

    def round_done(self, gamma: int, mean_accepted: float, profile=None) -> None:
        """A speculative round of ``gamma`` drafts ended; ``mean_accepted`` drafts per active sequence were
        kept; ``profile[i]``: the share of active sequences that kept at least ``i + 1``."""
        if self.controller is not None:
            t, wall = self._seconds()
            self.controller.observe_round(gamma, mean_accepted, t, profile=profile, wall=wall)
            self._observed()


def warm_up_script(arms) -> list[int]:
    """The γ_t an engine's warm-up runs (:meth:`specdec.engine.SpeculativeEngine.warm_up`) for a controller's
    ``arms`` (:attr:`SpeculationController.arms`; ``0``: dense steps): every speculative arm after a verification and,
    where dense is an arm, after a dense step (a re-plan without scores first), then a dense step — each step kind
    the controller can choose later, so none of them is first seen (and captured) in a timed call."""
    dense = 0 in arms
    script: list[int] = []
    for g in sorted((a for a in arms if a > 0), reverse=True):
        script += [g, g] + ([0, g] if dense else [])
    return script + ([0] if dense else [])


class ScriptedPacing(Pacing):
    """A :class:`Pacing` that hands out γ_t from a script and observes nothing (the engine's warm-up): dense steps
    mark the plan stale, as under a controller; after the script, dense steps. ``done``: the script ran out.
    One object serves several ``generate`` calls (a call may end before its script does)."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(None, script[0] if script else 0)
        self.script = list(script)
        self.position = 0

    @property
    def done(self) -> bool:
        return self.position >= len(self.script)

    @property
    def fixed_gamma(self) -> int:
        return 0  # the next γ_t is the script's, not known to the drafter's early start

    def next_gamma(self) -> int:
        g = self.script[self.position] if not self.done else 0
        self.position += 1
        return g

    def dense_done(self) -> None:
        self.dense_steps += 1
        self._stale_plan = True

    def round_done(self, gamma: int, mean_accepted: float, profile=None) -> None:
        pass

    def finish(self) -> None:
        pass


class AcceptanceReplay:
    """Replays per-round acceptance lengths recorded by a real run (``generate --record-acceptance``).

    At the papers' scale (random-weight 8B models, see :mod:`specdec.shapes`) drafts are never
    accepted; replaying the accepted lengths a real model reached with the same method and budget
    makes every real cost run (draft steps, selection, score emission, verification, host work)
    with a realistic τ. Round ``i`` of sequence ``b`` takes ``rounds[i % R][b % B_rec]`` clamped to
    the round's γ; the emitted token after them is the target's greedy token at that position. The
    tokens are meaningless, the timings are not: rows made this way are labelled *replayed*.

    Args:
        rounds: per round, each recorded sequence's accepted drafts (``-1``: finished, skipped).
    """

    def __init__(self, rounds: list[list[int]], meta: dict | None = None) -> None:
        clean = [[int(n) for n in r if int(n) >= 0] for r in rounds]
        clean = [r for r in clean if r]
        if not clean:
            raise ValueError("the acceptance trace has no rounds; record one with generate --record-acceptance FILE")
        self.rounds = clean
        self.meta = dict(meta or {})
        self._table: torch.Tensor | None = None

    @classmethod
    def load(cls, path) -> "AcceptanceReplay":
        """Read a trace file written by :func:`save_trace`."""
        import json
        from pathlib import Path

        from specdec.errors import SpecdecError

        p = Path(path)
        try:
            data = json.loads(p.read_text())
            return cls(data["rounds"], {k: v for k, v in data.items() if k != "rounds"})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecdecError(f"cannot read acceptance trace {p} ({type(exc).__name__}: {exc}); record one with "
                               "`specdec generate ... --record-acceptance FILE`.") from None

    @property
    def mean_accepted(self) -> float:
        n = sum(len(r) for r in self.rounds)
        return sum(sum(r) for r in self.rounds) / n

    def _lengths(self, i: int, B: int, device) -> torch.Tensor:
        if self._table is None or self._table.shape[1] != B or self._table.device != torch.device(device):
            rows = [[r[b % len(r)] for b in range(B)] for r in self.rounds]
            self._table = torch.tensor(rows, dtype=torch.long, device=device)  # (R, B), made once
        return self._table[i % self._table.shape[0]]

    def apply(self, acc, logits: torch.Tensor, round_index: int):
        """``acc`` with the recorded lengths; ``logits`` ``(B, γ+1, V)`` give the token after them."""
        from specdec.sampling import Acceptance

        B, rows = logits.shape[0], logits.shape[1]
        n = self._lengths(round_index, B, logits.device).clamp(max=rows - 1)
        nxt = logits.argmax(-1).gather(1, n.view(B, 1)).view(B)
        return Acceptance(n_accepted=n, next_token=nxt)


def trace_json(stats, **meta) -> str:
    """``stats.acceptance_trace`` (a :class:`~specdec.engine.RunStats` of a recording run) and ``meta`` as JSON."""
    import json

    return json.dumps(dict(meta, method=stats.method, gamma=stats.gamma, tau=stats.mean_accepted_length,
                           gamma_per_round=stats.gamma_per_round, rounds=stats.acceptance_trace))


def save_trace(path, stats, **meta) -> None:
    """Write :func:`trace_json` to ``path`` (atomically; read back by :meth:`AcceptanceReplay.load`)."""
    from specdec.outputs import write_text

    write_text(path, trace_json(stats, **meta), "acceptance trace")
