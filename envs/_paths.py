"""Where shared data and caches live (never write into ../shared)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_dir(*parts: str) -> Path:
    """``$CB_AGENT_CACHE`` (else ``~/.cache/cb-agent``) joined with ``parts``, created if missing."""
    root = Path(os.environ.get("CB_AGENT_CACHE") or Path.home() / ".cache" / "cb-agent")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def shared_dir() -> Path:
    """The read-only shared folder, ``<repo root>/../shared``."""
    return REPO_ROOT.parent / "shared"
