"""``cb-agent eval-decisions``: top-1 accuracy on held-out expert decisions (teacher forcing).

The concepts are fitted on the expert demonstrations (cached), or read from ``--concepts FOLDER``
(a round of ``cb-agent improve``: what that round's concepts learned; the held-out decisions are
then those of the task types the folder holds).

For each held-out expert decision (its context is the expert's own history, seed Eq. (5)) the
candidate with the highest log P is compared with the expert's action, once with alpha = 0
(prior only) and once with the fitted concept of the decision's task type. Every accuracy comes
with its 95% Wilson score interval (per task type and overall), as success rates do in ``report``
(:func:`agent_shell.decision_scorer.decision_accuracy`).

``--out FILE.json`` writes ``{"schema": EVAL_SCHEMA, "model", "features", "rows", "decisions"}``:
the accuracy rows and every held-out decision (:func:`heldout_decisions`) with its candidates,
the expert's index and each candidate's prior term, concept term and log P, which ``cb-agent
view`` shows (where the concept overturns the prior, and where it is wrong).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import click

from agent_shell.agents.step import rounded
from agent_shell.commands._common import COMMON_OPTIONS, cli_errors, config_options, make_console
from agent_shell.decision_scorer import accuracy_cell, batch_terms, decision_accuracy
from agent_shell.feature_settings import FeatureSettings
from agent_shell.pipeline import prepare
from agent_shell.run_config import RunConfig
from cb_io.storage import write_bytes_atomic

#: ``schema`` of the ``--out`` file (older files are a bare list of the rows).
EVAL_SCHEMA = "cb-agent/eval-decisions-v1"


def heldout_decisions(features: Mapping, trajectories: Sequence, concepts: Mapping, gamma: float,
                      settings: FeatureSettings) -> list[dict]:
    """One dict per held-out decision, in the order of ``features`` (task type -> TypeFeatures of
    :func:`agent_shell.concepts.collect_features` on ``trajectories`` under ``settings``): ``task_type``, ``task_id``,
    ``step`` (index in the expert trajectory), ``observation`` (the last one before the decision),
    ``candidates``, ``expert`` (index), and per candidate ``prior``, ``concept`` and ``log_p`` (floats,
    :func:`agent_shell.agents.step.rounded`) under the type's concept; a type without one has the
    alpha = 0 prior (``gamma``) and ``concept`` None.

    Raises ValueError when a trajectory's decisions no longer match the features' (a bug).
    """
    import cb_core

    from agent_shell.concepts import decision_inputs

    by_id = {t.task_id: t for t in trajectories}
    out = []
    for task_type, tf in sorted(features.items()):
        if not tf.n_decisions:
            continue
        decisions = tf.decisions()
        concept = concepts.get(task_type)
        acting = concept if concept is not None else cb_core.Concept.prior_only(decisions.hidden_size, gamma)
        inputs = [(task_id, d, e) for task_id in tf.task_ids
                  for d, e in decision_inputs(by_id[task_id], settings)[0]]
        if [e for _, _, e in inputs] != list(tf.expert):
            raise ValueError(f"held-out decisions of {task_type!r} do not match their features")
        for (task_id, d, e), (prior, term, log_p) in zip(inputs, batch_terms(acting, decisions)):
            out.append({"task_type": task_type, "task_id": task_id, "step": len(d.history),
                        "instruction": d.instruction,
                        "observation": d.history[-1].observation if d.history else d.observation,
                        "candidates": list(d.candidates), "expert": int(e), "prior": rounded(prior),
                        "concept": rounded(term) if concept is not None else None, "log_p": rounded(log_p)})
    return out


def heldout_trajectories(setup, config: RunConfig, heldout_split: str, heldout_per_type: int,
                         task_types: Sequence[str] | None = None, on_task=None) -> list:
    """The held-out won expert trajectories of ``heldout_split`` (collected once into the cache):
    ``heldout_per_type`` of each type, or, when it is ``config.demo_split``, the next
    ``heldout_per_type`` of each type after the ``config.demos_per_type`` fitting ones
    (``setup.demo_trajectories``: :func:`agent_shell.pipeline.prepare`'s)."""
    from agent_shell.demos import expert_demos

    same_split = heldout_split == config.demo_split
    trajs = expert_demos(setup.env, config.demos_per_type + heldout_per_type if same_split else heldout_per_type,
                         split=heldout_split, path=setup.cache / "expert" / config.env / f"{heldout_split}.jsonl",
                         task_types=task_types, on_task=on_task)
    used = {t.task_id for t in setup.demo_trajectories}
    return [t for t in trajs if t.task_id not in used]


@click.command("eval-decisions")
@config_options(*COMMON_OPTIONS, "concepts")
@click.option("--heldout-split", default=None,
              help="Split of the held-out expert trajectories (default: the environment's evaluation split: "
                   "ALFWorld valid_unseen, ScienceWorld and TextWorld test; if it equals --demo-split, the "
                   "held-out ones are the next tasks of each type after the fitting ones).")
@click.option("--heldout-per-type", type=click.IntRange(min=1), default=2, show_default=True,
              help="Won held-out expert trajectories per task type (after the fitting ones when --heldout-split "
                   "equals --demo-split).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows and every held-out decision (candidates, expert, prior and concept "
                   "terms, log P) as JSON here, for `cb-agent view`.")
def eval_decisions(config: RunConfig, heldout_split: str | None, heldout_per_type: int, out_path: str | None) -> None:
    """Top-1 accuracy on held-out expert decisions for alpha = 0 and the fitted concepts."""
    import orjson
    from rich.table import Table

    from envs.registry import default_split

    heldout_split = heldout_split or default_split(config.env)

    from agent_shell.concepts import collect_features, skipped_summary

    from agent_shell.commands.tasks import validated_tasks
    from envs import make_env

    console = make_console()
    env = make_env(config.env)
    # with --concepts, the task types they hold (the held-out decisions of other types have no concept)
    task_types = sorted(p.stem for p in Path(config.concepts).glob("*.safetensors")) if config.concepts else None
    try:
        validated_tasks(env, heldout_split, [])  # both splits are checked before anything loads
        with cli_errors():
            setup = prepare(config, need_concepts=True, echo=console.print, env=env, task_types=task_types)
    except BaseException:
        env.close()
        raise
    settings = setup.feature_settings
    try:
        heldout = heldout_trajectories(setup, config, heldout_split, heldout_per_type, task_types,
                                       on_task=lambda tid: console.print(f"collecting expert trajectory {tid}"))
        console.print(f"held out: {len(heldout)} won expert trajectories from {heldout_split}")
        features = collect_features(setup.lm, heldout, settings, cache_dir=setup.cache)
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
        decisions = heldout_decisions(features, heldout, setup.concepts, config.gamma, settings)
        write_bytes_atomic(out_path, orjson.dumps({"schema": EVAL_SCHEMA, "model": setup.lm.name,
                                                 "features": config.features, "rows": rows,
                                                 "decisions": decisions}))
        console.print(f"rows and {len(decisions)} decisions: {out_path}", markup=False)
