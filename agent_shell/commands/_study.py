"""What ``probe`` and ``recover`` share: the backbone options, and one :func:`play_study` that opens
the environment, builds the study's actors (:class:`agent_shell.pipeline.StudyAgents`: the backbone
loaded once), shows progress and turns a resume conflict or a set-up error into a one-line error
(see :mod:`agent_shell.studies` for the studies themselves)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import click

from agent_shell.commands._common import cli_errors, config_options
from agent_shell.pipeline import StudyAgents
from agent_shell.run_config import RunConfig
from envs.protocol import Environment

#: = :data:`agent_shell.studies.STUDY_ACTORS` (kept here so ``--help`` imports nothing heavy).
ACTORS = ("react", "prior-only", "cb-agent")

_BACKBONE = ("model", "dtype", "device", "demo_split", "demos_per_type", "layout", "calibrator", "cache_dir", "seed")
_SEED = {"help": "Seed of the agents' generations and of the shuffle renderings."}
#: The backbone options of a study; the command receives them as one ``config:`` :class:`RunConfig`
#: (its ``env`` and ``rendering`` are set per study and per rendering).
study_options = config_options(*_BACKBONE, seed=_SEED)
#: The options of a study that plays episodes (``recover``): also ``--episode-timeout``.
episode_study_options = config_options(*_BACKBONE, "episode_timeout", seed=_SEED)


def play_study(study: str, out: str, keys: set[tuple[str, str, str, str]], resume: bool, config: RunConfig,
               task_types: set[str], actors: tuple[str, ...], last: Callable[[dict], str],
               echo: Callable[[str], None],
               play: Callable[[Environment, StudyAgents, dict, Callable[[dict | None], None]], list[dict]],
               settings: Mapping[str, Any] | None = None) -> list[dict]:
    """Play the (item, condition, rendering, actor) ``keys`` of ``study`` into ``out``.

    First checks ``out`` (:func:`agent_shell.studies.pending_keys`): a rerun without ``resume`` is
    refused, so is a resume whose finished lines were played with another env, dtype, seed,
    demonstrations or layout than ``config`` (or other ``settings``, e.g. the recovery's
    new_actions; the backbone's name is compared once it has loaded), and with nothing pending
    nothing loads. Otherwise opens ``config.env``, builds an
    :class:`agent_shell.pipeline.StudyAgents` (concepts only when ``cb-agent`` is an actor), and calls
    ``play(env, factory, meta, on_record)`` under a progress bar over ``keys`` whose last column
    is ``last(record)``. Returns what ``play`` returns (the records written; [] when none pending).

    Raises:
        click.ClickException: a resume conflict, or ``play`` raised ValueError or FileNotFoundError
            (e.g. an unknown condition, a demonstrations split the env lacks).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    from agent_shell.progress import progress_bar

    from agent_shell import studies
    from envs import make_env

    run_meta = {"env": config.env, "dtype": config.dtype, "seed": config.seed, "demos_per_type": config.demos_per_type,
                "demo_split": config.demo_split}  # every line's; with the backbone's name once it has loaded
    if resume:  # a torn last line of an interrupted study: aside, the rest byte for byte
        from agent_shell.results import repair_for_resume

        repair_for_resume(out, echo)
    try:
        shared = {**run_meta, "layout": config.layout, **(settings or {})}
        if not studies.pending_keys(out, study, keys, resume, shared):
            return []
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    env = make_env(config.env)
    try:
        factory = StudyAgents(config, env, "cb-agent" in actors, task_types, echo)
        meta = {"env": config.env, "model": factory.lm.name, **run_meta}  # key order: env, model, dtype, ...
        progress = progress_bar(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.fields[last]}"))
        bar = progress.add_task(study, total=len(keys), last="")

        def on_record(record: dict | None) -> None:
            progress.update(bar, advance=1, last="" if record is None else last(record))

        with cli_errors(), progress:
            return play(env, factory, meta, on_record)
    finally:
        env.close()


__all__ = ["ACTORS", "episode_study_options", "play_study", "study_options"]
