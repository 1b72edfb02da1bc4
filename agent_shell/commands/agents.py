"""``cb-agent agents``: the agents ``run --agent`` can play (built-in and plug-ins), and what each needs."""

from __future__ import annotations

import click


@click.command()
def agents() -> None:
    """List agents: name, where it comes from, what it needs (concepts, scoring_lm, reviewer)."""
    from agent_shell.agents.registry import ENTRY_POINT_GROUP, agent_entry, available_agents

    for name, source in available_agents().items():
        try:
            needs = ", ".join(sorted(agent_entry(name).needs)) or "-"
        except ValueError as err:  # a plug-in that fails to load is listed with its error
            needs = f"unusable: {err}"
        click.echo(f"{name}\t{source}\t{needs}")
    click.echo(f"(third-party agents register an AgentEntry under the entry-point group {ENTRY_POINT_GROUP!r})")
