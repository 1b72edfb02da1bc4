"""``cb-agent tasks``: the task ids of a benchmark split (or the splits and their sizes), and the
up-front check every command runs on the task ids, splits and variations it is given.

Nothing here starts an engine: ALFWorld ids come from the game folders, ScienceWorld's from the
variation table of the pinned simulator, TextWorld's from the seed ranges.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import click

from envs.protocol import Environment
from agent_shell.commands._common import cli_errors, shared_option


def validated_tasks(env: Environment, split: str, task_ids: Iterable[str]) -> list[str]:
    """:func:`agent_shell.pipeline.check_tasks` as a one-line click error that also says how to
    list the valid ids.

    Raises:
        click.ClickException: an unknown split, an unknown id, or an id of another split.
    """
    from agent_shell.pipeline import check_tasks

    with cli_errors():
        return check_tasks(env, split, list(task_ids))


@click.command("tasks")
@shared_option("env", default=None, show_default=False, required=True, help="Benchmark to list.")
@shared_option("split", help="Print this split's task ids, one per line (default: print the splits with their "
               "numbers of tasks and task types).")
@click.option("--type", "task_type", default=None, help="Only ids of this task type.")
def tasks(env, split, task_type) -> None:
    """List the task ids of a split (or the splits); no engine is started."""
    from envs import make_env

    env = make_env(env)
    try:
        if split is None:
            for name in env.splits:
                ids = env.tasks(name)
                types = Counter(env.task_type_of(t) for t in ids)
                click.echo(f"{name}: {len(ids)} tasks, {len(types)} task types")
            return
        try:
            ids = env.tasks(split)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        if task_type is not None:
            ids = [t for t in ids if env.task_type_of(t) == task_type]
            if not ids:
                known = sorted({env.task_type_of(t) for t in env.tasks(split)})
                raise click.ClickException(f"no {split} task of type {task_type!r}; types: {', '.join(known)}")
        for task_id in ids:
            click.echo(task_id)
    finally:
        env.close()


__all__ = ["task_error", "tasks", "validated_tasks"]
