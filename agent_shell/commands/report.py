"""``cb-agent report``: success table per task type and agent (95% Wilson interval) and a bar chart.

Episodes run with different settings (budget, dtype, rendering, ...) are never pooled: each setting
that differs between the records becomes part of the row label. Error episodes (an engine fault)
are counted apart. ``--paired`` adds the same-games comparison of every two agents (exact sign test);
``--common-games`` keeps only the games every agent finished (runs of different sizes side by side).
A torn line is skipped with one plain warning line (``--resume`` of the run
moves it aside); an episode recorded twice (same agent, task and settings) is counted once, with a
warning line.
"""

from __future__ import annotations

from pathlib import Path

import click

from agent_shell.commands._common import make_console
from cb_io.storage import write_bytes_atomic


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the bar chart (default: beside a single RESULTS file, .png; for several "
                   "files report.png in the current folder, so no run's own chart is overwritten).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the table as Markdown here (title line, then the table).")
@click.option("--paired", is_flag=True,
              help="Also compare every two agents game by game on the games both played (won by both, "
                   "by one only, by neither; exact sign test on the discordant games).")
@click.option("--common-games", is_flag=True,
              help="Keep only the games (task ids) that every agent finished without an error, e.g. a "
                   "134-game run beside 30-game runs; says how many games were left out.")
@click.option("--rounds", "rounds_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The rounds.jsonl of a `cb-agent improve` run whose evaluation episodes RESULTS hold: also "
                   "the rounds paired against round 0 and each round's training play per task type.")
def report(results, chart_path, markdown_path, paired, common_games, rounds_path) -> None:
    """Summarise RESULTS (JSONL files written by `cb-agent run`)."""

    from agent_shell.charts import bar_chart
    from agent_shell.reporting import (describe_run, differing_settings, markdown_cells, markdown_table,
                                       paired_comparisons,
                                       pairs_markdown, pairs_table, rich_table, running_time, summarize)
    from agent_shell.reporting import common_games as keep_common_games
    from agent_shell.results import read_results, unique_episodes

    records, repeated = unique_episodes(r for path in results for r in read_results(path))
    for line in repeated:
        click.echo(f"warning: {line}", err=True)
    if not records:
        raise click.ClickException(f"no finished episodes in {', '.join(results)}")
    console = make_console()
    left_out = 0
    if common_games:
        try:
            records, left_out = keep_common_games(records)
        except ValueError as err:
            raise click.ClickException(f"--common-games: {err}") from None
        console.print(f"--common-games: {len({r['task_id'] for r in records})} games finished by every agent, "
                      f"{left_out} left out", markup=False)
    rows = summarize(records)
    title = describe_run(records)
    differing = differing_settings(records)
    if differing:
        console.print(f"settings differ between the episodes ({', '.join(differing)}): one row per setting",
                      markup=False)
    console.print(rich_table(rows, title=f"{title}: success per task type"))
    pairs = []
    if paired:
        try:
            pairs = paired_comparisons(records)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        if pairs:
            console.print(pairs_table(pairs, title=f"{title}: same games, agent against agent"))
        else:
            console.print("--paired: the results hold one agent only, nothing to pair", markup=False)
    rounds = []
    if rounds_path:
        from agent_shell.improve_rounds import read_rounds, round_tables
        from agent_shell.reporting import cells_table

        lines = read_rounds(Path(rounds_path))
        if not lines:
            raise click.ClickException(f"--rounds: {rounds_path} holds no round line of cb-agent improve")
        # a cb-agent episode without concept_round is round 0's (the expert data's concept: a round 0
        # seeded from a plain `cb-agent run`, as the results scripts do)
        ours = [r for r in records if r.get("agent") == "cb-agent"]
        rounds = round_tables(lines, ours, title)
        for table in rounds:
            console.print(cells_table(*table))
    timing = running_time(records)
    timing_line = ""
    if timing.busy_s > 0:
        timing_line = (f"running time: {timing.episodes} episodes in {timing.busy_s / 3600:.2f} h while any episode "
                       f"ran ({timing.per_hour:.1f} episodes per hour; first start to last finish "
                       f"{timing.span_s / 3600:.2f} h)")
        if timing.untimed:
            timing_line += f"; {timing.untimed} older episodes carry no finish time"
        console.print(timing_line, markup=False)
    if markdown_path:
        note = f" (settings differ: {', '.join(differing)})" if differing else ""
        if common_games:
            note += f" (the games every agent finished; {left_out} left out)"
        text = f"{title}: success per task type{note}\n\n{markdown_table(rows)}"
        if pairs:
            text += f"\nSame games, agent against agent (exact sign test on the discordant games)\n\n{pairs_markdown(pairs)}"
        for name, head, cells, caption in rounds:
            text += f"\n{name}\n\n{markdown_cells(head, cells)}\n{caption[0].upper()}{caption[1:]}.\n"
        if timing_line:
            text += f"\n{timing_line[0].upper()}{timing_line[1:]}.\n"
        write_bytes_atomic(markdown_path, text.encode())
        click.echo(f"markdown: {markdown_path}")
    default_chart = Path(results[0]).with_suffix(".png") if len(results) == 1 else Path("report.png")
    chart = bar_chart(rows, chart_path or default_chart, f"{title}: success rate by task type")
    click.echo(f"chart: {chart}")
