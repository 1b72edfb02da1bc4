"""JAX's persistent compilation cache, in a directory the caller chooses (for one-off CLI fits).

cb_core decides no file locations: the agent shell passes ``<its cache dir>/jax``. Call it from
entry points, never from library maths.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["enable_persistent_cache"]


def enable_persistent_cache(directory: str | os.PathLike) -> Path:
    """Turn on JAX's persistent compilation cache in ``directory`` (every compiled program is
    stored). Returns the directory (created if needed)."""
    import jax

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return directory
