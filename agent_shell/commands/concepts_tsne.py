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

import time
from pathlib import Path

import click

from agent_shell.commands._common import COMMON_OPTIONS, cli_errors, config_options, fixed_strength, make_console
from agent_shell.feature_pool import pooled_features
from agent_shell.lm.protocol import backbone_dtype
from agent_shell.run_config import RunConfig
from cb_io.storage import write_bytes_atomic

#: Common options of these commands: all but --demos-per-type, which each replaces by its own pool size.
OPTIONS = tuple(name for name in COMMON_OPTIONS if name != "demos_per_type")
#: concepts-tsne's ``--seed``: the run's seed (the shuffle renderings read it), also the samples' and t-SNE's.
TSNE_SEED = {"help": "Seed of the samples, of t-SNE and of the shuffle renderings."}


def pool_filters(fn):
    """The ``--task-type`` and ``--cached-only`` options of both commands (see :func:`pooled_features`)."""
    fn = click.option("--cached-only", is_flag=True,
                      help="Use only trajectories whose features are already cached (no LM time; the others are "
                           "left out and counted).")(fn)
    return click.option("--task-type", "task_types", multiple=True,
                        help="Only this task type (repeatable; default: every type of the split).")(fn)


@click.command("concepts-tsne")
@config_options(*OPTIONS, seed=TSNE_SEED)
@click.option("--pool-per-type", type=click.IntRange(min=1), default=20, show_default=True,
              help="Won expert trajectories per task type to sample from (fewer if a type has fewer).")
@click.option("--sample-size", type=click.IntRange(min=1), default=5, show_default=True,
              help="Trajectories per sample (one concept per sample).")
@click.option("--samples", type=click.IntRange(min=1), default=20, show_default=True,
              help="Samples (concepts) per task type (all distinct subsets if there are fewer).")
@click.option("--perplexity", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="t-SNE perplexity (capped at (concepts - 1) / 3).")
@pool_filters
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="concepts_tsne.png", show_default=True,
              help="PNG to write; the points go to the same name with .json.")
def concepts_tsne(config: RunConfig, pool_per_type: int, sample_size: int, samples: int, perplexity: float,
                  task_types: tuple[str, ...], cached_only: bool, out_path: str) -> None:
    """t-SNE of concepts fitted on random samples of expert trajectories, one colour per task type."""
    import numpy as np
    import orjson

    from agent_shell.studies.concept_data import embed_concepts, sampled_concepts, silhouette, tsne_figure

    lam = fixed_strength(config, "concepts-tsne (one strength for every sampled concept)")
    seed = config.seed
    console = make_console()
    with cli_errors():
        setup, per_trajectory, _ = pooled_features(config, pool_per_type, console.print, task_types=task_types,
                                                   cached_only=cached_only)
    for task_type, pool in sorted(per_trajectory.items()):
        console.print(f"{task_type}: pool of {len(pool)} won trajectories")
    start = time.perf_counter()
    fitted, skipped = sampled_concepts(per_trajectory, sample_size, samples, lam, config.gamma, seed=seed)
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
    dtype = backbone_dtype(setup.lm)
    title = (f"Concepts of {len(set(labels))} task types ({config.env}, {setup.lm.name}, {dtype}): "
             f"{len(fitted) // max(1, len(set(labels)))} per type, each fitted on {sample_size} expert trajectories")
    caption = (f"t-SNE (scikit-learn, perplexity {min(perplexity, max(1.0, (len(fitted) - 1) / 3)):g}, seed {seed}) of "
               f"alpha; samples drawn from <= {pool_per_type} won {config.demo_split} trajectories per type; "
               f"lam {lam}, gamma {config.gamma}; silhouette (cosine, concept space) "
               + (f"{sil:.2f}" if sil is not None else "n/a"))
    path = tsne_figure(points, labels, out_path, title, caption)
    record = {"env": config.env, "backbone": setup.lm.name, "dtype": dtype, "demo_split": config.demo_split,
              "pool_per_type": {t: len(p) for t, p in sorted(per_trajectory.items())}, "sample_size": sample_size,
              "samples": samples, "seed": seed, "lam": lam, "gamma": config.gamma, "rendering": config.rendering,
              "silhouette_cosine": sil, "skipped_types": skipped,
              "points": [{"task_type": c.task_type, "x": float(p[0]), "y": float(p[1]), "task_ids": c.task_ids,
                          "n_decisions": c.n_decisions, "converged": c.converged} for c, p in zip(fitted, points)]}
    write_bytes_atomic(path.with_suffix(".json"), orjson.dumps(record, option=orjson.OPT_INDENT_2))
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
    lam = fixed_strength(config, "concept-data-size (one strength for every data size)")
    import orjson
    from rich.table import Table

    from agent_shell.commands.tasks import validated_tasks
    from agent_shell.studies.concept_data import data_size_cells, data_size_markdown, data_size_rows
    from envs import make_env

    console = make_console()
    env = make_env(config.env)
    try:
        validated_tasks(env, heldout_split, [])
    finally:
        env.close()
    with cli_errors():
        setup, per_trajectory, heldout = pooled_features(config, max(sizes), console.print,
                                                         need_heldout=(heldout_split, heldout_per_type),
                                                         task_types=task_types, cached_only=cached_only)
    if not any(f.n_decisions for f in heldout.values()):
        raise click.ClickException(f"no held-out decisions: {heldout_split} gave no won expert trajectory")
    results = data_size_rows(per_trajectory, heldout, sizes, lam, config.gamma)
    types = sorted(per_trajectory)
    held = next(r for r in results[-1].rows if r["task_type"] == "all")["decisions"] if results else 0
    record = {"env": config.env, "backbone": setup.lm.name,
              "dtype": backbone_dtype(setup.lm), "demo_split": config.demo_split,
              "heldout_split": heldout_split, "heldout_per_type": heldout_per_type, "heldout_decisions": held,
              "lam": lam, "gamma": config.gamma, "task_types": types,
              "sizes": [{"k": r.size, "used": r.used, "rows": r.rows} for r in results]}
    table = Table(title=f"Top-1 accuracy on held-out {heldout_split} expert decisions vs trajectories per type in "
                        f"the concept ({setup.lm.name})",
                  caption="accuracy [95% Wilson score interval]; n used per type in brackets when below k")
    table.add_column("k")
    for col in [*types, "all (alpha = 0)", "all (concept)"]:
        table.add_column(col, justify="right")
    for row in data_size_cells(record["sizes"], types):
        table.add_row(*row)
    console.print(table)
    console.print(f"held-out decisions: {held} ({heldout_split}, {heldout_per_type} won expert trajectories per type)")
    if out_path:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out_path, orjson.dumps(record, option=orjson.OPT_INDENT_2))
        write_bytes_atomic(Path(out_path).with_suffix(".md"), data_size_markdown(record).encode())
        console.print(f"table: {out_path} and {Path(out_path).with_suffix('.md')}")
