"""``cb-agent collect``: expert trajectories of a benchmark split into a JSONL file (resumable)."""

from __future__ import annotations

from statistics import mean

import click


@click.command()
@click.option("--env", "env_name", type=click.Choice(["alfworld", "scienceworld", "textworld"]), required=True)
@click.option("--split", default="train", show_default=True, help="Task split (alfworld: train/valid_unseen; "
              "scienceworld: train/dev/test; textworld: train/test).")
@click.option("--n-per-type", type=click.IntRange(min=1), default=None, help="First K tasks of each task type.")
@click.option("--tasks", "task_list", multiple=True, help="Explicit task ids (repeatable or comma-separated).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True, help="JSONL output file.")
@click.option("--resume/--no-resume", default=True, show_default=True,
              help="Skip tasks already in --out; --no-resume starts the file afresh.")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Step budget per task (default: the environment's, ALFWorld 50).")
def collect(env_name, split, n_per_type, task_list, out_path, resume, max_steps) -> None:
    """Collect expert trajectories (every candidate set saved) into OUT, one JSON line per task."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from envs import make_env
    from envs.collect import collect_expert_trajectories, select_tasks

    if n_per_type is not None and task_list:
        raise click.UsageError("--n-per-type and --tasks are mutually exclusive")
    env = make_env(env_name)
    try:
        if task_list:
            task_ids = [t.strip() for item in task_list for t in item.split(",") if t.strip()]
        else:
            task_ids = select_tasks(env, split, n_per_type)
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("won {task.fields[won]}"), TimeElapsedColumn())
        with Progress(*columns) as progress:
            bar = progress.add_task(f"{env_name}/{split}", total=len(task_ids), won=0)

            def on_task(task_id, traj, summary):
                progress.update(bar, advance=1, won=summary.won)

            summary = collect_expert_trajectories(env, task_ids, out_path, resume=resume,
                                                  max_steps=max_steps, on_task=on_task)
    except ValueError as err:  # bad input (unknown split or task id): one line, not a traceback
        raise click.ClickException(str(err)) from err
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
