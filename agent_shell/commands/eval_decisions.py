"""``cb-agent eval-decisions``: top-1 accuracy on held-out expert decisions (teacher forcing).

For each held-out expert decision (its context is the expert's own history, seed Eq. (5)) the
candidate with the highest log P is compared with the expert's action, once with alpha = 0
(prior only) and once with the fitted concept of the decision's task type. Every accuracy comes
with its 95% Wilson score interval (per task type and overall), as success rates do in ``report``
(:func:`agent_shell.decision_scorer.decision_accuracy`).
"""

from __future__ import annotations

import click

from agent_shell.commands._common import cli_errors, common_options, make_console
from agent_shell.decision_scorer import accuracy_cell, decision_accuracy
from agent_shell.pipeline import prepare
from agent_shell.run_config import RunConfig
from envs.storage import write_bytes_atomic


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
                                    feature_set=config.feature_set, calibrator=setup.calibrator, seed=config.seed)
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
        write_bytes_atomic(out_path, orjson.dumps(rows, option=orjson.OPT_INDENT_2))
