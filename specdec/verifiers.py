"""Verifiers: the target model scoring γ+1 rows with full attention (lossless) or over Dustin's
sparse verification set (near-lossless)."""

from __future__ import annotations

import torch

from specdec.interfaces import AttentionBackend, ScoreRequest, Verifier
from specdec.models import SpecdecModel


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


def head_attention(q: torch.Tensor, k_cache: torch.Tensor, lengths: torch.Tensor, heads, scale: float,
                   rows=None, full: bool = False) -> torch.Tensor:
    """Dense causal softmax attention of selected query heads over the whole cached context.

    Args:
        q: ``(B, H, T, D)`` queries of the new rows (row ``t`` sits at ``lengths[b] + t``).
        k_cache: ``(B, H_kv, L, D)`` one layer's keys (the new rows' keys already written).
        heads: query-head indices to score (a list, or an int64 tensor on ``q``'s device).
        rows: rows to keep (``None`` = all ``T``).
        full: attend over all ``L`` cache positions with the visibility mask instead of slicing to
            the used length: no host read of ``lengths`` (CUDA-graph capturable), same result.

    Returns:
        ``(B, len(heads), L)`` float32 attention weights summed over the rows; 0 where not visible.
    """
    B, H, T, D = q.shape
    Hkv, L = k_cache.shape[1], k_cache.shape[2]
    G = H // Hkv
    if isinstance(heads, torch.Tensor):
        heads_t = heads.to(device=q.device, dtype=torch.long)
    else:
        heads_t = torch.as_tensor(list(heads), dtype=torch.long, device=q.device)
    rows_t = torch.arange(T, device=q.device) if rows is None else torch.as_tensor(list(rows), dtype=torch.long, device=q.device)
    used = L if full else min(L, int(lengths.max()) + T)
    qh = q.index_select(1, heads_t).index_select(2, rows_t).float()  # (B, h, R, D)
    kh = k_cache[:, :, :used].index_select(1, heads_t // G).float()  # (B, h, used, D)
    logits = torch.einsum("bhrd,bhld->bhrl", qh, kh) * scale
    pos = torch.arange(used, device=q.device)
    row_pos = lengths.view(B, 1) + rows_t.view(1, -1)  # (B, R)
    visible = pos.view(1, 1, used) <= row_pos.view(B, -1, 1)  # (B, R, used)
    logits = logits.masked_fill(~visible.unsqueeze(1), float("-inf"))
    if full:
        return torch.softmax(logits, dim=-1).sum(2)
    out = torch.zeros(B, len(heads_t), L, dtype=torch.float32, device=q.device)
    out[..., :used] = torch.softmax(logits, dim=-1).sum(2)
    return out


class SRHScoringBackend(AttentionBackend):
    """Delegates attention to ``inner`` and, on the retrieval layers, also records the dense softmax
    attention of the retrieval heads over the *full* context (the cheap estimation of Dustin).

    The layer is recognised by which layer of ``cache`` the backend is given (``layer_of`` maps the
    data pointer of ``cache.k[l]`` to ``l``). After the forward, :attr:`scores` is ``(B, L)``
    (summed over the heads and rows).

    CUDA-graph safe (one instance is reused across passes, see :class:`SparseVerifier`): the
    estimation attends over the whole capacity with a visibility mask (no host read of the
    lengths), :attr:`scores` is one persistent buffer that the first retrieval layer of each
    forward *overwrites* (a captured graph keeps writing the same buffer, no reset outside the
    forward), and the head indices are device tensors made once. :attr:`seconds` (host time of the
    estimation) is only counted outside a capture; a replayed graph does not call the backend.
    """

    name = "srh-scoring"

    def __init__(self, inner: AttentionBackend, cache, heads: dict[int, list[int]]) -> None:
        self.inner = inner
        self.heads = {int(l): list(h) for l, h in heads.items() if h}
        self.layer_of = {cache.k[l].data_ptr(): l for l in range(cache.n_layers)}
        self.scores = torch.zeros(cache.batch, cache.capacity, dtype=torch.float32, device=cache.k.device)
        self._heads_t = {l: torch.tensor(h, dtype=torch.long, device=cache.k.device) for l, h in self.heads.items()}
        self._first = min(self.heads) if self.heads else None
        self.seconds = 0.0  # time spent on the SRH estimation

    @property
    def capture_safe(self) -> bool:
        return bool(getattr(self.inner, "capture_safe", False))

    def attend(self, q, k_cache, v_cache, lengths, scale, **kw):
        import time

        layer = self.layer_of.get(k_cache.data_ptr())
        if layer is not None and layer in self.heads:
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            t0 = time.perf_counter()
            a = head_attention(q, k_cache, lengths, self._heads_t[layer], scale, full=True)  # (B, h, L)
            if layer == self._first:  # the first retrieval layer of a forward resets the accumulator
                self.scores.copy_(a.sum(1))
            else:
                self.scores.add_(a.sum(1))
            if not capturing:
                self.seconds += time.perf_counter() - t0
        return self.inner.attend(q, k_cache, v_cache, lengths, scale, **kw)

    def validate(self, device, dtype):
        return self.inner.validate(device, dtype)


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
                 disagree: float | None = None, dense_first: bool = True) -> None:
        from specdec.errors import SpecdecError

        if dense_every < 0:
            raise SpecdecError(f"dense_every must be >= 0 (got {dense_every}); use 0 to turn the periodic dense pass off.")
        if disagree is not None and not 0 <= disagree <= 1:
            raise SpecdecError(f"disagree must be in [0, 1] (got {disagree}); e.g. 0.9, or leave it unset.")
        selector.check_heads(model.dims.n_layers, model.dims.n_heads, "target")
        self.model = model
        self.selector = selector
        self.drafter = drafter
        self.dense_every = dense_every
        self.disagree = disagree
        self.dense_first = dense_first
        self._state = None
        self._scores: torch.Tensor | None = None
        self.last_plan = None
        self._stats: dict = {}
        self._kv: torch.Tensor | None = None  # (2,) float64 on the device: KV entries read, read by dense passes
        self._srh: SRHScoringBackend | None = None
        self._srh_key: tuple | None = None

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
        self._stats = dict(passes=0, dense_passes=0, dense_periodic=0, dense_disagree=0, dense_first=0,
                           kv_read=0.0, kv_dense=0.0, select_seconds=0.0, srh_seconds=0.0,
                           dense_seconds=0.0, sparse_seconds=0.0)
        self._kv = torch.zeros(2, dtype=torch.float64, device=state.lengths.device)

    def scoring_backend(self, cache) -> "SRHScoringBackend":
        """The SRH scoring backend wrapped around the target's backend: one instance per (cache,
        backend, heads), reused across passes so that a CUDA graph captured with it (keyed by the
        backend's identity, :func:`specdec.graphs.step_key`) writes the buffer read here."""
        inner, heads = self.model.backend, self.selector.target_heads
        key = (cache, cache.k, inner, heads)
        old = self._srh_key
        if self._srh is None or old is None or any(a is not b for a, b in zip(old[:3], key[:3])) or old[3] != heads:
            self._srh = SRHScoringBackend(inner, cache, heads)
            self._srh_key = key
        return self._srh

    def _dense_reason(self, state) -> str | None:
        if self.dense_first and self.selector.target_signal is None:
            return "first"
        if self.dense_every and self.iteration % self.dense_every == 0:
            return "periodic"
        if self.disagree is not None and float(self.selector.disagreement(state.lengths).max()) > self.disagree:
            return "disagree"
        return None

    def prefill(self, state) -> None:
        self._reset(state)

    def verify(self, state, tokens: torch.Tensor, scores: ScoreRequest | None) -> torch.Tensor:
        import time

        if self._state is not state:  # driven without the engine's prefill hook (a test, a probe)
            self._reset(state)
        self.iteration += 1
        st = self._stats
        t0 = time.perf_counter()
        self.selector.observe_draft(getattr(self.drafter, "lookahead", None))
        reason = self._dense_reason(state)
        plan = None if reason else self.selector.plan(state.cache, state.lengths)
        if reason and self.selector.target_signal is not None:
            self.selector.mark(state.lengths)  # adaptive m still learns from dense passes
        self.last_plan = plan
        t1 = time.perf_counter()
        st["select_seconds"] += t1 - t0
        backend = self.scoring_backend(state.cache)
        seconds = backend.seconds
        with self.model.using_backend(backend):
            logits = self.model.forward(tokens, state.cache, state.lengths, plan=plan, scores=scores)
        # the backend's buffer is rewritten by the next pass: keep this pass's signal
        self._scores = backend.scores.clone()
        st["srh_seconds"] += backend.seconds - seconds
        dt = time.perf_counter() - t1
        # KV entries read by this pass vs a dense pass (active sequences), summed on the device
        act = state.active.to(state.lengths.dtype)
        dense_read = (state.lengths * act).sum()
        read = dense_read if reason else ((plan.indices[0, :, 0] >= 0).sum(1) * act).sum()
        self._kv += torch.stack([read, dense_read]).to(self._kv.dtype)
        st["passes"] += 1
        if reason:
            st["dense_passes"] += 1
            st[f"dense_{reason}"] += 1
            st["dense_seconds"] += dt
        else:
            st["sparse_seconds"] += dt
        return logits

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
