"""``cb-agent collect``: expert trajectories of a benchmark split into a JSONL file (resumable).

The split and every task id are checked before any engine starts (an id of another split is
refused: no test variation collected as train). Without ``--resume`` a file that already holds one
of the tasks is refused, as ``run``, ``probe`` and ``recover`` do; ``--resume`` first moves a torn
last line aside, then skips the stored tasks.
"""

from __future__ import annotations

import time
from statistics import mean

import click

from agent_shell.commands._common import shared_option
from agent_shell.commands.tasks import validated_tasks


@click.command()
@shared_option("env", default=None, show_default=False, required=True, help="Benchmark to collect from.")
@shared_option("split", default="train", show_default=True, help="Task split (alfworld: train/valid_unseen; "
               "scienceworld: train/dev/test; textworld: train/test); every --tasks id must belong to it.")
@click.option("--n-per-type", type=click.IntRange(min=1), default=None, help="First K tasks of each task type.")
@click.option("--tasks", "task_list", multiple=True, help="Explicit task ids (repeatable or comma-separated; "
              "list them with `cb-agent tasks --env ENV --split SPLIT`).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="JSONL output file.")
@shared_option("resume", help="Skip tasks already in --out (after moving a torn last line aside); without it a "
                             "file that already holds one of the tasks is refused.")
@shared_option("budget", default=None, show_default=False,
               help="Step budget per task (default: the environment's, ALFWorld 50).")
@shared_option("episode_timeout")
def collect(env, split, n_per_type, task_list, out_path, resume, budget, episode_timeout) -> None:
    """Collect expert trajectories (every candidate set saved) into OUT, one JSON line per task."""
    from agent_shell.results import repair_for_resume
    from agent_shell.progress import episode_line, interactive
    from envs import make_env
    from envs.collect import collect_expert_trajectories, select_tasks

    if n_per_type is not None and task_list:
        raise click.UsageError("--n-per-type and --tasks are mutually exclusive")
    env_name = env
    env = make_env(env_name)
    try:
        if task_list:
            task_ids = validated_tasks(env, split, [t.strip() for item in task_list for t in item.split(",")
                                                    if t.strip()])
        else:
            validated_tasks(env, split, [])
            task_ids = select_tasks(env, split, n_per_type)
        if resume:
            repair_for_resume(out_path)
        if interactive():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("won {task.fields[won]}"), TimeElapsedColumn())
            bar = progress.add_task(f"{env_name}/{split}", total=len(task_ids), won=0)
        else:
            progress = bar = None

        started = [time.perf_counter()]  # when the current task began

        def on_task(task_id, traj, summary):
            now = time.perf_counter()
            if progress is not None:
                progress.update(bar, advance=1, won=summary.won)
            elif traj is not None:
                steps = len(traj.steps)
                click.echo(episode_line("expert", task_id, traj.won, steps, (now - started[0]) / steps if steps else None))
            elif task_id in summary.failed:
                click.echo(f"expert {task_id} FAILED: {summary.failed[task_id]}")
            started[0] = now

        try:
            if progress is not None:
                progress.start()
            summary = collect_expert_trajectories(env, task_ids, out_path, resume=resume, max_steps=budget,
                                                  on_task=on_task, split=split, time_limit=episode_timeout)
        finally:
            if progress is not None:
                progress.stop()
    except ValueError as err:  # e.g. a file that already holds these tasks: one line, not a traceback
        raise click.ClickException(str(err)) from None
    finally:
        env.close()
    sizes = summary.candidate_set_sizes
    click.echo(
        f"collected {summary.collected} (won {summary.won}), skipped {len(summary.skipped)} already stored, "
        f"failed {len(summary.failed)}; {summary.n_env_steps} env steps in {summary.seconds:.1f} s"
        + (f"; candidate sets: mean {mean(sizes):.1f}, min {min(sizes)}, max {max(sizes)}" if sizes else "")
    )
    for task_id, err in summary.failed.items():
        click.echo(f"FAILED {task_id}: {err}", err=True)
    if summary.failed:
        raise SystemExit(1)
