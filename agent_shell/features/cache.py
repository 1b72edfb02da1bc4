"""Per-trajectory cache of feature blocks: ``<cache>/features/blocks/<key>.npz``.

A block is cached per (extractor, trajectory): the key hashes :data:`BLOCK_VERSION`, the
extractor's description (name, width, metadata: model names and versions for model-based blocks),
the backbone's identity and everything the decisions show (each decision's context, instruction,
initial observation, executed history and candidate set). So a feature selection is the
concatenation of cached blocks, and a combination costs nothing once each of its blocks was
computed alone. A file holds ``blocks`` [T, k] float32 and ``offsets`` [N + 1] int64 (decision i
owns rows ``offsets[i]:offsets[i + 1]``), written atomically (:func:`cb_io.storage.atomic_path`).

Imports nothing of the agents.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from agent_shell.features.protocol import DecisionInput

if TYPE_CHECKING:
    from agent_shell.history import StepLike

#: Bumped when the file layout or the key's payload changes.
BLOCK_VERSION = 1


def _step_payload(step: StepLike) -> list[str]:
    return [step.kind, step.action, step.observation]


def block_key(description: dict[str, Any], backbone: Sequence[str], decisions: Sequence[DecisionInput]) -> str:
    """Content hash naming one extractor's block of one trajectory's decisions."""
    payload = [BLOCK_VERSION, description, list(backbone)]
    for d in decisions:
        payload.append([d.context, d.instruction, d.observation, [_step_payload(s) for s in d.history],
                        list(d.candidates), d.action_prefix])
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()[:32]


def cached_blocks(path: Path | None, compute: Callable[[], list[np.ndarray]]) -> tuple[list[np.ndarray], bool]:
    """(one [M_i, k] block per decision, whether they came from ``path``); computed and saved when
    ``path`` is None or absent."""
    from cb_io.storage import atomic_path

    if path is not None and path.exists():
        with np.load(path) as f:
            blocks, off = f["blocks"], f["offsets"]
        return [blocks[a:b] for a, b in zip(off[:-1], off[1:])], True
    out = compute()
    if path is not None and out:
        path.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.concatenate([[0], np.cumsum([len(b) for b in out])]).astype(np.int64)
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez(tmp, blocks=np.concatenate(out).astype(np.float32), offsets=offsets)
    return out, False


def block_path(cache_dir: str | os.PathLike | None, key: str) -> Path | None:
    """``<cache_dir>/features/blocks/<key>.npz`` (None without a cache)."""
    return None if cache_dir is None else Path(cache_dir) / "features" / "blocks" / f"{key}.npz"


__all__ = ["BLOCK_VERSION", "block_key", "block_path", "cached_blocks"]
