"""``cb-agent report``: success table per task type and agent (95% Wilson interval) and a bar chart."""

from __future__ import annotations

from pathlib import Path

import click

from agent_shell.commands._common import make_console


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--chart", "chart_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the bar chart (default: beside the first RESULTS file, .png).")
def report(results, chart_path) -> None:
    """Summarise RESULTS (JSONL files written by `cb-agent run`)."""

    from agent_shell.reporting import bar_chart, rich_table, summarize
    from agent_shell.runner import read_results

    records = [r for path in results for r in read_results(path)]
    if not records:
        raise click.ClickException(f"no finished episodes in {', '.join(results)}")
    rows = summarize(records)
    make_console().print(rich_table(rows))
    chart = bar_chart(rows, chart_path or Path(results[0]).with_suffix(".png"))
    click.echo(f"chart: {chart}")
