"""Drafters: the target itself with sparse attention (self-speculation)."""

from __future__ import annotations

from contextlib import contextmanager

import torch

from specdec.errors import SpecdecError
from specdec.interfaces import Drafter, KVSelector, ScoreRequest
from specdec.models import SpecdecModel
from specdec.planner import planner_for
from specdec.sampling import check_finite, choose, nonfinite_flags


class SparseSelfDrafter(Drafter):
    """Draft with the target model attending only to a :class:`KVSelector`'s plan.

    The plan is built once per iteration (``select`` phase) and reused by all γ draft steps;
    tokens drafted in this iteration are always visible (``plan.dense_from``). Draft K/V are
    written into the target's cache and overwritten by the verification pass.

    The next iteration's plan is built in :meth:`on_verify`, which the engine calls before it waits for the
    iteration's host transfer: the GPU builds the plan while the host emits, and the next :meth:`draft` starts from
    it (a draft without one, the first after the prefill, builds its own). The draft reads device state only
    (``drafts_ahead``): where γ is fixed the engine queues it there too (:meth:`Drafter.draft_ahead`).
    """

    dense_steps_ok = True
    drafts_ahead = True

    def __init__(self, model: SpecdecModel, selector: KVSelector) -> None:
        if not all(callable(getattr(selector, n, None)) for n in ("plan", "reset", "on_verify")):
            hint = f"SELECTORS.build({selector!r}, budget=256)" if isinstance(selector, str) else \
                "SELECTORS.build('sliding_window', budget=256)"
            raise SpecdecError(f"selector must be a KV selector (with plan, reset and on_verify); got "
                               f"{type(selector).__name__}: use e.g. {hint}.")
        self.model = model
        self.selector = selector
        self._plan = None  # the next draft's plan, built by on_verify

    def prefill(self, state) -> None:
        self.take_ahead(None)
        self._plan = None
        self.selector.reset(state.cache)
        self.selector.on_verify(None, state.lengths)

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ahead = self.take_ahead(gamma)
        if ahead is not None:  # started by draft_ahead after the last verification (γ fixed)
            return ahead
        B = state.lengths.shape[0]
        plan, self._plan = self._plan, None
        if plan is None:
            with state.timer("select"):
                plan = planner_for(state.cache).plan(self.selector, state.lengths)
        if state.sampling.greedy:
            # the logits' finiteness is flagged on the device and read with the engine's one host transfer of the
            # iteration (take_flags; a check per step was 3 host reads each: the GPU idled while the host launched
            # the next step); with CUDA graphs the γ steps replay as one graph (SpecdecModel.greedy_steps)
            tokens, self._flags = self.model.greedy_steps(state.pending, state.cache, state.lengths, gamma, plan=plan)
            return tokens, None
        # sampling checks each step (a NaN probability must not reach torch.multinomial)
        tokens, probs = [], []
        cur = state.pending
        for i in range(gamma):
            logits = self.model.forward(cur.view(B, 1), state.cache, state.lengths + i, plan=plan)[:, -1]
            check_finite(logits, "drafter")
            cur, p = choose(logits, state.sampling, state.generator)
            tokens.append(cur)
            probs.append(p)
        self._flags = None
        return torch.stack(tokens, dim=1), torch.stack(probs, dim=1)

    def score_request(self, gamma: int) -> ScoreRequest | None:
        return self.selector.score_request(gamma)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.raise_untaken_flags()
        self.selector.on_verify(scores, state.lengths)
        # the next draft's plan, queued now: state.lengths are the new verified lengths (and after dense steps the
        # engine calls this again before the draft, so the plan is never older than the lengths it is used at)
        self._plan = planner_for(state.cache).plan(self.selector, state.lengths)


# ---------------------------------------------------------------------------------------------------
# Drafters with their own model (Dustin, docs page *Dustin*): a separate small LM, or the target's first layers.
# ---------------------------------------------------------------------------------------------------


def check_same_tokenizer(target: SpecdecModel, draft: SpecdecModel) -> None:
    """Refuse a draft whose tokenizer maps tokens to ids differently from the target's (same vocabulary
    size is not enough: two tokenizers of 49152 entries can disagree on every id)."""
    if draft.dims.vocab_size != target.dims.vocab_size:
        raise SpecdecError(
            f"the draft model has a vocabulary of {draft.dims.vocab_size}, the target {target.dims.vocab_size}; "
            "use a draft that shares the target's tokenizer."
        )
    if target.tokenizer is None or draft.tokenizer is None:
        return
    a, b = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()), key=lambda kv: kv[1])[0]
        raise SpecdecError(
            f"the draft's tokenizer maps tokens to ids differently from the target's (e.g. {diff[0]!r} -> {diff[1]} "
            "in only one of them); use a draft that shares the target's tokenizer."
        )


def lookahead_request(heads: dict[int, list[int]] | None) -> "ScoreRequest | None":
    """Score request for one draft row restricted to the draft's retrieval heads (softmax weights)."""
    if not heads:
        return None
    return ScoreRequest(rows=[0], kind="softmax", heads="group", layers=sorted(heads),
                        query_heads={int(l): list(h) for l, h in heads.items()})


class ModelDrafter(Drafter):
    """Draft with another causal LM sharing the target's tokenizer, with its own KV cache.

    The draft cache holds ``draft_len[b]`` valid entries per sequence. Before drafting, the
    tokens the target accepted that the draft never fed (the last draft when all γ were accepted,
    or nothing yet after the prefill) are fed in one ragged catch-up forward; after verification
    the draft rolls back by lowering ``draft_len`` to the new verified length (entries past it
    are overwritten later). Greedy drafts therefore equal the draft model's own greedy decoding.

    While drafting, the drafter records its **lookahead signal** (Dustin, "Attention Lookahead of
    the draft"): the softmax attention of the γ drafted rows over the context, summed over the
    retrieval heads ``heads`` ``{draft layer: [query heads]}`` → :attr:`lookahead` ``(B, L)``.

    Args:
        draft: the draft :class:`SpecdecModel` (same vocabulary as the target).
        heads: draft retrieval heads whose attention forms the lookahead signal (``None`` = none).
    """

    def __init__(self, draft: SpecdecModel, heads: dict[int, list[int]] | None = None) -> None:
        self.draft_model = draft
        self.heads = heads
        self.lookahead: torch.Tensor | None = None  # (B, L) float32
        self.cache = None
        self.draft_len: torch.Tensor | None = None  # (B,) int64 valid draft-cache entries

    @property
    def n_layers(self) -> int:
        """Draft layers whose attention can be a lookahead signal: the global (full-context) ones."""
        return self.draft_model.dims.n_global

    def set_heads(self, heads: dict[int, list[int]] | None) -> None:
        from specdec.errors import SpecdecError

        for layer, hs in (heads or {}).items():
            if not 0 <= int(layer) < self.n_layers or any(not 0 <= int(h) < self.draft_model.dims.n_heads for h in hs):
                raise SpecdecError(
                    f"draft retrieval head ({layer}, {list(hs)}) is outside the draft's {self.n_layers} layers × "
                    f"{self.draft_model.dims.n_heads} heads; re-run `specdec profile-srh` for this draft."
                )
        self.heads = heads

    def layer_map(self, n_target_layers: int) -> list[int]:
        """Draft layer that corresponds to each target layer (proportional depth)."""
        nd = self.n_layers
        if n_target_layers == 1:
            return [nd - 1]
        return [round(l * (nd - 1) / (n_target_layers - 1)) for l in range(n_target_layers)]

    def identity(self) -> dict:
        from specdec.artifacts import model_identity

        return model_identity(self.draft_model)

    # -- cache ------------------------------------------------------------------------------------
    def _draft_cache(self, state):
        return self.cache

    def prefill(self, state) -> None:
        """Allocate the draft cache; the prompt is fed by the first catch-up (no separate pass)."""
        B = state.lengths.shape[0]
        if self.draft_model.dims.vocab_size != state.model.dims.vocab_size:
            from specdec.errors import SpecdecError

            raise SpecdecError(
                f"the draft model has a vocabulary of {self.draft_model.dims.vocab_size}, the target "
                f"{state.model.dims.vocab_size}; use a draft that shares the target's tokenizer."
            )
        if self.draft_model.device != state.lengths.device:
            from specdec.errors import SpecdecError

            raise SpecdecError("the draft model and the target are on different devices; load both with the same --device.")
        self.cache = self.draft_model.new_cache(B, state.cache.capacity)
        self.draft_len = torch.zeros(B, dtype=torch.long, device=state.lengths.device)

    def _catch_up(self, state) -> None:
        """Feed tokens ``draft_len[b] .. lengths[b] - 1`` (verified but not in the draft cache)."""
        cache = self._draft_cache(state)
        B = state.lengths.shape[0]
        lens = state.lengths.tolist()
        have = self.draft_len.tolist()
        todo = [state.tokens[b][have[b] : lens[b]] for b in range(B)]
        T = max(len(t) for t in todo)
        chunk = 1024  # bounds memory of the first (prompt-sized) catch-up
        done = 0
        while done < T:
            rows = [t[done : done + chunk] for t in todo]
            width = max(len(r) for r in rows)
            if width == 0:
                break
            ids = torch.tensor([r + [0] * (width - len(r)) for r in rows], device=state.lengths.device)  # (B, width)
            start = torch.tensor([have[b] + min(done, len(todo[b])) for b in range(B)], device=state.lengths.device)
            self.draft_model.forward(ids, cache, start, logits_to_keep=1)
            done += width
        self.draft_len = state.lengths.clone()

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ahead = self.take_ahead(gamma)
        if ahead is not None:  # started by draft_ahead (EarlyExitDrafter) after the last verification
            return ahead
        B = state.lengths.shape[0]
        self._catch_up(state)
        cache = self._draft_cache(state)
        self.lookahead = torch.zeros(B, cache.capacity, dtype=torch.float32, device=state.lengths.device)
        tokens, probs = [], []
        cur = state.pending
        # greedy drafting checks the logits once after the γ steps (no host read between steps);
        # sampling checks each step (a NaN probability must not reach torch.multinomial)
        deferred = state.sampling.greedy
        flags = None
        for i in range(gamma):
            req = lookahead_request(self.heads)
            logits = self.draft_model.forward(cur.view(B, 1), cache, state.lengths + i, scores=req)[:, -1]
            if deferred:
                f = nonfinite_flags(logits)
                flags = f if flags is None else flags | f
            else:
                check_finite(logits, "drafter")
            if req is not None:
                for s in req.scores.values():  # (B, H_kv, L)
                    self.lookahead += s.sum(1)
            cur, p = choose(logits, state.sampling, state.generator)
            tokens.append(cur)
            probs.append(p)
        self._flags = flags  # greedy: read with the engine's transfer (take_flags), or in on_verify
        # the pending token and drafts 1..γ-1 are now in the draft cache
        self.draft_len = state.lengths + gamma
        q = torch.stack(probs, dim=1) if probs[0] is not None else None
        return torch.stack(tokens, dim=1), q

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.raise_untaken_flags()
        # roll back: entries beyond the new verified length hold rejected drafts
        self.draft_len = torch.minimum(self.draft_len, state.lengths)

    def drafts_replaced(self, state, drafts: torch.Tensor, mask: torch.Tensor) -> None:
        # the draft cache holds this drafter's own drafts after the pending token: valid only up to the first replaced one
        first = torch.where(mask.any(1), mask.long().argmax(1), torch.full_like(self.draft_len, mask.shape[1]))
        self.draft_len = torch.minimum(self.draft_len, state.lengths + 1 + first)


class TruncatedModel(SpecdecModel):
    """The first ``n`` decoder layers of a :class:`SpecdecModel` (+ final norm + LM head), sharing its
    weights, tokenizer and attention route (see :func:`truncated_model`).

    The attention backend, compilation and CUDA graphs **follow the parent**; the last two are never
    shared with it: when the parent has ``enable_compile()`` on, the view uses its own ``torch.compile``
    of its own truncated module (the parent's compiled module runs all layers); when the parent has a
    :class:`~specdec.graphs.GraphCache`, the view uses its own (bound to the view, sharing the
    parent's memory pool). Both are made lazily on first use and dropped/remade when the parent's
    are dropped/replaced, so ``enable_compile()`` / ``enable_cuda_graphs()`` / ``disable_cuda_graphs()``
    on the target after the drafter was built take effect on the draft too. Call them on the parent.
    """

    def __init__(self, parent: SpecdecModel, hf, dims) -> None:  # no SpecdecModel.__init__: the route is the parent's
        self.parent = parent
        self.hf = hf
        self.tokenizer = parent.tokenizer
        self._backend = None  # None = the parent's current backend
        self.dims = dims
        self._reusable_cache = None
        self._own_compiled = None  # (parent's compiled module it follows, own compiled module)
        self._own_graphs = None  # (parent's GraphCache it follows, own GraphCache)

    @property
    def backend(self):
        """The parent's backend unless one was set on the view (``using_backend`` on the view sets it
        for the block only)."""
        return self.parent.backend if self._backend is None else self._backend

    @backend.setter
    def backend(self, value) -> None:
        self._backend = value

    @contextmanager
    def using_backend(self, backend):
        old, self._backend = self._backend, backend
        try:
            yield
        finally:
            self._backend = old

    # routing state: the parent's (the shared layers are routed through the parent's config)
    @property
    def _saved_impl(self):
        return self.parent._saved_impl

    def attach(self) -> None:
        self.parent.attach()

    def detach(self) -> None:
        self.parent.detach()

    @property
    def _compile_rows(self) -> int:
        return self.parent._compile_rows

    @property
    def _compiled(self):
        src = self.parent._compiled
        if src is None:
            self._own_compiled = None
            return None
        if self._own_compiled is None or self._own_compiled[0] is not src:
            kw = dict(getattr(self.parent, "_compile_kwargs", {}) or {})
            self._own_compiled = (src, torch.compile(self.hf, dynamic=False, **kw))
        return self._own_compiled[1]

    @property
    def _graphs(self):
        src = self.parent._graphs
        if src is None:
            self._own_graphs = None
            return None
        if self._own_graphs is None or self._own_graphs[0] is not src:
            from specdec.graphs import GraphCache

            self._own_graphs = (src, GraphCache.for_view(src, self))
        return self._own_graphs[1]

    def _follow_parent(self, *a, **kw):
        from specdec.errors import SpecdecError

        raise SpecdecError("an early-exit view follows its target's compile/graph settings; "
                           "call enable_compile()/enable_cuda_graphs()/disable_cuda_graphs() on the target.")

    enable_compile = enable_cuda_graphs = disable_cuda_graphs = _follow_parent


def truncated_model(model: SpecdecModel, n_layers: int) -> SpecdecModel:
    """A view of ``model`` running only its first ``n_layers`` decoder layers, then the final norm
    and the LM head. Weights are shared (no copy); only the config differs (:class:`TruncatedModel`)."""
    import copy

    from specdec.errors import SpecdecError

    N = model.dims.n_layers
    if not 1 <= n_layers < N:
        raise SpecdecError(f"draft_layers must be between 1 and {N - 1} for this {N}-layer target (got {n_layers}).")
    hf = model.hf
    base_name = hf.base_model_prefix  # "model" for Llama/Qwen/Mistral
    base = getattr(hf, base_name)
    cfg = copy.deepcopy(hf.config)
    cfg.num_hidden_layers = n_layers
    if isinstance(getattr(cfg, "layer_types", None), list):
        cfg.layer_types = cfg.layer_types[:n_layers]
    inner = copy.copy(base)  # shares submodules (embeddings, layers, norm)
    inner.config = cfg  # the decoder loop runs self.layers[: config.num_hidden_layers]
    outer = copy.copy(hf)
    outer._modules = dict(hf._modules)
    outer._modules[base_name] = inner
    outer.config = cfg
    from specdec.models import model_dims

    return TruncatedModel(model, outer, model_dims(cfg))


class EarlyExitDrafter(ModelDrafter):
    """Draft with the target's first ``n_layers`` layers + final norm + LM head (weights shared).

    Self-speculation by early exit (as in LayerSkip / Draft&Verify), used as Dustin's draft model
    on the embedded model where no separate small model ships. The first ``n_layers`` layers of
    the draft compute exactly what the target's first layers compute, so the draft reads and
    writes the **target's own cache** for those layers: no prefill, no catch-up, and rollback is
    the target's. Draft rows written at ``lengths .. lengths+γ-1`` are overwritten by the
    verification pass. The lookahead signal is recorded as in :class:`ModelDrafter`; draft layer
    ``l`` corresponds to target layer ``l`` (:meth:`layer_map`).

    Args:
        target: the target :class:`SpecdecModel`.
        n_layers: how many leading layers the draft runs (``1 .. N-1``).
        heads: draft retrieval heads ``{layer: [query heads]}`` for the lookahead signal.
    """

    def __init__(self, target: SpecdecModel, n_layers: int, heads: dict[int, list[int]] | None = None) -> None:
        super().__init__(truncated_model(target, n_layers), heads)
        self.target = target
        self.exit_layers = n_layers

    def layer_map(self, n_target_layers: int) -> list[int]:
        """Identity on the shared layers; deeper target layers map to the last draft layer.

        Indices count global (full-context) layers on both sides: target global layer ``g`` maps to
        the deepest draft global layer at or above it (the same layer when the draft has it)."""
        shared = self.target.dims.global_layers
        n_draft = self.n_layers
        return [max(0, min(sum(1 for l in shared[: g + 1] if l < self.exit_layers), n_draft) - 1)
                for g in range(n_target_layers)]

    def identity(self) -> dict:
        from specdec.artifacts import model_identity

        return {**model_identity(self.target), "early_exit_layers": self.exit_layers}

    def _draft_cache(self, state):
        """The target cache's first ``exit_layers`` model layers, sliding-window rings included (a view
        sharing storage; CUDA graphs are keyed on the memory a step writes, so a new view of the same
        memory replays the same graphs). The engine sized the cache: no host capacity check on the view
        either (the view keeps the cache's ``bounded``)."""
        return state.cache.first_layers(self.exit_layers)

    #: greedy drafting reads device state only (no catch-up from the host's lists: the target wrote every verified
    #: entry): the engine may start it early
    drafts_ahead = True

    def prefill(self, state) -> None:
        self.draft_len = state.lengths.clone()
        self.take_ahead(None)  # an early draft left by the last generation

    def _catch_up(self, state) -> None:
        self.draft_len = state.lengths.clone()  # the target wrote every verified entry

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        self.raise_untaken_flags()
        self.draft_len = state.lengths.clone()
