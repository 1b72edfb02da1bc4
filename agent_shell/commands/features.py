"""``cb-agent features``: the feature extractors ``--features`` can select (built-in and plug-ins)."""

from __future__ import annotations

import click


@click.command()
def features() -> None:
    """List feature extractors: --features NAME[:ARG],... selects them (lm-hidden by default)."""
    from agent_shell.features.registry import ENTRY_POINT_GROUP, available_extractors

    for name, source in available_extractors().items():
        click.echo(f"{name}\t{source}")
    click.echo(f"(third-party extractors register under the entry-point group {ENTRY_POINT_GROUP!r}; a complete "
               "example: agent_shell.features.examples)")
