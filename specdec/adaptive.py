"""Speculation that never loses: an adaptive γ per iteration and dense fall-back.

:class:`SpeculationController` decides, before each iteration of :meth:`SpeculativeEngine.generate`,
how many tokens to draft — γ_t in ``1..γ`` (the configured γ is the ceiling: caches and plans are
sized for it) — or ``0``: one plain dense step instead of a draft/verify round.

- **γ per iteration.** After each round the mean accepted length ``a`` (over the active sequences)
  moves γ_t: ``a ≥ γ_t − ½`` (acceptance saturates: every draft was taken) grows it by one; ``a <
  γ_t / 2`` (acceptance collapses) shrinks it to ``max(1, ⌈a⌉ + 1)``; otherwise it stays.
- **Dense fall-back, by a measured cost model.** Speculation pays when its tokens per second per
  sequence, ``(a + 1) / T_iter(γ_t)``, beat plain decoding's ``1 / T_dense``
  (``speedup ≈ τ·T_dense / (γ·T_draft + T_verify + T_select)``, see the memory-bound concepts page). Both rates are
  exponential moving averages of wall-clock iteration times (the engine reads the device back once
  per iteration, so these are real end-to-end costs); the first sample of each kind is dropped
  (CUDA-graph captures and compilations happen there). A dense probe step measures ``T_dense``
  after a few rounds and again every ``probe_every`` rounds; while dense wins, every
  ``probe_every``-th step is a speculative round, so a change (acceptance recovers, contexts grow)
  is noticed. Typical case: B = 1 on a small model, where a draft step costs as much as a dense
  step (launch-bound) and no τ can pay for γ of them.

Both decisions change only *how* tokens are produced: dense steps and verified rounds each emit
exactly the target's tokens (greedy) or samples of its distribution (rejection sampling), so the
output is unchanged. Only lossless methods adapt: a near-lossless one (Dustin's sparse verification)
emits what its γ gives, and γ_t follows the whole batch's acceptance, so adapting would make a
sequence's output depend on its batch mates. Fall-back needs a drafter that drafts from the target's own cache
(``Drafter.dense_steps_ok``) and the full verifier; otherwise only γ adapts.
"""

from __future__ import annotations

import math
import time

import torch


class SpeculationController:
    """Chooses γ_t (``0`` = a dense step) per iteration from observed acceptance and iteration times.

    Args:
        gamma_max: the configured γ (upper bound).
        adapt_gamma: move γ_t with the acceptance (``False``: always ``gamma_max``).
        fall_back: allow dense steps when the cost model says drafting cannot pay.
        probe_every: rounds between probes of the other mode.
        warmup_rounds: speculative rounds before the first dense probe.
        ema: weight of a new time sample.
        margin: dense is chosen when ``rate_spec < margin · rate_dense``.
    """

    def __init__(self, gamma_max: int, adapt_gamma: bool = True, fall_back: bool = True, probe_every: int = 16,
                 warmup_rounds: int = 3, ema: float = 0.3, margin: float = 1.0) -> None:
        if gamma_max < 1:
            raise ValueError(f"gamma_max must be >= 1 (got {gamma_max})")
        self.gamma_max = gamma_max
        self.gamma = gamma_max
        self.adapt_gamma = adapt_gamma
        self.fall_back = fall_back
        self.probe_every = probe_every
        self.warmup_rounds = warmup_rounds
        self.ema = ema
        self.margin = margin
        self.t_dense: float | None = None
        self.rate_spec: float | None = None  # tokens / s / sequence of speculative rounds (EMA)
        self._seen_spec: set[int] = set()
        self._seen_dense = False
        self.rounds = 0  # speculative rounds so far
        self.dense_steps = 0
        self._since_probe = 0
        self.dense_mode = False

    # -- decision ------------------------------------------------------------------------------
    def next_gamma(self) -> int:
        """γ for the coming iteration, ``0`` for a dense step."""
        if not self.fall_back:
            return self.gamma
        if self.dense_mode:
            return self.gamma if self._since_probe >= self.probe_every else 0  # probe speculation again
        if self.t_dense is None:  # measure a dense step once speculation has been timed
            return 0 if self.rounds >= self.warmup_rounds else self.gamma
        if self._since_probe >= 4 * self.probe_every:  # re-measure the dense cost now and then
            return 0
        return self.gamma

    def dense_rate(self) -> float | None:
        return None if not self.t_dense else 1.0 / self.t_dense

    # -- observations --------------------------------------------------------------------------
    def observe_round(self, gamma: int, mean_accepted: float, seconds: float) -> None:
        """A speculative round of ``gamma`` drafts took ``seconds``; ``mean_accepted`` drafts were kept."""
        self.rounds += 1
        self._since_probe = 0 if self.dense_mode else self._since_probe + 1
        if gamma in self._seen_spec and seconds > 0:
            rate = (mean_accepted + 1.0) / seconds
            self.rate_spec = rate if self.rate_spec is None else (1 - self.ema) * self.rate_spec + self.ema * rate
        self._seen_spec.add(gamma)
        if self.adapt_gamma:
            if mean_accepted >= gamma - 0.5:
                self.gamma = min(self.gamma_max, gamma + 1)
            elif mean_accepted < gamma / 2:
                self.gamma = max(1, min(gamma - 1, math.ceil(mean_accepted) + 1))
        self._decide()

    def observe_dense(self, seconds: float) -> None:
        """A dense step took ``seconds``."""
        self.dense_steps += 1
        self._since_probe = self._since_probe + 1 if self.dense_mode else 0
        if self._seen_dense and seconds > 0:
            self.t_dense = seconds if self.t_dense is None else (1 - self.ema) * self.t_dense + self.ema * seconds
        elif not self._seen_dense and self.t_dense is None:
            self._seen_dense = True  # first dense step: captures/compiles land here; measure the next one
            self._since_probe = 4 * self.probe_every  # ... at once
            return
        self._decide()

    def _decide(self) -> None:
        if not self.fall_back or self.t_dense is None or self.rate_spec is None:
            return
        self.dense_mode = self.rate_spec < self.margin / self.t_dense


class Pacing:
    """The engine's side of a controller: γ_t per iteration, timed observations, dense-step bookkeeping.

    :meth:`~specdec.engine.SpeculativeEngine.generate` calls :meth:`next_gamma` at the start of each
    iteration and :meth:`dense_done` or :meth:`round_done` at its end (the wall time in between is the
    controller's observation). ``controller`` ``None`` (adaptation off, the dense method, a replay, a
    near-lossless method): every iteration has the fixed ``gamma`` (``0`` for the dense method).
    """

    def __init__(self, controller, gamma: int) -> None:
        self.controller = controller
        self.gamma = gamma
        self.dense_steps = 0  # dense steps chosen by the controller
        self._stale_plan = False  # dense steps ran since the last verification
        self._t0 = 0.0

    def next_gamma(self) -> int:
        """γ_t of the coming iteration, ``0`` for a dense step."""
        self._t0 = time.perf_counter()
        return self.gamma if self.controller is None else self.controller.next_gamma()

    def dense_done(self) -> None:
        """A dense step ended."""
        if self.controller is not None:
            self.controller.observe_dense(time.perf_counter() - self._t0)
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
            self.controller.observe_round(gamma, mean_accepted, time.perf_counter() - self._t0)


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
