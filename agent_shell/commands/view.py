"""``cb-agent view``: the decision explorer, one self-contained HTML page (no network) of results
files and ``eval-decisions --out`` files.

At the top, ``report``'s success table and chart with the runs' settings; then the episodes, with
filters (agent, task type, won or lost, game id); an episode's steps with, at each scored decision,
the candidates ranked by log P with bars for their prior and concept terms and the chosen one
marked (and the expert's action, where ``--expert`` trajectories tell it); two agents on one game
side by side (the first step where they differ highlighted); and the held-out expert decisions of
eval-decisions files (the expert's action marked, where the concept overturns the prior and where
it is wrong). Bad input as in ``report``: a missing file is one line, a torn line is skipped with a
warning naming it, mixed settings label their rows.
"""

from __future__ import annotations

from pathlib import Path

import click

from agent_shell.commands._common import cli_errors


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Where to write the page (default: beside the first RESULTS file, .html).")
@click.option("--expert", "expert_paths", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Expert trajectories (JSONL, e.g. the cache's expert/<env>/<split>.jsonl): at the steps "
                   "taken from a state the expert passed through, its action is marked. Repeatable.")
def view(results, out_path, expert_paths) -> None:
    """Write the decision explorer of RESULTS (`cb-agent run` results, plain or .gz, and
    `eval-decisions --out` files) as one HTML file."""
    from agent_shell.view import read_inputs, render_page
    from cb_io.storage import write_bytes_atomic

    with cli_errors():
        inputs = read_inputs(results, expert_paths)
    first = Path(results[0])
    out = Path(out_path) if out_path else first.with_name(first.name.split(".")[0] + ".html")
    page = render_page(inputs, results).encode()
    write_bytes_atomic(out, page)
    click.echo(f"view: {out} ({len(page) / 1e6:.2f} MB; {len(inputs.records)} episodes, "
               f"{len(inputs.heldout)} held-out decisions)")
