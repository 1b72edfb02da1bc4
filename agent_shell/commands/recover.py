"""``cb-agent recover``: reference-history recovery (see :mod:`agent_shell.studies`).

Unsuccessful trajectories of ``cb-agent run`` (L steps, at least 6 environment steps) are
replayed to step floor(L/3) in a fresh episode; the agent then plays at most ``--new-actions``
new steps with (a) that history, or (b) that history plus the recorded steps
floor(L/3)..floor(2L/3) shown as a Reference block, under each ``--history`` rendering. One JSON
line per (item, condition, rendering, agent); ``--resume`` continues an interrupted study.
"""

from __future__ import annotations

from dataclasses import replace

import click

from agent_shell.commands._common import RENDERING_NAMES, make_console, shared_option
from agent_shell.commands._study import ACTORS, episode_study_options, play_study
from agent_shell.run_config import RunConfig

#: = :data:`agent_shell.studies.CONDITIONS`.
CONDITIONS = ("history", "reference")


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--condition", "conditions", type=click.Choice(CONDITIONS), multiple=True, default=CONDITIONS,
              show_default=True, help="history: the replayed history; reference: plus the recorded segment.")
@click.option("--history", "renderings", type=click.Choice(list(RENDERING_NAMES)), multiple=True,
              default=("raw",), show_default=True, help="Rendering(s) (repeatable), e.g. raw, causal, experience.")
@click.option("--agent", "actors", type=click.Choice(ACTORS), multiple=True, default=("react",),
              show_default=True, help="Agent(s) that continue (repeatable).")
@click.option("--max-items", type=click.IntRange(min=0), default=20, show_default=True,
              help="Cap on the failed trajectories, in file order; 0 = all.")
@click.option("--new-actions", type=click.IntRange(min=1), default=30, show_default=True,
              help="New steps after the replay (think steps included).")
@click.option("--out", type=click.Path(dir_okay=False), default="recover/recover.jsonl", show_default=True,
              help="JSONL file of the study's lines, one per (item, condition, rendering, agent); --resume continues it.")
@shared_option("resume", help="Skip (item, condition, rendering, agent) keys already in --out.")
@episode_study_options
def recover(results, conditions, renderings, actors, max_items, new_actions, out, resume,
            config: RunConfig) -> None:
    """Reference-history recovery on RESULTS (JSONL files of `cb-agent run`): replay failed trajectories
    to a third of their length, continue, and report how many are won."""
    from agent_shell import studies

    console = make_console()
    if "calibrator" in renderings and config.calibrator is None:
        raise click.UsageError("--history calibrator needs --calibrator FILE (cb-agent calibrate fit)")
    conditions, renderings, actors = (tuple(dict.fromkeys(x)) for x in (conditions, renderings, actors))
    trials = studies.recorded_trials(results)
    items = studies.select_recovery_items(trials, max_items)
    if not items:
        raise click.ClickException(f"no unsuccessful trajectory with >= {studies.MIN_ENV_STEPS} environment steps "
                                   f"among {len(trials)} trials of {', '.join(results)}")
    console.print(f"{len(items)} failed trajectories x {len(conditions)} condition(s) x {len(renderings)} "
                  f"rendering(s) x {len(actors)} agent(s), {new_actions} new steps each -> {out}")
    keys = {(i.key, c, r, a) for i in items for c in conditions for r in renderings for a in actors}

    skipped: list[str] = []

    def skip(message: str) -> None:
        skipped.append(message)
        console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)

    def play(env, factory, meta, on_record) -> list[dict]:
        return studies.run_recovery(env, items, renderings, conditions, actors, factory, out, resume,
                                    new_actions, meta, on_record, config.episode_timeout, skip)

    written = play_study(
        "recover", out, keys, resume, replace(config, env=studies.env_name_of([i.recorded for i in items])),
        {i.recorded.trajectory.task_type for i in items}, actors,
        lambda r: (f"{r['condition']}/{r['rendering']}/{r['agent']}: "
                   f"{'won' if r['recovered'] else 'lost'} in {r['new_steps']}"), console.print, play,
        {"new_actions": new_actions})
    records = [r for r in studies.read_study(out, "recover")
               if (r["item"], r["condition"], r["rendering"], r["agent"]) in keys]
    mismatched = sum(r["replay_mismatch"] for r in records)
    console.print(f"{len(written)} lines written, {len(keys) - len(written) - len(skipped)} already in {out}; "
                  + (f"{len(skipped)} skipped (engine fault or --episode-timeout; --resume plays them again); "
                     if skipped else "") + f"{mismatched} replay(s) did not reproduce the recorded observations")
    console.print(studies.rate_table(
        studies.recovery_rows(records), ("condition", "rendering", "agent"), "won", "Reference-history recovery",
        "history: replayed history only; reference: plus the recorded steps k..2L/3 as a Reference block; "
        "new steps and cycle (longest repeated block span): means over the new steps; mismatch: replays "
        "whose observations differed from the recording"))


__all__ = ["CONDITIONS", "recover"]
