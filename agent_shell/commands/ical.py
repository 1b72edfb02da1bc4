"""``cb-agent ical``: In-Context Abstraction Learning (noisy inputs, abstraction, refinement, memory, retrieval).

Every output is a JSONL file keyed by the noisy input's id and appended one line per input
(atomic appends), so an interrupted command continues with ``--resume``; without it a file that
already holds some of the keys is refused (never duplicated). Bad inputs (a torn or foreign line,
a missing file) are one-line errors naming the file and line.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agent_shell.commands._common import config_from, shared_option
from agent_shell.commands._ical import (_check_split, _done_keys, _fail, _learn_options, _load_lm, _memory, _progress,
                                        _with, episode_timeout_option, model_options, prompt_examples_option)

if TYPE_CHECKING:
    from rich.console import Console

    from agent_shell.ical.learn import LearnConfig
    from agent_shell.ical.memory import Lambdas, Memory
    from agent_shell.run_config import RunConfig
    from agent_shell.lm.protocol import LanguageModel
    from cb_io.records import Trajectory
    from envs.protocol import Environment


@click.group()
def ical() -> None:
    """In-Context Abstraction Learning: noisy trajectories -> abstracted, refined examples -> memory."""


@ical.command()
@shared_option("env", help="The game of the trials and expert trajectories.")
@click.option("--from-run", "runs", multiple=True, type=click.Path(dir_okay=False),
              help="cb-agent run results file(s) whose trials become noisy inputs (repeatable).")
@click.option("--which", type=click.Choice(["failed", "won", "all"]), default="failed", show_default=True,
              help="Which trials of --from-run.")
@click.option("--expert-per-type", type=click.IntRange(min=0), default=0, show_default=True,
              help="Won expert trajectories per task type to corrupt (0: none).")
@click.option("--expert-split", default="train", show_default=True,
              help="Split the corrupted expert trajectories come from.")
@click.option("--corruptions", type=click.IntRange(min=1), default=2, show_default=True,
              help="Corruptions per expert trajectory (insert, repeat, drop, swap; seeded).")
@shared_option("seed", help="Seed of the corruptions.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="ical/noisy.jsonl", show_default=True,
              help="JSONL file of the noisy trajectories.")
@shared_option("resume", help="Add what is missing to --out; without it an existing --out is refused.")
@episode_timeout_option
@config_from("env", "seed", "resume", "episode_timeout")
@_fail
def noisy(runs, which, expert_per_type, expert_split, corruptions, out_path, config: RunConfig) -> None:
    """Collect noisy trajectories: agent trials from results files and corrupted expert trajectories."""
    from agent_shell.ical.noisy import add_trials, corrupted_expert, corrupted_id, noisy_id
    from cb_io.records import read_trajectories
    from cb_io.storage import append_jsonl

    env_name, seed, resume, episode_timeout = config.env, config.seed, config.resume, config.episode_timeout
    if not runs and not expert_per_type:
        raise click.UsageError("give --from-run FILE and/or --expert-per-type N")
    if expert_per_type:
        _check_split(env_name, expert_split)  # before anything is written or loaded
    out = Path(out_path)
    done = {noisy_id(t) for t in read_trajectories(out, on_error="skip")} if out.exists() else set()
    if done and not resume:
        raise ValueError(f"{out} already exists; pass --resume to add what is missing, or choose another --out")
    written, skipped = add_trials(out, runs, which, done), []
    if expert_per_type:
        from agent_shell.demos import expert_demos
        from envs import make_env

        env = make_env(env_name)
        try:
            experts = expert_demos(env, expert_per_type, split=expert_split, time_limit=episode_timeout,
                                   on_task=lambda tid: click.echo(f"collecting expert trajectory {tid}"))
            todo = [e for e in experts if corrupted_id(e.task_id, seed) not in done]
            with _progress() as progress:
                bar = progress.add_task("corrupt + replay", total=len(todo), note="")

                def save(traj: Trajectory) -> None:
                    nonlocal written
                    append_jsonl(out, traj)
                    written += 1
                    progress.update(bar, advance=1, note=traj.task_type)

                corrupted_expert(env, todo, seed, corruptions, save, time_limit=episode_timeout, on_skip=skipped.append)
        finally:
            env.close()
    for message in skipped:
        click.echo(f"warning: {message}", err=True)
    click.echo(f"{written} noisy trajectories written to {out}" + (f", {len(skipped)} skipped" if skipped else ""))


@ical.command()
@click.argument("noisy_path", type=click.Path(dir_okay=False))
@shared_option("env", help="The game the noisy trajectories were played in (their final candidate sets are replayed).")
@_with(model_options)
@click.option("--memory", "memory_dir", type=click.Path(file_okay=False), default=None,
              help="Memory whose retrieved examples are shown (default: the built-in example only).")
@prompt_examples_option
@_learn_options
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="ical/abstract.jsonl", show_default=True,
              help="JSONL file of the abstractions.")
@shared_option("resume", help="Skip noisy ids already in --out; without it an existing id is refused.")
@config_from("env", "model", "dtype", "device", "resume", check_model=False)
@_fail
def abstract(noisy_path, memory_dir, out_path, config: RunConfig, learn: LearnConfig) -> None:
    """Phase 1 only: the LM abstracts each noisy trajectory; outputs are parsed strictly (not executed)."""
    from collections import Counter

    from agent_shell.ical.learn import abstract_record
    from agent_shell.ical.memory import examples_for
    from agent_shell.ical.noisy import noisy_id, read_noisy
    from cb_io.records import EngineError, one_line
    from cb_io.storage import append_jsonl
    from envs import make_env

    trajs = read_noisy(noisy_path)
    out = Path(out_path)
    done = _done_keys(out, config.resume, [noisy_id(t) for t in trajs])
    todo = [t for t in trajs if noisy_id(t) not in done]
    reasons: Counter = Counter()
    n_ok = 0
    if todo:
        lm = _load_lm(config)
        memory = _memory(memory_dir)
        env = make_env(config.env)
        with _progress() as progress, contextlib.closing(env):
            bar = progress.add_task("abstract", total=len(todo), note="")
            for traj in todo:
                try:
                    record, parsed = abstract_record(lm, env, traj, examples_for(memory, traj, learn.k), learn)
                except EngineError as err:  # skipped (--resume abstracts it again); the command goes on
                    click.echo(f"warning: skipped {noisy_id(traj)}: {type(err).__name__}: {one_line(err)}", err=True)
                    reasons[f"skipped ({type(err).__name__})"] += 1
                    continue
                n_ok += parsed.ok
                reasons.update(parsed.reasons)
                append_jsonl(out, record)
                progress.update(bar, advance=1, note=f"parsed {n_ok}")
    click.echo(f"{len(todo)} abstracted now ({len(done)} already in {out}); parsed {n_ok}/{len(todo)}"
               + ("; rejected: " + ", ".join(f"{r} x{c}" for r, c in reasons.most_common()) if reasons else ""))


def _learn_all(trajs: list, out: Path, lm: LanguageModel, env: Environment, memory: Memory | None, config: LearnConfig, human: bool,
               first_outputs: dict[str, str] | None = None) -> None:
    from agent_shell.ical.execution import HumanFeedback
    from agent_shell.ical.learn import learn_example, learn_record
    from agent_shell.ical.memory import examples_for
    from agent_shell.ical.noisy import noisy_id
    from cb_io.storage import append_jsonl

    feedback = HumanFeedback(ask=lambda p: click.prompt(p, default="", show_default=False, prompt_suffix=""),
                             show=click.echo) if human else None
    if human:  # a person's replies are part of every execution: the person ends a hung game (Ctrl-C)
        config = replace(config, episode_timeout=None)
    with _progress() as progress:
        bar = progress.add_task("ical", total=len(trajs), note="")
        kept = 0
        for i, traj in enumerate(trajs, 1):
            shown = examples_for(memory, traj, config.k)
            first = None if first_outputs is None else first_outputs.get(noisy_id(traj))
            outcome = learn_example(lm, env, traj, shown, config, feedback, first_output=first)
            if outcome.example is not None and memory is not None:
                memory.add(outcome.example)
            kept += outcome.example is not None
            append_jsonl(out, learn_record(outcome, shown, config, lm))
            progress.update(bar, advance=1, note=f"kept {kept}/{i}")


def _summarize(out: Path, title: str) -> None:
    from agent_shell.commands._common import make_console
    from agent_shell.ical.summary import outcome_rows, outcome_table, read_outcomes

    records = read_outcomes(out)
    if records:
        make_console().print(outcome_table(outcome_rows(records), title))


def _check_human(human: bool) -> None:
    import sys

    if human and not sys.stdin.isatty():
        raise click.UsageError("--human needs a terminal (standard input is not one)")


@ical.command()
@click.argument("abstract_path", type=click.Path(dir_okay=False))
@click.option("--noisy", "noisy_path", type=click.Path(dir_okay=False), required=True,
              help="The noisy trajectories the abstractions were written from.")
@shared_option("env", help="The game the abstractions are executed in.")
@_with(model_options)
@click.option("--memory", "memory_dir", type=click.Path(file_okay=False), default=None,
              help="Memory for retrieved examples; kept examples are added to it.")
@prompt_examples_option
@click.option("--max-rounds", type=click.IntRange(min=0), default=2, show_default=True,
              help="Revisions after the first execution.")
@_learn_options
@click.option("--human", is_flag=True, help="A person gives feedback at the terminal (Enter accepts a step).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="ical/refine.jsonl", show_default=True,
              help="JSONL file of the refined examples (every round recorded).")
@shared_option("resume", help="Skip noisy ids already in --out; without it an existing id is refused.")
@config_from("env", "model", "dtype", "device", "resume", check_model=False)
@_fail
def refine(abstract_path, noisy_path, memory_dir, human, out_path, config: RunConfig, learn: LearnConfig) -> None:
    """Phase 2: execute each abstraction in the real game and revise it on feedback (every round recorded)."""
    from agent_shell.ical.learn import read_abstractions
    from agent_shell.ical.noisy import noisy_id, read_noisy
    from envs import make_env

    _check_human(human)
    firsts = read_abstractions(abstract_path)
    trajs = [t for t in read_noisy(noisy_path) if noisy_id(t) in firsts]
    out = Path(out_path)
    done = _done_keys(out, config.resume, [noisy_id(t) for t in trajs])
    todo = [t for t in trajs if noisy_id(t) not in done]
    if todo:
        lm = _load_lm(config) if learn.max_rounds else None
        env = make_env(config.env)
        try:
            _learn_all(todo, out, lm, env, _memory(memory_dir), learn, human, firsts)
        finally:
            env.close()
    _summarize(out, f"ICAL refinement ({out})")


@ical.command("build-memory")
@click.argument("noisy_path", type=click.Path(dir_okay=False))
@click.option("--memory", "memory_dir", type=click.Path(file_okay=False), required=True,
              help="Memory folder the won examples enter (created if missing).")
@shared_option("env", help="The game the abstractions are executed in.")
@_with(model_options)
@click.option("--k", type=click.IntRange(min=0), default=2, show_default=True,
              help="Retrieved examples per prompt (the built-in example while the memory is empty).")
@click.option("--max-rounds", type=click.IntRange(min=0), default=2, show_default=True,
              help="Revisions after the first execution.")
@_learn_options
@click.option("--human", is_flag=True, help="A person gives feedback at the terminal (Enter accepts a step).")
@shared_option("resume", help="Skip noisy ids already in the memory's log; without it an existing id is refused.")
@config_from("env", "model", "dtype", "device", "resume", check_model=False)
@_fail
def build_memory(noisy_path, memory_dir, human, config: RunConfig, learn: LearnConfig) -> None:
    """Both phases for every noisy trajectory; won examples enter MEMORY (log: MEMORY/log.jsonl)."""
    from agent_shell.ical.noisy import noisy_id, read_noisy
    from envs import make_env

    _check_human(human)
    trajs = read_noisy(noisy_path)
    out = Path(memory_dir) / "log.jsonl"
    done = _done_keys(out, config.resume, [noisy_id(t) for t in trajs], elsewhere="choose another --memory")
    todo = [t for t in trajs if noisy_id(t) not in done]
    if todo:
        memory = _memory(memory_dir)
        lm = _load_lm(config)
        env = make_env(config.env)
        try:
            _learn_all(todo, out, lm, env, memory, learn, human)
        finally:
            env.close()
    _summarize(out, f"ICAL memory {memory_dir}")


@ical.command()
@click.argument("memory_dir", type=click.Path(file_okay=False, exists=True))
@click.option("--instruction", default=None, help="Query instruction (one query).")
@click.option("--state", default=None, help="Query textual state (initial observation).")
@shared_option("env", help="The game of the --split queries.")
@shared_option("split", help="Evaluate retrieval precision on the tasks of this split instead.")
@shared_option("per_type", default=0, help="With --split: the first N tasks of each task type (0: all).")
@click.option("--k", type=click.IntRange(min=1), default=10, show_default=True, help="Examples retrieved per query.")
@click.option("--lambda-instruction", type=click.FloatRange(min=0), default=0.8, show_default=True,
              help="Weight of the instruction embedding's cosine similarity.")
@click.option("--lambda-text", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="Weight of the textual state embedding's cosine similarity.")
@click.option("--lambda-visual", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Kept for the source's formula; must be 0 (no visual embeddings in text games).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="With --split: one JSON line per query (resumable with --resume).")
@shared_option("resume", help="Skip queries already in --out; without it an existing one is refused.")
@config_from("env", "resume")
@_fail
def retrieve(memory_dir, instruction, state, split, per_type, k, lambda_instruction, lambda_text, lambda_visual,
             out_path, config: RunConfig) -> None:
    """Top-K examples for an instruction, or retrieval precision (share of top-K of the query's type) on a split."""
    from agent_shell.commands._common import make_console
    from agent_shell.ical import Lambdas
    from rich.table import Table

    env_name, resume = config.env, config.resume
    if (instruction is None) == (split is None):
        raise click.UsageError("give either --instruction or --split")
    if split is not None:
        _check_split(env_name, split)  # before the memory and its embedder load
    lambdas = Lambdas(lambda_instruction, lambda_text, lambda_visual)
    console = make_console()
    memory = _memory(memory_dir)
    if not len(memory):
        raise ValueError(f"the memory at {memory_dir} holds no examples")
    if instruction is not None:
        table = Table(title=f"top {k} of {len(memory)} examples")
        for col in ("rank", "score", "task type", "instruction", "example"):
            table.add_column(col)
        for rank, (e, s) in enumerate(memory.retrieve(instruction, state, k, lambdas), 1):
            table.add_row(str(rank), f"{s:.3f}", e.task_type, e.instruction, e.example_id)
        console.print(table)
        return
    _precision(memory, env_name, split, per_type, k, lambdas, out_path, resume, console)


def _precision(memory: Memory, env_name: str, split: str, per_type: int, k: int, lambdas: Lambdas, out_path: str | None, resume: bool,
               console: Console) -> None:
    from collections import Counter

    from agent_shell.ical.memory import retrieval_query
    from agent_shell.ical.summary import precision_rows
    from envs import make_env
    from cb_io.storage import append_jsonl, iter_jsonl
    from rich.table import Table

    env = make_env(env_name)
    out = Path(out_path) if out_path else None
    queries: list[dict] = []
    try:
        from envs.collect import select_tasks

        task_ids = select_tasks(env, split, per_type or None)
        if out is not None:
            _done_keys(out, resume, [f"{split}:{t}" for t in task_ids])
            if out.exists():
                queries = [r for _, r, err in iter_jsonl(out) if err is None and isinstance(r, dict) and "noisy_id" in r]
        done = {q["noisy_id"] for q in queries}
        with _progress() as progress:
            bar = progress.add_task("queries", total=len(task_ids), note="", completed=len(done))
            for tid in task_ids:
                if f"{split}:{tid}" in done:
                    continue
                q = retrieval_query(memory, env.reset(tid), f"{split}:{tid}", k, lambdas)
                queries.append(q)
                if out is not None:
                    append_jsonl(out, q)
                progress.update(bar, advance=1)
    finally:
        env.close()
    table = Table(title=f"retrieval precision@{k} on {split} ({len(memory)} examples; lambda_I={lambdas.instruction}, "
                        f"lambda_text={lambdas.text})")
    for col in ("task type", "queries", "precision", "examples of the type in memory"):
        table.add_column(col)
    have = Counter(e.task_type for e in memory.examples)
    for r in precision_rows(queries):
        table.add_row(r["task_type"], str(r["queries"]), f"{r['precision']:.3f}",
                      str(len(memory) if r["task_type"] == "all" else have.get(r["task_type"], 0)))
    console.print(table)
