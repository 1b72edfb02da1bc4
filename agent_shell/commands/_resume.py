"""What every ``--resume`` does first: move a torn last line (an interrupted write) out of the file."""

from __future__ import annotations

import os
from typing import Callable

import click


def repair_for_resume(path: str | os.PathLike, echo: Callable[[str], None] = click.echo) -> None:
    """Move unreadable lines of ``path`` to ``<path>.torn`` (:func:`envs.storage.repair_jsonl`) and
    say so in one plain line per line moved; the rest of the file stays byte for byte."""
    from envs.storage import repair_jsonl

    for line in repair_jsonl(path):
        echo(f"repaired {path}: line {line.line_number} ({line.error}) moved to {path}.torn")
