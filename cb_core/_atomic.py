"""Atomic file replacement for cb_core's file formats (the only I/O in cb_core; no maths here)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Iterator


def _default_mode() -> int:
    """0o666 minus the process umask: the mode ``open()`` would give a new file."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    The new file gets the ordinary permissions of a newly created file (not mkstemp's 0600). On
    any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, _default_mode())  # after writing: some writers (safetensors) recreate the file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
