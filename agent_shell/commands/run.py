"""``cb-agent run``: the main job. Agents play evaluation games; one JSONL line per episode.

On embedded defaults (``cb-agent run --env alfworld --agent cb-agent``): the offline SmolLM2
backbone; two won expert trajectories per task type from ALFWorld's train split (collected
once into the cache) as ReAct demonstrations and concept data; concepts fitted per task type
(features and concepts cached); the first valid_unseen game of the first two task types (a
smoke-sized slice); a 50-step budget with think steps counted. ``--per-type 5 --games 0`` gives
the 30-game evaluation (five per type); ``--all-games`` (= ``--per-type 0 --games 0``) the whole
split (ALFWorld valid_unseen: 134 games). The options form one :class:`RunConfig`, whose settings
every results line records.
"""

from __future__ import annotations

import time

import click

from agent_shell.commands._common import COMMON_OPTIONS, RUN_OPTIONS, config_options, make_console, prepare
from agent_shell.run_config import RunConfig


@click.command()
@config_options(*COMMON_OPTIONS, *RUN_OPTIONS)
def run(config: RunConfig) -> None:
    """Run agents on evaluation games; print the success table and write a chart."""
    from agent_shell.agents import AgentConfig, build_agent, needs_concepts
    from agent_shell.reporting import bar_chart, rich_table, summarize
    from agent_shell.runner import check_results_file, make_progress, read_results, run_episodes
    from envs import make_env

    console = make_console()
    results_path = config.results_path
    settings = config.settings()
    env = make_env(config.env)
    try:
        task_ids = config.task_ids(env)
        type_of = getattr(env, "task_type_of", None)
        try:  # refuse a results file that cannot be continued before loading anything heavy
            check_results_file(results_path, config.agents, task_ids, config.resume, settings)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        setup = prepare(config, any(needs_concepts(a) for a in config.agents), echo=console.print, env=env,
                        task_types=None if type_of is None else {type_of(t) for t in task_ids})
        agent_config = AgentConfig.for_env(config.env, rendering=config.rendering, layout=config.layout,
                                           action_space=config.action_space, seed=config.seed)
        meta = {**settings, "model": setup.lm.name,
                "concepts_dir": str(setup.concepts_dir) if setup.concepts_dir else None}
        console.print(f"{len(task_ids)} {config.split} games x {len(config.agents)} agent(s), budget {config.budget} "
                      f"steps (think steps included) -> {results_path}")
        scorer = setup.lm.fork()  # scoring contexts and routing prompts keep separate KV caches
        reviewer = setup.lm.fork() if config.rendering == "experience" else None
        start = time.perf_counter()
        with make_progress() as progress:
            for name in config.agents:
                agent = build_agent(name, setup.lm, setup.demos, setup.concepts, agent_config,
                                    config.reflexion_trials, scorer, reviewer)
                summary = run_episodes(env, agent, task_ids, results_path, config.budget, resume=config.resume,
                                       meta=meta, progress=progress)
                if summary.skipped:
                    console.print(f"{name}: {len(summary.skipped)} finished episodes skipped (--resume)")
        console.print(f"episodes took {time.perf_counter() - start:.1f} s; set-up "
                      + ", ".join(f"{k} {v:.1f}" for k, v in setup.timings.items()))
    finally:
        env.close()
    records = [r for r in read_results(results_path) if r["task_id"] in set(task_ids) and r["agent"] in config.agents]
    rows = summarize(records)
    console.print(rich_table(rows, title=f"{config.env} {config.split}: success per task type"))
    console.print(f"chart: {bar_chart(rows, results_path.with_suffix('.png'))}")
