"""Reading the text files a command is given (``--prompt-file``, ``--config``) with one-line errors.

Only regular files are read: a FIFO or a device (``/dev/zero``) would block or never end, so it is refused
before it is opened. NUL bytes (a binary file) and text that is not valid in the given encoding are refused
with the byte offset and the fix. No typer import here.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.outputs import _kind

__all__ = ["read_text_file", "read_json_object"]


def read_text_file(path: str | os.PathLike, option: str, encoding: str = "utf-8", encoding_option: str | None = None) -> str:
    """The text of the regular file ``path``; ``option`` names the command-line option in errors.

    ``encoding_option`` (e.g. ``"--encoding"``) is suggested when the bytes do not decode.
    """
    p = Path(path)
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise SpecdecError(f"unknown encoding {encoding!r}; use a Python codec name such as utf-8 or latin-1.") from None
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise SpecdecError(f"{option} {p} does not exist (file not found); check the path.") from None
    except NotADirectoryError:
        raise SpecdecError(f"{option} {p}: a parent of it is a file, not a directory (file not found); check the path.") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecdecError(f"{option} {p} is a directory, not a file; pass a file path.")
    if not stat.S_ISREG(st.st_mode):
        raise SpecdecError(f"{option} {p} is {_kind(st.st_mode)}, not a regular file; save the text to a file and pass that.")
    data = p.read_bytes()
    nul = data.find(b"\0")
    if nul >= 0 and encoding.lower().replace("-", "").replace("_", "") not in ("utf16", "utf32", "utf16le", "utf16be",
                                                                                   "utf32le", "utf32be"):
        raise SpecdecError(f"{option} {p} has a NUL byte at offset {nul}: it is a binary file, not text; pass a text file.")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        fix = (f"pass its encoding with {encoding_option} (e.g. {encoding_option} latin-1) or convert it to UTF-8"
               if encoding_option else "save it as UTF-8")
        raise SpecdecError(
            f"{option} {p} is not valid {encoding} text (byte 0x{data[exc.start]:02x} at offset {exc.start}); {fix}."
        ) from None


def read_json_object(path: str | os.PathLike, option: str) -> dict[str, Any]:
    """A JSON object read from the UTF-8 file ``path``."""
    text = read_text_file(path, option)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecdecError(f"config file {path} is not valid JSON (line {exc.lineno}: {exc.msg}).") from None
    if not isinstance(obj, dict):
        raise SpecdecError(f"config file {path} must hold a JSON object of pipeline fields.")
    return obj
