"""Safe output files: every path is checked before any model work, then written atomically.

Every command that writes (``generate``, ``bench``, ``tune``, ``profile-srh``, ``fidelity``) calls
:func:`check_outputs` on all its output paths *before* loading a model, and writes each file with
:func:`write_text` / :func:`write_bytes`:

- the target must be a regular file or not exist yet: a directory, a symbolic link, a device, a FIFO or a
  socket is refused (``os.replace`` would replace ``/dev/null`` or the link itself with a regular file);
- the nearest existing ancestor of the target must be a writable directory (missing folders are created
  only when writing, so a refused run leaves nothing behind);
- the content goes to a unique temporary file in the target's folder (``tempfile.mkstemp``), which is then
  renamed over the target in one atomic ``os.replace``: two runs writing one file never collide and a reader
  never sees half a file; the temporary file is removed on any failure, Ctrl-C included.

No typer import here: the CLI turns :class:`~specdec.errors.SpecdecError` into one ``error: ...`` line.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable

from specdec.errors import SpecdecError

__all__ = ["check_output", "check_outputs", "check_output_dir", "write_text", "write_bytes"]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check_parent(path: Path, option: str, shown: Path | None = None) -> None:
    """The nearest existing ancestor of ``path`` is a writable directory (errors name ``shown``, default ``path``)."""
    parent = path.parent
    path = shown if shown is not None else path
    while True:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            if parent == parent.parent:
                break
            parent = parent.parent
            continue
        except NotADirectoryError:
            parent = parent.parent
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise SpecdecError(f"{option} {path}: {parent} is a file, not a directory; choose a path in a directory.")
        if not os.access(parent, os.W_OK | os.X_OK) or not _can_create_in(parent):
            raise SpecdecError(f"{option} {path}: directory {parent} is not writable; choose a writable directory.")
        return


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in ``folder``: ``os.access`` says yes to root everywhere (``/proc``, a full or
    otherwise refusing file system), and the run then failed at its final write, after all its work."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".specdec-probe.", suffix=".tmp")
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def check_output(path: str | os.PathLike, option: str) -> Path:
    """Refuse, in one line naming ``option``, an output file that cannot be written safely.

    Call it before any model work. Returns the path as a :class:`~pathlib.Path`.
    """
    p = Path(path)
    if str(path) == "" or p.name in ("", ".", ".."):
        raise SpecdecError(f"{option} {str(path)!r} does not name a file; pass a file path such as out.json.")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        st = None  # a component of the parent is a file: reported by _check_parent
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise SpecdecError(
            f"{option} {p} is {_kind(st.st_mode)}; specdec writes only regular files, pass a new or regular file path."
        )
    if st is not None and not os.access(p, os.W_OK):
        raise SpecdecError(f"{option} {p} is read-only; choose another path or change its permissions.")
    _check_parent(p, option)
    return p


def check_output_dir(path: str | os.PathLike, option: str) -> Path:
    """Refuse an output folder that is not a directory (or creatable as one), in one line naming ``option``."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    if st is not None:
        if not stat.S_ISDIR(os.stat(p).st_mode):
            kind = "a file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
            raise SpecdecError(f"{option} {p} is {kind}, not a directory; pass a directory path.")
        if not os.access(p, os.W_OK | os.X_OK) or not _can_create_in(p):
            raise SpecdecError(f"{option} {p}: directory {p} is not writable; choose a writable directory.")
        return p
    _check_parent(p / "x", option, shown=p)
    return p


def check_outputs(paths: Iterable[tuple[str | os.PathLike | None, str]]) -> None:
    """:func:`check_output` on each ``(path, option)`` (``None`` paths skipped); one path given twice is refused."""
    seen: dict[str, str] = {}
    for path, option in paths:
        if path is None:
            continue
        p = check_output(path, option)
        key = os.path.abspath(p)
        if key in seen:
            raise SpecdecError(f"{seen[key]} and {option} name the same file {p}; give them different paths.")
        seen[key] = option


def write_bytes(path: str | os.PathLike, data: bytes, option: str = "output") -> Path:
    """Write ``data`` to ``path`` atomically (unique temp file in its folder + ``os.replace``); no stray file on failure."""
    p = check_output(path, option)  # again: the path may have changed since the preflight check
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as exc:  # it named the temporary file ("file not found: /proc/.h.safetensors.axjy2try.tmp")
        raise SpecdecError(f"cannot write {option} {p}: {exc.strerror or exc}; choose a writable folder.") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if p.exists():
            os.chmod(tmp, stat.S_IMODE(os.stat(p).st_mode))
        else:  # mkstemp creates 0600; give the file the permissions a plain open() would
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, p)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):  # a full disk, a file system that refuses: the user's path, not the temp file's
            raise SpecdecError(f"cannot write {option} {p}: {exc.strerror or exc}; choose another folder.") from None
        raise
    return p


def write_text(path: str | os.PathLike, text: str, option: str = "output") -> Path:
    """:func:`write_bytes` of ``text`` encoded as UTF-8."""
    return write_bytes(path, text.encode("utf-8"), option)
