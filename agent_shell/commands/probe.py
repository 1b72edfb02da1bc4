"""``cb-agent probe``: the repetition probe (see :mod:`agent_shell.studies`).

Fixed histories mined from results files of ``cb-agent run`` end in two identical environment
actions whose feedback does not support repeating them; each actor is asked for its next action
under each history rendering, and the table reports how often it repeats. One JSON line per
(item, rendering, actor); ``--resume`` continues an interrupted probe.
"""

from __future__ import annotations

from dataclasses import replace

import click

from agent_shell.commands._common import RENDERING_NAMES, make_console, shared_option
from agent_shell.commands._study import ACTORS, play_study, study_options
from agent_shell.run_config import RunConfig


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--history", "renderings", type=click.Choice(list(RENDERING_NAMES)), multiple=True,
              help="Rendering(s) to probe (repeatable); default: every rendering, the calibrator's only with "
                   "--calibrator.")
@click.option("--actor", "actors", type=click.Choice(ACTORS), multiple=True, default=("react", "prior-only"),
              show_default=True, help="Actor(s) (repeatable); cb-agent fits concepts per rendering.")
@click.option("--max-items", type=click.IntRange(min=0), default=30, show_default=True,
              help="Cap on the mined items (round robin over trajectories); 0 = all.")
@click.option("--out", type=click.Path(dir_okay=False), default="probe/probe.jsonl", show_default=True,
              help="JSONL file of the study's lines, one per (item, rendering, actor); --resume continues it.")
@shared_option("resume", help="Skip (item, rendering, actor) keys already in --out.")
@study_options
def probe(results, renderings, actors, max_items, out, resume, config: RunConfig) -> None:
    """Repetition probe on RESULTS (JSONL files of `cb-agent run`): how often does each actor repeat an
    action that just did nothing, under each history rendering?"""
    from agent_shell import studies

    console = make_console()
    if not renderings:
        renderings = tuple(r for r in RENDERING_NAMES if r != "calibrator" or config.calibrator is not None)
    if "calibrator" in renderings and config.calibrator is None:
        raise click.UsageError("--history calibrator needs --calibrator FILE (cb-agent calibrate fit)")
    renderings, actors = tuple(dict.fromkeys(renderings)), tuple(dict.fromkeys(actors))
    trials = studies.recorded_trials(results)
    items = studies.mine_probe_items(trials, max_items)
    if not items:
        raise click.ClickException(f"no unsupported repeats with a following environment step in {len(trials)} "
                                   f"trials of {', '.join(results)}")
    n_traj = len({i.recorded.key for i in items})
    console.print(f"{len(items)} probe items from {n_traj} of {len(trials)} trials x {len(renderings)} rendering(s) "
                  f"x {len(actors)} actor(s) -> {out}")
    keys = {(i.key, "", r, a) for i in items for r in renderings for a in actors}
    review_calls = []

    def play(env, factory, meta, on_record) -> list[dict]:
        reviews = studies.ReviewCache(factory.reviewer)
        try:
            return studies.run_probe(items, renderings, actors, factory, out, resume, reviews, meta, on_record)
        finally:
            review_calls.append(reviews.calls)

    written = play_study(
        "probe", out, keys, resume, replace(config, env=studies.env_name_of([i.recorded for i in items])),
        {i.recorded.trajectory.task_type for i in items}, actors,
        lambda r: f"{r['rendering']}/{r['agent']}: {'repeat' if r['repeat'] else r['kind']}", console.print, play)
    records = [r for r in studies.read_study(out, "probe") if (r["item"], "", r["rendering"], r["agent"]) in keys]
    console.print(f"{len(written)} lines written, {len(keys) - len(written)} already in {out}; "
                  f"{sum(review_calls)} experience review calls")
    console.print(studies.rate_table(
        studies.probe_rows(records), ("rendering", "actor"), "repeat", "Repetition probe: next action repeats",
        "repeat: the next action equals the repeated one; think/malformed answers count as no repeat; "
        "in set: items whose repeated action is in the fixed action space"))


__all__ = ["probe"]
