"""Speculation that never loses: an adaptive γ per iteration and dense fall-back.

:class:`SpeculationController` decides, before each iteration of :meth:`SpeculativeEngine.generate`,
how many tokens to draft — γ_t on a ladder ``γ, ⌈γ/2⌉, …, 1`` (the configured γ is the ceiling:
caches and plans are sized for it; the ladder keeps the verify shapes, hence CUDA-graph captures,
to a few) — or ``0``: one plain dense step instead of a draft/verify round.

- **γ per iteration.** After each round the mean accepted length ``a`` (over the active sequences)
  moves γ_t: ``a ≥ γ_t − ½`` (acceptance saturates) climbs one rung; ``a < γ_t / 2`` (acceptance
  collapses) in two consecutive rounds steps down to the largest rung ``≤ ⌈a⌉ + 1``.
- **Dense fall-back, by measured steady-state costs.** Speculation pays when its tokens per second
  per sequence, ``(a + 1) / T_iter(γ_t)``, beat plain decoding's ``1 / T_dense``
  (``speedup ≈ τ·T_dense / (γ·T_draft + T_verify + T_select)``). Each cost is the *median* of the
  last ``window`` wall-clock samples of its kind (the engine reads the device back once per
  iteration, so these are real end-to-end costs). A sample is discarded when a CUDA-graph capture
  or a ``torch.compile`` compilation happened during its iteration (:func:`specdec.graphs.capture_events`,
  dynamo's graph count), and when it is ``outlier``× the median of its kind (an unseen warm-up);
  three such in a row are a real change and restart the estimate. Acceptance of a round right after
  dense steps (its plan predates them) does not count. A dense step is probed once speculation has
  two samples and again every ``4·probe_every`` rounds; while dense wins, every ``probe_every``
  dense steps two speculative rounds probe back (the gap doubles, up to 8×, while probes confirm
  dense). Hysteresis: dense is chosen when speculation is 2 % slower, speculation again when it is
  3 % faster — no flapping.
- **Steady state across calls.** The engine keeps its controller between ``generate`` calls of the
  same batch size and context scale (:meth:`SpeculationController.start_run`), so a warmed-up
  engine decides from its first iteration.

Both decisions change only *how* tokens are produced: dense steps and verified rounds each emit
exactly the target's tokens (greedy) or samples of its distribution (rejection sampling), so the
output is unchanged. Only lossless methods adapt: a near-lossless one (Dustin's sparse verification)
emits what its γ gives, and γ_t follows the whole batch's acceptance, so adapting would make a
sequence's output depend on its batch mates. Fall-back needs a drafter that drafts from the target's own cache
(``Drafter.dense_steps_ok``) and the full verifier; otherwise only γ adapts.

:data:`ADAPTIVE_DEFAULT` is the one switch for the default (``PipelineConfig.adaptive``,
``specdec generate`` and ``specdec bench`` without ``--adaptive/--no-adaptive``).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque

import torch

#: whether adaptive γ / dense fall-back is on by default (PipelineConfig.adaptive, the CLI): off until an
#: H200 run shows it never loses (B = 64 and 16 within ~2 % of fixed γ, B = 1 >= 0.97x dense)
ADAPTIVE_DEFAULT = False


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
        self._rejected = 0

    def add(self, x: float) -> bool:
        if len(self.values) >= 2 and x > self.outlier * self.median():
            self._rejected += 1
            if self._rejected < 3:
                return False
            self.values.clear()  # three in a row: the cost really changed
        self._rejected = 0
        self.values.append(x)
        return True

    def median(self) -> float:
        return statistics.median(self.values)

    def __len__(self) -> int:
        return len(self.values)


class SpeculationController:
    """Chooses γ_t (``0`` = a dense step) per iteration from observed acceptance and steady-state times.

    Args:
        gamma_max: the configured γ (upper bound).
        adapt_gamma: move γ_t with the acceptance (``False``: always ``gamma_max``).
        fall_back: allow dense steps when the measured costs say drafting cannot pay.
        probe_every: dense steps between probes of speculation (and ``4·probe_every`` rounds between
            dense probes).
        warmup_rounds: steady-state speculative samples before the first dense probe.
        window: samples per cost kept for its median.
        enter_margin: hysteresis, lower side: dense when ``rate_spec < (1 − enter_margin)·rate_dense``
            (small: a losing speculation stays above 0.98× dense).
        exit_margin: hysteresis, upper side: speculation again when ``rate_spec > (1 + exit_margin)·rate_dense``
            (with ``enter_margin`` a 5 % band: no flapping).
        outlier: a sample this many times its kind's median is a warm-up, not a cost.
    """

    def __init__(self, gamma_max: int, adapt_gamma: bool = True, fall_back: bool = True, probe_every: int = 16,
                 warmup_rounds: int = 2, window: int = 8, enter_margin: float = 0.02, exit_margin: float = 0.03,
                 outlier: float = 4.0) -> None:
        if gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1 (got {gamma_max})")
        self.gamma_max = gamma_max
        self.ladder = gamma_ladder(gamma_max)
        self.adapt_gamma = adapt_gamma
        self.fall_back = fall_back
        self.probe_every = probe_every
        self.warmup_rounds = warmup_rounds
        self.window = window
        self.enter_margin = enter_margin
        self.exit_margin = exit_margin
        self.outlier = outlier
        self._run_key = None
        self.reset()

    def reset(self) -> None:
        """Forget every estimate (a new batch size or context scale)."""
        self.gamma = self.gamma_max
        self._times: dict[int, _Samples] = {}  # γ → round times; 0 → dense step times
        self._acc: dict[int, deque] = {}  # γ → mean accepted drafts of rounds with a fresh plan
        self.rounds = 0
        self.dense_steps = 0
        self.discarded = 0  # samples dropped (captures, compilations, outliers)
        self.dense_mode = False
        self._since_dense = 0  # rounds since the last dense step
        self._since_probe = 0  # dense steps since the last speculative probe (dense mode)
        self._probe_left = 0  # speculative probe rounds still to run (dense mode)
        self._probe_gap = self.probe_every  # dense steps between probes; doubles while probes confirm dense
        self._last_dense = False
        self._low = 0  # consecutive rounds of collapsed acceptance

    def start_run(self, batch: int, context: int) -> None:
        """A ``generate`` call of ``batch`` sequences of about ``context`` tokens begins: estimates from
        earlier calls carry over when both match (same batch, context within a factor of 2)."""
        key = (int(batch), max(1, int(context)).bit_length())
        if key != self._run_key:
            self.reset()
            self._run_key = key
        self._last_dense = False  # the drafter plans afresh after the prefill
        self._probe_left = 0

    # -- estimates ---------------------------------------------------------------------------
    @property
    def t_dense(self) -> float | None:
        d = self._times.get(0)
        return d.median() if d is not None and len(d) else None

    def rate_spec(self, gamma: int | None = None) -> float | None:
        """Tokens/s per sequence of speculative rounds at ``gamma`` (default γ_t), or ``None``."""
        g = self.gamma if gamma is None else gamma
        t, a = self._times.get(g), self._acc.get(g)
        if t is None or not len(t) or not a:
            return None
        return (sum(a) / len(a) + 1.0) / t.median()

    def dense_rate(self) -> float | None:
        t = self.t_dense
        return None if not t else 1.0 / t

    # -- decision ------------------------------------------------------------------------------
    def next_gamma(self) -> int:
        """γ for the coming iteration, ``0`` for a dense step."""
        if not self.fall_back:
            return self.gamma
        if self.dense_mode:
            if self._probe_left > 0:
                return self.gamma
            if self._since_probe >= self._probe_gap:
                self._probe_left = 2  # the first round drafts from a stale plan: its acceptance does not count
                return self.gamma
            return 0
        dense = self._times.get(0)
        spec = self._times.get(self.gamma)
        if (dense is None or len(dense) < 2) and spec is not None and len(spec) >= self.warmup_rounds:
            return 0  # measure a dense step (twice: a first one may be discarded as a capture)
        if self._since_dense >= 4 * self.probe_every:  # re-measure the dense cost now and then
            return 0
        return self.gamma

    # -- observations --------------------------------------------------------------------------
    def observe_round(self, gamma: int, mean_accepted: float, seconds: float | None) -> None:
        """A speculative round of ``gamma`` drafts took ``seconds`` (``None``: a warm-up, not a cost);
        ``mean_accepted`` drafts were kept per active sequence."""
        self.rounds += 1
        self._since_dense += 1
        stale = self._last_dense
        self._last_dense = False
        probe_done = False
        if self._probe_left > 0:
            self._probe_left -= 1
            if self._probe_left == 0:
                self._since_probe, probe_done = 0, True
        self._sample(gamma, seconds)
        if not stale:
            self._acc.setdefault(gamma, deque(maxlen=self.window)).append(float(mean_accepted))
            if self.adapt_gamma:
                self._adapt(gamma, mean_accepted)
        self._decide()
        if probe_done and self.dense_mode:  # the probe confirmed dense: probe less often (at most 8x)
            self._probe_gap = min(8 * self.probe_every, 2 * self._probe_gap)

    def observe_dense(self, seconds: float | None) -> None:
        """A dense step took ``seconds`` (``None``: a warm-up, not a cost)."""
        self.dense_steps += 1
        self._since_dense = 0
        self._since_probe += 1
        self._last_dense = True
        self._sample(0, seconds)
        self._decide()

    def _sample(self, kind: int, seconds: float | None) -> None:
        if seconds is None or seconds <= 0:
            self.discarded += 1
            return
        samples = self._times.setdefault(kind, _Samples(self.window, self.outlier))
        if not samples.add(float(seconds)):
            self.discarded += 1

    def _adapt(self, gamma: int, a: float) -> None:
        i = self.ladder.index(gamma) if gamma in self.ladder else len(self.ladder) - 1
        if a >= gamma - 0.5:
            self._low = 0
            self.gamma = self.ladder[min(i + 1, len(self.ladder) - 1)]
        elif a < gamma / 2:
            self._low += 1
            if self._low >= 2:
                self._low = 0
                cap = max(1, math.ceil(a) + 1)
                lower = [g for g in self.ladder[:i] if g <= cap]
                self.gamma = lower[-1] if lower else self.ladder[0]
        else:
            self._low = 0

    def _decide(self) -> None:
        if not self.fall_back:
            return
        rd, rs = self.dense_rate(), self.rate_spec()
        if rd is None or rs is None:
            return
        if not self.dense_mode and rs < (1.0 - self.enter_margin) * rd:
            self.dense_mode, self._since_probe = True, 0
        elif self.dense_mode and self._probe_left == 0 and rs > (1.0 + self.exit_margin) * rd:
            self.dense_mode, self._probe_gap = False, self.probe_every


class Pacing:
    """The engine's side of a controller: γ_t per iteration, timed observations, dense-step bookkeeping.

    :meth:`~specdec.engine.SpeculativeEngine.generate` calls :meth:`next_gamma` at the start of each
    iteration and :meth:`dense_done` or :meth:`round_done` at its end (the wall time in between is the
    controller's observation, ``None`` when a capture or compilation happened in between). ``controller``
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
        start = getattr(controller, "start_run", None)
        if start is not None and batch is not None:
            start(batch, context or 1)

    def next_gamma(self) -> int:
        """γ_t of the coming iteration, ``0`` for a dense step."""
        if self.controller is None:
            return self.gamma
        self._events = warm_up_events()
        self._t0 = time.perf_counter()
        return self.controller.next_gamma()

    def _seconds(self) -> float | None:
        t = time.perf_counter() - self._t0
        return None if warm_up_events() != self._events else t

    def dense_done(self) -> None:
        """A dense step ended."""
        if self.controller is not None:
            self.controller.observe_dense(self._seconds())
            self.dense_steps += 1
            self._stale_plan = True

    def take_stale_plan(self) -> bool:
        """Whether dense steps ran since the last verification (the draft plan predates them): the
        drafter re-plans without scores (sinks + recent) before the next draft. Reading clears it."""
        stale, self._stale_plan = self._stale_plan, False
        return stale

    def round_done(self, gamma: int, mean_accepted: float) -> None:
        """A speculative round of ``gamma`` drafts ended; ``mean_accepted`` drafts per active sequence were kept."""
        if self.controller is not None:
            self.controller.observe_round(gamma, mean_accepted, self._seconds())


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
