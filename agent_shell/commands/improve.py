"""``cb-agent improve``: a concept that learns from its own wins, round by round
(:mod:`agent_shell.improve`).

Round 0 is ``cb-agent run``'s concept (the expert demonstrations of ``--demo-split``); each round
then plays CB-Agent on ``--games-per-round`` training games per task type that the expert data did
not use, adds the won episodes' decisions to the concept data, refits (warm-started) and plays the
new concepts on the evaluation games (chosen as ``cb-agent run`` chooses them). One line per round
and per game; at the end the success table per round (95% Wilson intervals), each round paired
against round 0 on the same games (exact sign test), and a chart (``<out>/rounds.png``). Every
round's concepts are saved under ``<out>/round-K/concepts`` with their provenance
(``cb-agent run --concepts`` acts with them). ``--workers N`` plays each round's training and
evaluation games N at once on Ray workers, as ``cb-agent run --workers N`` does (each worker acting
with the round's saved concepts); labels, features and fits stay in this process.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from agent_shell.commands._common import (COMMON_OPTIONS, check_ray_start, cli_errors, config_options, make_console,
                                          task_error)
from agent_shell.configure import task_ids
from agent_shell.run_config import RunConfig

#: The options of ``cb-agent run`` that ``improve`` takes (the evaluation games, budget, output, resume).
IMPROVE_RUN_OPTIONS = ("split", "per_type", "all_games", "games", "game_ids", "budget", "out_dir", "resume",
                       "keep_errors", "episode_timeout", "workers", "shared_lm", "ray_address")


@click.command()
@config_options(*COMMON_OPTIONS, *IMPROVE_RUN_OPTIONS)
@click.option("--labels", type=click.Choice(["wins", "expert"]), default="wins", show_default=True,
              help="A round's targets: wins = its won training episodes, the agent's own choices; expert = every "
                   "training episode, won or lost, each state labelled with the expert's action (DAgger; ALFWorld "
                   "and TextWorld, whose experts answer from any state).")
@click.option("--beta", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
              help="DAgger's mixing (with --labels expert): round k's training play executes the expert's action "
                   "instead of the agent's with probability beta**k at each step (0: the agent's own actions).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Rounds of play and refit after round 0 (the expert-data concept).")
@click.option("--games-per-round", type=click.IntRange(min=1), default=6, show_default=True,
              help="Training games per task type played each round (the next ones the expert data did not use; "
                   "from the first again once they run out).")
@click.option("--max-decisions", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Cap on the own decisions in a task type's concept data, the newest kept (0 = no cap; the expert "
                   "decisions are not counted).")
@click.option("--keep-expert-data/--no-keep-expert-data", default=True, show_default=True,
              help="Keep the expert decisions in the concept data (off: rounds >= 1 fit on own decisions only).")
@click.option("--train-game", "train_games", multiple=True,
              help="Explicit training game(s) of --demo-split (repeatable; default: every game of the evaluated "
                   "task types that the expert data did not use).")
def improve(config: RunConfig, labels: str, beta: float, rounds: int, games_per_round: int, max_decisions: int,
            keep_expert_data: bool, train_games: tuple[str, ...]) -> None:
    """Rounds of play on training games; the won episodes (or the expert's labels of every state
    played) refit the concept; each round evaluated."""
    from agent_shell.improve import ImproveSettings, improve as run_rounds
    from agent_shell.improve_labels import check_labels
    from agent_shell.progress import interactive
    from agent_shell.scheduler import make_progress
    from envs import make_env

    console = make_console()
    check_ray_start(config)
    try:
        settings = ImproveSettings(labels=labels, beta=beta, rounds=rounds, games_per_round=games_per_round,
                                   max_decisions=max_decisions, keep_expert_data=keep_expert_data,
                                   train_games=train_games)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    out = Path(config.out_dir or f"runs/improve-{config.env}-{config.split}")

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    env = make_env(config.env)
    try:
        try:  # the label source, the evaluation games and the training split, before anything loads
            check_labels(labels, env)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        try:
            task_ids(config, env)
        except ValueError as err:
            raise task_error(env, config.split, err) from None
        progress = make_progress() if interactive() else None
        with cli_errors(), (progress if progress is not None else contextlib.nullcontext()):
            lines = run_rounds(config, settings, out, say, env=env, progress=progress)
    finally:
        env.close()
    show(console, out, lines)


def show(console, out, lines) -> None:
    """The success table per round and task type, the rounds' summary paired against round 0, the
    training play per round and task type, the chart."""
    from agent_shell.charts import bar_chart
    from agent_shell.improve_rounds import evaluation_records, round_tables
    from agent_shell.reporting import cells_table, describe_run, rich_table, summarize

    records = evaluation_records(out)
    rows = summarize(records)
    title = describe_run(records)
    console.print(rich_table(rows, title=f"{title}: success per round and task type"))
    for table in round_tables(lines, records, title):
        console.print(cells_table(*table))
    chart = bar_chart(rows, out / "rounds.png", f"{title}: success rate by round")
    console.print(f"concepts: {out}/round-K/concepts (cb-agent run --concepts); chart: {chart}", markup=False)
