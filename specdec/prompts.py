"""The Python API's input boundary: check what :meth:`SpeculativeEngine.generate` is given, and encode
plain text as text.

Every refusal is one :class:`~specdec.errors.SpecdecError` sentence naming the argument, what it got
and what it accepts (see ``docs/guarantees.md``, "Python API arguments").

Plain-text prompts are encoded **as text**: a special token's spelling inside a prompt (say
``<|im_start|>``) becomes ordinary text tokens, so a prompt file cannot inject chat roles or an
end-of-sequence. ``allow_special_tokens=True`` parses them as control tokens instead.
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from specdec.errors import SpecdecError

#: what ``prompts`` accepts, quoted in every refusal
PROMPTS_ACCEPTED = "a list of strings or of token-id lists (e.g. [\"text\"] or [[1, 2, 3]])"


def _kind(x: Any) -> str:
    return type(x).__name__


def _int_arg(value: Any, name: str, low: int, option: str | None = None) -> int:
    """``value`` as an int ``>= low``; bools, floats and strings are refused (never truncated)."""
    label = option or name
    if isinstance(value, bool) or isinstance(value, float):
        raise SpecdecError(f"{label} must be an integer >= {low} (got {value!r} of type {_kind(value)}).")
    try:
        n = operator.index(value)  # int, numpy/torch integer scalars
    except TypeError:
        raise SpecdecError(f"{label} must be an integer >= {low} (got {value!r:.40} of type {_kind(value)}).") from None
    if n < low:
        raise SpecdecError(f"{label} must be >= {low} (got {n}).")
    return n


def check_generate_args(max_new_tokens: Any, context_tokens: Any = None, allow_special_tokens: Any = False) -> tuple[int, int | None]:
    """Validate the scalar arguments of ``generate``; returns ``(max_new_tokens, context_tokens)`` as ints."""
    n = _int_arg(max_new_tokens, "max_new_tokens", 1)
    c = None if context_tokens is None else _int_arg(context_tokens, "context_tokens", 1)
    if not isinstance(allow_special_tokens, bool):
        raise SpecdecError(f"allow_special_tokens must be True or False (got {allow_special_tokens!r:.40}).")
    return n, c


def _is_ndarray(x: Any) -> bool:
    return type(x).__module__ == "numpy" and hasattr(x, "tolist") and hasattr(x, "ndim")


def _prompt_list(prompts: Any) -> list:
    """``prompts`` as a list of prompts, or a refusal naming the mistake."""
    if _is_ndarray(prompts):  # items are checked one by one below (floats refused)
        prompts = prompts.tolist()
    if isinstance(prompts, torch.Tensor):
        if prompts.dtype.is_floating_point or prompts.dtype.is_complex or prompts.dtype == torch.bool:
            raise SpecdecError(f"prompts is a {prompts.dtype} tensor; token ids must be integers, e.g. a long tensor.")
        if prompts.dim() != 2:
            raise SpecdecError(f"prompts is a {prompts.dim()}-d tensor; pass a 2-d (batch, tokens) tensor or "
                               f"{PROMPTS_ACCEPTED}.")
        return prompts.tolist()
    if isinstance(prompts, str):
        raise SpecdecError("prompts must be a list of strings or token-id lists, not one string; wrap it in [ ].")
    if isinstance(prompts, (bytes, bytearray)):
        raise SpecdecError(f"prompts is {_kind(prompts)}; decode it to text first (prompts=[data.decode()]) "
                           "or pass token ids as a list of int lists.")
    if not isinstance(prompts, Sequence):
        raise SpecdecError(f"prompts must be {PROMPTS_ACCEPTED} (got {_kind(prompts)}).")
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        raise SpecdecError("prompts is a flat list of token ids; wrap it in [ ] for one prompt, e.g. prompts=[[1, 2, 3]].")
    return prompts


def _prompt_ids(p: Any, i: int) -> list[int]:
    """Token ids of prompt ``i`` given as ids (a sequence or a 1-d integer tensor)."""
    if isinstance(p, torch.Tensor):
        if p.dtype.is_floating_point or p.dtype.is_complex or p.dtype == torch.bool or p.dim() != 1:
            raise SpecdecError(f"prompts[{i}] is a {p.dim()}-d {p.dtype} tensor; token ids must be a 1-d integer tensor.")
        return p.tolist()
    if _is_ndarray(p):
        p = p.tolist()
    if isinstance(p, (bytes, bytearray)):
        raise SpecdecError(f"prompts[{i}] is {_kind(p)}; decode it to text first (.decode()) or pass a list of token ids.")
    if not isinstance(p, Sequence):
        raise SpecdecError(f"prompts[{i}] is {_kind(p)}; each prompt must be a string or a list of token ids.")
    ids = []
    for j, t in enumerate(p):
        if isinstance(t, (bool, float)):
            what = "floats (never truncated)" if isinstance(t, float) else "booleans"
            raise SpecdecError(f"prompts[{i}][{j}] is {t!r} ({_kind(t)}); token ids must be integers, not {what}.")
        try:
            ids.append(operator.index(t))
        except TypeError:
            raise SpecdecError(f"prompts[{i}][{j}] is {_kind(t)}; token ids must be integers "
                               f"(each prompt is a string or a list of ints).") from None
    return ids


def encode_text(tokenizer, text: str, allow_special_tokens: bool = False) -> list[int]:
    """Token ids of ``text`` without added BOS/EOS. Special-token spellings in ``text`` are ordinary text
    unless ``allow_special_tokens`` (then ``<|im_start|>`` etc. become control tokens)."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=not allow_special_tokens).input_ids


def chat_ids(tokenizer, text: str, allow_special_tokens: bool = False, context_tokens: int | None = None) -> list[int]:
    """``text`` as one user message in the tokenizer's chat template, with a generation prompt.

    The template's own markers are control tokens; the message itself is encoded by :func:`encode_text`,
    so a role marker written in the message stays text. ``context_tokens``: at most this many tokens in all, by
    keeping the message's last tokens (the template stays whole; one line where it alone does not fit).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise SpecdecError("this model's tokenizer has no chat template; drop --chat (or use a chat model).")
    slot = "\x00specdec-message\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": slot}], tokenize=False,
                                             add_generation_prompt=True)
    if rendered.count(slot) != 1:
        raise SpecdecError("this model's chat template rewrites the message text, so it cannot be encoded safely; "
                           "drop --chat and write the template into the prompt yourself.")
    before, after = rendered.split(slot)
    head, msg, tail = (encode_text(tokenizer, before, True), encode_text(tokenizer, text, allow_special_tokens),
                       encode_text(tokenizer, after, True))
    if context_tokens is not None:
        room = context_tokens - len(head) - len(tail)
        if room < 1:
            raise SpecdecError(f"--context-tokens {context_tokens} leaves no room for the message: the chat template "
                               f"alone takes {len(head) + len(tail)} tokens; use --context-tokens > "
                               f"{len(head) + len(tail)} or drop --chat.")
        msg = msg[-room:]
    return head + msg + tail


def encode_prompts(prompts: Any, tokenizer, vocab_size: int, context_tokens: int | None = None,
                   allow_special_tokens: bool = False) -> list[list[int]]:
    """Check ``prompts`` and turn each into token ids (the last ``context_tokens`` of each, if given)."""
    out = []
    for i, p in enumerate(_prompt_list(prompts)):
        if isinstance(p, str):
            if not p.strip():
                raise SpecdecError("a prompt is empty or whitespace only; give it some text.")
            if tokenizer is None:
                raise SpecdecError("text prompts need a tokenizer; pass token ids or load the model with one.")
            ids = encode_text(tokenizer, p, allow_special_tokens)
        else:
            ids = _prompt_ids(p, i)
        if not ids:
            raise SpecdecError("a prompt has no tokens; give it some text.")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise SpecdecError(
                f"token id {bad[0]} is outside the model's vocabulary [0, {vocab_size}); pass ids from this model's tokenizer."
            )
        if context_tokens is not None:
            ids = ids[-context_tokens:]
        out.append(ids)
    if not out:
        raise SpecdecError("no prompts given; pass at least one.")
    return out


def check_positions(longest: int, max_new_tokens: int, max_positions: int, option: str = "context_tokens=") -> None:
    """Refuse a prompt that, with ``max_new_tokens``, does not fit the model's positions; the message names
    ``option``, the way to shorten it on the caller's surface (``context_tokens=`` in Python,
    ``--context-tokens`` on the command line)."""
    if longest + max_new_tokens > max_positions:
        keep = max_positions - max_new_tokens
        sep = "" if option.endswith("=") else " "
        hint = f"shorten the prompt (e.g. {option}{sep}{keep})" if keep >= 1 else "shorten the prompt"
        raise SpecdecError(
            f"prompt of {longest} tokens + max_new_tokens {max_new_tokens} exceeds the model's "
            f"{max_positions} positions; {hint} or generate fewer tokens."
        )
