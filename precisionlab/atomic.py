"""Atomic file writes: write beside the target, then rename, so a failed or
interrupted write never leaves a partial result behind."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def write_problem(path: str | os.PathLike, *, folder_ok: bool = False) -> str | None:
    """Why ``path`` cannot be written, checked before any work is done: its folder is
    missing or not writable, or (unless ``folder_ok``) a folder stands there; None when
    it can be."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        return f"cannot write {str(path)!r}: folder {str(parent)!r} does not exist"
    if not os.access(parent, os.W_OK):
        return f"cannot write {str(path)!r}: folder {str(parent)!r} is not writable"
    if path.is_dir() and not folder_ok:
        return f"cannot write {str(path)!r}: it is a folder"
    try:  # what the write will do first; permissions alone miss read-only file systems
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=f".{path.name}."))
    except OSError as exc:  # (a pseudo file system such as /proc answers "no such file")
        why = "" if exc.errno == errno.ENOENT else f" ({exc.strerror or exc})"
        return f"cannot write {str(path)!r}: folder {str(parent)!r} is not writable{why}"
    return None


class WriteError(OSError):
    """A result that could not be written (a full disk, a folder gone read-only); its
    message names the file the user asked for, not the temporary one."""

    def __str__(self) -> str:
        return f"cannot write {str(self.filename)!r}: {self.strerror}"


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success it replaces ``path``
    (a file, or a folder such as a zarr store, never a folder by a file) with the usual
    permissions; on error it is removed and ``path`` is left as it was."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    tmp_dir = Path(tempfile.mkdtemp(dir=parent, prefix=f".{path.name}."))
    tmp = tmp_dir / path.name
    try:
        yield tmp
        if tmp.is_file():
            os.chmod(tmp, _default_mode())
        else:
            os.chmod(tmp, _default_mode() | 0o111)
        if path.is_dir() and not tmp.is_dir():  # never a folder's contents for a file
            raise IsADirectoryError(f"cannot write {str(path)!r}: it is a folder")
        if path.is_dir():  # a folder being replaced: move the old one aside first
            os.replace(path, tmp_dir / (path.name + ".old"))
        os.replace(tmp, path)
    except OSError as exc:
        if isinstance(exc, WriteError | IsADirectoryError):
            raise
        raise WriteError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def write_json(path: str | os.PathLike, obj, **dump_kw) -> None:
    """``json.dump(obj, ..., **dump_kw)`` into ``path`` through :func:`atomic_path`."""
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        json.dump(obj, fh, **dump_kw)


def json_out_error(path: str | None, option: str = "--out") -> str | None:
    """Why ``path`` cannot take a JSON result file, as a usage message naming ``option``
    (``None`` if it can, or if no path was given)."""
    if path is None or (path.endswith(".json") and Path(path).parent.is_dir()):
        return None
    return f"{option} takes a .json path in an existing folder, not {path!r}"
