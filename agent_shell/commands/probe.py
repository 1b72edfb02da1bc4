"""``cb-agent probe``: the repetition probe of issue 5 (see :mod:`agent_shell.studies`).

Fixed histories mined from results files of ``cb-agent run`` end in two identical environment
actions whose feedback does not support repeating them; each actor is asked for its next action
under each history rendering, and the table reports how often it repeats. One JSON line per
(item, rendering, actor); ``--resume`` continues an interrupted probe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from agent_shell.commands._common import RENDERING_NAMES, make_console

#: = :data:`agent_shell.studies.STUDY_ACTORS` (kept here so ``--help`` imports nothing heavy).
ACTORS = ("react", "prior-only", "cb-agent")


def study_options(fn: Callable) -> Callable:
    """Backbone and demonstration options shared by ``probe`` and ``recover``."""
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
        fn = option(fn)
    return fn


class AgentFactory:
    """Builds a study's agents on demand: one :func:`prepare` per rendering (demonstrations, and
    concepts when ``need_concepts``), one shared backbone with scoring and review views."""

    def __init__(self, env_name: str, env: Any, model: str | None, dtype: str, demo_split: str,
                 demos_per_type: int, layout: str, cache_dir: str | None, seed: int, need_concepts: bool,
                 task_types: set[str], echo: Callable[[str], None]):
        from agent_shell.commands._common import resolve_dtype, scoring_view
        from agent_shell.lm import load_language_model

        self.env_name, self.env, self.demo_split, self.demos_per_type = env_name, env, demo_split, demos_per_type
        self.layout, self.cache_dir, self.seed, self.need_concepts = layout, cache_dir, seed, need_concepts
        self.task_types, self.echo = task_types, echo
        self.lm = load_language_model(model, dtype=resolve_dtype(dtype))
        self.scorer = scoring_view(self.lm)
        self.reviewer = scoring_view(self.lm)  # its own KV cache
        self.setups: dict[str, Any] = {}

    def setup(self, rendering: str) -> Any:
        from agent_shell.commands._common import prepare

        if rendering not in self.setups:
            self.setups[rendering] = prepare(
                self.env_name, None, "auto", self.demo_split, self.demos_per_type, rendering, 1.0, 0.8, self.cache_dir,
                need_concepts=self.need_concepts, echo=self.echo, env=self.env, lm=self.lm,
                task_types=self.task_types, layout=self.layout)
        return self.setups[rendering]

    def __call__(self, rendering: str, actor: str) -> Any:
        from agent_shell.agents import AgentConfig, CBAgent, ReActAgent

        setup = self.setup(rendering)
        config = AgentConfig.for_env(self.env_name, rendering=rendering, layout=self.layout, seed=self.seed)
        if actor == "react":
            return ReActAgent(setup.lm, setup.demos, config, self.reviewer)
        concepts = setup.concepts if actor == "cb-agent" else None
        if actor == "cb-agent" and concepts is None:
            raise click.ClickException("cb-agent needs concepts (internal: the factory was built without them)")
        return CBAgent(setup.lm, setup.demos, concepts, config, self.scorer, self.reviewer)


def study_progress(total: int, description: str) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.fields[last]}"))
    bar = progress.add_task(description, total=total, last="")
    return progress, bar


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--history", "renderings", type=click.Choice(list(RENDERING_NAMES)), multiple=True,
              default=RENDERING_NAMES, show_default=True, help="Rendering(s) to probe (repeatable).")
@click.option("--actor", "actors", type=click.Choice(ACTORS), multiple=True, default=("react", "prior-only"),
              show_default=True, help="Actor(s) (repeatable); cb-agent fits concepts per rendering.")
@click.option("--max-items", type=click.IntRange(min=0), default=30, show_default=True,
              help="Cap on the mined items (round robin over trajectories); 0 = all.")
@click.option("--out", type=click.Path(dir_okay=False), default="probe/probe.jsonl", show_default=True)
@click.option("--resume/--no-resume", default=False, show_default=True,
              help="Skip (item, rendering, actor) keys already in --out.")
@study_options
def probe(results, renderings, actors, max_items, out, resume, model, dtype, demo_split, demos_per_type, layout,
          cache_dir, seed) -> None:
    """Repetition probe on RESULTS (JSONL files of `cb-agent run`): how often does each actor repeat an
    action that just did nothing, under each history rendering?"""
    from agent_shell import studies
    from agent_shell.commands._common import resolve_dtype
    from envs import make_env

    console = make_console()
    renderings, actors = tuple(dict.fromkeys(renderings)), tuple(dict.fromkeys(actors))
    trials = studies.recorded_trials(results)
    items = studies.mine_probe_items(trials, max_items)
    if not items:
        raise click.ClickException(f"no unsupported repeats with a following environment step in {len(trials)} "
                                   f"trials of {', '.join(results)}")
    env_name = studies.env_name_of([i.recorded for i in items])
    n_traj = len({i.recorded.key for i in items})
    console.print(f"{len(items)} probe items from {n_traj} of {len(trials)} trials x {len(renderings)} rendering(s) "
                  f"x {len(actors)} actor(s) -> {out}")
    env = make_env(env_name)
    try:
        factory = AgentFactory(env_name, env, model, dtype, demo_split, demos_per_type, layout, cache_dir, seed,
                               "cb-agent" in actors, {i.recorded.trajectory.task_type for i in items}, console.print)
        reviews = studies.ReviewCache(factory.reviewer)
        meta = {"env": env_name, "model": factory.lm.name, "dtype": resolve_dtype(dtype), "seed": seed,
                "demos_per_type": demos_per_type, "demo_split": demo_split}
        progress, bar = study_progress(len(items) * len(renderings) * len(actors), "probe")

        def on_record(record: dict | None) -> None:
            last = "" if record is None else (f"{record['rendering']}/{record['agent']}: "
                                              f"{'repeat' if record['repeat'] else record['kind']}")
            progress.update(bar, advance=1, last=last)

        try:
            with progress:
                written = studies.run_probe(items, renderings, actors, factory, out, resume, reviews, meta, on_record)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    finally:
        env.close()
    keys = {(i.key, r, a) for i in items for r in renderings for a in actors}
    records = [r for r in studies.read_study(out, "probe") if (r["item"], r["rendering"], r["agent"]) in keys]
    console.print(f"{len(written)} lines written, {len(keys) - len(written)} already in {out}; "
                  f"{reviews.calls} experience review calls")
    console.print(studies.rate_table(
        studies.probe_rows(records), ("rendering", "actor"), "repeat", "Repetition probe: next action repeats",
        "repeat: the next action equals the repeated one; think/malformed answers count as no repeat; "
        "in set: items whose repeated action is in the fixed action space"))


__all__ = ["ACTORS", "AgentFactory", "probe", "study_options", "study_progress"]
