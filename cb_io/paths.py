"""Where shared data and caches live, for the whole project (never write into ../shared).

The cache root is ``$CB_AGENT_CACHE`` (``~`` expanded), else ``~/.cache/cb-agent``: expert
trajectories, generated games, converted models, features, concepts, reviews and compiled fits
all live under it. This is the one place that decides it; the agent shell and the CLI's
``--cache-dir`` default to it. Imports nothing else of this project.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """``$CB_AGENT_CACHE`` if set (``~`` expanded), else ``~/.cache/cb-agent`` (not created)."""
    env = os.environ.get("CB_AGENT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "cb-agent"


def cache_dir(*parts: str) -> Path:
    """:func:`cache_root` joined with ``parts``, created if missing (:func:`writable_folder`)."""
    return writable_folder(cache_root().joinpath(*parts))


def writable_folder(path: str | os.PathLike, what: str = "the cache folder",
                    setting: str = "CB_AGENT_CACHE or --cache-dir", create: bool = True) -> Path:
    """``path`` as a folder, created with its parents if missing.

    ``what`` names the folder in the error (``"the results folder"``), ``setting`` what the user sets
    to choose another (``"--out-dir"``). With ``create=False`` nothing is created: the nearest folder
    that exists on the way is checked instead (a folder this process may write into), so a
    command can refuse bad input before it leaves an empty folder behind.

    Raises:
        ValueError: one line when it cannot be created (a regular file on the way, no permission):
            naming the folder, the reason and what to set instead.
    """
    path = Path(path)
    try:
        if create:
            path.mkdir(parents=True, exist_ok=True)
        else:
            existing = next(p for p in (path, *path.parents) if p.exists())
            if not existing.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
            if not os.access(existing, os.W_OK | os.X_OK):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(existing))
    except OSError as err:
        raise ValueError(f"{what} {path} cannot be created ({err.strerror}: {err.filename}); set "
                         f"{setting} to a folder that can be") from None
    return path


def shared_dir() -> Path:
    """The read-only shared folder, ``<repo root>/../shared``."""
    return REPO_ROOT.parent / "shared"


__all__ = ["REPO_ROOT", "cache_dir", "cache_root", "shared_dir", "writable_folder"]
