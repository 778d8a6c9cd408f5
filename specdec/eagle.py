"""An EAGLE-style draft head fed the target's own last hidden state (Dustin's default draft on the embedded model).

EAGLE (Li et al., 2024) drafts at the *feature* level: the head sees the target's final (normed) hidden
state ``f_p`` at position ``p`` and the embedding of the token ``t_{p+1}`` that followed it, and predicts
``f_{p+1}``; the target's LM head turns a feature into next-token logits::

    u_p  = fc([embed(t_{p+1}); f_p])              # (B, T, 2d) -> (B, T, d)
    y_p  = decoder_layer(u_p)                      # one Llama layer with its own small KV cache (head position p)
    f̂_{p+1} = norm(y_p)                            # the target's final norm
    logits = lm_head(f̂_{p+1})                      # the target's LM head: predicts t_{p+2}

While drafting, step ``j >= 2`` feeds the head's own prediction ``f̂`` instead of a target feature. After
verification, the target's features of the accepted positions (recorded during the verify pass, see
:attr:`specdec.models.SpecdecModel.keep_hidden`) replace the predicted ones in the head's cache.

The head's weights (``fc`` + one decoder layer, ~4.2 M parameters, ~8 MB in float16) are trained by
:func:`specdec.train_eagle.train` (``specdec train-draft --kind eagle``); the embedding, final norm and LM
head are the target's own (shared, not stored).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specdec.errors import SpecdecError

#: the keys an EAGLE artifact's metadata must carry
EAGLE_META = {"kind", "target", "layer_from"}


def _qkv(layer, x, cos, sin):
    """Post-RoPE ``q (B, H, T, D)``, ``k, v (B, H_kv, T, D)`` of a Llama decoder layer on ``x (B, T, d)``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    a = layer.self_attn
    B, T, _ = x.shape
    D = a.head_dim
    xn = layer.input_layernorm(x)
    q = a.q_proj(xn).view(B, T, -1, D).transpose(1, 2)
    k = a.k_proj(xn).view(B, T, -1, D).transpose(1, 2)
    v = a.v_proj(xn).view(B, T, -1, D).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v


def _finish(layer, x, att):
    """Output projection + residual + MLP; ``att (B, H, T, D)``."""
    B, _, T, _ = att.shape
    x = x + layer.self_attn.o_proj(att.transpose(1, 2).reshape(B, T, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


class EagleHead(nn.Module):
    """``fc`` (2d → d, with bias) + one decoder layer shaped like the target's layers.

    Args:
        target_layer: a decoder layer of the target (copied: class, config and initial weights).
        hidden: model width ``d``.
    """

    def __init__(self, target_layer: nn.Module, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = copy.deepcopy(target_layer)
        self.layer.requires_grad_(True)
        with torch.no_grad():  # start as "the feature itself" plus a little of the token embedding
            self.fc.weight.zero_()
            self.fc.weight[:, hidden:].copy_(torch.eye(hidden))
            nn.init.normal_(self.fc.weight[:, :hidden], std=0.02)
            self.fc.bias.zero_()

    def inputs(self, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """``fc([embed(t_{p+1}); f_p])``: ``(B, T, d)`` each → ``(B, T, d)``."""
        return self.fc(torch.cat([emb, feat.to(emb.dtype)], dim=-1))


# ---------------------------------------------------------------------------------------------------
# Artifact: safetensors (fc + layer weights, float16) + JSON metadata {kind: "eagle", target, ...}
# ---------------------------------------------------------------------------------------------------


def save_eagle(path: str | Path, head: EagleHead, meta: dict) -> Path:
    """Write the head's weights (float16) and metadata ``{"kind": "eagle", ...}`` to one ``.safetensors`` file."""
    from safetensors.torch import save

    from specdec.outputs import write_bytes

    tensors = {k: v.detach().to(torch.float16).contiguous().cpu() for k, v in head.state_dict().items()}
    return write_bytes(path, save(tensors, metadata={"specdec_draft": json.dumps(dict(meta, kind="eagle"))}), "--out")


def read_meta(path: str | Path) -> dict | None:
    """The ``specdec_draft`` metadata of a draft artifact (``None`` if there is none)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("specdec_draft", "null"))
    return meta if isinstance(meta, dict) else None


def is_eagle(path: str | Path) -> bool:
    """Whether ``path`` is an EAGLE head artifact (else: a layer-skip adapter, or not a draft)."""
    try:
        meta = read_meta(path)
    except Exception:  # unreadable: let the loader of the other kind name the problem
        return False
    return bool(meta) and meta.get("kind") == "eagle"


def build_head(model, path: str | Path) -> tuple[dict, EagleHead]:
    """Load an EAGLE artifact for ``model`` (checks the target identity) on the model's device and dtype."""
    from specdec.artifacts import _describe, model_identity, read_draft_artifact

    path = Path(path)
    meta, tensors = read_draft_artifact(path, "specdec train-draft --kind eagle")
    if not isinstance(meta, dict) or not EAGLE_META <= set(meta) or meta["kind"] != "eagle":
        raise SpecdecError(f"{path} is not an EAGLE draft artifact (no kind/target metadata); "
                           "pass a file written by `specdec train-draft --kind eagle`.")
    ident = model_identity(model)
    if meta["target"] != ident:
        raise SpecdecError(f"draft artifact {path} was trained for {_describe(meta['target'])}, not this target "
                           f"({_describe(ident)}); train one with `specdec train-draft --kind eagle`.")
    layers = getattr(model.hf, model.hf.base_model_prefix).layers
    head = EagleHead(layers[int(meta["layer_from"])], model.hf.config.hidden_size)
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return meta, head.to(device=model.device, dtype=model.dtype).eval().requires_grad_(False)


def head_layer_step(layer, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, probs: list | None = None) -> torch.Tensor:
    """The head's decoder layer on rows at positions ``pos (B, T)``: writes their K/V into
    ``k_cache, v_cache (B, H_kv, C, D)`` and attends to every cache entry at a position ``<=`` the row's.

    The attention reads each KV head's cache once for its ``G`` query heads (``(B, H_kv, G·T, D) @ (B, H_kv,
    D, C)``; no GQA expansion). Rows past a sequence's valid range write entries that are overwritten before
    any row reads them (positions are written in increasing order). ``probs``: when a list, the attention
    weights ``(B, H, T, C)`` float32 are appended to it (the lookahead signal). Returns ``(B, T, d)``.
    """
    q, k, v = _qkv(layer, x, cos, sin)  # (B, H, T, D), (B, H_kv, T, D)
    B, H, T, D = q.shape
    H_kv, C = k_cache.shape[1], k_cache.shape[2]
    G = H // H_kv
    idx = pos.clamp(max=C - 1).view(B, 1, T, 1).expand(B, H_kv, T, D)
    k_cache.scatter_(2, idx, k.to(k_cache.dtype))
    v_cache.scatter_(2, idx, v.to(v_cache.dtype))
    s = torch.matmul(q.reshape(B, H_kv, G * T, D).to(k_cache.dtype), k_cache.transpose(-1, -2))  # (B, H_kv, G·T, C)
    s = s.view(B, H_kv, G, T, C).float() * D ** -0.5
    visible = torch.arange(C, device=x.device).view(1, 1, 1, 1, C) <= pos.view(B, 1, 1, T, 1)
    p = torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1)  # (B, H_kv, G, T, C)
    if probs is not None:
        probs.append(p.view(B, H, T, C))
    att = torch.matmul(p.view(B, H_kv, G * T, C).to(v_cache.dtype), v_cache).view(B, H, T, D)
    return _finish(layer, x, att.to(x.dtype))


def rope(model, x: torch.Tensor, pos: torch.Tensor):
    """``(cos, sin)`` of the target's rotary embedding at positions ``pos (B, T)``."""
    base = getattr(model.hf, model.hf.base_model_prefix)
    return base.rotary_emb(x, pos)


def head_components(model) -> tuple[nn.Module, nn.Module, nn.Module]:
    """The target's ``(embed_tokens, final norm, lm_head)`` the head shares."""
    base = getattr(model.hf, model.hf.base_model_prefix)
    return base.embed_tokens, base.norm, model.hf.get_output_embeddings()


def describe(meta: dict) -> dict[str, Any]:
    """A short summary of an EAGLE artifact's metadata for logs."""
    return {k: meta.get(k) for k in ("tokens", "epochs", "heldout_top1", "cpu_seconds") if k in meta}


# ---------------------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------------------

from specdec.interfaces import Drafter, ScoreRequest  # noqa: E402
from specdec.sampling import check_finite, choose, nonfinite_flags, raise_nonfinite  # noqa: E402


class _HeadDims:
    """What Dustin's selector asks of a draft model (:attr:`EagleDrafter.draft_model`): its head count."""

    def __init__(self, n_heads: int) -> None:
        self.dims = type("Dims", (), {"n_heads": n_heads, "n_global": 1})()


class EagleDrafter(Drafter):
    """Draft with an EAGLE head (:class:`EagleHead`) fed the target's final hidden states.

    Paper: *EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty* (Li et al., 2024), chain
    drafting. The target records its final normed hidden states in every forward
    (:attr:`~specdec.models.SpecdecModel.keep_hidden`): the prompt's at prefill, the γ+1 verify rows' at
    each verification. Head position ``p`` holds ``(f_p, t_{p+1})``; after a verification that accepted
    ``a`` drafts, positions ``L-1 .. L+a-1`` are (re)written with the target's true features in the same
    forward as the first draft step (ragged rows, one forward), then steps ``2..γ`` feed the head's own
    predicted features. The head's KV cache is its own ``(B, H_kv, C, D)``; rollback = rewriting.

    Lookahead signal (Dustin): the head's attention (heads :attr:`heads` of its one layer) over its
    positions, which align with the target's.

    Args:
        target: the target :class:`SpecdecModel` (its embedding, final norm and LM head are shared).
        path: an EAGLE artifact of ``specdec train-draft --kind eagle`` trained for this target.
        heads: ``{0: [query heads]}`` for the lookahead signal (``None`` = none).
    """

    def __init__(self, target, path: str | Path, heads: dict[int, list[int]] | None = None) -> None:
        meta, head = build_head(target, path)
        self.meta = meta
        self.head = head
        self.target = target
        self.path = Path(path)
        self.heads = heads
        self.draft_model = _HeadDims(target.dims.n_heads)
        self.lookahead: torch.Tensor | None = None
        self.embed, self.norm, self.lm_head = head_components(target)
        target.keep_hidden = True  # the verify passes record what the head needs
        self.k_cache = self.v_cache = None
        self._qf = self._qt = self._qn = self._rows = None  # queued true rows (see _reset_queue), last verify rows
        self._feat_last = None  # (B, d) true feature at the last verified position
        self._drafted_len = None  # (B,) verified length when the last draft started

    # -- what Dustin's builder asks ---------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return 1

    def set_heads(self, heads: dict[int, list[int]] | None) -> None:
        for layer, hs in (heads or {}).items():
            if int(layer) != 0 or any(not 0 <= int(h) < self.target.dims.n_heads for h in hs):
                raise SpecdecError(f"draft retrieval head ({layer}, {list(hs)}) is outside the EAGLE head's 1 layer × "
                                   f"{self.target.dims.n_heads} heads; use layer 0.")
        self.heads = heads

    def layer_map(self, n_target_layers: int) -> list[int]:
        return [0] * n_target_layers

    def identity(self) -> dict:
        from specdec.artifacts import model_identity

        return {**model_identity(self.target), "eagle_head": self.path.name}

    # -- the head's forward -------------------------------------------------------------------------
    def _run(self, feats: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, lookahead: bool = False) -> torch.Tensor:
        """Head rows ``(B, T)`` at positions ``pos``: returns predicted features ``(B, T, d)``. With
        ``lookahead``, the attention of the draft retrieval heads is added to :attr:`lookahead`."""
        dt = self.head.fc.weight.dtype
        x = self.head.inputs(self.embed(toks).to(dt), feats.to(dt))
        cos, sin = rope(self.target, x, pos)
        hs = sorted({int(h) for h in (self.heads or {}).get(0, [])}) if lookahead else []
        probs = [] if hs else None
        y = head_layer_step(self.head.layer, x, self.k_cache, self.v_cache, pos, cos, sin, probs)
        if hs:  # (B, H, T, C) -> summed over the heads and rows
            C = self.k_cache.shape[2]
            self.lookahead[:, :C] += probs[0][:, hs].sum((1, 2))
        return self.norm(y)

    def _logits(self, feat: torch.Tensor) -> torch.Tensor:
        return self.lm_head(feat).float()

    # -- engine hooks ---------------------------------------------------------------------------------
    def prefill(self, state) -> None:
        B = state.lengths.shape[0]
        C = state.cache.capacity
        d = self.target.dims
        dev, dt = state.lengths.device, self.head.fc.weight.dtype
        H_kv = self.head.layer.self_attn.k_proj.out_features // self.head.layer.self_attn.head_dim
        self.k_cache = torch.zeros(B, H_kv, C, self.head.layer.self_attn.head_dim, device=dev, dtype=dt)
        self.v_cache = torch.zeros_like(self.k_cache)
        hidden = getattr(state, "prompt_hidden", None)
        lens = [len(t) - 1 for t in state.tokens]  # verified prompt length (the pending token is emitted)
        feats, memo = [], {}
        for b in range(B):
            if hidden is not None:
                f = hidden[b, : lens[b]]
            else:  # equal prompts (a benchmark's batch) are run once
                key = tuple(state.tokens[b][: lens[b]])
                f = memo[key] if key in memo else memo.setdefault(key, self._prompt_features(list(key)))
            feats.append(f)
        self._feat_last = torch.stack([f[-1] for f in feats])  # (B, d)
        # head positions 0..L-2: (f_p, t_{p+1}), one sequence at a time in chunks (ragged prompts)
        chunk = 1024
        done: dict[tuple, int] = {}
        for b in range(B):
            L = lens[b]
            key = tuple(state.tokens[b][:L])
            if key in done:  # an equal prompt earlier in the batch (a benchmark's batch): copy its rows
                self.k_cache[b].copy_(self.k_cache[done[key]])
                self.v_cache[b].copy_(self.v_cache[done[key]])
                continue
            done[key] = b
            toks = torch.tensor(state.tokens[b][1:L], device=dev)
            for s in range(0, L - 1, chunk):
                e = min(L - 1, s + chunk)
                pos = torch.arange(s, e, device=dev).view(1, -1)
                kc, vc = self.k_cache, self.v_cache
                self.k_cache, self.v_cache = kc[b : b + 1], vc[b : b + 1]
                try:
                    self._run(feats[b][s:e].unsqueeze(0), toks[s:e].unsqueeze(0), pos)
                finally:
                    self.k_cache, self.v_cache = kc, vc
        self._reset_queue(B, dev)
        self._drafted_len = state.lengths.clone()

    def _reset_queue(self, B: int, dev, rows: int = 1) -> None:
        """An empty queue of ``rows`` slots per sequence."""
        d = self._feat_last.shape[-1]
        self._qf = self._feat_last.new_zeros(B, rows, d)  # (B, R, d) features f_{L-1}, f_L, ...
        self._qt = torch.zeros(B, rows, dtype=torch.long, device=dev)  # (B, R) tokens t_L, d_1, ...
        self._qn = torch.zeros(B, dtype=torch.long, device=dev)  # (B,) valid queued rows

    @torch.no_grad()
    def _prompt_features(self, ids: list[int]) -> torch.Tensor:
        """The target's features of a prompt when the prefill did not record them (a ``Prefilled`` made
        before this drafter existed): one extra target pass over the prompt into a scratch cache."""
        m = self.target
        cache = m.new_cache(1, len(ids))
        out = []
        for s in range(0, len(ids), 1024):
            x = torch.tensor([ids[s : s + 1024]], device=m.device)
            m.forward(x, cache, torch.tensor([s], device=m.device), logits_to_keep=1)
            out.append(m.last_hidden[0])
        return torch.cat(out)

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        B = state.lengths.shape[0]
        dev = state.lengths.device
        C = self.k_cache.shape[2]
        d = self._feat_last.shape[-1]
        self.lookahead = torch.zeros(B, state.cache.capacity, dtype=torch.float32, device=dev)
        # first forward (fixed shape B × (R+1)): the queued true rows at positions L_old-1 .. L-2, then the row
        # (f_{L-1}, pending) at L-1, left-aligned; padding rows after it are rewritten by the next draft steps
        R = self._qf.shape[1]
        ar = torch.arange(B, device=dev)
        feats = torch.cat([self._qf, self._qf.new_zeros(B, 1, d)], dim=1)
        toks = torch.cat([self._qt, self._qt.new_zeros(B, 1)], dim=1)
        feats[ar, self._qn] = self._feat_last.to(feats.dtype)
        toks[ar, self._qn] = state.pending
        last = state.lengths - 1  # position of the row (f_{L-1}, pending)
        pos = (last - self._qn).view(B, 1) + torch.arange(R + 1, device=dev)
        pred = self._run(feats, toks, pos.clamp(0, C - 1))[ar, self._qn]  # (B, d): f̂_L
        tokens, probs = [], []
        deferred = state.sampling.greedy
        flags = None
        for i in range(gamma):
            logits = self._logits(pred)
            if deferred:
                f_ = nonfinite_flags(logits)
                flags = f_ if flags is None else flags | f_
            else:
                check_finite(logits, "drafter")
            cur, p = choose(logits, state.sampling, state.generator)
            tokens.append(cur)
            probs.append(p)
            if i + 1 < gamma:
                at = (last + 1 + i).clamp(max=C - 1).view(B, 1)
                pred = self._run(pred.view(B, 1, d), cur.view(B, 1), at, lookahead=True)[:, 0]
        if flags is not None:
            raise_nonfinite(flags, "drafter")
        self._drafted_len = state.lengths.clone()
        drafts = torch.stack(tokens, dim=1)
        self._rows = torch.cat([state.pending.view(B, 1), drafts], dim=1)  # (B, γ+1) what the verifier scores
        qd = torch.stack(probs, dim=1) if probs[0] is not None else None
        return drafts, qd

    def drafts_replaced(self, state, drafts: torch.Tensor, mask: torch.Tensor) -> None:
        """The verified rows are ``drafts`` (a prompt-lookup wrapper replaced some): queue those tokens."""
        self._rows = torch.cat([state.pending.view(-1, 1), drafts], dim=1)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        """Queue the accepted positions' true features: ``(f_{L-1}, t_L), (f_L, d_1) .. (f_{L+a-1}, d_a)``
        (device tensors, no host read)."""
        hidden = self.target.last_hidden  # (B, γ+1, d): f_L .. f_{L+γ} of the verify rows
        if hidden is None or hidden.shape[:2] != self._rows.shape:
            raise SpecdecError("the target recorded no hidden states for the verify rows; the EAGLE drafter needs "
                               "model.keep_hidden (set when the drafter is built) and one target pass per verification.")
        B, R = self._rows.shape
        # accepted drafts a = new length - old length - 1; a finished (frozen) sequence gives -1: nothing queued
        a = (state.lengths - self._drafted_len - 1).clamp(-1, R - 1)
        self._qf = torch.cat([self._feat_last.view(B, 1, -1).to(hidden.dtype), hidden[:, : R - 1]], dim=1)  # (B, R, d)
        self._qt = self._rows
        self._qn = a + 1
        ar = torch.arange(B, device=a.device)
        self._feat_last = torch.where((a >= 0).view(B, 1), hidden[ar, a.clamp(min=0)], self._feat_last.to(hidden.dtype))
