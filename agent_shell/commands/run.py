"""``cb-agent run``: the main job. Agents play evaluation games; one JSONL line per episode.

On embedded defaults (``cb-agent run --env alfworld --agent cb-agent``): the offline SmolLM2
backbone; two won expert trajectories per task type from ALFWorld's train split (collected
once into the cache) as ReAct demonstrations and concept data; concepts fitted per task type
(features and concepts cached); the first valid_unseen game of the first two task types (a
smoke-sized slice); a 50-step budget with think steps counted. ``--per-type 5 --games 0`` gives
the 30-game evaluation (five per type); ``--all-games`` (= ``--per-type 0 --games 0``) the whole
split (ALFWorld valid_unseen: 134 games). The options form one :class:`RunConfig`, whose settings
every results line records. Episodes are played in :mod:`agent_shell.scheduler`'s order;
``--workers N`` plays N at once on Ray workers (:mod:`agent_shell.parallel`), each building its
own env and backbone from the caches this process filled (demonstrations, features, concepts).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, Collection

import click

from agent_shell.commands._common import (COMMON_OPTIONS, RUN_OPTIONS, config_options, fit_from_trajectories,
                                          make_console, prepare)
from agent_shell.history import REVIEWED
from agent_shell.run_config import RunConfig, check_not_demos


@click.command()
@config_options(*COMMON_OPTIONS, *RUN_OPTIONS)
def run(config: RunConfig) -> None:
    """Run agents on evaluation games; print the success table and write a chart."""
    from agent_shell.results import repair_for_resume
    from agent_shell.commands.tasks import task_error
    from agent_shell.reporting import bar_chart, describe_run, rich_table, summarize
    from agent_shell.results import check_results_file, read_results
    from envs import make_env

    console = make_console()
    if config.calibrator is not None and config.rendering != "calibrator":
        raise click.UsageError(f"--calibrator {config.calibrator} is used only with --history calibrator")
    results_path = config.results_path
    settings = config.settings()
    env = make_env(config.env)
    try:
        try:  # game ids, splits and the demonstrations' split, before any engine or model loads
            task_ids = config.task_ids(env)
        except ValueError as err:
            raise task_error(env, config.split, err) from None
        type_of = getattr(env, "task_type_of", None)
        if config.resume:
            repair_for_resume(results_path, console.print)
        try:  # refuse a results file that cannot be continued before loading anything heavy
            finished = check_results_file(results_path, config.agents, task_ids, config.resume, settings)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        if all(done >= set(task_ids) for done in finished.values()):  # --resume of a finished run: nothing to load
            console.print(f"nothing left to play: all {len(task_ids) * len(config.agents)} episodes are in "
                          f"{results_path} (--resume)")
        else:
            _play(config, env, task_ids, type_of, settings, console)
    finally:
        env.close()
    records = [r for r in read_results(results_path) if r["task_id"] in set(task_ids) and r["agent"] in config.agents]
    rows = summarize(records)
    title = describe_run(records)
    console.print(rich_table(rows, title=f"{title}: success per task type"))
    console.print(f"chart: {bar_chart(rows, results_path.with_suffix('.png'), f'{title}: success rate by task type')}")


def _play(config: RunConfig, env: Any, task_ids: list[str], type_of: Any, settings: dict[str, Any],
          console: Any) -> None:
    """Set up (demonstrations, features, concepts, backbone) and play ``config``'s unfinished
    episodes of ``task_ids``, sequentially or on Ray workers, appending to its results file."""
    from agent_shell.progress import interactive
    from agent_shell.scheduler import InProcessExecutor, make_progress, play_episodes

    results_path = config.results_path
    task_types = None if type_of is None else sorted({type_of(t) for t in task_ids})
    setup = set_up(config, env, task_types, console.print)
    if config.split == config.demo_split:  # explicit --game ids: never one of the demonstrations' games
        try:
            check_not_demos(task_ids, [t.task_id for t in setup.demo_trajectories])
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    meta = {**settings, "model": setup.lm.name,
            "concepts_dir": str(setup.concepts_dir) if setup.concepts_dir else None}
    console.print(f"{len(task_ids)} {config.split} games x {len(config.agents)} agent(s), budget {config.budget} "
                  f"steps (think steps included) -> {results_path}")
    start = time.perf_counter()
    # a bar on a terminal (none in a log, CI, nohup), and one plain line per finished episode
    progress = make_progress() if interactive() else None

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    with progress if progress is not None else contextlib.nullcontext():
        if config.workers > 1 or config.ray_address or config.shared_lm:
            setup.lm = None  # the workers load their own backbones, or share the server's
            summaries = run_on_ray(config, task_ids, task_types, type_of, meta, progress, say)
        else:
            summaries = play_episodes(InProcessExecutor(env, players_of(config, setup)), config.agents, task_ids,
                                      results_path, config.budget, resume=config.resume, meta=meta,
                                      task_type_of=type_of, progress=progress, echo=say)
    for name, summary in summaries.items():
        if summary.skipped:
            console.print(f"{name}: {len(summary.skipped)} finished episodes skipped (--resume)")
        if summary.n_errors:
            console.print(f"{name}: {summary.n_errors} episode(s) ended by an engine fault or failed every "
                          "attempt (recorded as errors, counted apart from won and lost)")
    console.print(f"episodes took {time.perf_counter() - start:.1f} s; set-up "
                  + ", ".join(f"{k} {v:.1f}" for k, v in setup.timings.items()))


def run_on_ray(config: RunConfig, task_ids: list[str], task_types: list[str] | None, type_of: Any,
               meta: dict[str, Any], progress: Any, echo: Any) -> dict[str, Any]:
    """``config``'s episodes on Ray workers (:class:`agent_shell.parallel.RayExecutor`); with
    ``--shared-lm`` the workers share one backbone behind an ``LMServer`` actor. Returns agent
    name -> :class:`agent_shell.scheduler.RunSummary`."""
    from agent_shell.parallel import RayExecutor, start_ray
    from agent_shell.scheduler import play_episodes

    owns_ray = start_ray(config.workers + int(config.shared_lm), config.ray_address)  # + the server's CPU
    try:
        server = None
        if config.shared_lm:
            import torch

            from agent_shell.lm.server import start_lm_server

            server = start_lm_server(config.model, config.dtype, num_gpus=int(torch.cuda.is_available()), threads=1)
        players = functools.partial(build_players, config, task_types, server)
        return play_episodes(RayExecutor(players, config.workers, config.ray_address), config.agents, task_ids,
                             config.results_path, config.budget, resume=config.resume, meta=meta,
                             task_type_of=type_of, progress=progress, echo=echo)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()


def set_up(config: RunConfig, env: Any, task_types: Collection[str] | None, echo: Any, lm: Any = None) -> Any:
    """The run's set-up (:func:`prepare`; with an ICAL memory, its retrieved demonstrations and,
    concept data "ical", concepts fitted on its won examples); the driver and every parallel
    worker build it alike (the workers from the caches the driver filled)."""
    from agent_shell.agents import needs_concepts

    need_concepts = any(needs_concepts(a) for a in config.agents)
    setup = prepare(config, need_concepts and config.concept_data == "expert", echo=echo, env=env,
                    task_types=task_types, lm=lm)
    if config.ical_memory is not None:
        setup.demos, ical_trajectories = ical_setup(config, task_types, need_concepts)
        kept = ("; the expert trajectories above stay the concept's data"
                if need_concepts and config.concept_data == "expert" else "")
        echo(f"ReAct demonstrations: {config.demos_per_type} retrieved per game from the ICAL memory "
             f"{config.ical_memory} ({len(setup.demos.memory)} examples) in place of the expert ones{kept}")
        if need_concepts and config.concept_data == "ical":
            setup.features, setup.concepts, setup.concepts_dir = fit_from_trajectories(
                config, setup.lm, ical_trajectories, setup.cache, echo, setup.timings)
    return setup


def ical_setup(config: RunConfig, task_types: Collection[str] | None, need_concepts: bool) -> tuple[Any, list]:
    """(retrieved demonstrations, the memory's won trajectories of ``task_types`` as concept data)
    of ``config``'s ICAL memory.

    Raises click.ClickException for an empty memory, or (concept data "ical") a played task type
    without an example."""
    from agent_shell.embeddings import SentenceEmbedder
    from agent_shell.ical import Memory
    from agent_shell.ical.acting import RetrievedDemos, demos_with_thoughts, examples_by_type

    memory = Memory(config.ical_memory, SentenceEmbedder(), on_malformed=lambda msg: click.echo(msg, err=True))
    try:
        demos = RetrievedDemos(memory, k=config.demos_per_type, rendering=config.rendering,
                               thoughts=demos_with_thoughts(config.demos))
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    groups = examples_by_type(memory)
    missing = sorted(set(task_types or ()) - set(groups))
    if need_concepts and config.concept_data == "ical" and missing:
        raise click.ClickException(f"the ICAL memory {config.ical_memory} has no example of {', '.join(missing)} to "
                                   "fit its concept; use --concept-data expert")
    return demos, [e.trajectory for t in sorted(groups) if task_types is None or t in task_types for e in groups[t]]


def players_of(config: RunConfig, setup: Any) -> dict[str, Any]:
    """Agent name -> agent over ``setup``'s backbone (routing, scoring and reviews on separate
    KV caches), demonstrations and concepts."""
    from agent_shell.agents import AgentConfig, build_agent

    # prior-only acts with the run's gamma (a concept carries its own fit's gamma)
    agent_config = AgentConfig.for_env(config.env, rendering=config.rendering, layout=config.layout,
                                       action_space=config.action_space, seed=config.seed, gamma=config.gamma)
    scorer = setup.lm.fork()  # scoring contexts and routing prompts keep separate KV caches
    reviewer = setup.lm.fork() if config.rendering in REVIEWED else None
    return {name: build_agent(name, setup.lm, setup.demos, setup.concepts, agent_config, config.reflexion_trials,
                              scorer, reviewer, setup.calibrator, config.feature_set) for name in config.agents}


def build_players(config: RunConfig, task_types: list[str] | None, server: Any = None) -> tuple[Any, dict[str, Any]]:
    """A parallel worker's env and agents (:data:`agent_shell.parallel.MakePlayers`): the same
    set-up as the driver's, read from the caches the driver filled; with ``server`` (an
    :class:`agent_shell.lm.server.LMServer` handle) the agents use it and no model is loaded."""
    import torch

    torch.set_num_threads(1)  # one CPU per worker
    lm = None
    if server is not None:
        from agent_shell.lm.server import RemoteLM

        lm = RemoteLM(server)
    setup = set_up(config, None, task_types, lambda line: None, lm)
    return setup.env, players_of(config, setup)
