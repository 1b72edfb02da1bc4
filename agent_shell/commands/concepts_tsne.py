"""``cb-agent concepts-tsne``: the seed's concept figure, and ``cb-agent concept-data-size``: its table.

Both read won expert trajectories of ``--demo-split`` (collected once into the cache), compute
each one's features with the backbone (cached per trajectory, so a rerun costs no LM time) and
refit concepts on subsets (:mod:`agent_shell.studies.concept_data`).

* ``concepts-tsne``: per task type, ``--samples`` random draws of ``--sample-size`` trajectories
  from the first ``--pool-per-type`` won ones, one concept per draw, all concepts embedded with
  scikit-learn's t-SNE and drawn one colour per type (PNG), the points and the silhouette of the
  types in concept space (cosine) beside it as JSON.
* ``concept-data-size``: top-1 accuracy (95% Wilson) on the same held-out expert decisions for
  concepts fitted on the first k won trajectories per type, for each ``--sizes`` k.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from pathlib import Path

import click

from agent_shell.commands._common import COMMON_OPTIONS, config_options, make_console, prepare
from agent_shell.run_config import RunConfig

#: Common options of these commands: all but --demos-per-type, which each replaces by its own pool size.
OPTIONS = tuple(name for name in COMMON_OPTIONS if name != "demos_per_type")


def pooled_features(config: RunConfig, pool: int, echo, need_heldout: tuple[str, int] | None = None,
                    task_types: tuple[str, ...] = (), cached_only: bool = False):
    """(setup, task type -> one TypeFeatures per won trajectory, held-out features or None).

    The pool: the first ``pool`` won expert trajectories per type of ``config.demo_split`` (of
    ``task_types`` only, when given); with ``need_heldout = (split, per_type)`` also the held-out
    split's won expert trajectories (after the pool when the split is the same), merged per type.
    ``cached_only``: trajectories whose features are not in the cache yet are left out (counted
    per type), so no LM time is spent.
    """
    from agent_shell.concepts import collect_features, features_cached
    from agent_shell.demos import expert_demos
    from cb_core.cache import enable_persistent_cache

    from agent_shell.demos import tasks_by_type
    from envs import make_env

    env = make_env(config.env)
    try:  # task types are checked before anything loads
        known = tasks_by_type(env, config.demo_split)
        unknown = sorted(set(task_types) - set(known))
        if unknown:
            raise click.ClickException(f"unknown task type(s) {', '.join(unknown)} in {config.env} "
                                       f"{config.demo_split}; types: {', '.join(known)}")
        setup = prepare(dataclasses.replace(config, demos_per_type=pool), need_concepts=False, echo=echo, env=env,
                        task_types=set(task_types) or None)
    except BaseException:
        env.close()
        raise
    enable_persistent_cache(setup.cache / "jax")

    def usable(trajs: list) -> list:
        if not cached_only:
            return trajs
        kept = [t for t in trajs if features_cached(setup.lm, t, config.rendering, setup.cache, config.layout)]
        missing = Counter(t.task_type for t in trajs if t not in kept)
        for task_type, n in sorted(missing.items()):
            echo(f"{task_type}: {n} trajectories without cached features left out (--cached-only)")
        return kept

    try:
        per_trajectory: dict[str, list] = {}
        start = time.perf_counter()
        setup.demo_trajectories = usable(setup.demo_trajectories)
        for i, traj in enumerate(setup.demo_trajectories, 1):
            for task_type, tf in collect_features(setup.lm, [traj], config.rendering, cache_dir=setup.cache,
                                                  layout=config.layout).items():
                if tf.n_decisions:
                    per_trajectory.setdefault(task_type, []).append(tf)
            if i % 10 == 0 or i == len(setup.demo_trajectories):
                echo(f"features {i}/{len(setup.demo_trajectories)} trajectories ({time.perf_counter() - start:.0f} s)")
        heldout = None
        if need_heldout is not None:
            split, per_type = need_heldout
            same = split == config.demo_split
            trajs = expert_demos(setup.env, pool + per_type if same else per_type, split=split,
                                 path=setup.cache / "expert" / config.env / f"{split}.jsonl",
                                 task_types=set(task_types) or None,
                                 on_task=lambda tid: echo(f"collecting expert trajectory {tid}"))
            if same:  # the held-out trajectories follow the pool's
                used = {t.task_id for t in setup.demo_trajectories}
                trajs = [t for t in trajs if t.task_id not in used]
            trajs = usable(trajs)
            heldout = collect_features(setup.lm, trajs, config.rendering, cache_dir=setup.cache, layout=config.layout)
            echo(f"held out: {len(trajs)} won expert trajectories of {split}, "
                 f"{sum(f.n_decisions for f in heldout.values())} decisions")
    finally:
        setup.env.close()
    return setup, per_trajectory, heldout


def pool_filters(fn):
    """The ``--task-type`` and ``--cached-only`` options of both commands (see :func:`pooled_features`)."""
    fn = click.option("--cached-only", is_flag=True,
                      help="Use only trajectories whose features are already cached (no LM time; the others are "
                           "left out and counted).")(fn)
    return click.option("--task-type", "task_types", multiple=True,
                        help="Only this task type (repeatable; default: every type of the split).")(fn)


@click.command("concepts-tsne")
@config_options(*OPTIONS)
@click.option("--pool-per-type", type=click.IntRange(min=1), default=20, show_default=True,
              help="Won expert trajectories per task type to sample from (fewer if a type has fewer).")
@click.option("--sample-size", type=click.IntRange(min=1), default=5, show_default=True,
              help="Trajectories per sample (one concept per sample).")
@click.option("--samples", type=click.IntRange(min=1), default=20, show_default=True,
              help="Samples (concepts) per task type (all distinct subsets if there are fewer).")
@click.option("--perplexity", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="t-SNE perplexity (capped at (concepts - 1) / 3).")
@pool_filters
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the samples and of t-SNE.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="concepts_tsne.png", show_default=True,
              help="PNG to write; the points go to the same name with .json.")
def concepts_tsne(config: RunConfig, pool_per_type: int, sample_size: int, samples: int, perplexity: float,
                  task_types: tuple[str, ...], cached_only: bool, seed: int, out_path: str) -> None:
    """t-SNE of concepts fitted on random samples of expert trajectories, one colour per task type."""
    import numpy as np
    import orjson

    from agent_shell.studies.concept_data import embed_concepts, sampled_concepts, silhouette, tsne_figure

    console = make_console()
    setup, per_trajectory, _ = pooled_features(config, pool_per_type, console.print, task_types=task_types,
                                               cached_only=cached_only)
    for task_type, pool in sorted(per_trajectory.items()):
        console.print(f"{task_type}: pool of {len(pool)} won trajectories")
    start = time.perf_counter()
    fitted, skipped = sampled_concepts(per_trajectory, sample_size, samples, config.lam, config.gamma, seed=seed)
    for task_type, why in skipped.items():
        console.print(f"{task_type}: left out ({why})")
    if len(fitted) < 3:
        raise click.ClickException(f"only {len(fitted)} concepts were fitted; t-SNE needs at least 3")
    console.print(f"{len(fitted)} concepts fitted in {time.perf_counter() - start:.1f} s "
                  f"({sum(not c.converged for c in fitted)} not converged)")
    alphas = np.stack([c.alpha for c in fitted])
    labels = [c.task_type for c in fitted]
    points = embed_concepts(alphas, seed=seed, perplexity=perplexity)
    sil = silhouette(alphas, labels)
    dtype = str(getattr(setup.lm, "dtype", "")).removeprefix("torch.")
    title = (f"Concepts of {len(set(labels))} task types ({config.env}, {setup.lm.name}, {dtype}): "
             f"{len(fitted) // max(1, len(set(labels)))} per type, each fitted on {sample_size} expert trajectories")
    caption = (f"t-SNE (scikit-learn, perplexity {min(perplexity, max(1.0, (len(fitted) - 1) / 3)):g}, seed {seed}) of "
               f"alpha; samples drawn from <= {pool_per_type} won {config.demo_split} trajectories per type; "
               f"lam {config.lam}, gamma {config.gamma}; silhouette (cosine, concept space) "
               + (f"{sil:.2f}" if sil is not None else "n/a"))
    path = tsne_figure(points, labels, out_path, title, caption)
    record = {"env": config.env, "backbone": setup.lm.name, "dtype": dtype, "demo_split": config.demo_split,
              "pool_per_type": {t: len(p) for t, p in sorted(per_trajectory.items())}, "sample_size": sample_size,
              "samples": samples, "seed": seed, "lam": config.lam, "gamma": config.gamma, "rendering": config.rendering,
              "silhouette_cosine": sil, "skipped_types": skipped,
              "points": [{"task_type": c.task_type, "x": float(p[0]), "y": float(p[1]), "task_ids": c.task_ids,
                          "n_decisions": c.n_decisions, "converged": c.converged} for c, p in zip(fitted, points)]}
    path.with_suffix(".json").write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    console.print(f"silhouette of the task types in concept space (cosine): "
                  + (f"{sil:.3f}" if sil is not None else "n/a"))
    console.print(f"figure: {path} (points: {path.with_suffix('.json')})")


def parse_sizes(ctx, param, value: str) -> list[int]:
    """``"2,5,10,20"`` -> [2, 5, 10, 20] (positive, increasing); a usage error otherwise."""
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if not sizes or any(s < 1 for s in sizes) or sizes != sorted(set(sizes)):
        raise click.BadParameter(f"{value!r}: give increasing positive sizes, e.g. 2,5,10,20")
    return sizes


@click.command("concept-data-size")
@config_options(*OPTIONS)
@click.option("--sizes", default="2,5,10,20", show_default=True, callback=parse_sizes,
              help="Won expert trajectories per task type for the concept (comma-separated, increasing).")
@click.option("--heldout-split", default="valid_unseen", show_default=True,
              help="Split of the held-out expert decisions (the same for every size).")
@click.option("--heldout-per-type", type=click.IntRange(min=1), default=5, show_default=True,
              help="Won held-out expert trajectories per task type.")
@pool_filters
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the table as JSON here (and as Markdown beside it, .md).")
def concept_data_size(config: RunConfig, sizes: list[int], heldout_split: str, heldout_per_type: int,
                      task_types: tuple[str, ...], cached_only: bool, out_path: str | None) -> None:
    """Held-out top-1 decision accuracy vs the number of expert trajectories per type in the concept."""
    import orjson
    from rich.table import Table

    from agent_shell.decision_scorer import accuracy_cell
    from agent_shell.commands.tasks import validated_tasks
    from agent_shell.studies.concept_data import data_size_rows
    from envs import make_env

    console = make_console()
    env = make_env(config.env)
    try:
        validated_tasks(env, heldout_split, [])
    finally:
        env.close()
    setup, per_trajectory, heldout = pooled_features(config, max(sizes), console.print,
                                                     need_heldout=(heldout_split, heldout_per_type),
                                                     task_types=task_types, cached_only=cached_only)
    if not any(f.n_decisions for f in heldout.values()):
        raise click.ClickException(f"no held-out decisions: {heldout_split} gave no won expert trajectory")
    results = data_size_rows(per_trajectory, heldout, sizes, config.lam, config.gamma)
    types = sorted(per_trajectory)
    table = Table(title=f"Top-1 accuracy on held-out {heldout_split} expert decisions vs trajectories per type in "
                        f"the concept ({setup.lm.name})",
                  caption="accuracy [95% Wilson score interval]; n used per type in brackets when below k")
    table.add_column("k")
    for col in [*types, "all (alpha = 0)", "all (concept)"]:
        table.add_column(col, justify="right")
    lines = ["| k | " + " | ".join(types) + " | all: alpha = 0 | all: concept |",
             "|---" * (len(types) + 3) + "|"]
    for res in results:
        by_type = {r["task_type"]: r for r in res.rows}
        cells = []
        for t in types:
            r = by_type.get(t)
            cell = accuracy_cell(r, "concept") if r else "-"
            if res.used.get(t, 0) < res.size:
                cell += f" (n={res.used.get(t, 0)})"
            cells.append(cell)
        total = by_type["all"]
        row = [str(res.size), *cells, accuracy_cell(total, "prior"), accuracy_cell(total, "concept")]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    held = by_type["all"]["decisions"] if results else 0
    console.print(table)
    console.print(f"held-out decisions: {held} ({heldout_split}, {heldout_per_type} won expert trajectories per type)")
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_bytes(orjson.dumps(
            {"env": config.env, "backbone": setup.lm.name,
             "dtype": str(getattr(setup.lm, "dtype", "")).removeprefix("torch."), "demo_split": config.demo_split,
             "heldout_split": heldout_split, "heldout_per_type": heldout_per_type, "heldout_decisions": held,
             "lam": config.lam, "gamma": config.gamma,
             "sizes": [{"k": r.size, "used": r.used, "rows": r.rows} for r in results]},
            option=orjson.OPT_INDENT_2))
        Path(out_path).with_suffix(".md").write_text("\n".join(lines) + "\n")
        console.print(f"table: {out_path} and {Path(out_path).with_suffix('.md')}")
