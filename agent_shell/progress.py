"""Progress of long commands: a rich bar on a terminal, one plain line per finished item elsewhere.

Rich draws its bar only on a terminal; in a log file, CI or under nohup it stays silent until the
end. :func:`interactive` tells the commands which to use, :func:`episode_line` is the plain line.
Imports nothing heavy (``cb-agent --help`` stays fast).
"""

from __future__ import annotations

import sys


def interactive() -> bool:
    """True when standard output is a terminal (draw a bar), False in logs, pipes and CI (print lines)."""
    return sys.stdout.isatty()


def episode_line(agent: str, task_id: str, won: bool, steps: int, s_per_step: float | None,
                 extra: str = "") -> str:
    """One finished episode as a plain line: ``<agent> <task> won|lost steps=N s/step=X [extra]``."""
    rate = "-" if s_per_step is None else f"{s_per_step:.2f}"
    return f"{agent} {task_id} {'won' if won else 'lost'} steps={steps} s/step={rate}" + (f" {extra}" if extra else "")
