"""Verifiers: the target model scoring γ+1 rows with full attention (lossless) or over Dustin's
sparse verification set (near-lossless)."""

from __future__ import annotations

import torch

from specdec.attention.recording import head_attention  # noqa: F401  (re-exported)
from specdec.interfaces import ScoreRequest, Verifier
from specdec.models import SpecdecModel
from specdec.planner import planner_for

#: Dustin's confidence valve re-runs the fired sequences with the cache marked
#: :attr:`~specdec.cache.KVCache.few_live` (the count rounded up to a power of two) when that bound is at most
#: :data:`VALVE_FEW_LIVE_UPTO` of the batch: the attention runs programs for those sequences alone, split for that
#: many (the Triton backend; the others ignore it). ``False``: the re-run's attention keeps the full batch's launch (the
#: other sequences' programs read nothing but still run, one split each), for side-by-side timing.
VALVE_FEW_LIVE = True
VALVE_FEW_LIVE_UPTO = 0.25


class FullVerifier(Verifier):
    """Dense attention over the whole cache; emits the requested scores in the same pass."""

    lossless = True

    def __init__(self, model: SpecdecModel) -> None:
        self.model = model

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        return self.model.forward(tokens, state.cache, state.lengths, scores=scores)


# ---------------------------------------------------------------------------------------------------
# Dustin: sparse verification over I_verify (near-lossless).
# ---------------------------------------------------------------------------------------------------


def srh_request(heads: dict[int, list[int]], rows: int) -> ScoreRequest | None:
    """Dustin's target history signal: the dense softmax attention of the retrieval ``heads``
    ``{layer: [query heads]}`` over the whole context for ``rows`` verify rows, whatever the plan
    (``source="context"``, summed over each KV group; :func:`srh_scores` sums the rest)."""
    heads = {int(l): list(h) for l, h in heads.items() if h}
    if not heads:
        return None
    return ScoreRequest(rows=list(range(rows)), kind="softmax", heads="group", layers=sorted(heads),
                        query_heads=heads, source="context")


def srh_scores(req: ScoreRequest | None, like: torch.Tensor) -> torch.Tensor:
    """``(B, L)`` float32: ``req``'s scores summed over its layers, KV heads and rows (0 with no heads)."""
    if req is None or not req.scores:
        return torch.zeros(like.shape[0], like.shape[-1], dtype=torch.float32, device=like.device)
    return sum(s.sum(1) for s in req.scores.values())


def plan_reads(plan, lengths: torch.Tensor) -> torch.Tensor:
    """``(B,)`` float64 KV entries one layer and KV head of a sparse pass reads: the plan's positions, plus for a plan
    with a per-layer part its ``room`` entries and what it reads to rank them (``plan.scoring_reads``: the page key
    bounds of a :class:`~specdec.selectors.hybrid_srh.LayerSetPlan`, one K+V entry's worth per page; the low-rank keys
    of a :class:`~specdec.selectors.key_rank.KeyRankPlan`, ``key_rank / 2D`` of an entry per token)."""
    read = (plan.indices[0, :, 0] >= 0).sum(1).to(torch.float64)
    room = getattr(plan, "room", None)
    if room is not None:
        read = read + room.to(torch.float64) + plan.scoring_reads(lengths).to(torch.float64)
    return read


class _RowsKept:
    """The K/V rows a forward of ``T`` rows is about to write (positions ``lengths .. lengths + T - 1`` of every global
    layer, and the ring slots ``position % C`` of every local one), kept so that :meth:`restore` can put them back for
    the sequences a later forward should not have changed."""

    def __init__(self, cache, lengths: torch.Tensor, T: int) -> None:
        pos = lengths.view(-1, 1) + torch.arange(T, device=lengths.device)
        self.kept = []
        for buf, ring in ((cache.k, False), (cache.v, False), (cache.ring_k, True), (cache.ring_v, True)):
            if buf is None or buf.numel() == 0:
                continue
            N, B, H, L, D = buf.shape
            idx = (pos % L if ring else pos).view(1, B, 1, T, 1).expand(N, B, H, T, D)
            self.kept.append((buf, idx, buf.gather(3, idx)))

    def restore(self, keep: torch.Tensor) -> None:
        """Put the kept rows back where ``keep`` ``(B,)`` is true (the others keep what was written since)."""
        for buf, idx, old in self.kept:
            buf.scatter_(3, idx, torch.where(keep.view(1, -1, 1, 1, 1), old, buf.gather(3, idx)))


class SparseVerifier(Verifier):
    """The target verifies the γ+1 rows attending only to ``I_verify`` plus the new tokens.

    Paper: *Dustin* (docs page *Dustin*): dense verification
    dominates latency at long context, so the target reads only a fixed-size set chosen by a
    :class:`specdec.selectors.hybrid_srh.HybridSRHSelector` from the drafter's lookahead signal
    and the target's history on the Semantic Retrieval Heads. In the same pass it records the
    target SRH attention over the full context (the next iteration's history signal).

    **Near-lossless**: output can differ from dense decoding (``lossless = False``; the engine's
    stats say so). A budget covering the whole context gives exactly the dense output.

    The first pass has no target history yet. With ``dense_first`` (the default) it is dense: it
    verifies exactly and records the target SRH attention over the whole context, so the next pass
    starts with a history signal (the prefill plays this role in the paper). Without it, all free
    slots of the first pass go to the draft signal.
    Safety valve (beyond the paper): with ``dense_every = N`` every N-th pass is dense; with ``disagree = x`` a pass is dense when, for
    some sequence, more than a share ``x`` of the draft-only and target-only choices differ.
    :attr:`stats` reports how many passes were dense and the KV entries read relative to dense.

    Args:
        model: the target.
        selector: the hybrid selector (its heads must fit the target).
        drafter: where the lookahead signal comes from (its ``lookahead`` attribute), or ``None``.
        dense_every: dense verification every N passes (0 = never).
        disagree: dense when the signals' disagreement exceeds this share (``None`` = off).
        dense_first: the first pass of a generation is dense (no target history yet).
    """

    lossless = False

    def __init__(self, model: SpecdecModel, selector, drafter=None, dense_every: int = 0,
                 disagree: float | None = None, dense_first: bool = True, margin: float | None = None) -> None:
        from specdec.errors import SpecdecError

        if dense_every < 0:
            raise SpecdecError(f"dense_every must be >= 0 (got {dense_every}); use 0 to turn the periodic dense pass off.")
        if disagree is not None and not 0 <= disagree <= 1:
            raise SpecdecError(f"disagree must be in [0, 1] (got {disagree}); e.g. 0.9, or leave it unset.")
        if margin is not None and not margin >= 0:
            raise SpecdecError(f"margin must be >= 0 (got {margin}); e.g. 2.0 (logits), 0 to record margins only, "
                               "or leave it unset.")
        need = ("check_heads", "target_heads", "target_signal", "observe_target", "observe_draft", "mark",
                "disagreement")
        missing = [n for n in need if not hasattr(selector, n)]
        if missing:  # a plain selector failed at the first pass with an AttributeError ('check_heads')
            raise SpecdecError(f"SparseVerifier needs Dustin's hybrid selector (HybridSRHSelector: retrieval heads and "
                               f"a target history); {type(selector).__name__} has no {', '.join(missing)}. Build one "
                               "with SELECTORS.build('hybrid_srh', ...) or build_engine(model, "
                               "PipelineConfig(method='dustin')).")
        selector.check_heads(model.dims.n_global, model.dims.n_heads, "target")  # heads index global layers
        self.model = model
        self.selector = selector
        self.drafter = drafter
        self.dense_every = dense_every
        self.disagree = disagree
        self.dense_first = dense_first
        self.margin = margin
        self.last_margin: torch.Tensor | None = None  # (B,) smallest deciding-row margin of the last sparse pass
        self.last_deciding: torch.Tensor | None = None  # (B,) how many rows decided in it
        self._state = None
        self._scores: torch.Tensor | None = None
        self.last_plan = None
        self._stats: dict = {}
        self._kv: torch.Tensor | None = None  # (2,) float64 on the device: KV entries read, read by dense passes

    @property
    def stats(self) -> dict:
        """Counters (the KV-read ones are summed on the device and read here: one host sync)."""
        st = dict(self._stats)
        if self._kv is not None:
            kv_read, kv_dense = self._kv.tolist()
            st.update(kv_read=kv_read, kv_dense=kv_dense)
        return st

    def _reset(self, state) -> None:
        self._state = state
        self.selector.reset(state.cache)
        self.iteration = 0
        self._stats = dict(passes=0, dense_passes=0, dense_periodic=0, dense_disagree=0, dense_first=0, dense_local=0, dense_margin=0,
                           kv_read=0.0, kv_dense=0.0, select_seconds=0.0, srh_seconds=0.0,
                           dense_seconds=0.0, sparse_seconds=0.0)
        self._kv = torch.zeros(2, dtype=torch.float64, device=state.lengths.device)

    def _dense_reason(self, state) -> str | None:
        if state.cache.n_layers == 0:  # every layer is a sliding window: nothing grows, nothing to select
            return "local"
        if self.dense_first and self.selector.target_signal is None:
            return "first"
        if self.dense_every and self.iteration % self.dense_every == 0:
            return "periodic"
        if self.disagree is not None and float(self.selector.disagreement(state.lengths).max()) > self.disagree:
            return "disagree"
        return None

    def prefill(self, state) -> None:
        self._reset(state)
        self._prepare(state)  # prompt work of the selector (the low-rank key basis), outside the decode loop

    def _prepare(self, state) -> None:
        """The selector's eager work before a plan (:meth:`HybridSRHSelector.prepare`), given the host's copy of the
        lengths: each sequence's tokens but the pending one (``DecodeState.tokens``), so nothing waits for the device.
        A state without usable token lists (a hand-made one) passes none, and the selector reads the device."""
        # only where the selector has work: the host list below costs B lengths per pass in the decode loop
        if not getattr(self.selector, "prepares", False) or state.cache.n_layers == 0:
            return
        tokens = getattr(state, "tokens", None)
        host = [len(t) - 1 for t in tokens] if tokens is not None and len(tokens) == len(state.lengths) else None
        self.selector.prepare(state.cache, state.lengths, host if host and min(host) >= 0 else None)

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        import time

        if self._state is not state:  # driven without the engine's prefill hook (a test, a probe)
            self._reset(state)
        self.iteration += 1
        self.last_margin = None
        st = self._stats
        t0 = time.perf_counter()
        self.selector.observe_draft(getattr(self.drafter, "lookahead", None))
        reason = self._dense_reason(state)
        if not reason:
            self._prepare(state)
        plan = None if reason else planner_for(state.cache).plan(self.selector, state.lengths)
        if reason and self.selector.target_signal is not None:
            self.selector.mark(state.lengths)  # adaptive m still learns from dense passes
        self.last_plan = plan
        t1 = time.perf_counter()
        st["select_seconds"] += t1 - t0
        # the target SRH attention over the full context, recorded in the same pass
        srh = srh_request(self.selector.target_heads, tokens.shape[1])
        logits = self.model.forward(tokens, state.cache, state.lengths, plan=plan,
                                    scores=[r for r in (scores, srh) if r is not None])
        like = state.cache.k[0, :, 0, :, 0] if state.cache.n_layers else state.lengths.new_zeros(len(state.lengths), 1)
        self._scores = srh_scores(srh, like)
        st["srh_seconds"] += srh.seconds if srh is not None else 0.0
        # KV entries read by this pass vs a dense pass (active sequences), summed on the device
        act = state.active.to(state.lengths.dtype)
        dense_read = (state.lengths * act).sum()
        read = dense_read if reason else (plan_reads(plan, state.lengths) * act).sum()
        if plan is not None and self.margin is not None:
            logits, redo = self._margin_valve(state, tokens, logits, scores, like)
            read = read + redo
        dt = time.perf_counter() - t1
        self.last_read = torch.stack([read.to(self._kv.dtype), dense_read.to(self._kv.dtype)])  # (read, dense read)
        self._kv += self.last_read
        st["passes"] += 1
        if reason:
            st["dense_passes"] += 1
            st[f"dense_{reason}"] += 1
            st["dense_seconds"] += dt
        else:
            st["sparse_seconds"] += dt
        return logits

    def _margin_valve(self, state, tokens: torch.Tensor, logits: torch.Tensor, scores, like) -> tuple[torch.Tensor, torch.Tensor]:
        """Confidence-gated dense re-verification (beyond the paper).

        The deciding rows of a sparse pass are the rows up to the first one whose greedy token rejects the next
        draft token (all rows when every draft is accepted). When a sequence's smallest top-1/top-2 logit margin
        on those rows is below ``margin``, the pass is run again densely and that sequence's logits are the dense
        ones; every other sequence keeps what the sparse pass gave it (its logits, K/V rows, hidden states, history
        signal and the drafter's scores) and reads none of its context in the re-run. Returns the logits and the KV
        entries the re-run read (0 when none ran). ``last_margin`` keeps the smallest margin per sequence (``inf`` for
        inactive ones), so ``margin=0`` only records it."""
        top = logits.float().topk(2, dim=-1).values  # (B, T, 2)
        gap = top[..., 0] - top[..., 1]
        B, T = tokens.shape
        ok = logits.argmax(-1)[:, :-1] == tokens[:, 1:]  # (B, T-1) row j accepts draft j+1
        first_no = torch.where(ok, T, torch.arange(T - 1, device=ok.device).view(1, -1)).amin(1, keepdim=True)
        deciding = torch.arange(T, device=ok.device).view(1, -1) <= first_no.clamp(max=T - 1)
        low = gap.masked_fill(~deciding, float("inf")).amin(1)
        low = torch.where(state.active, low, torch.full_like(low, float("inf")))
        self.last_margin = low
        self.last_deciding = first_no.view(-1).clamp(max=T - 1) + 1  # (B,) rows that decide
        redo = low < self.margin
        fired = int(redo.sum())  # one host read per sparse pass, only with the valve on
        if not fired:
            return logits, logits.new_zeros((), dtype=state.lengths.dtype)
        # Only the sequences whose margin fired are re-verified: the others keep everything the sparse pass gave them
        # (logits, the K/V rows it wrote, the hidden states an EAGLE draft reads, the history signal, the drafter's
        # scores), so a sequence's output does not depend on its batch-mates; and, through the cache's live flags
        # (specdec.models.SKIP_FINISHED_READS), they read none of their context in the re-run.
        from specdec import models

        cache, model = state.cache, self.model
        kept = _RowsKept(cache, state.lengths, T) if cache is not None else None
        hidden = getattr(model, "last_hidden", None)
        drafter_scores = dict(scores.scores) if scores is not None else None
        live = models.skipped_live(cache, state.lengths)
        masked = live is not None
        before = live.clone() if masked else None
        if masked:
            live &= redo
            bound = 1 << (fired - 1).bit_length()  # a power of two: few captured graphs
            # the attention runs programs for the fired sequences alone (VALVE_FEW_LIVE_UPTO of the batch at most)
            cache.few_live = bound if VALVE_FEW_LIVE and bound <= VALVE_FEW_LIVE_UPTO * B else 0
        srh = srh_request(self.selector.target_heads, T)
        try:
            dense = model.forward(tokens, cache, state.lengths, scores=[r for r in (scores, srh) if r is not None])
        finally:
            if masked:
                live.copy_(before)
                cache.few_live = 0
        if kept is not None:
            kept.restore(~redo)
        new_scores, old_scores = srh_scores(srh, like), getattr(self, "_scores", None)
        self._scores = new_scores if old_scores is None else torch.where(redo.view(B, 1), new_scores, old_scores)
        now = getattr(model, "last_hidden", None)
        if hidden is not None and now is not None and now is not hidden and now.shape == hidden.shape:
            model.last_hidden = torch.where(redo.view(B, *([1] * (now.dim() - 1))), now, hidden)
        if drafter_scores:
            for layer, old in drafter_scores.items():
                new = scores.scores.get(layer)
                if new is not None and new.shape == old.shape:
                    scores.scores[layer] = torch.where(redo.view(B, *([1] * (new.dim() - 1))), new, old)
        self._stats["dense_margin"] += int(redo.sum())
        read = state.active & redo if masked else state.active
        return torch.where(redo.view(B, 1, 1), dense, logits), (state.lengths * read.to(state.lengths.dtype)).sum()

    def on_verify(self, state) -> None:
        if self._scores is not None:
            self.selector.observe_target(self._scores, state.lengths)

    def report(self) -> dict:
        """Counts and cost of the safety valve: dense share of passes and KV entries read vs dense."""
        st = self.stats
        if st.get("passes"):
            st["dense_share"] = st["dense_passes"] / st["passes"]
            st["kv_read_vs_dense"] = st["kv_read"] / max(st["kv_dense"], 1.0)
        return st
