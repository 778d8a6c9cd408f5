"""Random-weight models of real shapes, built directly on the device (``specdec bench --shape``).

The weights of Llama-3.1-8B or Qwen3-8B are not available here, but a step's cost depends only on the
shapes (GEMM sizes, KV bytes): a random model of the same configuration measures it exactly. Tokens
are meaningless, so acceptance comes from a recorded real run (:class:`specdec.adaptive.AcceptanceReplay`).
The model is built under ``with torch.device(device)`` in the target dtype (building 8B parameters on
the CPU and moving them takes minutes) and initialised with small normal weights (no HF init pass).
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.errors import SpecdecError

#: name -> (model family, config fields); published configurations
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama-3.1-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                    max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5)),
    "qwen3-8b": ("qwen3", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                               max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6)),
    "smollm2-135m": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                                   max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                                   tie_word_embeddings=True)),
    # CPU tests and the GPU script's --smoke mode
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=128, max_position_embeddings=4096)),
}


#: ``torch.compile`` is skipped (with a message) for shapes above this many parameters: at the
#: Llama-3.1-8B shape it did not finish within 4 minutes on an H200 (2026-12-01), and the limit is 2
#: minutes; the fused Triton kernels + CUDA graphs need no compilation (docs: Optimized backends)
COMPILE_MAX_PARAMS = 2e9


def shape_params(name: str) -> int:
    """Parameters of shape ``name``, counted on the meta device (nothing allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(shape_config(name)).parameters())


def compile_skip_reason(name: str) -> str | None:
    """Why ``torch.compile`` is skipped at shape ``name`` (one line), or ``None`` when it runs."""
    n = shape_params(name)
    if n <= COMPILE_MAX_PARAMS:
        return None
    return (f"torch.compile skipped at shape {name} ({n / 1e9:.1f}B parameters > {COMPILE_MAX_PARAMS / 1e9:g}B: "
            "at the Llama-3.1-8B shape it did not finish within 4 minutes on an H200); running the fused Triton "
            "kernels with CUDA graphs instead")


def shape_config(name: str):
    """The transformers config of shape ``name`` (unknown names list the known ones)."""
    import transformers as tf

    if name not in SHAPES:
        raise SpecdecError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}.")
    family, fields = SHAPES[name]
    cls = {"llama": tf.LlamaConfig, "qwen3": tf.Qwen3Config}[family]
    extra = dict(use_sliding_window=False) if family == "qwen3" else {}
    return cls(**fields, **extra, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def random_model(name: str, device: str = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0):
    """A random-weight Hugging Face causal LM of shape ``name``, built on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM

    cfg = shape_config(name)
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.no_grad():
            hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
            for n, p in hf.named_parameters():
                if "norm" in n:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)
    finally:
        torch.set_default_dtype(old)
    return hf.eval()
