"""``cb-agent eval-decisions``: top-1 accuracy on held-out expert decisions (teacher forcing).

For each held-out expert decision (its context is the expert's own history, seed Eq. (5)) the
candidate with the highest log P is compared with the expert's action, once with alpha = 0
(prior only) and once with the fitted concept of the decision's task type. Every accuracy comes
with its 95% Wilson score interval (per task type and overall), as success rates do in ``report``.
"""

from __future__ import annotations

from pathlib import Path

import click

from agent_shell.commands._common import cli_errors, common_options, make_console
from agent_shell.pipeline import prepare
from agent_shell.run_config import RunConfig


def decision_accuracy(features: dict, concepts: dict, gamma: float = 0.8) -> list[dict]:
    """Per task type (then ``all``): decisions, mean set size, top-1 accuracy of the prior
    (alpha = 0 with ``gamma``) and of the type's concept (with its own gamma and eps): ``acc_*``
    (None without a concept), the hit counts ``hits_*`` and 95% Wilson intervals ``ci_*`` = [low, high]."""
    import numpy as np

    import cb_core
    from agent_shell.statistics import wilson_interval

    def with_intervals(row: dict, hits: dict, has_concept: bool) -> dict:
        n = row["decisions"]
        for name in ("prior", "concept"):
            known = name == "prior" or has_concept
            row[f"acc_{name}"] = hits[name] / n if known else None
            row[f"hits_{name}"] = int(hits[name]) if known else None
            row[f"ci_{name}"] = list(wilson_interval(int(hits[name]), n)) if known else None
        return row

    rows, totals = [], {"n": 0, "prior": 0, "concept": 0, "sizes": 0}
    for task_type, tf in sorted(features.items()):
        if not tf.n_decisions:
            continue
        concept = concepts.get(task_type)
        hits = {"prior": 0, "concept": 0}
        for h, lq, nt, e in zip(tf.hidden, tf.log_q, tf.n_tokens, tf.expert):
            hits["prior"] += cb_core.Concept.prior_only(np.shape(h)[1], gamma).choose(h, lq, nt) == e
            if concept is not None:
                hits["concept"] += concept.choose(h, lq, nt) == e
        n = tf.n_decisions
        sizes = float(np.mean([len(x) for x in tf.log_q]))
        rows.append(with_intervals({"task_type": task_type, "decisions": n, "mean_candidates": sizes}, hits,
                                   concept is not None))
        totals["n"] += n
        totals["prior"] += hits["prior"]
        totals["concept"] += hits["concept"]
        totals["sizes"] += sizes * n
    if totals["n"]:
        rows.append(with_intervals({"task_type": "all", "decisions": totals["n"],
                                    "mean_candidates": totals["sizes"] / totals["n"]}, totals,
                                   True))  # a type without a concept counts as misses, as before
    return rows


def accuracy_cell(row: dict, name: str) -> str:
    """``"45.0% [30.1, 60.9]"``: the accuracy and its 95% Wilson interval, ``-`` without a concept."""
    if row[f"acc_{name}"] is None:
        return "-"
    low, high = row[f"ci_{name}"]
    return f"{100 * row[f'acc_{name}']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


@click.command("eval-decisions")
@common_options
@click.option("--heldout-split", default="valid_unseen", show_default=True,
              help="Split of the held-out expert trajectories (if it equals --demo-split, the "
                   "held-out ones are the next tasks of each type after the fitting ones).")
@click.option("--heldout-per-type", type=click.IntRange(min=1), default=2, show_default=True,
              help="Won held-out expert trajectories per task type (after the fitting ones when --heldout-split "
                   "equals --demo-split).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows as JSON here.")
def eval_decisions(config: RunConfig, heldout_split: str, heldout_per_type: int, out_path: str | None) -> None:
    """Top-1 accuracy on held-out expert decisions for alpha = 0 and the fitted concepts."""
    import orjson
    from rich.table import Table

    from agent_shell.concepts import collect_features, skipped_summary
    from agent_shell.demos import expert_demos

    from agent_shell.commands.tasks import validated_tasks
    from envs import make_env

    console = make_console()
    env = make_env(config.env)
    try:
        validated_tasks(env, heldout_split, [])  # both splits are checked before anything loads
        with cli_errors():
            setup = prepare(config, need_concepts=True, echo=console.print, env=env)
    except BaseException:
        env.close()
        raise
    try:
        same_split = heldout_split == config.demo_split
        trajs = expert_demos(setup.env, config.demos_per_type + heldout_per_type if same_split else heldout_per_type,
                             split=heldout_split,
                             path=setup.cache / "expert" / config.env / f"{heldout_split}.jsonl",
                             on_task=lambda tid: console.print(f"collecting expert trajectory {tid}"))
        used = {t.task_id for t in setup.demo_trajectories}
        heldout = [t for t in trajs if t.task_id not in used]
        console.print(f"held out: {len(heldout)} won expert trajectories from {heldout_split}")
        features = collect_features(setup.lm, heldout, config.rendering, cache_dir=setup.cache, layout=config.layout,
                                    feature_set=config.feature_set, calibrator=setup.calibrator)
        console.print(f"held-out decisions: {sum(f.n_decisions for f in features.values())}; "
                      f"{skipped_summary(features)}")
    finally:
        setup.env.close()
    rows = decision_accuracy(features, setup.concepts, config.gamma)
    table = Table(title=f"Top-1 accuracy on held-out expert decisions ({setup.lm.name}, features {config.features})",
                  caption="accuracy [95% Wilson score interval] over the decisions of each row")
    for col in ("task type", "decisions", "candidates", "alpha = 0", "concept"):
        table.add_column(col, justify="left" if col == "task type" else "right")
    for r in rows:
        table.add_row(r["task_type"], str(r["decisions"]), f"{r['mean_candidates']:.1f}", accuracy_cell(r, "prior"),
                      accuracy_cell(r, "concept"), style="bold" if r["task_type"] == "all" else None)
    console.print(table)
    if out_path:
        Path(out_path).write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
