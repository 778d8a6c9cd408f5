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


def _plain_copy(layer: nn.Module) -> nn.Module:
    """A copy of a target decoder layer with separate q/k/v and gate/up projections (an artifact's layout and
    what :func:`_qkv` runs), also when the target's projections were fused (:mod:`specdec.fusion`): the fused
    modules are replaced by fresh ones of the family's classes (their weights come from the artifact)."""
    import sys

    from specdec.fusion import FAMILIES, FusedAttention, FusedMLP

    out = copy.deepcopy(layer)
    a, mlp = out.self_attn, out.mlp
    if isinstance(a, FusedAttention) or isinstance(mlp, FusedMLP):
        cfg = a.config
        module = sys.modules[(a._rope if isinstance(a, FusedAttention) else type(a)).__module__]
        attn_cls, mlp_cls = (getattr(module, n) for n in FAMILIES[cfg.model_type])
        if isinstance(a, FusedAttention):
            out.self_attn = attn_cls(cfg, a.layer_idx)
        if isinstance(mlp, FusedMLP):
            out.mlp = mlp_cls(cfg)
    return out


def feature_norm(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """A decoder layer's output scaled to unit root-mean-square over the width (no weight): how a fused-feature
    head (:class:`EagleHead` ``feature_layers``) sees the target's intermediate layers, in training and drafting."""
    return (h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)


def default_feature_layers(n_layers: int) -> list[int]:
    """EAGLE-3's low and middle layers for an ``n_layers`` target (the final normed hidden is the high one)."""
    return sorted({min(2, n_layers - 1), n_layers // 2})


class EagleHead(nn.Module):
    """``fc`` (2d → d, with bias) + one decoder layer shaped like the target's layers.

    With ``feature_layers`` (EAGLE-3's fused features), a target feature is the final normed hidden ``f`` followed
    by the outputs of those decoder layers (each :func:`feature_norm`'d), ``(…, (1 + n) d)``, and the head reads
    ``f + proj([h_a; h_b; …])`` (``proj`` without bias, zero at initialisation: a new head starts as the plain
    one); the head's own predictions (draft steps ``>= 2``) are ``d`` wide and used as they are.

    Args:
        target_layer: a decoder layer of the target (copied: class, config and initial weights).
        hidden: model width ``d``.
        feature_layers: the target's decoder layers fused into its feature (``None``: the final hidden only).
    """

    def __init__(self, target_layer: nn.Module, hidden: int, feature_layers: list[int] | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        self.feature_layers = [int(i) for i in feature_layers or []]
        self.proj = (nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
                     if self.feature_layers else None)
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layer = _plain_copy(target_layer)
        self.layer.requires_grad_(True)
        with torch.no_grad():  # start as "the feature itself" plus a little of the token embedding
            self.fc.weight.zero_()
            self.fc.weight[:, hidden:].copy_(torch.eye(hidden))
            nn.init.normal_(self.fc.weight[:, :hidden], std=0.02)
            self.fc.bias.zero_()
            if self.proj is not None:
                self.proj.weight.zero_()

    @property
    def feature_width(self) -> int:
        """The width of a target feature this head reads: ``d``, or ``(1 + n) d`` with ``n`` fused layers."""
        return self.hidden * (1 + len(self.feature_layers))

    def fuse(self, feat: torch.Tensor) -> torch.Tensor:
        """A target feature ``(…, feature_width)`` → ``(…, d)`` (the identity for a plain head); a ``d``-wide
        input (the head's own prediction) is returned as it is."""
        if self.proj is None or feat.shape[-1] == self.hidden:
            return feat
        f = feat[..., : self.hidden]
        return f + self.proj(feat[..., self.hidden :].to(self.proj.weight.dtype)).to(f.dtype)

    def inputs(self, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
        """``fc([embed(t_{p+1}); fuse(f_p)])``: ``(B, T, d)`` and a target feature or a ``d``-wide prediction →
        ``(B, T, d)``."""
        return self.fc(torch.cat([emb, self.fuse(feat).to(emb.dtype)], dim=-1))


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
    fl = meta.get("feature_layers") or None
    if fl is not None and (not isinstance(fl, list) or any(not isinstance(i, int) or not 0 <= i < len(layers)
                                                            for i in fl)):
        raise SpecdecError(f"{path}: feature_layers {fl!r} is not a list of this target's {len(layers)} layers; "
                           "retrain it with `specdec train-draft --kind eagle`.")
    head = EagleHead(layers[int(meta["layer_from"])], model.hf.config.hidden_size, fl)
    head.load_state_dict({k: v.float() for k, v in tensors.items()})
    return meta, head.to(device=model.device, dtype=model.dtype).eval().requires_grad_(False)


def head_layer_step(layer, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, probs: list | None = None, backend=None,
                    score_heads: list[int] | None = None) -> torch.Tensor:
    """The head's decoder layer on rows at positions ``pos (B, T)``: writes their K/V into
    ``k_cache, v_cache (B, H_kv, C, D)`` and attends to every cache entry at a position ``<=`` the row's.

    The attention reads each KV head's cache once for its ``G`` query heads (``(B, H_kv, G·T, D) @ (B, H_kv,
    D, C)``; no GQA expansion). Rows past a sequence's valid range write entries that are overwritten before
    any row reads them (positions are written in increasing order). ``probs``: when a list, the attention
    weights ``(B, H, T, C)`` float32 are appended to it (the lookahead signal). Returns ``(B, T, d)``.

    ``backend``: an :class:`~specdec.interfaces.AttentionBackend` that computes the same attention instead
    (the Triton split-K kernel on a GPU: the cache read once at its bytes, no float32 logit tensors); rows
    must then sit at consecutive positions ``pos[:, 0] + t`` (every caller's do). With ``probs``, what is
    appended is the backend's softmax scores of ``score_heads`` summed over them and the rows, ``(B, H_kv, C)``.
    """
    q, k, v = _qkv(layer, x, cos, sin)  # (B, H, T, D), (B, H_kv, T, D)
    B, H, T, D = q.shape
    H_kv, C = k_cache.shape[1], k_cache.shape[2]
    G = H // H_kv
    idx = pos.clamp(max=C - 1).view(B, 1, T, 1).expand(B, H_kv, T, D)
    k_cache.scatter_(2, idx, k.to(k_cache.dtype))
    v_cache.scatter_(2, idx, v.to(v_cache.dtype))
    if backend is not None:
        from specdec.interfaces import AttentionMetadata

        # row t at pos[:, 0] + t; kept <= C - T so no row reads past the capacity (the head's callers never
        # reach it: a verification writes L + γ < C)
        start = pos[:, 0].clamp(min=0, max=C - T)
        want = probs is not None and bool(score_heads)
        meta = AttentionMetadata(lengths=start, scale=D ** -0.5, score_rows=list(range(T)) if want else None,
                                 score_kind="softmax", score_heads=list(score_heads) if want else None,
                                 static=k_cache.is_cuda)
        att, scores = backend.attend(q.to(k_cache.dtype), k_cache, v_cache, meta)
        if want:
            probs.append(scores)
        return _finish(layer, x, att.to(x.dtype))
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

from specdec.interfaces import AttentionMetadata, Drafter, ScoreRequest  # noqa: E402
from specdec.sampling import check_finite, choose, nonfinite_flags  # noqa: E402


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
        self.lookahead: torch.Tensor | None = None  # (B, capacity) float32, one buffer per cache shape
        self.embed, self.norm, self.lm_head = head_components(target)
        #: what this drafter's engine has the target record in its forwards: the final hidden states and these decoder
        #: layers' outputs (:meth:`specdec.engine.SpeculativeEngine._recording`; other engines on the model record none)
        self.records_hidden = tuple(sorted(int(i) for i in head.feature_layers))
        target.keep_hidden = True  # the verify passes record what the head needs (also outside an engine's calls)
        # and the layers a fused-feature head reads: the model records the union of what its drafters read (several
        # drafters may share one target), each drafter takes its own columns (:meth:`_own`)
        target.hidden_layers = tuple(sorted(set(getattr(target, "hidden_layers", ())) | set(head.feature_layers)))
        self.k_cache = self.v_cache = None  # (B, H_kv, C, D), one buffer per cache shape (kept across generations)
        self._feat_last = None  # (B, d) true feature at the last verified position
        self._drafted_len = None  # (B,) verified length when the last draft started
        self._hidden = self._rows = None  # (B, R, d) target features of the last verify rows, (B, R) those rows
        self._hs: torch.Tensor | None = None  # (n,) the lookahead heads on the device
        self._hs_key: tuple = ()  # the same heads on the host
        self._flags: torch.Tensor | None = None  # (2,) non-finite flags of the last greedy draft, read at on_verify
        #: where the head's attention runs: "auto" | "backend" | "torch" | a backend (:meth:`attention_backend`)
        self.attention = "auto"
        #: CUDA graphs of the draft (:class:`specdec.graphs.CapturedCall`), made when the target captures its own
        self.graphs = None
        self._graphs_of = None

    # -- what Dustin's builder asks ---------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return 1

    def _recorded_width(self) -> int:
        return self.head.hidden * (1 + len(getattr(self.target, "hidden_layers", ())))

    def _own(self, h: torch.Tensor) -> torch.Tensor:
        """This head's feature columns of ``h (…, (1 + n) d)``, recorded with the target's current
        :attr:`~specdec.models.SpecdecModel.hidden_layers` (the union of its drafters' layers): the final hidden, then
        the head's own layers in its order (``h`` itself when they are all of them, a view for a plain head)."""
        d, have = self.head.hidden, tuple(getattr(self.target, "hidden_layers", ()))
        want = tuple(self.head.feature_layers)
        if h.shape[-1] != d * (1 + len(have)):
            raise SpecdecError(f"the target recorded hidden states {h.shape[-1]} wide; the EAGLE drafter expected "
                               f"{d * (1 + len(have))} (layers {list(have)}): was model.hidden_layers changed by hand?")
        if want == have:
            return h
        if not want:
            return h[..., :d]
        blocks = [0] + [1 + have.index(i) for i in want]
        return torch.cat([h[..., b * d : (b + 1) * d] for b in blocks], dim=-1)

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
        record = lookahead and self._hs is not None
        probs = [] if record else None
        backend = self.attention_backend()
        y = head_layer_step(self.head.layer, x, self.k_cache, self.v_cache, pos, cos, sin, probs, backend=backend,
                            score_heads=list(self._hs_key))
        if record:
            C = self.k_cache.shape[2]
            if backend is not None:  # (B, H_kv, C): already summed over the heads and rows
                self.lookahead[:, :C] += probs[0].sum(1)
            else:  # (B, H, T, C) -> summed over the heads and rows; device-side head index: no host copy
                self.lookahead[:, :C] += probs[0].index_select(1, self._hs).sum((1, 2))
        return self.norm(y)

    def attention_backend(self):
        """The backend the head's attention runs on, or ``None`` (PyTorch matmuls in :func:`head_layer_step`).

        :attr:`attention` ``"auto"``: the target's backend when it is the Triton one (on a GPU the head's
        attention is then the split-K kernel, ~its cache's bytes, instead of bf16 matmuls + float32 mask and
        softmax over the whole capacity); ``"backend"``: the target's backend whatever it is; ``"torch"``: none;
        an :class:`~specdec.interfaces.AttentionBackend`: that one. Only the drafts' numerics change:
        verification decides what is emitted."""
        mode = self.attention
        if not isinstance(mode, str):
            return mode
        if mode not in ("auto", "backend", "torch"):
            raise SpecdecError(f"EagleDrafter.attention must be 'auto', 'backend' or 'torch', not {mode!r}.")
        be = getattr(self.target, "backend", None)
        if mode == "torch" or be is None:
            return None
        if mode == "auto" and type(be).__name__ != "TritonBackend":
            return None
        return be

    def _logits(self, feat: torch.Tensor) -> torch.Tensor:
        return self.lm_head(feat).float()

    # -- the draft as fixed-shape functions of tensors (one CUDA graph each on a GPU) -------------------
    # Each reads only its arguments and buffers whose addresses do not change while the cache shape does
    # not (the head's K/V cache, the lookahead buffer, weights), makes no host read and has shapes fixed by
    # (B, R, γ): :class:`specdec.graphs.CapturedCall` captures it once per shape and replays it.

    def _first(self, feat_last: torch.Tensor, hidden: torch.Tensor, rows: torch.Tensor, drafted_len: torch.Tensor,
               lengths: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first draft forward, which also rewrites the verified positions with the target's true features.

        Args:
            feat_last: ``(B, d)`` true feature at position ``L_old - 1`` (the last draft's start); ``d`` here is
                the head's :attr:`~EagleHead.feature_width` (wider for a fused-feature head).
            hidden: ``(B, R, d)`` the target's features ``f_{L_old} .. f_{L_old+R-1}`` of the last verify rows.
            rows: ``(B, R)`` those rows' tokens (the pending token and the drafts).
            drafted_len: ``(B,)`` ``L_old``; ``lengths``: ``(B,)`` ``L`` now (``a = L - L_old - 1`` drafts
                were accepted; ``-1``: nothing verified since, e.g. right after the prefill or a finished sequence).
            pending: ``(B,)`` the token at position ``L`` (emitted, not yet in the target's cache).

        One forward of ``B × (R+1)`` rows, left-aligned per sequence: the queued true rows
        ``(f_{L_old-1}, t_{L_old}), (f_{L_old}, d_1) .. (f_{L-2}, d_a)`` at positions ``L_old-1 .. L-2``, then the row
        ``(f_{L-1}, pending)`` at ``L-1``; the padding rows after it are rewritten by the next draft steps.
        Returns ``(f̂_L (B, d), f_{L-1} (B, d))``.
        """
        B, R = rows.shape
        d = feat_last.shape[-1]
        C = self.k_cache.shape[2]
        if self.lookahead is not None:
            self.lookahead.zero_()
        a = (lengths - drafted_len - 1).clamp(-1, R - 1)  # (B,) accepted drafts since the last draft
        qn = a + 1  # (B,) queued true rows
        feat_last = feat_last.to(hidden.dtype)
        new_last = hidden.gather(1, a.clamp(min=0).view(B, 1, 1).expand(B, 1, d))[:, 0]  # f_{L-1} = f_{L_old+a}
        new_last = torch.where((a >= 0).view(B, 1), new_last, feat_last)
        feats = torch.cat([feat_last.view(B, 1, d), hidden[:, : R - 1], hidden.new_zeros(B, 1, d)], dim=1)  # (B, R+1, d)
        toks = torch.cat([rows, rows.new_zeros(B, 1)], dim=1)  # (B, R+1)
        feats = feats.scatter(1, qn.view(B, 1, 1).expand(B, 1, d), new_last.view(B, 1, d))
        toks = toks.scatter(1, qn.view(B, 1), pending.view(B, 1))
        pos = (lengths - 1 - qn).view(B, 1) + torch.arange(R + 1, device=rows.device)
        pred = self._run(feats, toks, pos.clamp(0, C - 1))  # (B, R+1, d)
        return pred.gather(1, qn.view(B, 1, 1).expand(B, 1, pred.shape[-1]))[:, 0], new_last

    def _step(self, pred: torch.Tensor, tok: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        """Draft steps ``2..γ``: the head fed its own feature ``pred (B, d)`` and token ``tok (B,)`` at
        positions ``at (B, 1)``; records the lookahead signal. Returns the next ``f̂ (B, d)``."""
        B, d = pred.shape
        return self._run(pred.view(B, 1, d), tok.view(B, 1), at, lookahead=True)[:, 0]

    def _greedy(self, gamma: int, *first_args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A whole greedy draft: :meth:`_first`, then γ × (LM head, argmax, :meth:`_step`). Returns
        ``drafts (B, γ)``, the non-finite flags ``(2,)`` of the draft logits, ``f_{L-1}`` and ``L`` ``(B,)``."""
        lengths = first_args[4]
        pred, new_last = self._first(*first_args)
        B = pred.shape[0]
        C = self.k_cache.shape[2]
        tokens, flags = [], None
        for i in range(gamma):
            logits = self._logits(pred)
            f = nonfinite_flags(logits)
            flags = f if flags is None else flags | f
            tokens.append(logits.argmax(dim=-1))
            if i + 1 < gamma:
                pred = self._step(pred, tokens[-1], (lengths + i).clamp(max=C - 1).view(B, 1))
        return torch.stack(tokens, dim=1), flags, new_last, lengths.clone()

    def _greedy_chain(self, gamma: int, by_head: bool, cand: torch.Tensor, cmask: torch.Tensor, conf: torch.Tensor,
                      *first_args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A greedy draft that follows proposed continuations while it may (prompt lookup's candidates), then the
        head's own chain **conditioned on the tokens taken** (:class:`specdec.lookup.LookupDrafter`, ``policy="chain"``).

        Args:
            cand: ``(B, K, γ)`` candidate continuations, in order of preference; ``cmask``: ``(B, K, γ)`` where a
                candidate has a token.
            conf: ``(B, K, γ)`` thresholds: at step ``i`` candidate ``k`` may give a token the head's own argmax
                differs from only while the head's top probability is below ``conf[:, k, i]`` (``0``: only a token the
                head agrees with; ``> 1``: always).

        Step ``i`` takes the token of the first candidate that is still alive (equal to every token taken so far),
        has a token at ``i`` and is allowed by ``conf`` (``by_head``: of those, the one the head gives the highest
        probability, the first on ties); else the head's own argmax. Same head calls as :meth:`_greedy`
        (``γ`` LM-head evaluations, ``γ - 1`` head steps) plus a log-sum-exp over the vocabulary per step. One candidate with ``conf > 1``
        gives its tokens then the head's chain fed them. Returns what :meth:`_greedy` returns."""
        lengths = first_args[4]
        pred, new_last = self._first(*first_args)
        B = pred.shape[0]
        C = self.k_cache.shape[2]
        tokens, flags = [], None
        alive = torch.ones(cand.shape[:2], dtype=torch.bool, device=pred.device)  # (B, K)
        for i in range(gamma):
            logits = self._logits(pred)
            f = nonfinite_flags(logits)
            flags = f if flags is None else flags | f
            own = logits.argmax(dim=-1)  # (B,)
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # (B, 1): probabilities without a (B, V) softmax
            top = (logits.gather(1, own.view(B, 1)) - lse).exp()  # (B, 1) the head's confidence in its own token
            tok = cand[:, :, i]  # (B, K)
            ok = alive & cmask[:, :, i] & ((tok == own.view(B, 1)) | (top < conf[:, :, i]))
            score = torch.where(ok, (logits.gather(1, tok) - lse).exp(), -1.0) if by_head else ok.to(torch.uint8)
            pick = tok.gather(1, score.argmax(dim=1, keepdim=True))[:, 0]  # the first allowed (most probable) one
            tokens.append(torch.where(ok.any(dim=1), pick, own))
            alive = alive & cmask[:, :, i] & (tok == tokens[-1].view(B, 1))
            if i + 1 < gamma:
                pred = self._step(pred, tokens[-1], (lengths + i).clamp(max=C - 1).view(B, 1))
        return torch.stack(tokens, dim=1), flags, new_last, lengths.clone()

    def _captured(self):
        """The :class:`~specdec.graphs.CapturedCall` replaying the draft, or ``None`` (eager): graphs are used
        when the target captures its forwards (:meth:`SpecdecModel.enable_cuda_graphs`) and runs on a GPU."""
        g = getattr(self.target, "_graphs", None)
        if g is None or not self.k_cache.is_cuda:
            return None
        if self._graphs_of is not g:  # new target graphs (or none before): new draft graphs
            from specdec.graphs import CapturedCall

            self.graphs, self._graphs_of = CapturedCall(max_graphs=8), g
        return self.graphs

    def _call(self, name: str, fn, *inputs: torch.Tensor):
        """``fn(*inputs)``, replayed as a CUDA graph per ``name`` and buffers when :meth:`_captured` gives one."""
        calls = self._captured()
        if calls is None:
            return fn(*inputs)
        be = self.attention_backend()  # the head's attention kernel is part of what a graph replays
        key = ("eagle", name, self.k_cache.data_ptr(), self.lookahead.data_ptr(), self._hs_key,
               None if be is None else (type(be).__name__, repr(getattr(be, "config", None))))
        return calls(key, fn, *inputs, keep=self)

    # -- engine hooks ---------------------------------------------------------------------------------
    def _buffers(self, B: int, C: int, dev) -> None:
        """The head's K/V cache ``(B, H_kv, C, D)`` and the lookahead buffer ``(B, C)`` (``C``: the target cache's
        capacity; head positions are target positions), and the lookahead heads on the device. Kept while their
        shapes stay (their addresses key the captured draft), made anew otherwise."""
        a = self.head.layer.self_attn
        dt = self.head.fc.weight.dtype
        shape = (B, a.k_proj.out_features // a.head_dim, C, a.head_dim)
        k = self.k_cache
        if k is None or tuple(k.shape) != shape or k.dtype != dt or k.device != torch.device(dev):
            self.k_cache = torch.zeros(shape, device=dev, dtype=dt)
            self.v_cache = torch.zeros_like(self.k_cache)
        la = self.lookahead
        if la is None or tuple(la.shape) != (B, C) or la.device != torch.device(dev):
            self.lookahead = torch.zeros(B, C, dtype=torch.float32, device=dev)
        hs = sorted({int(h) for h in (self.heads or {}).get(0, [])})
        if tuple(hs) != self._hs_key or (self._hs is not None and self._hs.device != torch.device(dev)):
            self._hs = torch.tensor(hs, dtype=torch.long, device=dev) if hs else None
            self._hs_key = tuple(hs)  # part of the captured draft's key (no host read of _hs)

    def prefill(self, state) -> None:
        B = state.lengths.shape[0]
        C = state.cache.capacity
        dev = state.lengths.device
        self._buffers(B, C, dev)
        self._flags = None
        self.take_ahead(None)  # an early draft left by the last generation
        hidden = getattr(state, "prompt_hidden", None)
        if hidden is not None:
            # recorded before this drafter widened what the model records (a Prefilled made earlier): rerun
            hidden = self._own(hidden) if hidden.shape[-1] == self._recorded_width() else None
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
        # nothing verified since: one queued row (the pending token's), no accepted drafts (a = -1)
        d = self._feat_last.shape[-1]
        self._hidden = self._feat_last.new_zeros(B, 1, d)
        self._rows = torch.zeros(B, 1, dtype=torch.long, device=dev)
        self._drafted_len = state.lengths.clone()

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
            out.append(self._own(m.last_hidden)[0])
        return torch.cat(out)

    #: a greedy draft is one function of device state (one graph replay on a GPU): the engine may start it early
    drafts_ahead = True

    def draft(self, state, gamma: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        ahead = self.take_ahead(gamma)
        if ahead is not None:  # started by draft_ahead after the last verification
            return ahead
        B = state.lengths.shape[0]
        first = (self._feat_last, self._hidden, self._rows, self._drafted_len, state.lengths, state.pending)
        if state.sampling.greedy:  # the whole draft in one function (one graph replay on a GPU)
            drafts, flags, self._feat_last, self._drafted_len = self._call(
                f"greedy{gamma}", lambda *t: self._greedy(gamma, *t), *first)
            # read after the engine's own host read of this iteration (on_verify): no wait on the draft here
            self._flags = flags.clone()
            drafts, qd = drafts.clone(), None  # the graph's buffers are rewritten by the next draft
        else:  # sampling draws with the engine's generator between the head's forwards (eager)
            pred, self._feat_last = self._call("first", self._first, *first)
            self._drafted_len = state.lengths.clone()
            C = self.k_cache.shape[2]
            tokens, probs = [], []
            for i in range(gamma):
                logits = self._logits(pred)
                check_finite(logits, "drafter")
                cur, p = choose(logits, state.sampling, state.generator)
                tokens.append(cur)
                probs.append(p)
                if i + 1 < gamma:
                    at = (state.lengths + i).clamp(max=C - 1).view(B, 1)
                    pred = self._call("step", self._step, pred, cur, at)
            drafts, qd = torch.stack(tokens, dim=1), torch.stack(probs, dim=1)
        self._rows = torch.cat([state.pending.view(B, 1), drafts], dim=1)  # (B, γ+1) what the verifier scores
        return drafts, qd

    def draft_chain(self, state, gamma: int, cand: torch.Tensor, cmask: torch.Tensor,
                    conf: torch.Tensor, by_head: bool = False) -> torch.Tensor:
        """Greedy drafts ``(B, γ)`` that follow the candidates ``cand (B, K, γ)`` where ``cmask`` allows and ``conf``
        does not veto, the head continuing from the tokens taken (:meth:`_greedy_chain`); one graph replay on a GPU
        per ``K``, like :meth:`draft`."""
        if not state.sampling.greedy:
            raise SpecdecError("EagleDrafter.draft_chain drafts greedily; with sampling use draft() and replace tokens.")
        B = state.lengths.shape[0]
        first = (self._feat_last, self._hidden, self._rows, self._drafted_len, state.lengths, state.pending)
        drafts, flags, self._feat_last, self._drafted_len = self._call(
            f"chain{gamma}x{cand.shape[1]}{'h' if by_head else ''}", lambda *t: self._greedy_chain(gamma, by_head, *t),
            cand, cmask, conf, *first)
        self._flags = flags.clone()
        drafts = drafts.clone()
        self._rows = torch.cat([state.pending.view(B, 1), drafts], dim=1)
        return drafts

    @torch.no_grad()
    def draft_tree(self, state, tree) -> torch.Tensor:
        """Greedy draft of a :class:`~specdec.tree.DraftTree`: ``(B, N)`` tokens, node ``i + 1`` in column ``i``.

        The first forward is the chain's (:meth:`_first`: it also rewrites the verified positions with the target's
        true features); a node's token is the ``rank``-th most likely token of its parent's prediction. Then, depth by
        depth, every node with children runs one head row — its parent's predicted feature and its own token at
        position ``L + depth - 1``, attending to the head's cache below ``L`` and to its ancestors' rows (a tree mask
        over the tree's scratch rows). Along the path of argmax tokens this is the chain draft (its features up to
        float rounding: the softmax is split over cache and scratch). The attention runs where the chain's does
        (:meth:`attention_backend`): PyTorch matmuls over the cache and scratch K/V (the head's cache is not written
        past ``L - 1``), or a backend with tree rows (on a GPU the Triton split-K kernel: the cache read once per
        depth, no float32 logits over its capacity; the scratch rows then go into the head's cache at ``L, L + 1,
        ..``, past what any row reads before the next draft rewrites them, and every scratch row so far is queried
        with the tree's mask, :meth:`~specdec.tree.DraftTree.draft_masks`). No lookahead signal (dense
        verification needs none). A fixed-shape function of tensors
        (:meth:`_tree`): one CUDA graph replay per tree on a GPU with the target's graphs, as the chain's draft.
        A lookup branch (``tree.lookup``) gets the argmax chain's tokens (``tree.fallback``): a
        :class:`~specdec.lookup.LookupDrafter` replaces them where the context has a match."""
        first = (self._feat_last, self._hidden, self._rows, self._drafted_len, state.lengths, state.pending)
        name = ("tree", id(tree), tree.paths, tree.lookup)
        tok, self._feat_last, flags = self._call(name, lambda *t: self._tree(tree, *t), *first)
        self._drafted_len = state.lengths.clone()
        if flags is not None:
            self._flags = flags.clone()
        return tok[:, 1:].clone()

    def _tree(self, tree, *first_args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """:meth:`draft_tree`'s device work: ``(tokens (B, N + 1) with the pending token in column 0, f_{L-1}, the
        non-finite flags)``. Reads only its arguments, the head's cache and the tree's index tensors
        (:meth:`~specdec.tree.DraftTree.draft_index`); no host read."""
        lengths, pending = first_args[4], first_args[5]
        pred, new_last = self._first(*first_args)
        B = lengths.shape[0]
        rows_d, anc_d, look_rows, fallback = tree.draft_index(lengths.device)
        picks = tree.draft_picks(lengths.device)
        n = tree.nodes + 1
        tok = torch.zeros(B, n, dtype=torch.long, device=lengths.device)
        tok[:, 0] = pending
        preds = {0: pred}  # row -> its predicted feature (B, d): what its children's tokens come from
        layer, dt = self.head.layer, self.head.fc.weight.dtype
        Hkv, C, D = self.k_cache.shape[1:]
        be = self.attention_backend()
        if be is not None and not getattr(be, "supports_tree", False):
            be = None  # a backend without tree rows: the matmuls
        if be is None:
            seen_ctx = torch.arange(C, device=tok.device).view(1, C) < lengths.view(B, 1)  # head rows <= L - 1
        ks, vs = [], []  # (matmuls) scratch K/V of the tree's head rows
        qs, done = [], 0  # (backend) the scratch rows' queries so far, and how many rows that is
        flags = None
        for d in range(tree.max_depth):
            # the tokens at depth d + 1: the ranked predictions of their parents (the root, then depth d's inner
            # rows), one LM head and one top-k for all of them
            parents, k_top, kids, flat = picks[d]
            logits = self._logits(torch.stack([preds[u] for u in parents], dim=1))  # (B, P, V)
            f = nonfinite_flags(logits)
            flags = f if flags is None else flags | f
            top = logits.topk(k_top, dim=-1).indices.view(B, -1)  # (B, P k)
            tok.index_copy_(1, kids, top.index_select(1, flat))
            nxt = tree.inner[d] if d < len(rows_d) else []
            if not nxt:
                break  # (no deeper node has children)
            # the head rows of depth d + 1's inner nodes: (parent's prediction, own token) at L + d
            feats = torch.stack([preds[tree.parent_of[c]] for c in nxt], dim=1)  # (B, m, d)
            x = self.head.inputs(self.embed(tok.index_select(1, rows_d[d])).to(dt), feats.to(dt))
            pos = (lengths + d).view(B, 1).expand(B, len(nxt))
            cos, sin = rope(self.target, x, pos)
            q, k, v = _qkv(layer, x, cos, sin)  # (B, H, m, D), (B, Hkv, m, D)
            H = q.shape[1]
            m = len(nxt)
            if be is not None:
                # the backend's tree rows: scratch row j is written into the head's cache at position L + j (past
                # what any row reads before the next draft rewrites it) and every scratch row so far is queried
                # with the tree's mask among them; the cache is read once per depth by the kernel
                M = done + m
                at = (lengths.view(B, 1) + done + torch.arange(m, device=tok.device)).clamp(max=C - 1)
                at = at.view(B, 1, m, 1).expand(B, Hkv, m, D)
                self.k_cache.scatter_(2, at, k.to(self.k_cache.dtype))
                self.v_cache.scatter_(2, at, v.to(self.v_cache.dtype))
                qs.append(q.to(self.k_cache.dtype))
                meta = AttentionMetadata(lengths=lengths.clamp(max=C - M), scale=D ** -0.5,
                                         tree=tree.draft_masks(tok.device)[d], static=self.k_cache.is_cuda)
                att, _ = be.attend(torch.cat(qs, dim=2), self.k_cache, self.v_cache, meta)
                att, done = att[:, :, done:M], M
            else:
                ks.append(k.to(self.k_cache.dtype))
                vs.append(v.to(self.v_cache.dtype))
                # one softmax over the head's cache (read in place, each KV head once for its G query heads) and the
                # scratch rows of the tree so far
                G = H // Hkv
                qg = q.reshape(B, Hkv, G * m, D).to(self.k_cache.dtype)
                ksc, vsc = torch.cat(ks, dim=2), torch.cat(vs, dim=2)  # (B, Hkv, M, D)
                s = torch.cat([qg @ self.k_cache.transpose(-1, -2), qg @ ksc.transpose(-1, -2)], dim=-1)
                s = s.view(B, Hkv, G, m, -1).float() * D ** -0.5  # (B, Hkv, G, m, C + M)
                anc = anc_d[d]  # (m, M): ancestors-or-self among the scratch rows
                vis = torch.cat([seen_ctx.view(B, 1, C).expand(B, m, C), anc.view(1, m, -1).expand(B, -1, -1)], dim=2)
                p = torch.softmax(s.masked_fill(~vis.view(B, 1, 1, m, -1), float("-inf")), dim=-1)
                p = p.view(B, Hkv, G * m, -1).to(self.v_cache.dtype)
                att = (p[..., :C] @ self.v_cache + p[..., C:] @ vsc).view(B, H, m, D)
            y = self.norm(_finish(layer, x, att.to(x.dtype)))  # (B, m, d)
            for i, c in enumerate(nxt):
                preds[c] = y[:, i]
        if tree.lookup:  # a lookup branch (filled by a prompt-lookup wrapper): the argmax chain where no match
            tok.index_copy_(1, look_rows, tok.index_select(1, fallback))
        return tok, new_last, flags

    def tree_verified(self, state, rows: torch.Tensor, path: torch.Tensor) -> None:
        """After a tree's verification: queue the accepted path's rows (the pending token and the path's tokens
        ``rows.gather(1, path)``) and their true features for the next draft's first forward, as :meth:`on_verify`
        does for a chain's ``γ + 1`` rows. ``rows (B, N + 1)``: the verified tokens; ``path (B, D)``: the
        accepted path's rows (:func:`specdec.tree.accept_greedy`)."""
        self.raise_untaken_flags()
        hidden = self.target.last_hidden  # (B, N + 1, d)
        if hidden is None or hidden.shape[:2] != rows.shape:
            raise SpecdecError("the target recorded no hidden states for the tree's rows; the EAGLE drafter needs "
                               "model.keep_hidden (set when the drafter is built) and one target pass per verification.")
        B = rows.shape[0]
        idx = torch.cat([torch.zeros(B, 1, dtype=torch.long, device=rows.device), path], dim=1)  # (B, D + 1)
        hidden = self._own(hidden)
        self._hidden = hidden.gather(1, idx.view(B, -1, 1).expand(B, idx.shape[1], hidden.shape[-1]))
        self._rows = rows.gather(1, idx)

    def drafts_replaced(self, state, drafts: torch.Tensor, mask: torch.Tensor) -> None:
        """The verified rows are ``drafts`` (a prompt-lookup wrapper replaced some): queue those tokens."""
        self._rows = torch.cat([state.pending.view(-1, 1), drafts], dim=1)

    def on_verify(self, state, scores: ScoreRequest | None) -> None:
        """Keep the verify rows' true features for the next draft's first forward (no launch), and raise if the
        last greedy draft's logits were not finite and the engine did not take the flags (:meth:`take_flags`)."""
        self.raise_untaken_flags()
        hidden = self.target.last_hidden  # (B, γ+1, d): f_L .. f_{L+γ} of the verify rows
        if hidden is not None:
            hidden = self._own(hidden)
        if hidden is None or hidden.shape[:2] != self._rows.shape:
            raise SpecdecError("the target recorded no hidden states for the verify rows; the EAGLE drafter needs "
                               "model.keep_hidden (set when the drafter is built) and one target pass per verification.")
        self._hidden = hidden
