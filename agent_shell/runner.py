"""Episodes of an agent on a list of tasks, with durable results, resume and a progress bar.

Results are JSON Lines, one *finished* episode per line (all Reflexion trials together; the
record, its reading and writing: :mod:`agent_shell.results`), appended atomically by one process
at a time (:func:`agent_shell.results.store_record`). While an episode runs, its state
is rewritten after every step to ``<results>.partial/<agent>/<task>.json`` (temp file + rename),
so a crash never loses what happened; that file is removed once the episode's line is stored.
``resume=True`` skips every (agent, task) already in the results file, so an interrupted run
restarts exactly the unfinished episodes: none lost, none duplicated. A torn final line (a kill
during the write) is reported and its episode redone (``cb-agent run --resume`` first moves it to
``<results>.torn``).

An engine fault inside an episode (:class:`envs.EngineError`: a simulator exception, a dead JVM)
ends that episode only: its line is an *error episode* (``success`` False, ``error`` = the fault's
type, one-line message, trial and step, and the trials played so far), the run goes on, and the
report counts errors apart from won and lost episodes. ``--resume`` treats error episodes as
finished (the same fault would come again); rerun them with ``--game`` into another folder.

Every record carries loop statistics (:func:`agent_shell.results.loop_statistics`): the number of distinct
environment actions and the longest repeated cycle (e.g. ``open X`` / ``close X`` three times).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agent_shell.results import check_results_file, episode_record, error_record, store_record, trial_record
from envs.protocol import Environment
from envs.storage import write_json_atomic

if TYPE_CHECKING:
    from rich.progress import Progress

    from agent_shell.agents import Reflexion


def partial_path(results_path: Path, agent_name: str, task_id: str) -> Path:
    """Where an unfinished episode's state lives while it runs."""
    digest = hashlib.sha1(task_id.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(task_id).parent.name or task_id)
    return results_path.parent / f"{results_path.name}.partial" / agent_name / f"{stem[-60:]}-{digest}.json"


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class RunSummary:
    """What :func:`run_episodes` did: finished records (this run), skipped task ids (resume)."""

    records: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def n_won(self) -> int:
        return sum(r["success"] for r in self.records)

    @property
    def n_errors(self) -> int:
        return sum(bool(r.get("error")) for r in self.records)


def run_episodes(env: Environment, agent: Reflexion, task_ids: Sequence[str], results_path: str | os.PathLike,
                 max_steps: int, resume: bool = True, meta: dict[str, Any] | None = None,
                 progress: Progress | None = None,
                 on_episode: Callable[[dict], None] | None = None) -> RunSummary:
    """Play ``agent`` (an :class:`agent_shell.agents.Reflexion`) on each task, appending results.

    Args:
        env: the environment adapter.
        agent: the trial loop (``.name``, ``.run(new_episode, on_step)``).
        task_ids: tasks in order (duplicates played once).
        results_path: JSONL file (created with its folder).
        max_steps: step budget per trial, think steps included.
        resume: skip tasks this agent already finished in ``results_path``. With ``False`` an
            existing record of this agent raises ValueError instead of being duplicated.
        meta: extra fields for every record (env, split, model, seed, ...); ``meta["split"]``, when
            given, is the split every task must belong to.
        progress: a :class:`rich.progress.Progress` to report to (or None).
        on_episode: called with each finished record (error episodes included).

    An :class:`envs.EngineError` ends its episode only: the episode is stored as an error record
    (:func:`error_record`) and the next task starts.
    """
    results_path = Path(results_path)
    todo = list(dict.fromkeys(task_ids))
    finished = check_results_file(results_path, [agent.name], todo, resume,
                                  {**(meta or {}), "budget": max_steps})[agent.name]
    summary = RunSummary(skipped=[t for t in todo if t in finished])
    todo = [t for t in todo if t not in finished]
    bar = None
    if progress is not None:
        bar = progress.add_task(agent.name, total=len(todo), won=0, done=0, rate="-", step="")
    for task_id in todo:
        partial = partial_path(results_path, agent.name, task_id)

        def save(trials: list, task_id: str = task_id, partial: Path = partial) -> None:
            write_json_atomic(partial, {"agent": agent.name, "task_id": task_id, "finished": False,
                                         "trials": [trial_record(t) for t in trials]})
            if bar is not None:
                progress.update(bar, step=f"trial {len(trials)} step {len(trials[-1].episode.steps)}")

        record = play_episode(env, agent, task_id, max_steps, meta, on_step=save)
        store_record(results_path, record, partial)
        summary.records.append(record)
        if bar is not None:
            done = len(summary.records)
            progress.update(bar, advance=1, won=summary.n_won, done=done,
                            rate=f"{100 * summary.n_won / done:.0f}%", step="")
        if on_episode is not None:
            on_episode(record)
    return summary


def play_episode(env: Environment, agent: Reflexion, task_id: str, max_steps: int, meta: dict[str, Any] | None = None,
                 on_step: Callable[[list], None] | None = None) -> dict[str, Any]:
    """Play one episode (all trials) of ``agent`` on ``task_id`` and return its results record
    (:func:`episode_record`); ``on_step(trials)`` runs after every step. ``meta["split"]``, when
    given, is the split the task must belong to. An :class:`envs.EngineError` ends the episode
    and its :func:`error_record` is returned. Writes nothing: the sequential runner and the
    parallel workers (:mod:`agent_shell.parallel`) both call it."""
    from envs.episode import Episode
    from envs.protocol import EngineError

    split = (meta or {}).get("split")
    seen: list = []  # the trials so far, for an error record

    def step_done(trials: list) -> None:
        seen[:] = trials
        if on_step is not None:
            on_step(trials)

    start = time.perf_counter()
    try:
        result = agent.run(lambda: Episode(env, task_id, max_steps, split=split), on_step=step_done)
        return episode_record(agent.name, task_id, result.trials, time.perf_counter() - start, meta or {})
    except EngineError as err:  # this episode ends; the run goes on
        type_of = getattr(env, "task_type_of", None)
        return error_record(agent.name, task_id, type_of(task_id) if type_of else "", seen, max_steps,
                            time.perf_counter() - start, meta or {}, err)


def episode_summary(record: dict[str, Any]) -> str:
    """A finished episode as one plain line (agent, task, won, steps, s/step; the error if any, or
    that a trial ended with its context window full), for output that is not a terminal."""
    from agent_shell.progress import episode_line

    error = record.get("error")
    full = any("window_full" in (t.get("log") or {}) for t in record.get("trials") or ())
    extra = f"ERROR {error['message']}" if error else "(context window full)" if full else ""
    return episode_line(record["agent"], record["task_id"], bool(record["success"]), record["steps"],
                        record.get("s_per_step"), extra)


def make_progress() -> Progress:
    """A rich progress bar showing the running success rate and the current step."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("won {task.fields[won]}/{task.fields[done]}"
                   " ({task.fields[rate]})"), TimeElapsedColumn(),
        TextColumn("{task.fields[step]}"),
    )
