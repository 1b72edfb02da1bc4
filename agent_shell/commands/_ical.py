"""What the ``cb-agent ical`` sub-commands share: their options (``--k``, decoding, notes,
``--episode-timeout``... gathered into one :class:`agent_shell.ical.learn.LearnConfig`), the
one-line errors, the resumable outputs, the backbone, the memory and the progress bar."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import click

from agent_shell.commands._common import COMMON_OPTIONS, RUN_OPTIONS, check_backbone, cli_errors

if TYPE_CHECKING:
    from agent_shell.ical.memory import Memory
    from agent_shell.lm.protocol import LanguageModel
    from agent_shell.run_config import RunConfig


def _fail(fn: Callable) -> Callable:
    """Run ``fn`` under :func:`agent_shell.commands._common.cli_errors` (bad input: one line)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        with cli_errors():
            return fn(*args, **kwargs)

    return wrapper


def _done_keys(path: Path, resume: bool, wanted: Iterable[str], elsewhere: str = "choose another --out") -> set[str]:
    """:func:`agent_shell.ical.noisy.finished_ids`, unreadable lines reported on standard error."""
    from agent_shell.ical.noisy import finished_ids

    return finished_ids(path, resume, wanted, elsewhere, on_skipped=lambda msg: click.echo(msg, err=True))


def _check_split(env_name: str, split: str) -> None:
    """A one-line error (and how to list the splits) for an unknown split, without starting the engine."""
    from agent_shell.commands.tasks import validated_tasks
    from envs import make_env

    env = make_env(env_name)
    try:
        validated_tasks(env, split, [])
    finally:
        env.close()


def _progress():
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from agent_shell.progress import progress_bar

    return progress_bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[note]}"), TimeElapsedColumn())


def _load_lm(config: RunConfig) -> LanguageModel:
    """The backbone of the command's settings (device and dtype resolved as every command's),
    checked first (:func:`agent_shell.commands._common.check_backbone`)."""
    from agent_shell.lm import load_language_model

    check_backbone(config.model, config.device)
    return load_language_model(config.model, dtype=config.dtype, device=config.device)


def _memory(folder: str | None, need_embedder: bool = True) -> Memory | None:
    if folder is None:
        return None
    from agent_shell.embeddings import SentenceEmbedder
    from agent_shell.ical import Memory

    return Memory(folder, SentenceEmbedder() if need_embedder else None,
                  on_malformed=lambda msg: click.echo(msg, err=True))


#: The backbone options (the same as every command's that loads one).
model_options = [COMMON_OPTIONS[name] for name in ("model", "dtype", "device")]


#: Options several sub-commands share.
max_new_tokens_option = click.option("--max-new-tokens", type=click.IntRange(min=1), default=400, show_default=True,
                                     help="Token cap of each LM reply.")
decoding_option = click.option("--decoding", type=click.Choice(["free", "constrained", "anchored"]), default="free",
                               show_default=True,
                               help="How programs are written: free generation; constrained (lines by a grammar, "
                                    "actions from the admissible commands of a scratch game); anchored (constrained, "
                                    "the action options anchored to the noisy record's next actions).")
extra_actions_option = click.option("--extra-actions", type=click.IntRange(min=0), default=5, show_default=True,
                                    help="Constrained and anchored decoding stop a program at the noisy record's "
                                         "number of actions plus this many.")
notes_option = click.option("--notes", type=click.Choice(["inline", "chat"]), default="inline", show_default=True,
                            help="Constrained decoding's annotations: the LM continues the program text (inline), or "
                                 "answers a short chat request per note (chat).")
prompt_examples_option = click.option("--k", type=click.IntRange(min=0), default=2, show_default=True,
                                      help="Retrieved examples per prompt.")
#: ``--episode-timeout``: each game played for an input (none with ``--human``).
episode_timeout_option = RUN_OPTIONS["episode_timeout"]


def _with(options: list) -> Callable:
    def deco(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return deco


def _learn_options(fn: Callable) -> Callable:
    """How programs are written and played: the options of :class:`agent_shell.ical.learn.LearnConfig`
    (with ``--k`` and ``--max-rounds`` where the command has them), given to the command as one
    ``learn:``; a bad combination is a one-line error before anything loads."""
    import functools

    @functools.wraps(fn)
    def command(**kwargs: object) -> object:
        from agent_shell.ical.learn import LearnConfig

        names = ("k", "max_rounds", "max_new_tokens", "decoding", "notes", "extra_actions", "episode_timeout")
        try:
            config = LearnConfig(**{name: kwargs.pop(name) for name in names if name in kwargs})
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        return fn(learn=config, **kwargs)

    return _with([max_new_tokens_option, decoding_option, notes_option, extra_actions_option,
                  episode_timeout_option])(command)


__all__ = ["decoding_option", "episode_timeout_option", "extra_actions_option", "max_new_tokens_option",
           "model_options", "notes_option", "prompt_examples_option"]
