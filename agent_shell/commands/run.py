"""``cb-agent run``: the main job. Agents play evaluation games; one JSONL line per episode.

On embedded defaults (``cb-agent run --env alfworld --agent cb-agent``): the offline SmolLM2
backbone; two won expert trajectories per task type from ALFWorld's train split (collected
once into the cache) as ReAct demonstrations and concept data; concepts fitted per task type
(features and concepts cached); the first valid_unseen game of the first two task types (a
smoke-sized slice); a 50-step budget with think steps counted. ``--per-type 5 --games 0`` gives
the 30-game evaluation (five per type); ``--all-games`` (= ``--per-type 0 --games 0``) the whole
split (ALFWorld valid_unseen: 134 games).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from agent_shell.agents import AGENT_NAMES
from agent_shell.commands._common import common_options, make_console, prepare


@click.command()
@common_options
@click.option("--agent", "agents", type=click.Choice(AGENT_NAMES), multiple=True, default=("cb-agent",),
              show_default=True, help="Agent(s) to run (repeatable; all share one backbone load).")
@click.option("--split", default="valid_unseen", show_default=True, help="Evaluation split.")
@click.option("--per-type", type=click.IntRange(min=0), default=1, show_default=True,
              help="Evaluation games per task type (first in sorted order); 0 = all.")
@click.option("--all-games", is_flag=True, help="Evaluate the whole split (--per-type 0 --games 0).")
@click.option("--games", "n_games", type=click.IntRange(min=0), default=2, show_default=True,
              help="Cap on the number of games after --per-type (the default slice: the first game "
                   "of the first two task types); 0 = no cap.")
@click.option("--game", "game_ids", multiple=True, help="Explicit game/task id(s) (repeatable; "
              "overrides --per-type/--games).")
@click.option("--max-steps", type=click.IntRange(min=1), default=50, show_default=True,
              help="Step budget per episode (trial), think steps included.")
@click.option("--action-space", type=click.Choice(["fixed", "open"]), default="fixed", show_default=True,
              help="CB-Agent candidates: environment set, or 20 sampled replies.")
@click.option("--reflexion-trials", type=click.IntRange(min=2), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of sampled generations.")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="Results folder (default: runs/<env>-<split>).")
@click.option("--resume/--no-resume", default=False, show_default=True,
              help="Skip episodes already in the results file (after an interruption).")
def run(env_name, model, dtype, demo_split, demos_per_type, rendering, layout, lam, gamma, cache_dir, agents, split,
        per_type, all_games, n_games, game_ids, max_steps, action_space, reflexion_trials, seed, out_dir,
        resume) -> None:
    """Run agents on evaluation games; print the success table and write a chart."""
    from agent_shell.agents import AgentConfig, build_agent, needs_concepts
    from agent_shell.lm.dtypes import dtype_name
    from agent_shell.reporting import bar_chart, rich_table, summarize
    from agent_shell.runner import check_results_file, make_progress, read_results, run_episodes
    from envs import make_env
    from envs.collect import select_tasks

    console = make_console()
    results_path = Path(out_dir or f"runs/{env_name}-{split}") / "results.jsonl"
    env = make_env(env_name)
    try:
        if game_ids:
            task_ids = list(game_ids)
        else:
            task_ids = select_tasks(env, split, None if (all_games or per_type == 0) else per_type)
            task_ids = task_ids[:n_games] if n_games and not all_games else task_ids
        type_of = getattr(env, "task_type_of", None)
        settings = {"env": env_name, "split": split, "dtype": dtype_name(dtype), "seed": seed,
                    "rendering": rendering, "layout": layout, "action_space": action_space,
                    "demos_per_type": demos_per_type, "budget": max_steps}
        try:  # refuse a results file that cannot be continued before loading anything heavy
            check_results_file(results_path, agents, task_ids, resume, settings)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        setup = prepare(env_name, model, dtype, demo_split, demos_per_type, rendering, lam, gamma, cache_dir,
                        need_concepts=any(needs_concepts(a) for a in agents), echo=console.print, env=env,
                        task_types=None if type_of is None else {type_of(t) for t in task_ids}, layout=layout)
        config = AgentConfig.for_env(env_name, rendering=rendering, layout=layout, action_space=action_space,
                                     seed=seed)
        meta = {"env": env_name, "split": split, "model": setup.lm.name, "dtype": dtype_name(dtype), "seed": seed,
                "rendering": rendering, "layout": layout, "action_space": action_space, "demos_per_type": demos_per_type,
                "concepts_dir": str(setup.concepts_dir) if setup.concepts_dir else None}
        console.print(f"{len(task_ids)} {split} games x {len(agents)} agent(s), budget {max_steps} steps "
                      f"(think steps included) -> {results_path}")
        scorer = setup.lm.fork()  # scoring contexts and routing prompts keep separate KV caches
        reviewer = setup.lm.fork() if rendering == "experience" else None
        start = time.perf_counter()
        with make_progress() as progress:
            for name in agents:
                agent = build_agent(name, setup.lm, setup.demos, setup.concepts, config, reflexion_trials, scorer,
                                    reviewer)
                summary = run_episodes(env, agent, task_ids, results_path, max_steps, resume=resume,
                                       meta=meta, progress=progress)
                if summary.skipped:
                    console.print(f"{name}: {len(summary.skipped)} finished episodes skipped (--resume)")
        console.print(f"episodes took {time.perf_counter() - start:.1f} s; set-up "
                      + ", ".join(f"{k} {v:.1f}" for k, v in setup.timings.items()))
    finally:
        env.close()
    records = [r for r in read_results(results_path) if r["task_id"] in set(task_ids) and r["agent"] in agents]
    rows = summarize(records)
    console.print(rich_table(rows, title=f"{env_name} {split}: success per task type"))
    console.print(f"chart: {bar_chart(rows, results_path.with_suffix('.png'))}")
