"""Fused projections: one QKV GEMM and one gate/up GEMM per decoder layer (4 GEMMs instead of 7).

At decode sizes (a few rows per sequence) every projection of a small model is a ~3–4 µs GEMM launch
that reads a few hundred KB of weights: the launches, not the bytes, set the time (docs page *Optimized backends*).
:func:`fuse_projections` concatenates, per layer, the q/k/v weights (and biases: Qwen2 has them) into
one ``Linear`` and gate/up into one, replacing ``layer.self_attn`` by :class:`FusedAttention` and
``layer.mlp`` by :class:`FusedMLP`. The fused attention computes exactly what the family's attention
module computes — projection, Qwen3's per-head q/k norms, RoPE with the ``position_embeddings`` the
decoder layer passes, the attention function of ``config._attn_implementation`` (specdec's routed
function under :class:`~specdec.models.SpecdecModel`, SDPA/eager otherwise), ``o_proj`` — so the specdec
route, ``torch.compile`` and CUDA graphs work unchanged; results equal the unfused model's up to
floating-point rounding (a GEMM over concatenated weights may sum in another order).

Fused kernels (``kernels=``): besides the projections, each decoder layer's element-wise
work runs in Triton kernels (:mod:`specdec.cuda.triton_fused`): RMSNorm with the residual add before
it (one launch instead of ~8), SiLU·mul (one instead of 2), and — inside a specdec forward — Qwen3's
q/k norms, RoPE of q and k and the KV-cache write in one launch (instead of ~12). ``"auto"`` uses them
on CUDA tensors when triton is installed and the plain torch code elsewhere (the CPU path is
unchanged); ``"triton"`` forces them (the CPU runs them under ``TRITON_INTERPRET=1``, for tests);
``"torch"`` never uses them. Under ``torch.compile`` the torch code runs (inductor fuses it itself):
:meth:`SpecdecModel.enable_compile` switches the model to ``"torch"``. Results equal the unfused
model's up to the order of the RMS sums (every intermediate torch rounds to the model dtype is
rounded alike).

Supported: Llama, Qwen2, Qwen3 and Mistral decoder layers. Fusing is one-way: the separate
projections are dropped (their memory is freed), and neither :meth:`SpecdecModel.detach` nor anything
else restores them; reload the model to get the original modules back.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specdec.errors import SpecdecError
from specdec.interfaces import FORWARD_CONTEXT

FAMILIES = {
    "llama": ("LlamaAttention", "LlamaMLP"),
    "qwen2": ("Qwen2Attention", "Qwen2MLP"),
    "qwen3": ("Qwen3Attention", "Qwen3MLP"),
    "mistral": ("MistralAttention", "MistralMLP"),
}
_SUPPORTED = "supported: Llama, Qwen2, Qwen3 and Mistral decoder layers"
KERNELS = ("auto", "triton", "torch")
#: The GEMM-split switch: every layer :func:`fuse_projections` fuses runs its o_proj and qkv projection as
#: this many partial GEMMs (:func:`set_gemm_splits`; only with the Triton kernels on, for projections
#: without a bias whose input dim it divides). 2 measured fastest on the H200 at the Llama-3.1-8B shape,
#: B 16 x 32k (benchmarks/results/gpu_8b_steps_2026-12-01c.md): sparse draft step 5.99 vs 6.27 ms, dense
#: 20.28 vs 20.43 ms, verify 22.33 vs 22.27 ms (its GEMMs unchanged). At the embedded shape (SmolLM2-135M,
#: B 64 x 8k, interleaved end to end, gpu_gemm_splits_2026-12-01d.md) even with one GEMM: dense 1.009x (paired
#: median of 3 rounds, 0.88-1.04x), Vegas 1.095x; no measured loss anywhere. 1: one GEMM each, as before.
GEMM_SPLITS = 2
#: The down GEMM's split (:func:`set_gemm_splits` ``down=``): with ``n > 1`` every fused decoder layer's down
#: projection runs as ``n`` partial GEMMs whose sum (and the residual add) the NEXT layer's input norm kernel (or the
#: final norm) adds, so cuBLAS' split-K reduce after it goes. 1: one GEMM with the residual add as its epilogue
#: (``addmm_``). Measured on the H200 at the Llama-3.1-8B shape, B 16 x 32k (benchmarks/results/gpu_8b_steps_2026-
#: 12-01d.md): 2 splits take the sparse draft step from 6.41 to 6.15 ms (-4 %, 1.386x -> 1.330x roofline) and dense
#: from 20.47 to 20.37 ms (4 splits: 6.28 / 20.70 ms); at the embedded shape dense 1.083x, Vegas 1.096x (not resolved
#: from noise, no loss). On by default since the hidden state between two layers is only left incomplete where
#: nothing can read it: the split runs inside one full forward of the fused base model only
#: (:func:`_handoff_allowed`), never for a view whose layer list holds another module (a layer-skip draft's
#: adapter), with ``output_hidden_states``, a forward (pre-)hook on a decoder layer, or a layer called alone.
DOWN_SPLITS = 2
_KERNELS_ATTR = "_specdec_kernels"
#: The fused-GEMM switch (:mod:`specdec.cuda.triton_gemm`), opt-in: with the Triton kernels on, inside a specdec
#: forward, a fused decoder layer runs its input norm + QKV GEMM + RoPE + KV write as ONE launch and its
#: post-attention norm + gate/up GEMM + SiLU·mul as one more (6 launches -> 2 per layer), for inputs of at most
#: :data:`FUSED_GEMM_MAX_ROWS` rows and models of hidden size at most :data:`FUSED_GEMM_MAX_HIDDEN`.
#: ``True``: on CUDA tensors; ``"always"``: also on the CPU, under Triton's interpreter (tests); ``False``
#: (default): never (the per-kernel layer). Layers it cannot take (Qwen3's q/k norms, a gate/up bias, hooks on the
#: attention module, a sliding-window layer, mixed dtypes) run the per-kernel layer.
#: Measured on an H200 (2026-12-02, SmolLM2-135M shape, random weights, CUDA graphs, the arms' replays
#: interleaved; ``benchmarks/results/gpu_fused_gemm_2026-12-02.md``): a step with 1 or 16 rows per layer runs
#: 3-7 % faster (B 1 x 8k dense 1.141 -> 1.084 ms, sparse draft 1.108 -> 1.050; B 16 sparse draft 1.396 -> 1.295),
#: but each fused kernel takes ~6 us where the three it replaces took ~7 us with their gaps, so at 64 rows the
#: pair is level and at 144 and 576 rows (verification) 1.5-3x slower than cuBLAS plus the small kernels; at the
#: Llama-3.1-8B shape 1.4x slower (the GEMMs are weight-bound there). End to end at B 1 and B 16 (magicdec, vegas,
#: dense over two documents) the arms differed by -18 % to +5 % with no consistent sign, and an interleaved B 1 re-run
#: read paired medians of 0.994-1.036, inside its rounds' spread: not on by default.
FUSED_GEMM: bool | str = False
#: the most rows (``batch x tokens``) a fused-GEMM layer takes (a B 1 verification of γ 8 has 9)
FUSED_GEMM_MAX_ROWS = 16
#: the largest hidden size the fused GEMMs take (SmolLM2-135M: 576)
FUSED_GEMM_MAX_HIDDEN = 1024


def _triton_gemm():
    """:mod:`specdec.cuda.triton_gemm` (the caller has checked that the Triton kernels run)."""
    from specdec.cuda import triton_gemm

    return triton_gemm


def _triton_fused():
    """:mod:`specdec.cuda.triton_fused`, or ``None`` when triton is not installed."""
    try:
        from specdec.cuda import triton_fused
    except ImportError:  # triton is an optional extra
        return None
    return triton_fused


def _use_kernels(mod: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``mod`` runs its Triton kernels for input ``x`` (its ``kernels`` setting and ``x``'s device)."""
    k = getattr(mod, _KERNELS_ATTR, "torch")
    return k == "triton" or (k == "auto" and x.is_cuda)


def _specdec_context():
    """The running specdec forward's context (cache, lengths, ...) or ``None`` outside one."""
    return FORWARD_CONTEXT.get()


# -- decoder layers and norms patched in place (a subclass per HF class, made once) -----------------
_SUBCLASSES: dict = {}


def _patched(obj: nn.Module, forward) -> None:
    """Give ``obj`` a subclass of its class whose ``forward`` is ``forward(base_forward, self, ...)``.

    Keeps the module object, its parameters, attributes and ``isinstance`` checks (the model's own
    loops read e.g. ``decoder_layer.attention_type``); the subclass is marked so fusing twice is a no-op.
    """
    cls = type(obj)
    if getattr(cls, "_specdec_fused", False):
        return
    key = (cls, forward)
    if key not in _SUBCLASSES:
        base = cls.forward

        def fwd(self, *args, **kwargs):
            return forward(base, self, *args, **kwargs)

        _SUBCLASSES[key] = type(f"Fused{cls.__name__}", (cls,), {"forward": fwd, "_specdec_fused": True,
                                                                  "__module__": cls.__module__})
    obj.__class__ = _SUBCLASSES[key]


_HANDOFF_ATTR = "_specdec_handoff"


#: the handoff slot whose split down GEMM may run now: set by the fused base model's forward (:func:`_base_forward`)
#: for the duration of one full layer loop that nothing else can look into; ``None`` everywhere else
_HANDOFF_ON: ContextVar = ContextVar("specdec_down_handoff", default=None)


def _user_hooks(mod: nn.Module) -> bool:
    """Whether ``mod`` has forward (pre-)hooks other than transformers' output-capturing ones (installed on every
    decoder layer at the first forward, inactive unless ``output_hidden_states`` asks: that flag is checked)."""
    hooks = [*mod._forward_hooks.values(), *mod._forward_pre_hooks.values()]
    return any(getattr(h, "__name__", "") != "output_capturing_hook" for h in hooks)


def _handoff_allowed(base_model: nn.Module, kwargs: dict):
    """The handoff slot the split down GEMM may use in this forward of ``base_model`` (``model.model``), or ``None``.

    The partials of layer ``i`` are added by layer ``i + 1``'s input norm (the last layer's by the final norm), so
    the hidden state between two layers is the residual alone. That is only safe when nothing but the next fused
    layer reads it: every module of the layer loop a fused decoder layer sharing the final norm's slot (a
    layer-skip view with its adapter in the list: no), no ``output_hidden_states``, no forward hooks (global, or on
    a decoder layer) that could see a layer's input or output. Anything else runs every down GEMM whole.
    """
    norm = getattr(base_model, "norm", None)
    slot = None if norm is None else norm.__dict__.get(_HANDOFF_ATTR)
    if slot is None:
        return None
    ohs = kwargs.get("output_hidden_states")
    if ohs is None:
        ohs = getattr(base_model.config, "output_hidden_states", False)
    if ohs or any(getattr(h, "__name__", "") != "output_capturing_hook" for h in norm._forward_pre_hooks.values()):
        return None  # (a forward hook on the final norm sees its complete output: EAGLE's ``keep_hidden`` record)
    from torch.nn.modules import module as _m

    if _m._global_forward_hooks or _m._global_forward_pre_hooks:
        return None
    n = getattr(base_model.config, "num_hidden_layers", None)
    for layer in list(getattr(base_model, "layers", []))[:n]:
        if (not getattr(type(layer), "_specdec_fused", False) or layer.__dict__.get(_HANDOFF_ATTR) is not slot
                or _user_hooks(layer)):
            return None
    return slot


def _register_outputs(base_model: nn.Module) -> None:
    """Give the patched base model's class what its Hugging Face class records with ``output_hidden_states``:
    transformers 5.x keys that registry on the class name (``str(cls)``), so a subclass would record nothing.
    The registry is a dict keyed on that string: a plain ``dict`` up to 5.1x (indexed with the string), a
    ``dict`` subclass that takes the model since 5.2x; the string is written with ``dict``'s own methods, which
    both read."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # older transformers read the class attribute, which the subclass inherits
        return
    can = getattr(base_model, "_can_record_outputs", None)
    key = str(type(base_model))
    if can is not None and isinstance(_CAN_RECORD_REGISTRY, dict) and not dict.get(_CAN_RECORD_REGISTRY, key):
        dict.__setitem__(_CAN_RECORD_REGISTRY, key, can)


def _base_forward(base, self, *args, **kwargs):
    """The fused base model's forward: the layer loop of Hugging Face, with the split down GEMM allowed inside it
    when nothing can read the incomplete hidden states between its layers (:func:`_handoff_allowed`)."""
    if getattr(self, _KERNELS_ATTR, "torch") == "torch" or torch.compiler.is_compiling():
        return base(self, *args, **kwargs)
    token = _HANDOFF_ON.set(_handoff_allowed(self, kwargs))
    try:
        return base(self, *args, **kwargs)
    finally:
        _HANDOFF_ON.reset(token)


def _take_handoff(mod: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor | None:
    """The down GEMM's partial sums the previous fused layer left for ``hidden_states`` (its residual), or ``None``.

    A layer with a split down GEMM returns its residual stream WITHOUT the MLP's output and leaves the
    partials in the model's shared handoff slot (:func:`set_gemm_splits` ``down=``); the next decoder
    layer's input norm or the final norm adds them. A pending entry for another tensor is a bug (a
    consumer in between read an incomplete hidden state): raised, never dropped silently.
    """
    slot = getattr(mod, _HANDOFF_ATTR, None)
    if slot is None or slot[0] is None:
        return None
    residual, parts = slot[0]
    slot[0] = None
    if residual is not hidden_states:
        raise RuntimeError("split down GEMM: the partial sums left by the previous layer belong to another tensor; "
                           "something between two decoder layers replaced the hidden state (set_gemm_splits(hf, "
                           "down=1) turns the split off).")
    return parts


def _add_handoff(hidden_states: torch.Tensor, parts: torch.Tensor | None) -> torch.Tensor:
    """``hidden_states`` plus the pending partial sums (the torch path's add; each rounded as the GEMM's output)."""
    return hidden_states if parts is None else hidden_states + parts.sum(0).to(hidden_states.dtype)


def _norm_forward(base, self, hidden_states):
    parts = _take_handoff(self, hidden_states)
    if _use_kernels(self, hidden_states):
        tf = _triton_fused()
        if parts is not None:
            return tf.rms_norm(parts, self.weight, self.variance_epsilon, residual=hidden_states,
                               splits=parts.shape[0])[0]
        return tf.rms_norm(hidden_states, self.weight, self.variance_epsilon)
    return base(self, _add_handoff(hidden_states, parts))


def _check_fused_gemm() -> None:
    """Refuse a :data:`FUSED_GEMM` value other than ``True``, ``False`` or ``"always"`` (one line)."""
    if FUSED_GEMM not in (True, False, "always"):
        raise SpecdecError(f"specdec.fusion.FUSED_GEMM is {FUSED_GEMM!r}; set True (CUDA), 'always' (also the "
                           "Triton interpreter) or False.")


def _gemm_path(layer: nn.Module, hidden_states: torch.Tensor, kwargs: dict):
    """``(ctx, slot)`` when ``layer`` runs with the fused GEMMs (:data:`FUSED_GEMM`), else ``None``."""
    _check_fused_gemm()
    if FUSED_GEMM is False or (FUSED_GEMM is True and not hidden_states.is_cuda):
        return None
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    ln1, ln2 = getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)
    if (not isinstance(attn, FusedAttention) or not isinstance(mlp, FusedMLP) or attn.q_norm is not None
            or not (getattr(type(ln1), "_specdec_fused", False) and getattr(type(ln2), "_specdec_fused", False))
            or not mlp.gemm_ready()):  # (norms fuse_projections patched: Llama-family RMSNorms)
        return None
    K = hidden_states.shape[-1]
    if hidden_states.dim() != 3 or hidden_states.shape[0] * hidden_states.shape[1] > FUSED_GEMM_MAX_ROWS \
            or K > FUSED_GEMM_MAX_HIDDEN:
        return None
    qkv = attn.qkv_proj
    if type(qkv) is not nn.Linear or not qkv.weight.is_contiguous() or _user_hooks(attn):
        return None
    dt = hidden_states.dtype
    tensors = (ln1.weight, ln2.weight, qkv.weight, mlp.gate_up_proj.weight) + ((qkv.bias,) if qkv.bias is not None else ())
    if any(t.dtype != dt for t in tensors):
        return None
    return attn.fused_rope_slot(hidden_states, kwargs)


def _gemm_layer(self, hidden_states, parts, path, kwargs):
    """The decoder layer with the fused GEMMs: 4 launches plus the attention's (:data:`FUSED_GEMM`)."""
    tg = _triton_gemm()
    ctx, slot = path
    attn, mlp = self.self_attn, self.mlp
    ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
    B, T = hidden_states.shape[:2]
    if not ctx.static:
        ctx.cache.check_capacity(ctx.lengths, T)
    cos, sin = kwargs["position_embeddings"]
    qkv = attn.qkv_proj
    args = (ln1.weight, ln1.variance_epsilon, qkv.weight, qkv.bias, cos.expand(B, -1, -1), sin.expand(B, -1, -1),
            slot[0], slot[1], ctx.lengths, attn.q_size // attn.head_dim)
    if parts is not None:  # the previous layer's down GEMM partials + its residual, then the norm
        q, hidden_states = tg.norm_qkv_rope_write(parts, *args, residual=hidden_states, splits=parts.shape[0])
    else:
        q, _ = tg.norm_qkv_rope_write(hidden_states, *args)
    rest = {k: v for k, v in kwargs.items() if k not in ("position_embeddings", "attention_mask", "cache",
                                                           "past_key_values")}
    splits = attn.o_splits if attn.o_splittable() else 1
    o, _ = attn.attend_written(q, (B, T), kwargs.get("attention_mask"), splits > 1, **rest)
    act, residual = tg.norm_gate_up_silu(o, ln2.weight, ln2.variance_epsilon, mlp.gate_up_proj.weight,
                                         residual=hidden_states, splits=splits)
    hand = getattr(self, _HANDOFF_ATTR, None)
    if hand is not None and _HANDOFF_ON.get() is hand and mlp.down_splittable(act, residual):
        hand[0] = (residual, mlp.down_partials(act))  # the next layer's input kernel (or the final norm) adds them
        return residual
    return mlp.down_add(act, residual)


def _layer_forward(base, self, hidden_states, *args, **kwargs):
    """The Llama-family decoder layer in 10 launches plus cuBLAS's split-K reduces (at most 2).

    ``norm → qkv GEMM → RoPE + KV write → attention (+ combine) → o_proj GEMM → residual add + norm →
    gate/up GEMM → SiLU·mul → down GEMM + residual add``: the last residual add is the down GEMM's own
    epilogue (``residual.addmm_(act, W_down.T)``, β = 1, on the residual tensor the norm kernel just
    wrote), and with ``self_attn.o_splits > 1`` the o_proj GEMM is split by hand (:func:`split_linear`)
    and its partial sums are added by the norm kernel, so cuBLAS adds no reduce kernel of its own.
    With ``mlp.down_splits > 1``, inside a base-model forward that allows it (:func:`_handoff_allowed`), the
    down GEMM is split too and its partials plus the residual are added by the next layer's input norm (or
    the final norm): this layer returns the residual alone and leaves the partials in the model's handoff
    slot (:func:`_take_handoff`). With the fused GEMMs (:data:`FUSED_GEMM`, small models at decode sizes) the
    layer is ``norm + qkv GEMM + RoPE + KV write → attention (+ combine) → o_proj GEMM → residual add + norm +
    gate/up GEMM + SiLU·mul → down GEMM``: 4 launches plus the attention's (:func:`_gemm_layer`).
    """
    parts = _take_handoff(self, hidden_states)
    if args or not _use_kernels(self, hidden_states):
        return base(self, _add_handoff(hidden_states, parts), *args, **kwargs)
    path = _gemm_path(self, hidden_states, kwargs)
    if path is not None:
        return _gemm_layer(self, hidden_states, parts, path, kwargs)
    tf = _triton_fused()
    ln1, ln2 = self.input_layernorm, self.post_attention_layernorm
    if parts is not None:  # the previous layer's down GEMM partials + its residual, then the norm
        h, hidden_states = tf.rms_norm(parts, ln1.weight, ln1.variance_epsilon, residual=hidden_states,
                                       splits=parts.shape[0])
    else:
        h = tf.rms_norm(hidden_states, ln1.weight, ln1.variance_epsilon)
    attn = self.self_attn
    splits = attn.o_splits if isinstance(attn, FusedAttention) and attn.o_splittable() else 1
    if splits > 1:
        h, _ = attn(hidden_states=h, o_partials=True, **kwargs)  # (splits, B, T, hidden)
    else:
        h, _ = attn(hidden_states=h, **kwargs)
    # residual + h (h: the sum of the partials), then the norm
    h, residual = tf.rms_norm(h, ln2.weight, ln2.variance_epsilon, residual=hidden_states, splits=splits)
    mlp = self.mlp
    slot = getattr(self, _HANDOFF_ATTR, None)
    if (isinstance(mlp, FusedMLP) and slot is not None and _HANDOFF_ON.get() is slot
            and mlp.down_splittable(h, residual)):
        slot[0] = (residual, mlp.forward_partials(h))  # the next layer's input norm (or the final norm) adds them
        return residual
    if isinstance(mlp, FusedMLP):
        return mlp.forward_add(h, residual)  # residual (ours: the norm kernel's output) += down(act(h))
    return residual + mlp(h)


def _rotary_forward(base, self, x, position_ids, **kwargs):
    """The rotary embedding's ``(cos, sin)`` in one Triton launch (:func:`~specdec.cuda.triton_fused.rotary_cos_sin`)."""
    if (kwargs or not _use_kernels(self, x) or not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2
            or position_ids.is_floating_point()):
        return base(self, x, position_ids, **kwargs)
    inv = self.inv_freq if self.inv_freq.dtype == torch.float32 else self.inv_freq.float()
    return _triton_fused().rotary_cos_sin(position_ids, inv.to(x.device), self.attention_scaling, x.dtype)


#: rotary embeddings whose ``forward`` is ``cat([f, f]).cos() * attention_scaling`` of ``position · inv_freq``
#: (rope types whose frequencies change with the position, "dynamic" and "longrope", keep Hugging Face's code)
_ROTARY = ("LlamaRotaryEmbedding", "Qwen2RotaryEmbedding", "Qwen3RotaryEmbedding", "MistralRotaryEmbedding")


def _is_plain_rotary(mod) -> bool:
    return (type(mod).__name__ in _ROTARY and getattr(mod, "rope_type", None) not in ("dynamic", "longrope")
            and isinstance(getattr(mod, "inv_freq", None), torch.Tensor) and hasattr(mod, "attention_scaling"))


def _is_llama_norm(mod) -> bool:
    """An RMSNorm computing ``weight * (x / rms(x))`` (the Llama family's; not Gemma's ``1 + weight``)."""
    return (type(mod).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
            and getattr(mod, "weight", None) is not None and mod.weight.dim() == 1 and hasattr(mod, "variance_epsilon"))


def get_kernels(hf_model) -> str | None:
    """The fused-kernel setting of ``hf_model``'s fused modules (``None`` when it is not fused)."""
    for mod in hf_model.modules():
        if isinstance(mod, FusedMLP):
            return getattr(mod, _KERNELS_ATTR, "torch")
    return None


@contextmanager
def kernels_off(hf_model):
    """Run ``hf_model``'s fused modules with their torch code inside the block (e.g. for HF ``generate``,
    whose static cache compiles the model itself)."""
    old = get_kernels(hf_model)
    if old is not None:
        set_kernels(hf_model, "torch")
    try:
        yield
    finally:
        if old is not None:
            set_kernels(hf_model, old)


def set_kernels(hf_model, kernels: str) -> None:
    """Switch the fused modules of ``hf_model`` between ``"auto"``, ``"triton"`` and ``"torch"`` (see module doc)."""
    if kernels not in KERNELS:
        raise SpecdecError(f"unknown fused-kernel setting {kernels!r}; choose one of {', '.join(KERNELS)}.")
    if kernels == "triton" and _triton_fused() is None:
        raise SpecdecError("fused kernels 'triton' need the 'triton' package; pip install 'specdec[triton]' "
                           "or use kernels='auto'.")
    if kernels == "auto" and _triton_fused() is None:
        kernels = "torch"
    for mod in hf_model.modules():
        if getattr(type(mod), "_specdec_fused", False) or isinstance(mod, (FusedAttention, FusedMLP)):
            setattr(mod, _KERNELS_ATTR, kernels)


def set_gemm_splits(hf_model, o_proj: int | None = None, qkv: int | None = None, down: int | None = None) -> int:
    """Run every fused layer's o_proj (qkv projection) as ``o_proj`` (``qkv``) partial GEMMs.

    At decode sizes cuBLAS splits the o_proj GEMM over its input dim itself and launches a reduce
    kernel after it (``splitKreduce_kernel``, ~1.8 µs + a launch gap per layer at the Llama-3.1-8B
    shape, B = 16), and runs the qkv GEMM on fewer CTAs than the GPU has SMs (3.1 TB/s). With a split
    here the GEMM is ONE batched GEMM over slices of the input dim (:func:`~specdec.cuda.triton_fused.split_linear`)
    and the kernel that reads its output next adds the partials: the post-attention RMSNorm (o_proj)
    and the RoPE + KV-write kernel (qkv, inside a specdec forward). Only with the fused Triton kernels
    on, and for projections without a bias; ``1`` keeps the single GEMM; ``None`` (the default) is
    :data:`GEMM_SPLITS` (2), what :func:`fuse_projections` sets. ``down`` (``None``: :data:`DOWN_SPLITS`, 2)
    splits the MLP's down GEMM; its partials and the residual are added by the NEXT decoder layer's
    input norm (the last layer's by the final norm), so the hidden state between two layers is
    incomplete: it runs only inside a full forward of the fused base model that nothing can look into
    (:func:`_handoff_allowed`); elsewhere the down GEMM runs whole. Whether a split is faster depends on
    cuBLAS' choice for the batched shape: ``benchmarks/gpu/issue14.py`` measures it.
    Returns the number of layers set. Raises :class:`SpecdecError` for a model that is not fused or a
    split that does not divide the projection's input dim.
    """
    o_proj = GEMM_SPLITS if o_proj is None else o_proj
    qkv = GEMM_SPLITS if qkv is None else qkv
    down = DOWN_SPLITS if down is None else down
    for name, n in (("o_proj", o_proj), ("qkv", qkv), ("down", down)):
        if not isinstance(n, int) or n < 1:
            raise SpecdecError(f"{name} splits must be a positive integer, got {n!r}.")
    mods = [m for m in hf_model.modules() if isinstance(m, FusedAttention)]
    if not mods:
        raise SpecdecError("set_gemm_splits needs a fused model; call fuse_projections first.")
    mlps = [m for m in hf_model.modules() if isinstance(m, FusedMLP)]
    checks = [(name, n, lin) for m in mods for name, n, lin in (("o_proj", o_proj, m.o_proj), ("qkv", qkv, m.qkv_proj))]
    checks += [("down", down, m.down_proj) for m in mlps]
    for name, n, lin in checks:
        if lin.in_features % n:
            raise SpecdecError(f"{name} splits {n} do not divide its input dim {lin.in_features}; "
                               "pick a divisor (2 or 4 for most models).")
    for m in mods:
        m.o_splits, m.qkv_splits = o_proj, qkv
    for m in mlps:
        m.down_splits = down
    return len(mods)


def _cat_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One ``Linear`` whose output is the concatenation of ``parts``' outputs (same input)."""
    w = torch.cat([p.weight.detach() for p in parts], dim=0)
    has_bias = [p.bias is not None for p in parts]
    if any(has_bias) and not all(has_bias):  # a missing bias is a zero bias
        b = torch.cat([p.bias.detach() if p.bias is not None else w.new_zeros(p.out_features) for p in parts])
    elif all(has_bias):
        b = torch.cat([p.bias.detach() for p in parts])
    else:
        b = None
    out = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device="meta")
    grad = parts[0].weight.requires_grad
    out.weight = nn.Parameter(w, requires_grad=grad)
    if b is not None:
        out.bias = nn.Parameter(b, requires_grad=grad)
    return out


def _attention_function(impl: str | None, default):
    """The attention function transformers' modules call for ``impl`` (both 5.17 and 5.24 APIs)."""
    get = getattr(ALL_ATTENTION_FUNCTIONS, "get_interface", None)
    if get is not None:
        return get(impl, default)
    if impl is None or impl == "eager":
        return default
    return ALL_ATTENTION_FUNCTIONS[impl]


class FusedAttention(nn.Module):
    """A Llama-family attention module with q/k/v in one projection (``qkv_proj``).

    Same ``forward`` convention as the module it replaces: keyword ``hidden_states``,
    ``position_embeddings`` ``(cos, sin)``, ``attention_mask``, any further keywords passed on to the
    attention function; returns ``(attn_output, attn_weights)``.
    """

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        mod = sys.modules[type(attn).__module__]
        self.config = attn.config
        self.layer_idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.num_key_value_groups = attn.num_key_value_groups
        self.scaling = attn.scaling
        self.attention_dropout = attn.attention_dropout
        self.is_causal = attn.is_causal
        if hasattr(attn, "sliding_window"):  # Qwen2/Qwen3: per layer type
            self.sliding_window = attn.sliding_window
        elif self.config.model_type == "mistral":
            self.sliding_window = getattr(self.config, "sliding_window", None)
        else:
            self.sliding_window = None
        self.q_size = attn.q_proj.out_features
        self.kv_size = attn.k_proj.out_features
        self.qkv_proj = _cat_linear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = attn.o_proj
        self.q_norm = getattr(attn, "q_norm", None)  # Qwen3: RMSNorm over each head before RoPE
        self.k_norm = getattr(attn, "k_norm", None)
        self._rope = mod.apply_rotary_pos_emb
        self._eager = mod.eager_attention_forward
        #: o_proj / qkv_proj as this many partial GEMMs summed by the kernel that reads them next (the
        #: post-attention norm / the RoPE + KV-write kernel); 1: one GEMM. See :func:`set_gemm_splits`.
        #: Only with the Triton kernels on, o_proj inside a fused decoder layer, qkv inside a specdec forward.
        #: Starts at :data:`GEMM_SPLITS` (the switch; a split that does not apply runs the single GEMM).
        self.o_splits = GEMM_SPLITS
        self.qkv_splits = GEMM_SPLITS

    @staticmethod
    def _splittable(lin: nn.Linear, splits: int) -> bool:
        # a plain Linear only: a tensor-parallel RowParallelLinear (specdec.parallel) sums over ranks in its forward
        return (splits > 1 and type(lin) is nn.Linear and lin.bias is None and lin.in_features % splits == 0
                and lin.weight.is_contiguous())

    def o_splittable(self) -> bool:
        """Whether ``o_proj`` can run as :attr:`o_splits` partial GEMMs (no bias, input dim divisible)."""
        return self._splittable(self.o_proj, self.o_splits)

    def _out(self, out: torch.Tensor, o_partials: bool) -> torch.Tensor:
        """``o_proj(out)``, or its :attr:`o_splits` partial sums ``(splits, ..., hidden)``."""
        if o_partials:
            return _triton_fused().split_linear(out, self.o_proj.weight, self.o_splits)
        return self.o_proj(out)

    def attend_written(self, q: torch.Tensor, input_shape, attention_mask, o_partials: bool, **kwargs):
        """Attention of the rotated queries ``q`` ``(B, H, T, D)`` over the cache the keys and values of this
        forward were already written to (a specdec forward), then ``o_proj``: ``(output, weights)``."""
        attend = _attention_function(self.config._attn_implementation, self._eager)
        out, weights = attend(self, q, None, None, attention_mask, dropout=0.0, scaling=self.scaling,
                              kv_written=True, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self._out(out, o_partials), weights

    def fused_rope_slot(self, hidden_states: torch.Tensor, kwargs: dict):
        """``(ctx, slot)`` when this forward writes the KV cache itself (RoPE + write in one kernel): the Triton
        kernels on, inside a specdec forward on its own cache layer (no sliding-window ring, no Hugging Face
        cache); else ``None``."""
        ctx = _specdec_context() if _use_kernels(self, hidden_states) else None
        if (ctx is None or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
                or self.config._attn_implementation != "specdec"):
            return None
        slot = ctx.cache.layer(self.layer_idx)  # (k, v, window, global index)
        return (ctx, slot) if slot[2] is None else None

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                o_partials: bool = False, **kwargs):
        # ``o_partials`` (the fused decoder layer, with :meth:`o_splittable`): return o_proj's partial sums
        # Hugging Face's own KV cache (generate() on a fused model): specdec forwards pass none
        # (use_cache=False; the routed attention function owns specdec's cache)
        hf_cache = kwargs.pop("cache", None)  # transformers >= 5.2x
        past = kwargs.pop("past_key_values", None)  # earlier 5.x
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        cos, sin = position_embeddings
        attend = _attention_function(self.config._attn_implementation, self._eager)
        found = self.fused_rope_slot(hidden_states, {"cache": hf_cache, "past_key_values": past})
        fused_rope = found is not None  # sliding-window rings: the route writes them
        ctx, slot = found if fused_rope else (None, None)
        splits = self.qkv_splits if fused_rope and self._splittable(self.qkv_proj, self.qkv_splits) else 1
        if splits > 1:  # partial sums of the QKV GEMM: the RoPE + write kernel adds them
            qkv = _triton_fused().split_linear(hidden_states, self.qkv_proj.weight, splits)
            split_stride = qkv.stride(0)
            qkv = qkv[0]
        else:
            qkv, split_stride = self.qkv_proj(hidden_states), 0
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
        if fused_rope:
            # one launch: (Qwen3's q/k norms,) RoPE of q and k, rotated keys and values into the cache
            if not ctx.static:
                ctx.cache.check_capacity(ctx.lengths, q.shape[1])
            B = q.shape[0]
            norms = [(n.weight, n.variance_epsilon) if n is not None else None for n in (self.q_norm, self.k_norm)]
            q = _triton_fused().rope_qkv_write(q, k, v, cos.expand(B, -1, -1), sin.expand(B, -1, -1),
                                               slot[0], slot[1], ctx.lengths, *norms, splits=splits,
                                               split_stride=split_stride)
            return self.attend_written(q, input_shape, attention_mask, o_partials, **kwargs)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self._rope(q, k, cos, sin)
        if hf_cache is not None:  # the call transformers >= 5.2x modules make
            k, v = hf_cache.update(k, v, self.layer_idx, kwargs=kwargs)
        elif past is not None:  # the call earlier 5.x modules make
            k, v = past.update(k, v, self.layer_idx,
                               {"sin": sin, "cos": cos, "cache_position": kwargs.get("cache_position")})
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window
        out, weights = attend(self, q, k, v, attention_mask,
                              dropout=0.0 if not self.training else self.attention_dropout,
                              scaling=self.scaling, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self._out(out, o_partials), weights


class FusedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up in one projection (``gate_up_proj``)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.intermediate_size = mlp.gate_proj.out_features
        self.gate_up_proj = _cat_linear([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn
        self.silu = type(mlp.act_fn).__name__ in ("SiLU", "SiLUActivation")  # the fused kernel's activation
        #: the down GEMM as this many partial GEMMs, added by the next layer's norm (:func:`set_gemm_splits`)
        self.down_splits = DOWN_SPLITS

    def down_splittable(self, x: torch.Tensor, residual: torch.Tensor) -> bool:
        """Whether the down GEMM runs as :attr:`down_splits` partials for input ``x`` (kernels on, no bias, ...)."""
        lin = self.down_proj
        return (self.down_splits > 1 and self.silu and _use_kernels(self, x) and type(lin) is nn.Linear
                and lin.bias is None
                and lin.in_features % self.down_splits == 0 and lin.weight.is_contiguous()
                and residual.shape[:-1] == x.shape[:-1])

    def forward_partials(self, x: torch.Tensor) -> torch.Tensor:
        """The down GEMM's :attr:`down_splits` partial sums ``(splits, ..., hidden)`` of ``forward(x)``."""
        return self.down_partials(_triton_fused().silu_mul(self.gate_up_proj(x)))

    def down_partials(self, act: torch.Tensor) -> torch.Tensor:
        """The down GEMM's :attr:`down_splits` partial sums of ``down(act)`` (``act = silu(gate) * up``)."""
        return _triton_fused().split_linear(act, self.down_proj.weight, self.down_splits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.silu and _use_kernels(self, x):
            return self.down_proj(_triton_fused().silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual + forward(x)`` with the add in the down GEMM (``residual.addmm_``, β = 1): one
        launch less. ``residual`` is overwritten: pass a tensor nothing else reads (the fused layer's own)."""
        if (not (self.silu and _use_kernels(self, x)) or type(self.down_proj) is not nn.Linear
                or self.down_proj.bias is not None
                or not residual.is_contiguous() or residual.shape[:-1] != x.shape[:-1]):
            return residual + self.forward(x)
        return self.down_add(_triton_fused().silu_mul(self.gate_up_proj(x)), residual)

    def down_add(self, act: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += down(act)`` in the down GEMM (``addmm_``, β = 1; :meth:`forward_add`'s conditions)."""
        r2 = residual.view(-1, residual.shape[-1])
        r2.addmm_(act.view(-1, act.shape[-1]), self.down_proj.weight.t())
        return residual

    def gemm_ready(self) -> bool:
        """Whether the gate/up GEMM can run fused with the norm and SiLU·mul (:data:`FUSED_GEMM`): SiLU, plain
        ``Linear`` projections without a bias, contiguous weights."""
        gu, down = self.gate_up_proj, self.down_proj
        return (self.silu and type(gu) is nn.Linear and gu.bias is None and gu.weight.is_contiguous()
                and type(down) is nn.Linear and down.bias is None)


def _decoder_layers(hf_model) -> list:
    base = getattr(hf_model, "model", None)
    layers = getattr(base, "layers", None)
    return list(layers) if layers is not None else []


def fuse_projections(hf_model, kernels: str = "auto") -> int:
    """Fuse q/k/v and gate/up of every decoder layer of ``hf_model`` in place (idempotent).

    ``kernels`` (``"auto" | "triton" | "torch"``) says where the fused Triton kernels run (module
    doc); calling again with another setting switches it. Returns the number of layers fused now
    (0 when already fused). Raises :class:`SpecdecError` (before changing anything) for an
    architecture other than Llama, Qwen2, Qwen3 or Mistral, an unknown ``kernels`` or a bad :data:`FUSED_GEMM`.
    """
    if kernels not in KERNELS:
        raise SpecdecError(f"unknown fused-kernel setting {kernels!r}; choose one of {', '.join(KERNELS)}.")
    _check_fused_gemm()
    kind = getattr(hf_model.config, "model_type", type(hf_model).__name__)
    if kind not in FAMILIES:
        raise SpecdecError(f"fuse_projections cannot fuse model type {kind!r}; {_SUPPORTED}: run this model unfused.")
    attn_cls, mlp_cls = FAMILIES[kind]
    layers = _decoder_layers(hf_model)
    if not layers:
        raise SpecdecError(f"fuse_projections found no decoder layers in model type {kind!r} (model.layers); "
                           f"{_SUPPORTED}: run this model unfused.")
    todo = []
    for i, layer in enumerate(layers):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        a_ok = isinstance(attn, FusedAttention) or type(attn).__name__ == attn_cls
        m_ok = isinstance(mlp, FusedMLP) or type(mlp).__name__ == mlp_cls
        if not (a_ok and m_ok):
            found = type(attn).__name__ if not a_ok else type(mlp).__name__
            raise SpecdecError(f"fuse_projections cannot fuse layer {i} of model type {kind!r} ({found}); "
                               f"{_SUPPORTED}: run this model unfused.")
        todo.append(layer)
    fused = 0
    with torch.no_grad():
        for layer in todo:
            if not isinstance(layer.self_attn, FusedAttention):
                layer.self_attn = FusedAttention(layer.self_attn)
                fused += 1
            if not isinstance(layer.mlp, FusedMLP):
                layer.mlp = FusedMLP(layer.mlp)
            _patched(layer, _layer_forward)
            for mod in layer.modules():
                if _is_llama_norm(mod):
                    _patched(mod, _norm_forward)
        final = getattr(hf_model.model, "norm", None)
        if _is_llama_norm(final):
            _patched(final, _norm_forward)
            # one handoff slot per model for the split down GEMM's partials (the layers and the final norm
            # share it); without a patched final norm the last layer's partials would have no reader
            slot = getattr(final, _HANDOFF_ATTR, None) or [None]
            for mod in [*todo, final]:
                mod.__dict__[_HANDOFF_ATTR] = slot
            # the split down GEMM runs only inside this model's own layer loop (_handoff_allowed)
            _patched(hf_model.model, _base_forward)
            _register_outputs(hf_model.model)
        rotary = getattr(hf_model.model, "rotary_emb", None)
        if _is_plain_rotary(rotary):
            _patched(rotary, _rotary_forward)
    set_kernels(hf_model, kernels)
    return fused
