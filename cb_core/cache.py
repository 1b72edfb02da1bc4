"""JAX's persistent compilation cache in the user cache directory (for one-off CLI fits).

Directory: ``$CB_AGENT_CACHE/jax`` if CB_AGENT_CACHE is set, else ``~/.cache/cb-agent/jax``.
The only module of cb_core that touches the file system configuration; call it from entry
points (the CLI), never from library maths.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir", "enable_persistent_cache"]


def cache_dir() -> Path:
    """The cb-agent cache root ($CB_AGENT_CACHE or ~/.cache/cb-agent)."""
    root = os.environ.get("CB_AGENT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "cb-agent"


def enable_persistent_cache(path: str | os.PathLike | None = None) -> Path:
    """Turn on JAX's persistent compilation cache (every compiled program is stored).

    Returns the directory used (created if needed).
    """
    import jax

    directory = Path(path) if path is not None else cache_dir() / "jax"
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory
