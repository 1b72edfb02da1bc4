"""``cb-agent calibrate``: labels from the effect of experiences, and the learned calibrator (Sec. 6).

* ``label RESULTS...``: results files of ``cb-agent run`` on TRAINING games (every trial's split
  must be ``train``; no game may be one of the demonstrations) -> one JSON line per transition
  (:mod:`agent_shell.studies.labels`); ``--resume`` continues an interrupted labelling.
* ``fit LABELS...``: the calibrator on the labels of the fitting tasks (every ``--heldout-every``-th
  task is held out), its held-out accuracy against the effect labels and the content-screening
  labels, beside fixed rules; one safetensors file + ``<out>.eval.json``.
* ``eval LABELS... --calibrator FILE``: the same accuracies on the calibrator's held-out tasks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import click

from agent_shell.commands._common import cli_errors, config_options, fixed_strength, make_console, shared_option
from agent_shell.run_config import RunConfig

if TYPE_CHECKING:
    from rich.table import Table

#: = :data:`agent_shell.calibration.JUDGES` (kept here so ``--help`` imports nothing heavy).
JUDGES = ("expert-distance", "lm")
#: Recipient actors (the study actors).
ACTORS = ("react", "prior-only", "cb-agent")

backbone_options = config_options("model", "dtype", "device", "cache_dir")


@click.group()
def calibrate() -> None:
    """Action calibration: labels from the effect of experiences on actors' next actions, the learned
    calibrator (when to write an experience, and which), its held-out accuracy."""


@calibrate.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--actor", "actors", type=click.Choice(ACTORS), multiple=True, default=("react", "cb-agent"),
              show_default=True, help="Recipient actors (repeatable; at least two).")
@click.option("--judge", type=click.Choice(JUDGES), default="expert-distance", show_default=True,
              help="expert-distance: fewer handcoded-expert steps to the goal after the action (ALFWorld); "
                   "lm: blind A/B question to the backbone, asked in both orders (inconsistent = tie).")
@click.option("--k", type=click.IntRange(min=1), default=4, show_default=True,
              help="Review replies sampled per transition (their distinct valid experiences are the candidates).")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=0.8, show_default=True,
              help="Sampling temperature of the review replies.")
@click.option("--content-screening/--no-content-screening", default=True, show_default=True,
              help="Also label each transition by content alone (the ablation).")
@click.option("--max-transitions", type=click.IntRange(min=0), default=0, show_default=True,
              help="Cap on transitions (round robin over trials); 0 = all.")
@click.option("--max-expert-steps", type=click.IntRange(min=1), default=40, show_default=True,
              help="expert-distance judge: expert steps after the action before the distance counts as unknown.")
@click.option("--out", type=click.Path(dir_okay=False), default="calibration/labels.jsonl", show_default=True,
              help="JSONL of label records, one per transition; counts go to <out>.counts.json.")
@shared_option("resume", help="Skip transitions already in --out (after moving a torn last line aside).")
@config_options("model", "dtype", "device", "demo_split", "demos_per_type", "cache_dir", "seed", "episode_timeout")
def label(results, actors, judge, k, temperature, content_screening, max_transitions, max_expert_steps, out, resume,
          config: RunConfig) -> None:
    """Label candidate experiences of the transitions in RESULTS (runs on training games) by their effect
    on the recipient actors' next actions."""
    from agent_shell import studies
    from agent_shell.studies import labels as lab

    console = make_console()
    actors = tuple(dict.fromkeys(actors))
    if len(actors) < 2:
        raise click.UsageError("give at least two recipient actors (--actor A --actor B)")
    trials = studies.recorded_trials(results)
    splits = {t.trajectory.meta.get("split") for t in trials}
    if splits != {"train"}:
        raise click.ClickException(f"calibration labels come from training games only; {', '.join(results)} hold "
                                   f"trials of split(s) {sorted(map(str, splits))}")
    if config.demo_split != "train":
        raise click.ClickException(f"--demo-split {config.demo_split}: the recipients' demonstrations must come from "
                                   "the training split too (evaluation games stay unseen)")
    items = lab.mine_transitions(trials, max_transitions)
    if not items:
        raise click.ClickException(f"no reviewable transition followed by an environment step in {len(trials)} trials")
    if resume:
        from agent_shell.results import repair_for_resume

        repair_for_resume(out, console.print)
    try:
        todo = lab.pending(out, items, resume, label_settings(config, k, temperature, actors))
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    console.print(f"{len(items)} transitions from {len({i.recorded.key for i in items})} trials, {len(todo)} to label "
                  f"({k} review samples each, actors {', '.join(actors)}, judge {judge}) -> {out}")
    if todo:
        _label(todo, trials, actors, judge, k, temperature, content_screening, max_expert_steps, out, resume, config,
               console.print)
    records = [r for r in lab.read_labels(out, on_bad=console.print) if r["item"] in {i.key for i in items}]
    counts = lab.label_counts(records)
    from cb_io.storage import write_json_atomic

    write_json_atomic(f"{out}.counts.json", counts)
    console.print(counts_table(counts))


def _label(todo, trials, actors, judge_name, k, temperature, content_screening, max_expert_steps, out, resume,
           config: RunConfig, echo: Callable[[str], None]) -> None:
    from agent_shell.agents import AgentConfig, CBAgent, ReActAgent
    from agent_shell.calibration import LMJudge
    from agent_shell.calibration.expert_distance import ExpertDistanceJudge
    from agent_shell.studies.labels import ContentScreen, label_record, run_labels
    from agent_shell.pipeline import prepare
    from agent_shell.run_config import check_not_demos
    from envs import make_env

    env_name = studies_env(trials)
    env = make_env(env_name)
    try:
        config = replace(config, env=env_name, rendering="raw")
        with cli_errors():
            setup = prepare(config, "cb-agent" in actors, echo=echo, env=env,
                            task_types={t.recorded.trajectory.task_type for t in todo})
        try:
            check_not_demos([t.recorded.trajectory.task_id for t in todo], [d.task_id for d in setup.demo_trajectories])
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        lm = setup.lm
        scorer, reviewer, judge_lm = lm.fork(), lm.fork(), lm.fork()
        agent_config = AgentConfig.for_env(env_name, rendering="experience", seed=config.seed, gamma=config.gamma)
        agents = {}
        for name in actors:
            if name == "react":
                agents[name] = ReActAgent(lm, setup.demos, config=agent_config)
            else:
                agents[name] = CBAgent(lm, setup.demos, concepts=setup.concepts if name == "cb-agent" else None,
                                       config=agent_config, scoring_lm=scorer)
        judge = ExpertDistanceJudge(env, max_expert_steps, config.episode_timeout) if judge_name == "expert-distance" \
            else LMJudge(judge_lm)
        screen = ContentScreen(judge_lm) if content_screening else None
        meta = {"model": lm.name, **label_settings(config, k, temperature, actors),
                "recipient_rendering": "experience (demos raw)"}
        n = [0]

        def on_record(r: dict) -> None:
            n[0] += 1
            kept = sum(c["retained"] for c in r["candidates"])
            echo(f"[{n[0]}/{len(todo)}] {r['item']}: {len(r['candidates'])} candidates, {kept} retained, label "
                 f"{r['label_text'][:60]!r} ({r['wall_s']:.0f} s)")

        skipped: list[str] = []

        def on_skip(message: str) -> None:
            skipped.append(message)
            echo(f"warning: {message}")

        try:
            run_labels(todo, out, lambda t: label_record(t, agents, judge, reviewer, screen, k, temperature,
                                                         config.seed), resume=True, meta=meta, on_record=on_record,
                       on_skip=on_skip)
        except ValueError as err:
            raise click.ClickException(str(err)) from None
        if skipped:
            echo(f"{len(skipped)} of {len(todo)} transitions skipped (engine fault or --episode-timeout; --resume "
                 "labels them again)")
    finally:
        env.close()


def label_settings(config: RunConfig, k: int, temperature: float, actors: tuple[str, ...]) -> dict:
    """The settings every label record holds (besides the backbone's name), which a resume must share."""
    return {"dtype": config.dtype, "seed": config.seed, "k": k, "temperature": temperature,
            "demo_split": config.demo_split, "demos_per_type": config.demos_per_type, "recipients": list(actors)}


def studies_env(trials) -> str:
    from agent_shell import studies

    try:
        return studies.env_name_of(trials)
    except ValueError as err:
        raise click.ClickException(str(err)) from None


def counts_table(counts: dict) -> Table:
    """A rich table of :func:`agent_shell.calibration.label_counts`."""
    from rich.table import Table

    table = Table(title=f"Calibration labels: {counts['transitions']} transitions, {counts['candidates']} candidate "
                        f"experiences, {counts['tasks']} tasks (splits {', '.join(counts['splits'])})")
    for c in ("actor", "improvements", "degradations", "ties"):
        table.add_column(c, justify="right" if c != "actor" else "left")
    for actor, c in counts["by_actor"].items():
        table.add_row(actor, str(c.get("improvement", 0)), str(c.get("degradation", 0)), str(c.get("tie", 0)))
    table.add_row("all", str(counts["improvements"]), str(counts["degradations"]), str(counts["ties"]))
    table.caption = (f"retained candidates {counts['candidates_retained']}/{counts['candidates']}; transitions "
                     f"labelled with an experience {counts['labels_retaining']}/{counts['transitions']} "
                     f"({counts['transitions_without_candidate']} had no valid candidate); verdicts by judge "
                     f"{counts['verdicts_by_judge']}; content screening retained {counts['screen_retained']}, its "
                     f"label agrees on {counts['content_label_agrees']}/{counts['screened_transitions']}; "
                     f"{counts['wall_s']} s")
    return table


# ---------------------------------------------------------------------------------------------
# fit / eval


def _train_records(paths: Sequence[str]) -> list[dict]:
    from agent_shell.studies.labels import read_labels

    records = [r for p in paths for r in read_labels(p, on_bad=lambda msg: click.echo(f"warning: {msg}", err=True))]
    if not records:
        raise click.ClickException(f"no label records in {', '.join(paths)}")
    bad = sorted({r["split"] for r in records} - {"train"})
    if bad:
        raise click.ClickException(f"the calibrator is fitted on training games only; the labels hold split(s) {bad}")
    return records


def cached_features(lm, records: Sequence[dict], cache: Path, echo: Callable[[str], None]) -> list[tuple]:
    """Features of each record's options, cached per record under ``<cache>/calibrator-features/``."""
    import numpy as np

    from agent_shell.calibration import record_features
    from agent_shell.lm.protocol import backbone_dtype
    from agent_shell.experience import REVIEW_VERSION

    out = []
    for j, r in enumerate(records, 1):
        payload = json.dumps([REVIEW_VERSION, lm.name, backbone_dtype(lm), r["instruction"], r["observation"],
                              r["history"], r["i"], r["options"]], ensure_ascii=False)
        path = cache / "calibrator-features" / f"{hashlib.sha256(payload.encode()).hexdigest()[:32]}.npz"
        if path.exists():
            with np.load(path) as f:
                out.append((f["hidden"], f["log_q"], f["n_tokens"]))
            continue
        echo(f"features {j}/{len(records)}: {r['item']}")
        feats = record_features(lm, r)
        from cb_io.storage import atomic_path

        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, suffix=".npz") as tmp:
            np.savez(tmp, hidden=feats[0], log_q=feats[1], n_tokens=feats[2])
        out.append(feats)
    return out


def evaluation(calibrator, records: Sequence[dict], features: Sequence[tuple], gamma: float) -> dict:
    """Accuracies of the calibrator, the prior alone and fixed rules on ``records``."""
    from agent_shell.calibration import accuracy, baseline_predictions, predictions

    fields = ["label"] + (["content_label"] if all("content_label" in r for r in records) else [])
    rows = {"calibrator": predictions(calibrator, features), "prior only (alpha = 0)": predictions(None, features, gamma),
            **baseline_predictions(records)}
    return {name: {f: accuracy(pred, records, f) for f in fields} for name, pred in rows.items()}


def evaluation_table(result: dict, title: str) -> Table:
    from rich.table import Table

    table = Table(title=title)
    for c in ("predictor", "against", "top-1", "top-1 (ties)", "WHEN", "WHAT"):
        table.add_column(c)

    def cell(c: dict) -> str:
        return f"{c['k']}/{c['n']} = {100 * (c['rate'] or 0):.1f}% [{100 * c['ci95'][0]:.0f}, {100 * c['ci95'][1]:.0f}]"

    for name, by_field in result.items():
        for f, acc in by_field.items():
            table.add_row(name, {"label": "effect labels", "content_label": "content screening"}[f], cell(acc["top1"]),
                          cell(acc["top1_tied"]), cell(acc["when"]), cell(acc["what"]))
    table.caption = ("top-1: the labelled option; top-1 (ties): any option as good as the label by the label rule "
                     "(the label takes the earliest of tied candidates); WHEN: update vs NO UPDATE; WHAT: the same "
                     "experience, among transitions where label and prediction both update; 95% Wilson intervals")
    return table


@calibrate.command()
@click.argument("labels", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default="calibration/calibrator.safetensors",
              show_default=True, help="The calibrator file; the held-out evaluation goes to <out>.eval.json.")
@click.option("--labels", "label_kind", type=click.Choice(["effect", "content"]), default="effect", show_default=True,
              help="Fit on the effect labels, or on the content-screening labels (the ablation).")
@click.option("--heldout-every", type=click.IntRange(min=2), default=3, show_default=True,
              help="Every n-th task (sorted ids) is held out of fitting and evaluated.")
@config_options("model", "dtype", "device", "lam", "gamma", "cache_dir")
def fit(labels, out, label_kind, heldout_every, config: RunConfig) -> None:
    """Fit the calibrator on LABELS (`calibrate label` output, training games), report held-out accuracy."""
    lam = fixed_strength(config, "calibrate fit (the calibrator's one fit)")
    from agent_shell.calibration import decisive, fit_calibrator, split_tasks
    from agent_shell.pipeline import resolve_cache
    from agent_shell.lm import load_language_model
    from cb_io.storage import write_json_atomic

    console = make_console()
    records = _train_records(labels)
    usable = decisive(records)
    fit_tasks, held_tasks = split_tasks(records, heldout_every)
    train = [r for r in usable if r["task_id"] in set(fit_tasks)]
    held = [r for r in usable if r["task_id"] in set(held_tasks)]
    console.print(f"{len(records)} label records, {len(usable)} with a candidate experience; fitting on {len(train)} "
                  f"({len(fit_tasks)} tasks), held out {len(held)} ({len(held_tasks)} tasks)")
    field = "label" if label_kind == "effect" else "content_label"
    lm = load_language_model(config.model, dtype=config.dtype, device=config.device)
    cache = resolve_cache(config.cache_dir)
    feats = cached_features(lm, train + held, cache, console.print)
    first = records[0]
    try:
        calibrator = fit_calibrator(lm, train, feats[:len(train)], field, lam, config.gamma, extra={
            "env": first.get("env", ""), "labels": label_kind, "judge": sorted({r["judge"] for r in records}),
            "recipients": first.get("recipients"), "split": "train", "fit_tasks": fit_tasks,
            "heldout_tasks": held_tasks, "heldout_every": heldout_every, "label_files": [str(p) for p in labels],
            "k": first.get("k", 4), "temperature": first.get("temperature", 0.8), "review_tokens": 48})
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    calibrator.save(out)
    result = evaluation(calibrator, held, feats[len(train):], config.gamma) if held else {}
    write_json_atomic(f"{out}.eval.json", {"calibrator": str(out), "labels": label_kind, "heldout_tasks": held_tasks,
                                           "n_heldout": len(held), "n_train": len(train), "accuracy": result,
                                           "fit": calibrator.metadata.get("fit")})
    console.print(f"calibrator -> {out} (fit: {calibrator.metadata['fit']['n_iter']} iterations, converged "
                  f"{calibrator.metadata['fit']['converged']})")
    if result:
        console.print(evaluation_table(result, f"Held-out accuracy ({len(held)} transitions of {len(held_tasks)} "
                                               f"training tasks not fitted on; calibrator fitted on {label_kind} labels)"))


@calibrate.command(name="eval")
@click.argument("labels", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--calibrator", "calibrator_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A calibrator file of `cb-agent calibrate fit`.")
@click.option("--all-tasks", is_flag=True, help="Evaluate on every labelled task, not only the held-out ones.")
@config_options("model", "dtype", "device", "cache_dir")
def eval_(labels, calibrator_path, all_tasks, config: RunConfig) -> None:
    """Accuracy of a calibrator on LABELS (its held-out tasks unless --all-tasks)."""
    from agent_shell.calibration import Calibrator, decisive
    from agent_shell.pipeline import load_calibrator, resolve_cache
    from agent_shell.lm import load_language_model

    console = make_console()
    try:
        Calibrator.load(calibrator_path)
    except ValueError as err:
        raise click.ClickException(f"calibrator {calibrator_path}: {err}") from None
    lm = load_language_model(config.model, dtype=config.dtype, device=config.device)
    with cli_errors():
        calibrator = load_calibrator(calibrator_path, lm)
    held_tasks = set(calibrator.metadata.get("heldout_tasks") or [])
    records = [r for r in decisive(_train_records(labels)) if all_tasks or r["task_id"] in held_tasks]
    if not records:
        raise click.ClickException("no decisive label record on the calibrator's held-out tasks (try --all-tasks)")
    feats = cached_features(lm, records, resolve_cache(config.cache_dir), console.print)
    result = evaluation(calibrator, records, feats, calibrator.concept.gamma)
    console.print(evaluation_table(result, f"Accuracy on {len(records)} transitions "
                                           f"({'all tasks' if all_tasks else 'held-out tasks'})"))


__all__ = ["calibrate"]
