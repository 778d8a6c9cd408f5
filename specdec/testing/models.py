"""Tiny random Hugging Face models for the conformance matrices (no download, a second to build)."""

from __future__ import annotations

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def tiny_config(family: str, **over):
    """A 2-layer random config of a model family (GQA: 4 query heads, 2 KV heads)."""
    import transformers as tf

    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    common.update(over)
    if family == "llama":
        return tf.LlamaConfig(**common)
    if family == "qwen2":
        return tf.Qwen2Config(**common, use_sliding_window=False)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=16, use_sliding_window=False)
    if family == "mistral":
        return tf.MistralConfig(**common, sliding_window=None)
    raise ValueError(f"unknown family {family!r}; use one of {', '.join(FAMILIES)}.")


def tiny_model(family: str = "qwen2", seed: int = 3, backend=None, **over):
    """A tiny random :class:`~specdec.models.SpecdecModel` (no tokenizer) of ``family``.

    The LM head is sharpened so that greedy drafts are sometimes accepted (a flat random model would
    accept nothing and test little).
    """
    from transformers import AutoModelForCausalLM

    from specdec.models import SpecdecModel

    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(tiny_config(family, **over), dtype=torch.float32).eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(4.0)
    return SpecdecModel(hf, backend=backend)
