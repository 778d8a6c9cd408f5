"""The decode loop: prefill, then ``draft → verify → accept → rollback`` until every sequence ends.

One preallocated :class:`~specdec.cache.KVCache` holds the whole batch with a length per
sequence. Rolling back rejected drafts is lowering that length; finished sequences are frozen
(their length stops moving) so shapes stay static.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import Drafter, Verifier
from specdec.models import SpecdecModel
from specdec.sampling import SamplingConfig, accept, check_finite, choose, nonfinite_flags, raise_nonfinite

PHASES = ("prefill", "draft", "select", "verify", "sample")


class PhaseTimer:
    """Wall time per phase; synchronizes CUDA at phase edges so GPU time lands in the right phase."""

    def __init__(self, device: torch.device, sync: bool = True) -> None:
        self.seconds = {p: 0.0 for p in PHASES}
        self.sync = sync and device.type == "cuda"

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0


@dataclass
class DecodeState:
    """What every component sees during generation.

    Attributes:
        model: the target model.
        cache: KV cache ``(N, B, H_kv, L, D)``.
        lengths: ``(B,)`` int64 verified tokens in the cache per sequence.
        pending: ``(B,)`` int64 last emitted token, not yet in the cache.
        tokens: per sequence, the prompt and every emitted token (``pending`` included).
        active: ``(B,)`` bool, sequences still generating.
    """

    model: SpecdecModel
    cache: KVCache
    lengths: torch.Tensor
    pending: torch.Tensor
    tokens: list[list[int]]
    active: torch.Tensor
    sampling: SamplingConfig
    generator: torch.Generator | None
    timer: PhaseTimer


@dataclass
class RunStats:
    """Statistics of one :meth:`SpeculativeEngine.generate` call.

    Attributes:
        method: the method's name.
        batch_size: sequences generated together.
        gamma: draft length γ (0 for dense decoding).
        iterations: decode iterations (draft + verify rounds, or dense steps).
        generated_tokens: tokens emitted over all sequences.
        mean_accepted_length: τ, tokens gained per sequence and iteration (accepted drafts + 1).
        acceptance_per_position: share of iterations whose draft ``i`` was accepted.
        decode_seconds: wall time after the prefill.
        tokens_per_second: ``(generated_tokens - B) / decode_seconds`` (the first token comes from the prefill).
        phase_seconds: wall time per phase; ``select`` (plan building) runs inside ``draft`` and is counted in
            both, so the phases add up to more than ``decode_seconds``.
        lossless: ``False`` for near-lossless methods (sparse verification).
        dense_steps: iterations run as plain dense steps by the adaptive controller (:mod:`specdec.adaptive`).
        gamma_per_round: γ_t of each speculative round (constant γ without adaptation).
        acceptance_trace: per speculative round, each sequence's accepted drafts (``-1``: finished);
            filled when the engine's ``record_acceptance`` is set (``generate --record-acceptance``).
        replayed: the acceptance lengths were replayed from a trace (timings real, tokens not).
    """

    method: str
    batch_size: int
    gamma: int
    iterations: int = 0
    generated_tokens: int = 0
    mean_accepted_length: float = 1.0
    acceptance_per_position: list[float] = field(default_factory=list)
    decode_seconds: float = 0.0
    tokens_per_second: float = 0.0
    phase_seconds: dict[str, float] = field(default_factory=dict)
    lossless: bool = True
    dense_steps: int = 0
    gamma_per_round: list[int] = field(default_factory=list)
    acceptance_trace: list[list[int]] = field(default_factory=list)
    replayed: bool = False

    def to_dict(self) -> dict:
        """Plain dict for JSON, with ``selection_overhead_share`` = select seconds / decode seconds."""
        d = dict(self.__dict__)
        d["selection_overhead_share"] = (
            self.phase_seconds.get("select", 0.0) / self.decode_seconds if self.decode_seconds else 0.0
        )
        return d


@dataclass
class Prefilled:
    """A prompt batch already run through the target: reuse it across methods with the same model.

    Attributes:
        ids: the prompts' token ids.
        k, v: ``(N, B, H_kv, L_p, D)`` cache contents for the longest prompt.
        last_logits: ``(B, V)`` target logits after each prompt's last token.
    """

    ids: list[list[int]]
    k: torch.Tensor
    v: torch.Tensor
    last_logits: torch.Tensor


@dataclass
class GenerationResult:
    """``tokens[b]``: generated ids of sequence ``b`` (prompt excluded); ``text[b]`` decoded."""

    tokens: list[list[int]]
    text: list[str]
    stats: RunStats


class SpeculativeEngine:
    """Speculative (or, without a drafter, plain autoregressive) decoding on one engine.

    Args:
        model: the target :class:`SpecdecModel`.
        drafter: proposes γ tokens per iteration; ``None`` = dense autoregressive decoding.
        verifier: checks the γ+1 rows; defaults to :class:`specdec.verifiers.FullVerifier`.
        gamma: draft length γ.
        sampling: greedy (temperature 0) or sampling settings.
        method: a name for the stats.
        prefill_chunk: prompt tokens per prefill forward (bounds memory at long context).
    """

    def __init__(
        self,
        model: SpecdecModel,
        drafter: Drafter | None = None,
        verifier: Verifier | None = None,
        gamma: int = 4,
        sampling: SamplingConfig | None = None,
        method: str | None = None,
        prefill_chunk: int = 1024,
        eos_token_id: int | Sequence[int] | None = None,
        sync_timing: bool = True,
        adaptive: bool = True,
    ) -> None:
        from specdec.verifiers import FullVerifier

        if gamma < 1:
            raise SpecdecError(f"gamma must be >= 1 (got {gamma}); use gamma=4 or so.")
        self.model = model
        self.drafter = drafter
        self.verifier = verifier or (FullVerifier(model) if drafter is not None else None)
        self.gamma = gamma
        self.sampling = sampling or SamplingConfig()
        self.method = method or ("dense" if drafter is None else type(drafter).__name__)
        self.prefill_chunk = prefill_chunk
        self.sync_timing = sync_timing
        #: adaptive γ per iteration and dense fall-back (:mod:`specdec.adaptive`); lossless either way
        self.adaptive = adaptive
        #: record each round's accepted lengths in ``RunStats.acceptance_trace``
        self.record_acceptance = False
        #: an :class:`~specdec.adaptive.AcceptanceReplay` overriding acceptance lengths (benchmarks only)
        self.replay = None
        if eos_token_id is None:
            eos_token_id = model.hf.generation_config.eos_token_id if model.hf.generation_config else None
            if eos_token_id is None:
                eos_token_id = model.hf.config.eos_token_id
        self.eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        self.lossless = getattr(self.verifier, "lossless", True)

    # ------------------------------------------------------------------------------------------
    def _encode(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)):
            raise SpecdecError("prompts must be a list of strings or token-id lists, not one string; wrap it in [ ].")
        out = []
        for p in prompts:
            if isinstance(p, str):
                if not p.strip():
                    raise SpecdecError("a prompt is empty or whitespace only; give it some text.")
                if self.model.tokenizer is None:
                    raise SpecdecError("text prompts need a tokenizer; pass token ids or load the model with one.")
                ids = self.model.tokenizer(p, add_special_tokens=False).input_ids
            else:
                ids = [int(t) for t in p]
            if not ids:
                raise SpecdecError("a prompt has no tokens; give it some text.")
            vocab = self.model.dims.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise SpecdecError(
                    f"token id {bad[0]} is outside the model's vocabulary [0, {vocab}); pass ids from this model's tokenizer."
                )
            out.append(ids)
        if not out:
            raise SpecdecError("no prompts given; pass at least one.")
        return out

    def _prefill(self, state: DecodeState, prompts: list[list[int]]) -> torch.Tensor:
        """Fill the cache one sequence at a time (ragged prompts, exact per-sequence numerics)."""
        dev = self.model.device
        last = []
        for b, ids in enumerate(prompts):
            view = state.cache.rows(b, b + 1)
            done = 0
            logits = None
            while done < len(ids):
                chunk = torch.tensor([ids[done : done + self.prefill_chunk]], device=dev)
                logits = self.model.forward(chunk, view, torch.tensor([done], device=dev), logits_to_keep=1)
                done += chunk.shape[1]
            last.append(logits[0, -1])
        return torch.stack(last)

    @torch.no_grad()
    def prefill(self, prompts: Sequence[str] | Sequence[Sequence[int]]) -> Prefilled:
        """Run the prompts through the target once; pass the result to :meth:`generate` of any engine
        on the same model to skip its prefill (benchmarks compare methods this way)."""
        ids = self._encode(prompts)
        cache = self.model.new_cache(len(ids), max(len(p) for p in ids))
        lengths = torch.tensor([len(p) for p in ids], device=self.model.device)
        state = DecodeState(self.model, cache, lengths, lengths, [], lengths, self.sampling, None,
                            PhaseTimer(self.model.device, False))
        logits = self._prefill(state, ids)
        return Prefilled(ids=ids, k=cache.k, v=cache.v, last_logits=logits)

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = 64,
        prefilled: Prefilled | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt (stopping at EOS); see :class:`GenerationResult`.

        Args:
            prompts: strings (tokenized without special tokens) or token-id lists.
            max_new_tokens: per sequence.
            prefilled: the result of :meth:`prefill` on the same prompts, to skip the prefill.
        """
        if max_new_tokens < 1:
            raise SpecdecError(f"max_new_tokens must be >= 1 (got {max_new_tokens}).")
        ids = self._encode(prompts)
        if prefilled is not None and prefilled.ids != ids:
            raise SpecdecError("prefilled was made for other prompts; call engine.prefill(prompts) with these prompts.")
        dims, dev = self.model.dims, self.model.device
        B = len(ids)
        longest = max(len(p) for p in ids)
        if longest + max_new_tokens > dims.max_positions:
            raise SpecdecError(
                f"prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
                f"{dims.max_positions} positions; shorten the prompt (e.g. --context-tokens) or generate fewer tokens."
            )
        gamma = self.gamma if self.drafter is not None else 0
        cache = self.model.new_cache(B, longest + max_new_tokens + gamma + 2, reuse=True)
        cache.bounded = True  # every write stays below longest + max_new_tokens + gamma + 1: no host checks
        gen = None
        if not self.sampling.greedy:
            gen = torch.Generator(device=dev)
            gen.manual_seed(self.sampling.seed if self.sampling.seed is not None else torch.seed())
        timer = PhaseTimer(dev, self.sync_timing)
        state = DecodeState(
            model=self.model,
            cache=cache,
            lengths=torch.tensor([len(p) for p in ids], device=dev),
            pending=torch.zeros(B, dtype=torch.long, device=dev),
            tokens=[list(p) for p in ids],
            active=torch.ones(B, dtype=torch.bool, device=dev),
            sampling=self.sampling,
            generator=gen,
            timer=timer,
        )
        stats = RunStats(method=self.method, batch_size=B, gamma=gamma, lossless=self.lossless)
        out: list[list[int]] = [[] for _ in range(B)]

        with timer("prefill"):
            if prefilled is not None:
                lp = prefilled.k.shape[3]
                cache.k[:, :, :, :lp].copy_(prefilled.k)
                cache.v[:, :, :, :lp].copy_(prefilled.v)
                logits = prefilled.last_logits.clone()
            else:
                logits = self._prefill(state, ids)
            check_finite(logits, "prefill")
            first, _ = choose(logits, self.sampling, gen)
        self._emit(state, out, first, torch.zeros(B, dtype=torch.long, device=dev), None, max_new_tokens, advance=False)
        if self.drafter is not None:
            with timer("prefill"):
                self.drafter.prefill(state)

        accepted_at = torch.zeros(max(gamma, 1), dtype=torch.float64)
        trials = 0
        ctl = self._controller(gamma)
        stale_plan = False  # dense steps ran since the last verification
        t_start = time.perf_counter()
        while bool(state.active.any()):
            stats.iterations += 1
            active = state.active.clone()
            t_iter = time.perf_counter()
            g = ctl.next_gamma() if ctl is not None else gamma  # γ_t; 0: a dense step (adaptive.py)
            if self.drafter is None or g == 0:
                with timer("verify"):
                    logits = self.model.forward(state.pending.view(B, 1), cache, state.lengths)[:, -1]
                    if self.sampling.greedy:  # read with the emission below: one host read per step
                        flags = nonfinite_flags(logits)
                    else:  # a NaN probability must not reach torch.multinomial
                        check_finite(logits, "target")
                with timer("sample"):
                    nxt, _ = choose(logits, self.sampling, gen)
                extra = [flags] if self.sampling.greedy else []
                got = self._emit(state, out, nxt, torch.zeros(B, dtype=torch.long, device=dev), None, max_new_tokens,
                                 extra=extra)
                if got:
                    raise_nonfinite(got[0], "target")
                if ctl is not None:
                    ctl.observe_dense(time.perf_counter() - t_iter)
                    stats.dense_steps += 1
                    stale_plan = True
                continue
            if stale_plan:  # the verification scores predate the dense steps: plan from sinks + recent
                with timer("select"):
                    self.drafter.on_verify(state, None)
                stale_plan = False
            with timer("draft"):
                drafts, q = self.drafter.draft(state, g)
            req = self.drafter.score_request(g)
            with timer("verify"):
                rows = torch.cat([state.pending.view(B, 1), drafts], dim=1)
                logits = self.verifier.verify(state, rows, req)
                flags = nonfinite_flags(logits)  # read below, with the acceptance (no extra sync)
            if not self.sampling.greedy:  # sampling from NaN would fail first with a vaguer error
                raise_nonfinite(flags, "verifier")
            with timer("sample"):
                acc = accept(drafts, logits, self.sampling, q, gen)
                if self.replay is not None:  # benchmarks: acceptance lengths of a recorded real run
                    acc = self.replay.apply(acc, logits, len(stats.gamma_per_round))
            pos = torch.arange(g, device=dev).view(1, g)
            hits = ((pos < acc.n_accepted.view(B, 1)) & active.view(B, 1)).sum(0)
            # one host read for the emission, the acceptance statistics and the finiteness flags
            hits_h, flags_h, n_active, n_acc = self._emit(state, out, acc.next_token, acc.n_accepted, drafts,
                                                          max_new_tokens,
                                                          extra=[hits, flags, active.sum(), acc.n_accepted])
            raise_nonfinite(flags_h, "verifier")
            trials += int(n_active[0])
            accepted_at[:g] += torch.tensor(hits_h, dtype=torch.float64)
            stats.gamma_per_round.append(g)
            if self.record_acceptance:
                stats.acceptance_trace.append([n if a else -1 for n, a in zip(n_acc, active.tolist())])
            with timer("select"):
                self.verifier.on_verify(state)
                self.drafter.on_verify(state, req)
            if ctl is not None:
                ctl.observe_round(g, sum(hits_h) / max(1, int(n_active[0])), time.perf_counter() - t_iter)
        stats.decode_seconds = time.perf_counter() - t_start
        stats.replayed = self.replay is not None
        stats.generated_tokens = sum(len(o) for o in out)
        stats.tokens_per_second = (stats.generated_tokens - B) / stats.decode_seconds if stats.decode_seconds else 0.0
        if trials:
            stats.acceptance_per_position = (accepted_at / trials).tolist()
            stats.mean_accepted_length = 1.0 + float(accepted_at.sum()) / trials
        stats.phase_seconds = dict(timer.seconds)
        tok = self.model.tokenizer
        text = [tok.decode(o, skip_special_tokens=True) if tok is not None else "" for o in out]
        return GenerationResult(tokens=out, text=text, stats=stats)

    def _controller(self, gamma: int):
        """The :class:`~specdec.adaptive.SpeculationController` of this run, or ``None`` (dense, or not adaptive)."""
        # near-lossless methods (sparse verification) emit what their γ and batch give: adapting γ to
        # the batch's acceptance would change a sequence's output with its batch mates; they keep γ
        if self.drafter is None or not self.adaptive or self.replay is not None or not self.lossless:
            return None
        from specdec.adaptive import SpeculationController
        from specdec.verifiers import FullVerifier

        # dense steps write the target's cache only: a drafter with its own cache, or a sparse
        # verifier with its own state, would miss them; those runs adapt γ only
        fall_back = bool(getattr(self.drafter, "dense_steps_ok", False)) and type(self.verifier) is FullVerifier
        return SpeculationController(gamma, fall_back=fall_back)

    def _emit(
        self,
        state: DecodeState,
        out: list[list[int]],
        next_token: torch.Tensor,
        n_accepted: torch.Tensor,
        drafts: torch.Tensor | None,
        max_new_tokens: int,
        advance: bool = True,
        extra: Sequence[torch.Tensor] = (),
    ) -> list[list[int]]:
        """Append accepted drafts + the next token per active sequence; advance lengths; stop at EOS/limit.

        Everything the host needs comes over in **one** transfer (one synchronisation): the
        emission's tensors plus ``extra`` device tensors (integers or bools), returned as lists.
        """
        B = len(out)
        parts = [n_accepted.reshape(-1).long(), next_token.reshape(-1).long(), state.active.reshape(-1).long()]
        if drafts is not None:
            parts.append(drafts.reshape(-1).long())
        parts += [e.reshape(-1).long() for e in extra]
        host = torch.cat(parts).tolist()
        n_list, nxt_list = host[:B], host[B : 2 * B]
        active = [bool(a) for a in host[2 * B : 3 * B]]
        off = 3 * B
        drafts_list = None
        if drafts is not None:
            g = drafts.shape[1]
            drafts_list = [host[off + b * g : off + (b + 1) * g] for b in range(B)]
            off += B * g
        extra_host = []
        for e in extra:
            extra_host.append(host[off : off + e.numel()])
            off += e.numel()
        adv = [0] * len(out)
        for b in range(len(out)):
            if not active[b]:
                continue
            new = (drafts_list[b][: n_list[b]] if drafts_list is not None else []) + [nxt_list[b]]
            for t in new:
                out[b].append(t)
                state.tokens[b].append(t)
                if t in self.eos or len(out[b]) >= max_new_tokens:
                    active[b] = False
                    break
            # the pending token and accepted drafts enter the cache; the new token is pending.
            # A finished sequence is frozen where it is (its writes stay inside the capacity).
            adv[b] = 1 + n_list[b] if (advance and active[b]) else 0
        dev = state.lengths.device
        # one host-to-device copy each (not one tiny write per sequence)
        state.lengths += torch.tensor(adv, dtype=state.lengths.dtype).to(dev, non_blocking=True)
        state.active = torch.tensor(active, dtype=torch.bool).to(dev, non_blocking=True)
        state.pending = torch.where(state.active, next_token, state.pending)
        return extra_host
