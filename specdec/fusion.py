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

Supported: Llama, Qwen2, Qwen3 and Mistral decoder layers. Fusing is one-way: the separate
projections are dropped (their memory is freed), and neither :meth:`SpecdecModel.detach` nor anything
else restores them; reload the model to get the original modules back.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specdec.errors import SpecdecError

FAMILIES = {
    "llama": ("LlamaAttention", "LlamaMLP"),
    "qwen2": ("Qwen2Attention", "Qwen2MLP"),
    "qwen3": ("Qwen3Attention", "Qwen3MLP"),
    "mistral": ("MistralAttention", "MistralMLP"),
}
_SUPPORTED = "supported: Llama, Qwen2, Qwen3 and Mistral decoder layers"


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

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, **kwargs):
        # Hugging Face's own KV cache (generate() on a fused model): specdec forwards pass none
        # (use_cache=False; the routed attention function owns specdec's cache)
        hf_cache = kwargs.pop("cache", None)  # transformers >= 5.2x
        past = kwargs.pop("past_key_values", None)  # earlier 5.x
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        q, k, v = self.qkv_proj(hidden_states).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = position_embeddings
        q, k = self._rope(q, k, cos, sin)
        if hf_cache is not None:  # the call transformers >= 5.2x modules make
            k, v = hf_cache.update(k, v, self.layer_idx, kwargs=kwargs)
        elif past is not None:  # the call earlier 5.x modules make
            k, v = past.update(k, v, self.layer_idx,
                               {"sin": sin, "cos": cos, "cache_position": kwargs.get("cache_position")})
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window
        attend = _attention_function(self.config._attn_implementation, self._eager)
        out, weights = attend(self, q, k, v, attention_mask,
                              dropout=0.0 if not self.training else self.attention_dropout,
                              scaling=self.scaling, **kwargs)
        out = out.reshape(*input_shape, -1).contiguous()
        return self.o_proj(out), weights


class FusedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up in one projection (``gate_up_proj``)."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.intermediate_size = mlp.gate_proj.out_features
        self.gate_up_proj = _cat_linear([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _decoder_layers(hf_model) -> list:
    base = getattr(hf_model, "model", None)
    layers = getattr(base, "layers", None)
    return list(layers) if layers is not None else []


def fuse_projections(hf_model) -> int:
    """Fuse q/k/v and gate/up of every decoder layer of ``hf_model`` in place (idempotent).

    Returns the number of layers fused now (0 when already fused). Raises :class:`SpecdecError`
    (before changing anything) for an architecture other than Llama, Qwen2, Qwen3 or Mistral.
    """
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
    return fused
