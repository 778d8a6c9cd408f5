"""The decode loop: prefill, then ``draft → verify → accept → commit`` until every sequence ends.

:meth:`SpeculativeEngine.generate` is the algorithm (Vegas / Dustin / MagicDec share it; gpt-fast's
``speculative_decode`` reads the same way): the drafter proposes γ tokens, the verifier scores the γ+1
rows in one target pass, :func:`~specdec.sampling.accept` keeps the longest acceptable prefix plus one
token, and the commit emits them and advances the lengths (τ = tokens gained per iteration).

One preallocated :class:`~specdec.cache.KVCache` holds the whole batch with a length per
sequence. Rolling back rejected drafts is lowering that length; finished sequences are frozen
(their length stops moving) so shapes stay static.
"""

from __future__ import annotations

import numbers
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from specdec.adaptive import ADAPTIVE_DEFAULT, Pacing, ScriptedPacing, warm_up_events, warm_up_script
from specdec.cache import KVCache
from specdec.errors import SpecdecError
from specdec.interfaces import Drafter, Verifier
from specdec.models import SpecdecModel
from specdec.prompts import check_generate_args, check_positions, encode_prompts
from specdec.sampling import SamplingConfig, accept, check_finite, choose, nonfinite_flags, raise_nonfinite

PHASES = ("prefill", "draft", "select", "verify", "sample")


#: ``tree=True`` with a prompt-lookup drafter: the default tree and a lookup branch this long (the tree's depth, so γ
#: stays 4)
DEFAULT_LOOKUP_BRANCH = 4


def _check_tree(tree, drafter, verifier):
    """``tree`` as a :class:`~specdec.tree.DraftTree` (``None``: chain drafts), refused in one line where it cannot run."""
    from specdec.tree import DraftTree
    from specdec.verifiers import FullVerifier

    if tree is None or tree is False:
        return None
    looks = getattr(drafter, "lookup_branch", False) is True  # a prompt-lookup drafter fills a lookup branch
    branch = DEFAULT_LOOKUP_BRANCH if looks else 0
    if tree is True:
        tree = DraftTree.default(lookup=branch)
    elif isinstance(tree, int) and not isinstance(tree, bool):
        tree = DraftTree.top(tree, lookup=branch)
    elif isinstance(tree, (list, tuple)):
        tree = DraftTree(tree, lookup=branch)
    if not isinstance(tree, DraftTree):
        raise SpecdecError(f"tree must be a specdec.tree.DraftTree, True (the default tree), a node count (the most "
                           f"frequent rank paths), a list of rank paths or None, not {tree!r}.")
    drafts = drafter.inner if looks else drafter  # (behind prompt lookup, the inner drafter drafts the tree)
    if drafts is None or not callable(getattr(drafts, "draft_tree", None)):
        raise SpecdecError(f"the {type(drafts).__name__} drafter cannot draft a tree; draft with an EAGLE head "
                           "(specdec.eagle.EagleDrafter; Dustin's option draft=eagle) or without a tree.")
    if tree.lookup and not looks:
        raise SpecdecError(f"the tree's lookup branch is filled by prompt lookup, and the {type(drafter).__name__} "
                           "drafter has none; wrap it (specdec.lookup.LookupDrafter(drafter)) or use lookup=0.")
    if looks and not tree.lookup:
        raise SpecdecError("the prompt-lookup drafter needs a tree with a lookup branch, e.g. "
                           "DraftTree.default(lookup=4) or tree=True; or pass its inner drafter.")
    if verifier is not None and type(verifier) is not FullVerifier:
        raise SpecdecError(f"draft trees are verified densely; {type(verifier).__name__} is not the dense "
                           "FullVerifier: pass verifier=None (or a FullVerifier) or tree=None.")
    return tree


def cache_positions(longest: int, max_new_tokens: int, gamma: int) -> int:
    """Positions of the cache :meth:`SpeculativeEngine.generate` allocates for a ``longest``-token prompt
    (γ draft rows past the last token included; γ = 0 for dense). ``specdec.bench`` allocates it once per
    setting with the methods' γ, so every method of that setting reuses one cache
    (:meth:`~specdec.models.SpecdecModel.new_cache` with ``reuse=True``)."""
    return longest + max_new_tokens + gamma + 2


class PhaseTimer:
    """Time per phase (:data:`PHASES`), accumulated over a generation.

    On a GPU, by default (``sync=False``) from CUDA events recorded at the phase edges on the current stream: no host
    synchronisation, so the host's work (launches, the prompt lookup, the plan) overlaps the GPU's as in an untimed
    run, and a phase's time is the GPU time between its edges (idle gaps inside it included, e.g. while the GPU waits
    for a slow host). The events are resolved when :attr:`seconds` is read (one synchronisation, after the decode
    loop's last host read) and, so that a long generation holds few of them, whenever more than
    :attr:`MAX_PENDING` are waiting and the oldest have completed (:meth:`torch.cuda.Event.query`: no wait).
    ``sync=True`` synchronises at every edge and takes host wall time: host and GPU time per phase, at the cost of the
    overlap (a speculative iteration runs ~4-5 phases; at the embedded model's size the syncs made Dustin's
    iterations measurably slower). On a CPU, host wall time either way."""

    MAX_PENDING = 512
    #: per CUDA device, events whose times were read, for reuse (creating one costs more host time than recording it)
    _spare: dict[int, list] = {}

    def __init__(self, device: torch.device, sync: bool = False) -> None:
        self._seconds = {p: 0.0 for p in PHASES}
        self.device = torch.device(device)
        self.sync = sync and device.type == "cuda"
        self.events = device.type == "cuda" and not sync
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.events:
            if len(self._pending) > self.MAX_PENDING:
                self._drain(wait=False)
            start = self._event()
            self._record(start)
            try:
                yield
            finally:
                end = self._event()
                self._record(end)
                self._pending.append((phase, start, end))
            return
        if self.sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                torch.cuda.synchronize()
            self._seconds[phase] = self._seconds.get(phase, 0.0) + time.perf_counter() - t0

    def _index(self) -> int:
        return torch.cuda.current_device() if self.device.index is None else self.device.index

    def _event(self) -> torch.cuda.Event:
        spare = PhaseTimer._spare.setdefault(self._index(), [])
        return spare.pop() if spare else torch.cuda.Event(enable_timing=True)

    def _record(self, event: torch.cuda.Event) -> None:
        """On the model's device's current stream (where its kernels run, whichever device is current)."""
        event.record(torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None)

    def _drain(self, wait: bool) -> None:
        """Add the pending events' times, in order; ``wait=False`` stops at the first phase not yet completed. The
        events read go back to the spares of their device."""
        done = 0
        for phase, start, end in self._pending:
            if not wait and not end.query():
                break
            if wait:
                end.synchronize()
            self._seconds[phase] = self._seconds.get(phase, 0.0) + start.elapsed_time(end) / 1000.0
            PhaseTimer._spare.setdefault(self._index(), []).extend((start, end))
            done += 1
        del self._pending[:done]

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per phase so far (on a GPU with events: waits for the pending ones)."""
        if self._pending:
            self._drain(wait=True)
        return self._seconds


@dataclass
class DecodeState:
    """What every component sees during generation.

    Attributes:
        model: the target model.
        cache: KV cache ``(N, B, H_kv, L, D)``.
        lengths: ``(B,)`` int64 verified tokens in the cache per sequence.
        pending: ``(B,)`` int64 last emitted token, not yet in the cache.
        tokens: per sequence, the prompt and every emitted token (``pending`` included).
        active: ``(B,)`` bool, sequences still generating (the same tensor as ``cache.live``, updated in place).
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
    #: ``(B, L_p, d)`` the prompts' final hidden states when the model records them (``keep_hidden``, EAGLE)
    prompt_hidden: torch.Tensor | None = None


@dataclass
class RunStats:
    """Statistics of one :meth:`SpeculativeEngine.generate` call.

    Attributes:
        method: the method's name.
        batch_size: sequences generated together.
        gamma: draft length γ (0 for dense decoding).
        iterations: decode iterations (draft + verify rounds, or dense steps).
        generated_tokens: tokens emitted over all sequences.
        mean_accepted_length: τ, tokens gained per sequence and iteration (accepted drafts + 1), counted as the
            verifier accepted them: before an emission stops at EOS or ``max_new_tokens``, so in the last round of a
            sequence it may count tokens that were not emitted (τ measures the draft, ``generated_tokens`` the output).
        acceptance_per_position: share of iterations whose draft ``i`` was accepted.
        decode_seconds: wall time after the prefill.
        tokens_per_second: ``(generated_tokens - B) / decode_seconds`` (the first token comes from the prefill).
        phase_seconds: time per phase (:data:`PHASES`; on a GPU the GPU time between the phase's edges, or host wall
            time with ``sync_timing``; :class:`PhaseTimer`); ``select`` is plan building after each
            verification, ``select_in_draft`` query-aware selection inside draft steps (Quest), which is
            also part of ``draft``.
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

    @property
    def selection_overhead_share(self) -> float:
        """Selection time / decode time: the ``select`` phase (plans built after each verification) plus
        ``select_in_draft`` (query-aware selection done inside draft steps, e.g. Quest's page scoring).
        The one definition used by ``bench``, ``tune`` and the benchmarks."""
        sel = self.phase_seconds.get("select", 0.0) + self.phase_seconds.get("select_in_draft", 0.0)
        return sel / self.decode_seconds if self.decode_seconds else 0.0

    def to_dict(self) -> dict:
        """Plain dict for JSON, with :attr:`selection_overhead_share`."""
        d = dict(self.__dict__)
        d["selection_overhead_share"] = self.selection_overhead_share
        return d


@dataclass
class Prefilled:
    """A prompt batch already run through the target: reuse it across methods with the same model.

    Attributes:
        ids: the prompts' token ids.
        k, v: ``(N_g, B, H_kv, L_p, D)`` global layers' cache contents for the longest prompt.
        last_logits: ``(B, V)`` target logits after each prompt's last token.
        ring_k, ring_v: ``(N_l, B, H_kv, C, D)`` sliding-window layers' rings (``None`` without them).
    """

    ids: list[list[int]]
    k: torch.Tensor
    v: torch.Tensor
    last_logits: torch.Tensor
    ring_k: torch.Tensor | None = None
    ring_v: torch.Tensor | None = None
    hidden: torch.Tensor | None = None  # (B, L_p, d) final hidden states when the model recorded them


@dataclass
class GenerationResult:
    """``tokens[b]``: generated ids of sequence ``b`` (prompt excluded); ``text[b]`` decoded."""

    tokens: list[list[int]]
    text: list[str]
    stats: RunStats


def _check_parts(drafter, verifier) -> None:
    """A drafter / verifier passed to the engine is one (duck-typed: the methods the engine calls), so a selector
    or a name given in its place is one error here, not an ``AttributeError`` inside the first ``generate``."""
    for what, obj, need, hint in (
            ("drafter", drafter, ("prefill", "draft"), "drafter=SparseSelfDrafter(model, selector)"),
            ("verifier", verifier, ("prefill", "verify"), "verifier=FullVerifier(model), or leave it out")):
        if obj is not None and not all(callable(getattr(obj, n, None)) for n in need):
            raise SpecdecError(f"{what} must be a specdec {what.capitalize()} (with {' and '.join(need)}); got "
                               f"{type(obj).__name__}: use {hint}.")


def _composed_name(drafter, verifier) -> str:
    """``stats.method`` of a hand-composed engine: its drafter's class and selector, and a verifier other than the
    full one (``"SparseSelfDrafter(SlidingWindow)"``); the named methods pass their own name."""
    if drafter is None:
        return "dense"

    def part(x):
        sel = getattr(x, "selector", None)
        return type(x).__name__ + (f"({type(sel).__name__})" if sel is not None else "")

    name = part(drafter)
    if verifier is not None and type(verifier).__name__ != "FullVerifier":
        name += "+" + part(verifier)
    return name


class SpeculativeEngine:
    """Speculative (or, without a drafter, plain autoregressive) decoding on one engine.

    Args:
        model: the target :class:`SpecdecModel`.
        drafter: proposes γ tokens per iteration; ``None`` = dense autoregressive decoding.
        verifier: checks the γ+1 rows; defaults to :class:`specdec.verifiers.FullVerifier`.
        gamma: draft length γ.
        sampling: greedy (temperature 0) or sampling settings.
        method: a name for the stats (default: ``"dense"`` without a drafter, else the parts' classes, e.g.
            ``"SparseSelfDrafter(SlidingWindow)"``, ``"EagleDrafter+SparseVerifier(HybridSRHSelector)"``).
        prefill_chunk: prompt tokens per prefill forward (bounds memory at long context).
        eos_token_id: stop a sequence at these ids (default: the model's; ``-1``: never stop early).
        sync_timing: on a GPU, synchronise at every phase edge so that ``phase_seconds`` is host + GPU wall time per
            phase (slower: no overlap of host and GPU work). Default ``False``: phases are timed by CUDA events,
            without synchronisation (:class:`PhaseTimer`).
        adaptive: adaptive γ and the dense fall-back (:mod:`specdec.adaptive`); ``None``: the default (on).
        tree: draft a tree instead of a chain (:mod:`specdec.tree`): a :class:`~specdec.tree.DraftTree`; ``True``
            for :meth:`DraftTree.default() <specdec.tree.DraftTree.default>`; a node count ``n`` for
            :meth:`DraftTree.top(n) <specdec.tree.DraftTree.top>` (the ``n`` most frequent rank paths, 1 to 32); or a
            list of rank paths, e.g. ``[(0,), (1,), (0, 0)]``. With a prompt-lookup drafter
            (:class:`~specdec.lookup.LookupDrafter`) each but a ``DraftTree`` gets a lookup branch of
            :data:`DEFAULT_LOOKUP_BRANCH` nodes that it fills. Dense verification
            (:class:`~specdec.verifiers.FullVerifier`) and a drafter with ``draft_tree`` (the EAGLE drafter, alone or
            behind prompt lookup); γ becomes the tree's depth and stays fixed (no adaptive γ). Lossless as a chain:
            greedy acceptance (:func:`~specdec.tree.accept_greedy`) or, sampling, rejection sampling over the tree
            (:func:`~specdec.tree.accept_sampled`).
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
        sync_timing: bool = False,
        adaptive: bool | None = None,
        tree=None,
    ) -> None:
        from specdec.verifiers import FullVerifier

        _check_parts(drafter, verifier)
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral):
            raise SpecdecError(f"gamma must be an int (got {gamma!r}); use gamma=4 or so.")
        gamma = int(gamma)
        if gamma < 1:
            raise SpecdecError(f"gamma must be >= 1 (got {gamma}); use gamma=4 or so.")
        self.tree = _check_tree(tree, drafter, verifier)
        if self.tree is not None:
            gamma = self.tree.max_depth
            tp = getattr(model, "tp", None)
            if tp is not None and tp.world > 1:
                raise SpecdecError("draft trees run on one device; use tree=None with tensor parallelism.")
        self.model = model
        self.drafter = drafter
        self.verifier = verifier or (FullVerifier(model) if drafter is not None else None)
        self.gamma = gamma
        self.sampling = sampling or SamplingConfig()
        self.method = method or _composed_name(drafter, verifier)
        self.prefill_chunk = prefill_chunk
        self.sync_timing = sync_timing
        #: adaptive γ per iteration and dense fall-back (:mod:`specdec.adaptive`); lossless either way
        self.adaptive = ADAPTIVE_DEFAULT if adaptive is None else adaptive
        self._controllers: dict[int, object] = {}  # γ → SpeculationController (kept between calls)
        self._script: ScriptedPacing | None = None  # warm_up's γ_t in place of the controller
        self._accept_graphs = self._accept_of = None  # the tree acceptance's CUDA graphs, and the model's they follow
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
        # what the target records in this engine's forwards (``_recording``): an EAGLE drafter's final hidden states
        # and feature layers (``records_hidden``, through a lookup wrapper too), else nothing
        need = getattr(drafter, "records_hidden", None) if drafter is not None else None
        self._records = (True, tuple(sorted(need))) if need is not None else (False, ())

    @contextmanager
    def _recording(self) -> Iterator[None]:
        """Inside the block the target records what this engine's drafter reads and nothing else
        (:attr:`SpecdecModel.keep_hidden`, :attr:`~SpecdecModel.hidden_layers`); restored after. Building an EAGLE
        drafter sets them on the shared model for good, and recording hooks keep the fused layers from handing the
        split down GEMM's partials to the next layer's norm (:func:`specdec.fusion._handoff_allowed`): every later
        engine on the model — dense included — then ran other bf16 roundings (on an H200 a dense run after a Dustin
        run emitted other greedy tokens than before it, and MagicDec's τ went from 3.52 to 3.88 on the same window)."""
        m = self.model
        old = (getattr(m, "keep_hidden", False), tuple(getattr(m, "hidden_layers", ())))
        if old == self._records:
            yield
            return
        m.keep_hidden, m.hidden_layers = self._records
        try:
            yield
        finally:
            m.keep_hidden, m.hidden_layers = old

    # ------------------------------------------------------------------------------------------
    def _encode(self, prompts: Sequence[str] | Sequence[Sequence[int]], context_tokens: int | None = None,
                allow_special_tokens: bool = False) -> list[list[int]]:
        """Checked token ids of ``prompts`` (see :mod:`specdec.prompts`)."""
        return encode_prompts(prompts, self.model.tokenizer, self.model.dims.vocab_size, context_tokens,
                              allow_special_tokens)

    def _prefill(self, state: DecodeState, prompts: list[list[int]]) -> torch.Tensor:
        """Fill the cache one sequence at a time (ragged prompts, exact per-sequence numerics)."""
        dev = self.model.device
        last = []
        keep = getattr(self.model, "keep_hidden", False)  # an EAGLE drafter reads the prompt's hidden states
        hidden = None
        for b, ids in enumerate(prompts):
            view = state.cache.rows(b, b + 1)
            done = 0
            logits = None
            while done < len(ids):
                chunk = torch.tensor([ids[done : done + self.prefill_chunk]], device=dev)
                logits = self.model.forward(chunk, view, torch.tensor([done], device=dev), logits_to_keep=1)
                if keep:
                    h = self.model.last_hidden[0]  # (T, d)
                    if hidden is None:
                        hidden = h.new_zeros(len(prompts), max(len(p) for p in prompts), h.shape[-1])
                    hidden[b, done : done + h.shape[0]] = h
                done += chunk.shape[1]
            last.append(logits[0, -1])
        state.prompt_hidden = hidden
        return torch.stack(last)

    @torch.no_grad()
    def prefill(self, prompts: Sequence[str] | Sequence[Sequence[int]], context_tokens: int | None = None,
                allow_special_tokens: bool = False) -> Prefilled:
        """Run the prompts through the target once; pass the result to :meth:`generate` of any engine
        on the same model to skip its prefill (benchmarks compare methods this way). ``context_tokens``
        and ``allow_special_tokens`` as in :meth:`generate`."""
        _, context_tokens = check_generate_args(1, context_tokens, allow_special_tokens)
        ids = self._encode(prompts, context_tokens, allow_special_tokens)
        longest = max(len(p) for p in ids)
        # the prompt alone must fit the positions (generate checks it with its max_new_tokens again)
        check_positions(longest, 0, self.model.dims.max_positions, "context_tokens=")
        cache = self.model.new_cache(len(ids), longest)
        lengths = torch.tensor([len(p) for p in ids], device=self.model.device)
        state = DecodeState(self.model, cache, lengths, lengths, [], lengths, self.sampling, None,
                            PhaseTimer(self.model.device, False))
        with self._recording():
            logits = self._prefill(state, ids)
        return Prefilled(ids=ids, k=cache.k, v=cache.v, last_logits=logits, ring_k=cache.ring_k, ring_v=cache.ring_v,
                         hidden=state.prompt_hidden)

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = 64,
        prefilled: Prefilled | None = None,
        context_tokens: int | None = None,
        allow_special_tokens: bool = False,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt (stopping at EOS); see :class:`GenerationResult`.

        Args:
            prompts: a list of strings or of token-id lists (``[[1, 2, 3]]``), or a 2-d integer tensor.
                Strings are encoded as text, without BOS/EOS.
            max_new_tokens: per sequence, an integer >= 1.
            prefilled: the result of :meth:`prefill` on the same prompts, to skip the prefill.
            context_tokens: keep only the last ``context_tokens`` tokens of each prompt (the CLI's
                ``--context-tokens``); ``None`` keeps them all.
            allow_special_tokens: parse special-token spellings in text prompts (``<|im_start|>`` ...)
                as control tokens; by default they are ordinary text.

        Raises:
            SpecdecError: one sentence naming the bad argument and what it accepts.
        """
        max_new_tokens, context_tokens = check_generate_args(max_new_tokens, context_tokens, allow_special_tokens)
        ids = self._encode(prompts, context_tokens, allow_special_tokens)
        if prefilled is not None and prefilled.ids != ids:
            raise SpecdecError("prefilled was made for other prompts; call engine.prefill(prompts) with these prompts.")
        dims = self.model.dims
        longest = max(len(p) for p in ids)
        check_positions(longest, max_new_tokens, dims.max_positions, "context_tokens=")
        with self._recording():
            return self._decode(ids, max_new_tokens, prefilled, longest)

    def _decode(self, ids: list[list[int]], max_new_tokens: int, prefilled: Prefilled | None,
                longest: int) -> GenerationResult:
        """:meth:`generate` after its checks: prefill (or copy ``prefilled``), then the decode loop."""
        state, run = self._start(ids, max_new_tokens, prefilled)
        try:
            return self._loop(state, run, longest)
        finally:  # outside a decode loop every sequence of the cache reads its whole context again (a reused cache, a
            state.cache.live.fill_(True)  # forward on it after generate, an error mid-loop: SKIP_FINISHED_READS)

    def _loop(self, state: DecodeState, run: "_Run", longest: int) -> GenerationResult:
        """The decode loop of :meth:`_decode`: iterations until no sequence is active."""
        B, timer = len(state.tokens), state.timer
        # adaptive γ_t (specdec.adaptive); its cost estimates carry over between calls of this shape
        pace = self._script or Pacing(self._controller(run.stats.gamma), run.stats.gamma, batch=B, context=longest)
        t_start = time.perf_counter()
        if self.tree is not None and self.replay is not None:
            raise SpecdecError("an acceptance replay drives chain drafts; set engine.replay = None or build the engine "
                               "with tree=None.")
        while self.tree is not None and any(run.active):  # draft trees: γ is the tree's depth, no controller
            run.stats.iterations += 1
            self._tree_round(state, run)
        while any(run.active):  # the host's copy of state.active (_emit): no device read
            run.stats.iterations += 1
            gamma = pace.next_gamma()  # γ_t ≤ γ, the draft length of this iteration; 0: one dense step
            if gamma == 0:  # the dense method, or the controller's fall-back (drafting cannot pay)
                self._dense_step(state, run)
                pace.dense_done()
                continue
            if pace.take_stale_plan():  # dense steps since the last verification: plan from sinks + recent
                with timer("select"):
                    self.drafter.on_verify(state, None)
            with timer("draft"):  # γ tokens x̃_1..x̃_γ per sequence, q: their draft distributions (sampling)
                drafts, q = self.drafter.draft(state, gamma)  # (B, γ), (B, γ, V) or None
            request = self.drafter.score_request(gamma)  # scores the next plan is built from
            with timer("verify"):  # the target on γ+1 rows: the pending token and the drafts
                rows = torch.cat([state.pending.view(B, 1), drafts], dim=1)  # (B, γ+1)
                p_logits = self.verifier.verify(state, rows, request)  # (B, γ+1, V); fills request.scores
                flags = nonfinite_flags(p_logits)
            if not self.sampling.greedy:  # sampling from NaN would fail first with a vaguer error
                raise_nonfinite(flags, "verifier")
            with timer("sample"):  # keep x̃_i while it matches (greedy) or u·q(x̃_i) < p(x̃_i); then one more token
                acc = accept(drafts, p_logits, self.sampling, q, state.generator)
                if self.replay is not None:  # benchmarks: the accepted lengths of a recorded real run
                    acc = self.replay.apply(acc, p_logits, len(run.stats.gamma_per_round))
            # the emission's effect on the device state (lengths, active, pending) and the one host transfer are
            # queued; the next plan is queued behind the transfer, and the host emits into its lists while the GPU
            # builds the plan (the drafter's hook sees the new device state; the host lists grow after it)
            read = self._commit_launch(state, run, acc.n_accepted, acc.next_token, drafts, flags,
                                       self._take_drafter_flags())
            with timer("select"):  # next iteration's plan from this verification's scores
                self.drafter.on_verify(state, request)
            ahead = getattr(self.drafter, "draft_ahead", None)  # (a duck-typed plugin drafter may not have it)
            if pace.fixed_gamma and ahead is not None:  # the next draft queued too, where γ cannot change
                with timer("draft"):
                    ahead(state, pace.fixed_gamma)
            mean_accepted = self._commit_read(state, run, read)
            with timer("select"):
                self.verifier.on_verify(state)
            pace.round_done(gamma, mean_accepted, run.profile)
        pace.finish()  # a block of dense steps cut short by the end of generation
        run.stats.dense_steps = pace.dense_steps
        return self._finish(run, timer, time.perf_counter() - t_start)

    def _tree_round(self, state: DecodeState, run: "_Run") -> None:
        """One iteration with a draft tree: the drafter's tree, one dense target pass over its rows (tree mask),
        acceptance along the tree (greedy: :func:`specdec.tree.accept_greedy`; sampling:
        :func:`specdec.tree.accept_sampled`), the accepted path's K/V moved where a chain's would be
        (:meth:`~specdec.cache.KVCache.keep_path`), then the same commit as a chain's."""
        from specdec.tree import accept_sampled

        B, timer, tree = state.lengths.shape[0], state.timer, self.tree
        with timer("draft"):
            tokens = self.drafter.draft_tree(state, tree)  # (B, N)
        with timer("verify"):
            rows = torch.cat([state.pending.view(B, 1), tokens], dim=1)  # (B, N + 1)
            p_logits = self.model.forward(rows, state.cache, state.lengths, tree=tree)
            flags = nonfinite_flags(p_logits)
        with timer("sample"):
            if self.sampling.greedy:
                n_acc, nxt, path, drafts = self._tree_accept(rows, p_logits.argmax(dim=-1))
            else:  # a NaN probability must not reach torch.multinomial
                check_finite(p_logits, "verifier")
                n_acc, nxt, path = accept_sampled(tree, rows, p_logits, self.sampling, state.generator)
                drafts = rows.gather(1, path)  # (B, D) the accepted path's tokens (past n_acc: never emitted)
            state.cache.keep_path(state.lengths, path)
            # the drafter's non-finite flags are taken for the commit's transfer first: tree_verified raises the
            # flags nobody took, which is a host read (a wait for the whole round's device work) in every round
            dflags = self._take_drafter_flags()
            self.drafter.tree_verified(state, rows, path)  # the path's rows and features, for the next draft
        read = self._commit_launch(state, run, n_acc, nxt, drafts, flags, dflags)
        self._commit_read(state, run, read)

    def _tree_accept(self, rows: torch.Tensor, y: torch.Tensor):
        """Greedy acceptance over the tree (:func:`~specdec.tree.accept_greedy_targets`) and the accepted path's tokens
        ``(n_accepted, next_token, path, drafts (B, D))`` from the verified rows and the target's greedy tokens ``y``:
        ~40 small launches, replayed as one CUDA graph (:class:`~specdec.graphs.CapturedCall`) where the model
        captures its forwards on a GPU. Outputs are fresh tensors either way."""
        from specdec.tree import accept_greedy_targets

        tree = self.tree

        def accept(rows, y):
            n_acc, nxt, path = accept_greedy_targets(tree, rows, y)
            return n_acc, nxt, path, rows.gather(1, path)

        calls = self._accept_calls(rows.device)
        if calls is None:
            return accept(rows, y)
        out = calls(("tree-accept", id(tree), tree.paths, tree.lookup), accept, rows, y, keep=tree)
        return tuple(t.clone() for t in out)  # (the graph's buffers: the next round overwrites them)

    def _accept_calls(self, device: torch.device):
        """The :class:`~specdec.graphs.CapturedCall` of :meth:`_tree_accept`, or ``None`` (eager): on a GPU where the
        model captures its forwards (:meth:`SpecdecModel.enable_cuda_graphs`); new with new model graphs."""
        g = getattr(self.model, "_graphs", None)
        if g is None or device.type != "cuda":
            return None
        if self._accept_of is not g:
            from specdec.graphs import CapturedCall

            self._accept_graphs, self._accept_of = CapturedCall(max_graphs=4), g
        return self._accept_graphs

    @torch.no_grad()
    def warm_up(self, prompts: Sequence[str] | Sequence[Sequence[int]], max_new_tokens: int = 64, **kwargs) -> int:
        """Run every kind of step this engine may take on ``prompts``' shape once, untimed, before calls that
        count: with CUDA graphs each is captured here (with ``torch.compile``, compiled), not in the middle of a
        later call. Returns how many captures and compilations that took.

        Arguments as for :meth:`generate` (the same ``max_new_tokens``: the KV cache, to whose buffers the graphs
        are tied, is sized by it). With the adaptive controller (:mod:`specdec.adaptive`) a plain call visits only the
        γ it settles on, and a rung it explores later is captured inside that later call (on the H200 at B 1 such a
        call ran at a tenth of its usual speed); here every rung of the γ ladder runs after a verification and after
        a dense step, then dense steps (:func:`~specdec.adaptive.warm_up_script`), in as many calls as that takes,
        without the controller seeing them. Without a controller it is one :meth:`generate` call. The tokens are
        dropped."""
        before = warm_up_events()
        controller = self._controller(self.gamma)  # None for the dense method, as in generate
        if controller is None:
            self.generate(prompts, max_new_tokens, **kwargs)
            return warm_up_events() - before
        self._script = script = ScriptedPacing(warm_up_script(controller.arms))
        try:
            while not script.done:  # a call ends with its tokens: the script goes on in the next one
                at = script.position
                self.generate(prompts, max_new_tokens, **kwargs)
                if script.position == at:  # no iteration at all (max_new_tokens = 1): no decode step to warm
                    break
        finally:
            self._script = None
        return warm_up_events() - before

    # -- the steps of generate -----------------------------------------------------------------
    def _start(self, ids: list[list[int]], max_new_tokens: int, prefilled: Prefilled | None) -> tuple[DecodeState, "_Run"]:
        """Allocate the cache, prefill (or copy ``prefilled``), emit the first token, prefill the components."""
        dev = self.model.device
        B = len(ids)
        longest = max(len(p) for p in ids)
        gamma = self.gamma if self.drafter is not None else 0
        rows = max(gamma, self.tree.nodes) if self.tree is not None else gamma  # a tree writes all its nodes' rows
        cache = self.model.new_cache(B, cache_positions(longest, max_new_tokens, rows), reuse=True)
        cache.bounded = True  # every write stays below longest + max_new_tokens + gamma + 1: no host checks
        if cache.ring_k is not None and gamma + 1 > cache.RING_SLACK:
            raise SpecdecError(f"gamma {gamma} is too large for the sliding-window rings ({cache.RING_SLACK} slots of "
                               f"slack); use gamma <= {cache.RING_SLACK - 1}.")
        gen = None
        if not self.sampling.greedy:
            gen = torch.Generator(device=dev)
            gen.manual_seed(self.sampling.seed if self.sampling.seed is not None else torch.seed())
        timer = PhaseTimer(dev, self.sync_timing)
        # the active flags live on the cache (the same tensor, updated in place by every emission): a dense forward
        # then reads only the first positions of finished sequences (specdec.models.SKIP_FINISHED_READS); a reused
        # cache keeps its tensor, whose address its captured CUDA graphs read (new_cache has set it all live again)
        if cache.live is None or cache.live.shape != (B,) or cache.live.device != torch.device(dev):
            cache.live = torch.ones(B, dtype=torch.bool, device=dev)
        state = DecodeState(
            model=self.model,
            cache=cache,
            lengths=torch.tensor([len(p) for p in ids], device=dev),
            pending=torch.zeros(B, dtype=torch.long, device=dev),
            tokens=[list(p) for p in ids],
            active=cache.live,
            sampling=self.sampling,
            generator=gen,
            timer=timer,
        )
        run = _Run(stats=RunStats(method=self.method, batch_size=B, gamma=gamma, lossless=self.lossless),
                   out=[[] for _ in range(B)], max_new_tokens=max_new_tokens,
                   accepted_at=torch.zeros(max(gamma, 1), dtype=torch.float64),
                   produced=torch.zeros(B, dtype=torch.long, device=dev),
                   eos=torch.tensor(sorted(self.eos), dtype=torch.long, device=dev))
        with timer("prefill"):
            if prefilled is not None:
                cache.copy_prefix_from(prefilled.k, prefilled.v, prefilled.ring_k, prefilled.ring_v)
                logits = prefilled.last_logits.clone()
                state.prompt_hidden = prefilled.hidden
            else:
                logits = self._prefill(state, ids)
            check_finite(logits, "prefill")
            first, _ = choose(logits, self.sampling, gen)
        self._emit(state, run, first, torch.zeros(B, dtype=torch.long, device=dev), None, advance=False)
        if self.drafter is not None:
            with timer("prefill"):
                self.drafter.prefill(state)
                self.verifier.prefill(state)
        return state, run

    def _dense_step(self, state: DecodeState, run: "_Run") -> None:
        """Plain autoregressive decoding: one target row, one token (the ``dense`` method)."""
        B = state.lengths.shape[0]
        with state.timer("verify"):
            logits = self.model.forward(state.pending.view(B, 1), state.cache, state.lengths)[:, -1]
            if self.sampling.greedy:  # read with the emission below: one host read per step
                flags = nonfinite_flags(logits)
            else:  # a NaN probability must not reach torch.multinomial
                check_finite(logits, "target")
        with state.timer("sample"):
            nxt, _ = choose(logits, self.sampling, state.generator)
        self._emit(state, run, nxt, torch.zeros(B, dtype=torch.long, device=nxt.device), None,
                   extra=[flags] if self.sampling.greedy else [],
                   check=lambda got: got and raise_nonfinite(got[0], "target"))

    def _take_drafter_flags(self) -> torch.Tensor | None:
        """The drafter's non-finite flags of its greedy draft (:meth:`~specdec.interfaces.Drafter.take_flags`), taken
        for the commit's transfer, or ``None``."""
        take = getattr(self.drafter, "take_flags", None)  # (a duck-typed plugin drafter may not have it)
        return take() if take is not None else None

    def _commit_launch(self, state: DecodeState, run: "_Run", n_accepted: torch.Tensor, next_token: torch.Tensor,
                       drafts: torch.Tensor, flags: torch.Tensor, dflags: torch.Tensor | None) -> "_HostRead":
        """Queue the commit of an iteration: the emission's device side (:meth:`_emit_launch`) and its one host
        transfer, with the non-finite flags of the verifier (``flags``) and of the drafter (``dflags``, from
        :meth:`_take_drafter_flags`) riding along. :meth:`_commit_read` completes it."""
        read = self._emit_launch(state, run, next_token, n_accepted, drafts,
                                 extra=[flags] + ([dflags] if dflags is not None else []))
        read.drafter_flags = dflags is not None
        return read

    def _commit_read(self, state: DecodeState, run: "_Run", read: "_HostRead") -> float:
        """Wait for :meth:`_commit_launch`'s transfer, raise non-finite logits, emit the accepted drafts and the next
        token into the host lists and count acceptance per draft position (from the transfer's accepted counts and
        the sequences active before the emission). Returns the mean accepted drafts per active sequence (the adaptive
        controller's observation)."""
        self._emit_read(state, run, read, check=lambda extra: (
            raise_nonfinite(extra[0], "verifier"), read.drafter_flags and raise_nonfinite(extra[1], "drafter")))
        n_list, was_active, gamma = read.values[0], read.values[2], read.gamma
        live = [n for n, a in zip(n_list, was_active) if a]
        hits = [sum(1 for n in live if n > i) for i in range(gamma)]  # sequences that kept draft i
        run.trials += len(live)
        run.accepted_at[:gamma] += torch.tensor(hits, dtype=torch.float64)  # γ_t ≤ γ (adaptive)
        run.stats.gamma_per_round.append(gamma)
        if self.record_acceptance:  # each sequence's accepted drafts, -1: finished (--record-acceptance)
            run.stats.acceptance_trace.append([n if a else -1 for n, a in zip(n_list, was_active)])
        run.profile = [h / max(1, len(live)) for h in hits]  # share keeping >= i + 1 drafts
        return sum(hits) / max(1, len(live))

    def _finish(self, run: "_Run", timer: PhaseTimer, decode_seconds: float) -> GenerationResult:
        """Statistics (τ = 1 + mean accepted drafts per iteration and sequence) and the decoded text."""
        stats, out = run.stats, run.out
        stats.decode_seconds = decode_seconds
        stats.replayed = self.replay is not None
        stats.generated_tokens = sum(len(o) for o in out)
        stats.tokens_per_second = (stats.generated_tokens - len(out)) / decode_seconds if decode_seconds else 0.0
        if run.trials:
            stats.acceptance_per_position = (run.accepted_at / run.trials).tolist()
            stats.mean_accepted_length = 1.0 + float(run.accepted_at.sum()) / run.trials
        stats.phase_seconds = dict(timer.seconds)
        in_draft = getattr(getattr(self.drafter, "selector", None), "draft_select_seconds", None)
        if in_draft is not None:  # query-aware selection inside the draft forwards (Quest)
            stats.phase_seconds["select_in_draft"] = float(in_draft)
        tok = self.model.tokenizer
        text = [tok.decode(o, skip_special_tokens=True) if tok is not None else "" for o in out]
        return GenerationResult(tokens=out, text=text, stats=stats)

    def _controller(self, gamma: int):
        """The :class:`~specdec.adaptive.SpeculationController` of this run, or ``None`` (dense, or not adaptive)."""
        # near-lossless methods (sparse verification) emit what their γ and batch give: adapting γ to
        # the batch's acceptance would change a sequence's output with its batch mates; they keep γ
        if self.drafter is None or not self.adaptive or self.replay is not None or not self.lossless or self.tree:
            return None
        # a seeded sampling run keeps γ fixed: γ_t follows wall time and the random draws of an iteration depend on
        # its γ (and on whether it is a dense step), so adapting would give other tokens - of the same law - from
        # the same seed run to run; the seed's promise (same seed, same output) wins
        if not self.sampling.greedy and self.sampling.seed is not None:
            return None
        tp = getattr(self.model, "tp", None)
        if tp is not None and tp.world > 1:  # decisions from each rank's own clock would differ: every rank
            return None  # must run the same γ and step kinds (the collectives must match), so γ stays fixed
        from specdec.adaptive import SpeculationController
        from specdec.verifiers import FullVerifier

        # dense steps write the target's cache only: a drafter with its own cache, or a sparse
        # verifier with its own state, would miss them; those runs adapt γ only
        fall_back = bool(getattr(self.drafter, "dense_steps_ok", False)) and type(self.verifier) is FullVerifier
        # one controller per engine and γ: measured steady-state costs survive from one generate call to
        # the next (it restarts its estimates itself when the batch size or the context scale changes)
        c = self._controllers.get(gamma)
        if c is None or c.fall_back != fall_back:
            c = self._controllers[gamma] = SpeculationController(gamma, fall_back=fall_back)
        return c

    def _emit(self, state: DecodeState, run: "_Run", next_token: torch.Tensor, n_accepted: torch.Tensor,
              drafts: torch.Tensor | None, advance: bool = True, extra: Sequence[torch.Tensor] = (),
              check=None) -> list[list[int]]:
        """:meth:`_emit_launch` then :meth:`_emit_read`: emit now (the first token, a dense step)."""
        return self._emit_read(state, run, self._emit_launch(state, run, next_token, n_accepted, drafts, advance, extra),
                               check)

    def _emit_launch(
        self,
        state: DecodeState,
        run: "_Run",
        next_token: torch.Tensor,
        n_accepted: torch.Tensor,
        drafts: torch.Tensor | None,
        advance: bool = True,
        extra: Sequence[torch.Tensor] = (),
    ) -> "_HostRead":
        """The device side of an emission, queued without waiting: per active sequence the accepted drafts + the next
        token are emitted up to the first EOS or the ``max_new_tokens``-th token (which ends the sequence); the
        lengths of the sequences still active advance by the pending token + the accepted drafts (a finished
        sequence is frozen where it is: its writes stay inside the capacity), the next token becomes pending.
        Then **one** transfer to the host (:class:`_HostRead`) of the emission's tensors, the new active flags and
        ``extra`` device tensors (integers or bools); :meth:`_emit_read` emits the same tokens into the host lists.

        With tensor parallelism rank 0's values are broadcast first (one collective), so every rank advances alike.
        """
        B = next_token.shape[0]
        parts = [n_accepted, next_token, state.active] + ([drafts] if drafts is not None else [])
        tensors = parts + list(extra)
        flat = torch.cat([t.reshape(-1).long() for t in tensors])
        tp = getattr(self.model, "tp", None)
        if tp is not None and tp.world > 1:  # rank 0 decides, every rank follows (identical logits make the values
            tp.broadcast_(flat)  # equal; this makes it certain)
            n_accepted, next_token = flat[:B], flat[B : 2 * B].to(next_token.dtype)
            if drafts is not None:
                drafts = flat[3 * B : 3 * B + drafts.numel()].view(drafts.shape)
        g = drafts.shape[1] if drafts is not None else 0
        emit_update(n_accepted, next_token, drafts, state.active, run.produced, state.lengths, state.pending, run.eos,
                    run.max_new_tokens, advance)
        return _HostRead([flat, state.active], [t.numel() for t in tensors] + [B], len(parts), g)

    def _emit_read(self, state: DecodeState, run: "_Run", read: "_HostRead", check=None) -> list[list[int]]:
        """Wait for :meth:`_emit_launch`'s transfer, call ``check(extra)`` (raise before anything is emitted), append
        the emitted tokens per active sequence to the host lists (the same rule as the device side, which it must
        agree with) and keep the host's copy of the active flags; returns ``extra`` as lists."""
        host = read.result()
        n_list, nxt_list, active = host[0], host[1], [bool(a) for a in host[2]]
        extra_host, device_active = host[read.n_parts : -1], [bool(a) for a in host[-1]]
        if check is not None:
            check(extra_host)
        out = run.out
        g = read.gamma
        drafts_flat = host[3] if g else None
        for b in range(len(out)):
            if not active[b]:
                continue
            new = (drafts_flat[b * g : b * g + n_list[b]] if g else []) + [nxt_list[b]]
            for t in new:
                out[b].append(t)
                state.tokens[b].append(t)
                if t in self.eos or len(out[b]) >= run.max_new_tokens:
                    active[b] = False
                    break
        if active != device_active:  # the two sides of one rule: a bug here, never the user's
            odd = [b for b, (h, d) in enumerate(zip(active, device_active)) if h != d]
            raise RuntimeError(f"specdec internal error: the device and the host disagree on whether sequences {odd} "
                               "are still generating; please report it with the prompts and settings.")
        run.active = active
        return extra_host


def emit_update_torch(n_accepted: torch.Tensor, next_token: torch.Tensor, drafts: torch.Tensor | None,
                      active: torch.Tensor, produced: torch.Tensor, lengths: torch.Tensor, pending: torch.Tensor,
                      eos: torch.Tensor, max_new_tokens: int, advance: bool) -> None:
    """The emission's device side, in place: per active sequence the accepted drafts (``drafts[:, :n]``, ``drafts``
    ``(B, g)`` or ``None``) and then ``next_token`` are emitted up to the first EOS id in ``eos`` or the
    ``max_new_tokens``-th token, which ends the sequence; ``produced`` (tokens emitted per sequence) grows by the
    emitted count, ``active`` loses the ended sequences, ``lengths`` of the sequences still active advance by
    ``1 + n_accepted`` (when ``advance``), ``pending`` takes their next token."""
    B = next_token.shape[0]
    g = drafts.shape[1] if drafts is not None else 0
    j = torch.arange(g + 1, device=next_token.device).view(1, g + 1)
    n = n_accepted.view(B, 1)
    tok = next_token.view(B, 1).expand(B, g + 1)
    if drafts is not None:  # emission order: drafts 0..n-1, then the next token at position n
        tok = torch.where(j < n, torch.cat([drafts, drafts[:, :1]], dim=1), tok)
    ends = (j <= n) & ((produced.view(B, 1) + j + 1 >= max_new_tokens) | torch.isin(tok, eos))
    finished = active & ends.any(1)
    produced += torch.where(finished, torch.where(ends, j, g + 1).amin(1) + 1, (n_accepted + 1) * active)
    active &= ~finished
    if advance:
        lengths += torch.where(active, n_accepted + 1, 0).to(lengths.dtype)
    pending.copy_(torch.where(active, next_token.to(pending.dtype), pending))


#: the emission's device side on a GPU: one Triton launch (:mod:`specdec.cuda.triton_emit`) instead of ~22 torch
#: launches; ``False``: the torch operations everywhere
EMIT_KERNEL = True


def emit_update(n_accepted, next_token, drafts, active, produced, lengths, pending, eos, max_new_tokens: int,
                advance: bool) -> None:
    """:func:`emit_update_torch`, as one Triton launch on a GPU (:data:`EMIT_KERNEL`, where Triton imports)."""
    if EMIT_KERNEL and next_token.is_cuda:
        try:
            from specdec.cuda.triton_emit import emit_update as kernel
        except ImportError:  # triton is an optional extra
            kernel = None
        if kernel is not None:
            return kernel(n_accepted, next_token, drafts, active, produced, lengths, pending, eos, max_new_tokens,
                          advance)
    return emit_update_torch(n_accepted, next_token, drafts, active, produced, lengths, pending, eos, max_new_tokens,
                             advance)


class _HostRead:
    """Small device tensors (integers or bools, already packed) → host lists, in **one** transfer: started at once
    (a non-blocking copy into pinned memory on a GPU, and an event), waited for by :meth:`result`. The GPU work
    queued after it does not delay it."""

    def __init__(self, flats: list[torch.Tensor], sizes: list[int], n_parts: int, gamma: int) -> None:
        self.sizes, self.n_parts, self.gamma = sizes, n_parts, gamma
        self.drafter_flags = False
        self.values: list[list[int]] | None = None
        self.event = None
        if flats[0].is_cuda:  # each part copied into its slice of one pinned buffer: one read on the host
            self.buf = torch.empty(sum(sizes), dtype=torch.long, pin_memory=True)
            off = 0
            for f in flats:
                self.buf[off : off + f.numel()].copy_(f.reshape(-1), non_blocking=True)
                off += f.numel()
            self.event = torch.cuda.Event()  # on the stream the copies went to (the model's device, which need
            self.event.record(torch.cuda.current_stream(flats[0].device))  # not be the current one)
        else:
            self.buf = torch.cat([f.reshape(-1).long() for f in flats])

    def result(self) -> list[list[int]]:
        """The parts as lists (waits for the copy the first time; kept as :attr:`values`)."""
        if self.values is None:
            if self.event is not None:
                self.event.synchronize()
            flat = self.buf.tolist()
            self.values, off = [], 0
            for n in self.sizes:
                self.values.append(flat[off : off + n])
                off += n
        return self.values


@dataclass
class _Run:
    """Host-side bookkeeping of one :meth:`SpeculativeEngine.generate` call."""

    stats: RunStats
    out: list[list[int]]
    max_new_tokens: int
    accepted_at: torch.Tensor  # (γ,) float64: iterations whose draft i was accepted, summed over sequences
    trials: int = 0  # (iteration, active sequence) pairs
    profile: list | None = None  # last round: share of active sequences that kept >= i + 1 drafts
    active: list = field(default_factory=list)  # state.active as the last emission left it (host lists)
    produced: torch.Tensor | None = None  # (B,) tokens emitted per sequence, on the device (the emission's limit)
    eos: torch.Tensor | None = None  # the EOS ids on the device
