"""The ``cb-agent`` command line (click).

Sub-commands live in :mod:`agent_shell.commands`, one module each, and are imported only when
invoked, so ``cb-agent --help`` stays fast (no torch, JAX or game engine import).
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from typing import Iterator

import click

# name -> "module:attribute" of a click.Command
COMMANDS: dict[str, str] = {
    "fit": "agent_shell.commands.fit:fit",
    "collect": "agent_shell.commands.collect:collect",
    "fit-concepts": "agent_shell.commands.fit_concepts:fit_concepts",
    "eval-decisions": "agent_shell.commands.eval_decisions:eval_decisions",
    "concepts-tsne": "agent_shell.commands.concepts_tsne:concepts_tsne",
    "concept-data-size": "agent_shell.commands.concepts_tsne:concept_data_size",
    "run": "agent_shell.commands.run:run",
    "improve": "agent_shell.commands.improve:improve",
    "report": "agent_shell.commands.report:report",
    "view": "agent_shell.commands.view:view",
    "probe": "agent_shell.commands.probe:probe",
    "recover": "agent_shell.commands.recover:recover",
    "ical": "agent_shell.commands.ical:ical",
    "tasks": "agent_shell.commands.tasks:tasks",
    "backends": "agent_shell.commands.backends:backends",
    "features": "agent_shell.commands.features:features",
    "agents": "agent_shell.commands.agents:agents",
    "calibrate": "agent_shell.commands.calibrate:calibrate",
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:  # the command itself is not built yet
                return None
            raise
        return getattr(module, attr)

    def invoke(self, ctx: click.Context):
        """Run the sub-command; an environment that cannot start where it is installed
        (:class:`cb_io.records.SetupError`, e.g. its game files not found) or an output that cannot be
        written (:class:`cb_io.storage.OutputError`: a full disk, a file where its folder would be) is one
        error line, no traceback."""
        from cb_io.records import SetupError
        from cb_io.storage import OutputError

        try:
            return super().invoke(ctx)
        except (SetupError, OutputError) as err:
            raise click.ClickException(str(err)) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cb-agent")
def main() -> None:
    """CB-Agent: language-model agents that learn concepts from expert demonstrations."""
    warnings.showwarning = plain_warning
    if not sys.stderr.isatty():  # a log, CI, nohup: no model-loading bars (transformers and the hub read this)
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def leaf_commands(group: click.Group | None = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """(``"group sub"`` path, command) of every leaf command under ``group`` (None: ``cb-agent``),
    in listing order; each command module is imported."""
    group = main if group is None else group
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from leaf_commands(command, path + (name,))
        elif command is not None:
            yield " ".join(path + (name,)), command


def plain_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one plain line on stderr (``warning: ...``), not Python's file:line + source form,
    which reads like a crash (e.g. a skipped torn line in a results file)."""
    kind = "" if category is UserWarning else f" ({category.__name__})"
    click.echo(f"warning{kind}: {message}", err=True)


if __name__ == "__main__":
    main()
