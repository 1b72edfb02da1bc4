"""Progress of long commands: a rich bar on a terminal, one plain line per finished item elsewhere.

Rich draws its bar only on a terminal; in a log file, CI or under nohup it stays silent until the
end. :func:`interactive` tells the commands which to use, :func:`episode_line` is the plain line of
a finished episode, and :func:`progress_bar` gives a rich bar or a :class:`PlainProgress` that prints
one line per finished item.
Imports nothing heavy (``cb-agent --help`` stays fast).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn


def interactive() -> bool:
    """True when standard output is a terminal (draw a bar), False in logs, pipes and CI (print lines)."""
    return sys.stdout.isatty()


def episode_line(agent: str, task_id: str, won: bool, steps: int, s_per_step: float | None,
                 extra: str = "") -> str:
    """One finished episode as a plain line: ``<agent> <task> won|lost steps=N s/step=X [extra]``."""
    rate = "-" if s_per_step is None else f"{s_per_step:.2f}"
    return f"{agent} {task_id} {'won' if won else 'lost'} steps={steps} s/step={rate}" + (f" {extra}" if extra else "")


class PlainProgress:
    """The part of :class:`rich.progress.Progress` the commands use (``add_task``, ``update``,
    ``start``/``stop``, ``with``), printing one plain line per advance instead of drawing a bar:
    ``<description> <done>/<total> <fields>``."""

    def __init__(self, echo: Callable[[str], None] | None = None):
        import click

        self.echo = echo or click.echo
        self.tasks: dict[int, dict] = {}

    def add_task(self, description: str, total: float | None = None, completed: int = 0, **fields) -> int:
        self.tasks[len(self.tasks)] = {"description": description, "total": total, "completed": completed,
                                       "fields": dict(fields)}
        return len(self.tasks) - 1

    def update(self, task_id: int, advance: float = 0, completed: int | None = None, **fields) -> None:
        task = self.tasks[task_id]
        task["fields"].update(fields)
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
            shown = " ".join(str(v) for v in task["fields"].values() if v not in ("", None))
            total = "" if task["total"] is None else f"/{task['total']:g}"
            self.echo(f"{task['description']} {task['completed']:g}{total}" + (f" {shown}" if shown else ""))

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        return None


def progress_bar(*columns: str | ProgressColumn) -> Progress | PlainProgress:
    """A :class:`rich.progress.Progress` with ``columns`` on a terminal, else a :class:`PlainProgress`."""
    if not interactive():
        return PlainProgress()
    from rich.progress import Progress

    return Progress(*columns)
