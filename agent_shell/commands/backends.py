"""``cb-agent backends``: the LM backends ``--model`` can select (built-in and plug-ins)."""

from __future__ import annotations

import click


@click.command()
def backends() -> None:
    """List LM backends: --model NAME:ARG selects one (a plain folder or name: HuggingFace)."""
    from agent_shell.lm.factory import ENTRY_POINT_GROUP, available_backends

    for name, source in available_backends().items():
        click.echo(f"{name}\t{source}")
    click.echo(f"(third-party backends register under the entry-point group {ENTRY_POINT_GROUP!r})")
