"""What ``probe`` and ``recover`` share: the backbone options, the agent factory, and one
:func:`play_study` that opens the environment, loads the backbone once, shows progress and turns a
resume conflict into a one-line error (see :mod:`agent_shell.studies` for the studies themselves)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Callable

import click

#: = :data:`agent_shell.studies.STUDY_ACTORS` (kept here so ``--help`` imports nothing heavy).
ACTORS = ("react", "prior-only", "cb-agent")


@dataclass(frozen=True)
class StudyBackbone:
    """The backbone and demonstration options of a study (``--model`` ... ``--seed``)."""

    model: str | None
    dtype: str
    demo_split: str
    demos_per_type: int
    layout: str
    cache_dir: str | None
    seed: int


def study_options(fn: Callable) -> Callable:
    """Add the backbone options; the command receives them as one ``backbone:`` :class:`StudyBackbone`."""
    names = [f.name for f in fields(StudyBackbone)]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        backbone = StudyBackbone(**{name: kwargs.pop(name) for name in names})
        return fn(backbone=backbone, **kwargs)

    options = [
        click.option("--model", default=None, help="Backbone name or local path (default: the offline "
                     "SmolLM2-135M-Instruct)."),
        click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto",
                     show_default=True, help="Backbone dtype (auto: bfloat16 only where it is native)."),
        click.option("--demo-split", default="train", show_default=True,
                     help="Split the expert demonstrations (and concept data) come from."),
        click.option("--demos-per-type", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Won expert trajectories per task type (ReAct demos and concept data)."),
        click.option("--layout", type=click.Choice(["text", "chat"]), default="text", show_default=True,
                     help="One text prompt, or user/assistant chat messages."),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help="Cache for expert trajectories, features, concepts and reviews "
                          "(default: $CB_AGENT_CACHE or ~/.cache/cb-agent)."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of the agents' generations "
                     "and of the shuffle renderings."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class AgentFactory:
    """Builds a study's agents on demand: one :func:`prepare` per rendering (demonstrations, and
    concepts when ``need_concepts``), one shared backbone with scoring and review views."""

    def __init__(self, env_name: str, env: Any, backbone: StudyBackbone, need_concepts: bool,
                 task_types: set[str], echo: Callable[[str], None]):
        from agent_shell.lm import load_language_model

        self.env_name, self.env, self.backbone = env_name, env, backbone
        self.need_concepts, self.task_types, self.echo = need_concepts, task_types, echo
        self.lm = load_language_model(backbone.model, dtype=backbone.dtype)
        self.scorer = self.lm.fork()  # each stream of contexts keeps its own KV cache
        self.reviewer = self.lm.fork()
        self.setups: dict[str, Any] = {}

    def setup(self, rendering: str) -> Any:
        from agent_shell.commands._common import prepare

        b = self.backbone
        if rendering not in self.setups:
            self.setups[rendering] = prepare(
                self.env_name, None, "auto", b.demo_split, b.demos_per_type, rendering, 1.0, 0.8, b.cache_dir,
                need_concepts=self.need_concepts, echo=self.echo, env=self.env, lm=self.lm,
                task_types=self.task_types, layout=b.layout)
        return self.setups[rendering]

    def __call__(self, rendering: str, actor: str) -> Any:
        from agent_shell.agents import AgentConfig, CBAgent, ReActAgent

        setup = self.setup(rendering)
        config = AgentConfig.for_env(self.env_name, rendering=rendering, layout=self.backbone.layout,
                                     seed=self.backbone.seed)
        if actor == "react":
            return ReActAgent(setup.lm, setup.demos, config, self.reviewer)
        concepts = setup.concepts if actor == "cb-agent" else None
        if actor == "cb-agent" and concepts is None:
            raise click.ClickException("cb-agent needs concepts (internal: the factory was built without them)")
        return CBAgent(setup.lm, setup.demos, concepts, config, self.scorer, self.reviewer)


def play_study(study: str, out: str, keys: set[tuple[str, str, str, str]], resume: bool, env_name: str,
               task_types: set[str], actors: tuple[str, ...], backbone: StudyBackbone, last: Callable[[dict], str],
               echo: Callable[[str], None],
               play: Callable[[Any, AgentFactory, dict, Callable[[dict | None], None]], list[dict]]) -> list[dict]:
    """Play the (item, condition, rendering, actor) ``keys`` of ``study`` into ``out``.

    First checks ``out`` (:func:`agent_shell.studies.pending_keys`): a rerun without ``resume`` is
    refused, and with nothing pending nothing loads. Otherwise opens ``env_name``, builds an
    :class:`AgentFactory` (concepts only when ``cb-agent`` is an actor), and calls
    ``play(env, factory, meta, on_record)`` under a progress bar over ``keys`` whose last column
    is ``last(record)``. Returns what ``play`` returns (the records written; [] when none pending).

    Raises:
        click.ClickException: a resume conflict, or ``play`` raised ValueError (e.g. an unknown condition).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agent_shell import studies
    from agent_shell.lm.dtypes import dtype_name
    from envs import make_env

    try:
        if not studies.pending_keys(out, study, keys, resume):
            return []
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    env = make_env(env_name)
    try:
        factory = AgentFactory(env_name, env, backbone, "cb-agent" in actors, task_types, echo)
        meta = {"env": env_name, "model": factory.lm.name, "dtype": dtype_name(backbone.dtype),
                "seed": backbone.seed, "demos_per_type": backbone.demos_per_type, "demo_split": backbone.demo_split}
        progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.fields[last]}"))
        bar = progress.add_task(study, total=len(keys), last="")

        def on_record(record: dict | None) -> None:
            progress.update(bar, advance=1, last="" if record is None else last(record))

        try:
            with progress:
                return play(env, factory, meta, on_record)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    finally:
        env.close()


__all__ = ["ACTORS", "AgentFactory", "StudyBackbone", "play_study", "study_options"]
