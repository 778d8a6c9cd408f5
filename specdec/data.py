"""Long real documents that ship with Python: no downloads needed.

* ``pydoc``: Python's own reference documentation (``pydoc_data.topics``, ~113k tokens of English).
* ``pydoc:<i>/<n>``: part ``i`` of ``n`` of that documentation (topics in order, split into ``n`` runs of
  about equal length): prose held out from the built-in ``pydoc``, which is the end of the last part.
* ``stdlib:<module>``: the source of a standard-library module, e.g. ``stdlib:argparse``.
* ``long:prose`` and ``long:code``: documents of more than 40k tokens for 16k–32k contexts (see
  :data:`LONG_DOCUMENTS` for what each is made of).
* any path to an existing text file (benchmarks on held-out documents: ``--documents a.cpp,b.md``).

:func:`passkey_prompt` hides a pass key in such a document (the retrieval probe of ``fidelity`` and
``profile-srh``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Sequence

from specdec.errors import SpecdecError

#: documents used by benchmarks: prose and source code, each long enough for 8k tokens of context
BENCH_DOCUMENTS = ["pydoc", "stdlib:argparse", "stdlib:typing", "stdlib:inspect", "stdlib:tarfile"]


#: long documents (≥ 40k tokens with the SmolLM2 and Gemma 3 tokenizers) and the parts they concatenate, in order
LONG_DOCUMENTS = {
    # every pydoc topic, sorted by key (~113k SmolLM2 tokens): English reference prose
    "long:prose": ["pydoc"],
    # four standard-library modules, each headed by ``# ---- <module>.py ----`` (~90k tokens): source code
    "long:code": ["stdlib:argparse", "stdlib:typing", "stdlib:inspect", "stdlib:tarfile"],
}


def load_document(name: str) -> str:
    """Text of a built-in document (see module docstring) or of any existing text file (a path)."""
    if name in LONG_DOCUMENTS:
        parts = LONG_DOCUMENTS[name]
        if parts == ["pydoc"]:
            return load_document("pydoc")
        return "\n\n".join(f"# ---- {p.split(':', 1)[1]}.py ----\n" + load_document(p) for p in parts)
    if name == "pydoc":
        from pydoc_data.topics import topics

        return "\n\n".join(topics[k] for k in sorted(topics))
    if name.startswith("pydoc:"):
        return _pydoc_part(name)
    if name.startswith("stdlib:"):
        mod = name.split(":", 1)[1]
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):  # stdlib:nosuch.sub (its parent does not exist), stdlib:..x
            spec = None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            raise SpecdecError(f"no pure-Python standard-library module {mod!r}; try stdlib:argparse.")
        return Path(spec.origin).read_text(encoding="utf-8")
    path = Path(name)
    if path.is_file():
        from specdec.inputs import read_text_file

        # as strict as --prompt-file: no binary file, no bytes that are not UTF-8 (never replaced silently)
        text = read_text_file(path, "document file")
        if not text.strip():
            raise SpecdecError(f"document file {path} is empty or whitespace only; give it some text.")
        return text
    if path.exists():  # a directory, a FIFO, a device: "not an existing file" was wrong
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise SpecdecError(f"document {name!r} is {kind}; give a text file, 'pydoc' or 'stdlib:<module>'.")
    raise SpecdecError(f"unknown document {name!r}: not an existing file, 'pydoc', 'stdlib:<module>' or one of " + ", ".join(LONG_DOCUMENTS) + " "
                       f"(e.g. {', '.join(BENCH_DOCUMENTS)}).")


def is_builtin(name: str) -> bool:
    """Whether ``name`` is read as a built-in document (:func:`load_document` tries these before a path)."""
    return name in LONG_DOCUMENTS or name == "pydoc" or name.startswith(("pydoc:", "stdlib:"))


def check_documents(names: Sequence[str], option: str = "--documents") -> list[str]:
    """Load every document of ``names`` (one line for a bad one) and refuse one named twice (a file under two
    spellings too: each would run and report the same rows twice). Returns a note line for each built-in name that is
    also an existing path: the built-in document is read, and ``./name`` reads the file."""
    seen: dict[str, str] = {}
    notes = []
    for name in names:
        load_document(name)
        key = name if is_builtin(name) else "file:" + os.path.realpath(name)
        if key in seen:
            how = "" if seen[key] == name else f" (as {seen[key]!r} and {name!r}, the same file)"
            raise SpecdecError(f"{option} names {name!r} twice{how}; give each document once.")
        seen[key] = name
        if is_builtin(name) and os.path.lexists(name):
            local = name if os.path.isabs(name) else f"./{name}"
            notes.append(f"{option} {name} is the built-in document; a file {name} exists here too: pass {local} "
                         "to read the file.")
    return notes


def _pydoc_part(name: str) -> str:
    """``pydoc:<i>/<n>``: the ``i``-th of ``n`` runs of consecutive pydoc topics of about equal length."""
    import re

    from pydoc_data.topics import topics

    m = re.fullmatch(r"pydoc:(\d+)/(\d+)", name)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise SpecdecError(f"unknown document {name!r}: a pydoc part is written pydoc:<i>/<n> with 1 <= i <= n, e.g. pydoc:1/4.")
    i, n = int(m.group(1)), int(m.group(2))
    keys = sorted(topics)
    total = sum(len(topics[k]) for k in keys)
    out, acc = [], 0
    for k in keys:  # a topic belongs to the part where it starts
        if (i - 1) * total <= acc * n < i * total:
            out.append(topics[k])
        acc += len(topics[k])
    return "\n\n".join(out)


def context_windows(tokenizer, text: str, context_tokens: int, count: int, offset: int, stride: int,
                    option: str = "--windows", name: str = "the document",
                    context_option: str = "context") -> list[list[int]]:
    """``count`` windows of ``context_tokens`` tokens of ``text``, window ``k`` ending ``offset + k * stride`` tokens
    before its end (window 0 is :func:`context_ids`' window); a document too short for them is a one-line error
    naming ``name``, and ``option`` / ``context_option`` as what to lower."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    need = context_tokens + offset + (count - 1) * stride
    if len(ids) < need:
        if count == 1:
            raise SpecdecError(
                f"{name} has {len(ids)} tokens, fewer than the {need} that a context of {context_tokens} tokens and "
                f"{offset} after it need; use a longer document or a smaller {context_option}."
            )
        raise SpecdecError(
            f"{name} has {len(ids)} tokens, fewer than the {need} that {count} windows of {context_tokens} "
            f"tokens {stride} apart need; use a longer document, fewer {option} or a smaller stride or "
            f"{context_option}."
        )
    ends = [len(ids) - offset - k * stride for k in range(count)]
    return [ids[e - context_tokens : e] for e in ends]


def context_ids(tokenizer, text: str, context_tokens: int | None, offset: int = 0,
                name: str | None = None) -> list[int]:
    """Tokenize ``text`` and keep ``context_tokens`` tokens ending ``offset`` tokens before its end (``name``: the
    document, for the error)."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if context_tokens is None:
        return ids
    end = len(ids) - offset
    if end < context_tokens:
        doc = f"document {name!r}" if name else "document"
        after = f" ({context_tokens} of context + {offset} after it)" if offset else ""
        raise SpecdecError(
            f"the {doc} has {len(ids)} tokens, fewer than the {context_tokens + offset} requested{after}; "
            "use a longer document or a smaller --context-tokens."
        )
    return ids[end - context_tokens : end]


PASSKEY_INTRO = ("There is an important piece of information hidden inside a lot of irrelevant text. "
                 "Find it and memorize it. I will quiz you about it.\n\n")


def passkey_prompt(tokenizer, filler: str, context: int, depth: float, key: str) -> list[int]:
    """``context`` tokens: intro + filler with the key sentence at ``depth`` (0 = start, 1 = end) + question."""
    enc = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    intro, needle = enc(PASSKEY_INTRO), enc(f"\nThe pass key is {key}. Remember it. {key} is the pass key.\n")
    question = enc("\n\nWhat is the pass key? The pass key is")
    room = context - len(intro) - len(needle) - len(question)
    body = enc(filler)
    if room < 16 or len(body) < room:
        raise SpecdecError(f"passkey context {context} is too short or the filler too small; use >= 256 tokens.")
    body = body[:room]
    cut = int(round(depth * room))
    return intro + body[:cut] + needle + body[cut:] + question
