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
import time
from typing import TYPE_CHECKING, Any, Callable

import click

from agent_shell.commands._common import (COMMON_OPTIONS, RUN_OPTIONS, check_ray_start, cli_errors, config_options,
                                          make_console, task_error)
from agent_shell.configure import task_ids as configured_task_ids
from agent_shell.pipeline import players_of, set_up
from agent_shell.run_config import RunConfig, check_not_demos

if TYPE_CHECKING:
    from rich.console import Console
    from envs.protocol import Environment


@click.command()
@config_options(*COMMON_OPTIONS, *RUN_OPTIONS)
def run(config: RunConfig) -> None:
    """Run agents on evaluation games; print the success table and write a chart."""
    from agent_shell.charts import bar_chart
    from agent_shell.reporting import describe_run, rich_table, summarize
    from agent_shell.results import check_results_file, read_results, repair_for_resume
    from envs import make_env

    console = make_console()
    if config.calibrator is not None and config.rendering != "calibrator":
        raise click.UsageError(f"--calibrator {config.calibrator} is used only with --history calibrator")
    check_ray_start(config)
    results_path = config.results_path
    settings = config.settings()
    env = make_env(config.env)
    try:
        try:  # game ids, splits and the demonstrations' split, before any engine or model loads
            task_ids = configured_task_ids(config, env)
        except ValueError as err:
            raise task_error(env, config.split, err) from None
        type_of = getattr(env, "task_type_of", None)
        if config.resume:
            repair_for_resume(results_path, console.print)
        try:  # refuse a results file that cannot be continued before loading anything heavy
            finished = check_results_file(results_path, config.agents, task_ids, config.resume, settings,
                                          config.keep_errors)
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


def _play(config: RunConfig, env: Environment, task_ids: list[str], type_of: Callable[[str], str] | None,
          settings: dict[str, Any], console: Console) -> None:
    """Set up (demonstrations, features, concepts, backbone) and play ``config``'s unfinished
    episodes of ``task_ids``, sequentially or on Ray workers, appending to its results file."""
    from agent_shell.lm.protocol import BackboneFault
    from agent_shell.parallel import play_on_ray, uses_ray
    from agent_shell.progress import interactive
    from agent_shell.scheduler import InProcessExecutor, make_progress, play_episodes
    from cb_io.storage import OutputError

    results_path = config.results_path
    task_types = None if type_of is None else sorted({type_of(t) for t in task_ids})
    with cli_errors():
        setup = set_up(config, env, task_types, console.print)
    if config.split == config.demo_split:  # explicit --game ids: never one of the demonstrations' games
        try:
            check_not_demos(task_ids, [t.task_id for t in setup.demo_trajectories])
        except ValueError as err:
            raise click.ClickException(str(err)) from None
    meta = {**settings, "model": setup.lm.name, "device": config.device,  # provenance, not compared on resume
            "concepts_dir": str(setup.concepts_dir) if setup.concepts_dir else None}
    console.print(f"{len(task_ids)} {config.split} games x {len(config.agents)} agent(s), budget {config.budget} "
                  f"steps (think steps included) -> {results_path}")
    start = time.perf_counter()
    # a bar on a terminal (none in a log, CI, nohup), and one plain line per finished episode
    progress = make_progress() if interactive() else None

    def say(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    try:
        with progress if progress is not None else contextlib.nullcontext():
            if uses_ray(config):
                setup.lm = None  # the workers load their own backbones, or share the server's
                summaries = play_on_ray(config, task_ids, task_types, results_path, meta, resume=config.resume,
                                        task_type_of=type_of, progress=progress, echo=say)
            else:
                summaries = play_episodes(InProcessExecutor(env, players_of(config, setup)), config.agents,
                                          task_ids, results_path, config.budget, resume=config.resume, meta=meta,
                                          task_type_of=type_of, progress=progress, echo=say,
                                          time_limit=config.episode_timeout, keep_errors=config.keep_errors)
    except (OutputError, BackboneFault) as err:  # a full disk (--resume continues), a broken backbone
        raise click.ClickException(str(err)) from None
    for name, summary in summaries.items():
        if summary.skipped:
            console.print(f"{name}: {len(summary.skipped)} finished episodes skipped (--resume)")
        if summary.n_errors:
            console.print(f"{name}: {summary.n_errors} episode(s) ended by an engine fault or failed every "
                          "attempt (recorded as errors, counted apart from won and lost)")
    console.print(f"episodes took {time.perf_counter() - start:.1f} s; set-up "
                  + ", ".join(f"{k} {v:.1f}" for k, v in setup.timings.items()))
