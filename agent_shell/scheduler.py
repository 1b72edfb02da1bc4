"""The episode scheduler: which (agent, game) episodes a run plays, in which order, what happens when
one fails, where its unfinished state lives and what the run prints. Decided here once for the two
executors that play the episodes: :class:`InProcessExecutor` (this process, one episode at a time;
imports no Ray) and :class:`agent_shell.parallel.RayExecutor` (``--workers N`` / ``--ray-address``:
N Ray actors, a killed worker replaced).

Order (:func:`schedule`): game by game, every agent of a game (in the given agent order) before the
next game starts; the games round robin over task types when the types are known (the first game of
each type in first-seen order, then the second of each, ...; within a type the given order). A run
stopped part-way is then a paired comparison of the agents on every game it reached, spread over all
task types alike, so its partial results table compares the agents fairly. Episodes start in this
order; one executor slot plays them in it, several slots append the records as episodes finish (the
same records, another line order). A resumed run drops the finished episodes and keeps the order.

Retry rule: an episode is independent of the others (its agent, task, budget and seed decide its
actions), so an attempt that ends in an exception is played again from scratch, at the front of the
queue: an exception raised while playing it (anything but :class:`cb_io.records.EngineError`), or its Ray
worker dying (killed, out of memory, a crashed engine taking the process down). ``KeyboardInterrupt``
is never caught. After ``max_attempts`` failed attempts the episode is stored as an error record.

Error-record rule: an engine fault (:class:`cb_io.records.EngineError`) ends its episode at once, without a
retry (the same fault would come again), and so does the episode's wall-clock limit
(``time_limit``, :func:`envs.episode.time_limit`: an :class:`cb_io.records.EpisodeTimeout` raised in the
process playing it, whichever executor that is; a step that never returns is such a fault):
:func:`play_episode` returns its
:func:`agent_shell.results.error_record` (``success`` False, the trials so far, ``error``: type,
message, trial, step). An episode that failed every attempt gets :func:`failed_record` (no trials,
``error`` with the last attempt's type and message, ``attempts`` and every attempt's reason). Either
is counted apart from won and lost; ``--resume`` plays such an episode again (a restart may fix
what ended it: a broken engine, a hung step) and its new record replaces the error record
(:func:`agent_shell.results.unique_episodes`), unless ``keep_errors`` (``--keep-errors``).
An output that cannot be written (:class:`cb_io.storage.OutputError`: a full or read-only disk) is no
episode's fault: it stops the run at once, and ``--resume`` continues it. Nor is a fault of the
backbone itself (:class:`agent_shell.lm.protocol.BackboneFault`: a pass whose shapes do not fit its
weights, ids past its embedding table): every episode would meet it again, so it stops the run at
once too, with its one-line message, instead of retrying each episode and storing error records.

Partial-file rule: while an episode runs, the process playing it rewrites its state after every
step to ``<results>.partial/<agent>/<task>.json`` (:func:`partial_path`; temp file + rename), so a
crash never loses what happened; the driver alone appends finished records
(:func:`agent_shell.results.store_record`, one atomic line), then removes the state; the folders
the states leave empty go when every episode is stored and the executor is closed (never while a
worker may write into them). Executors whose
episodes run beside the results folder write these states (in-process, a local Ray cluster); on a
cluster joined with ``--ray-address`` the workers may not see that folder and write none.

Progress: the same for both executors: an optional rich bar per agent (:func:`make_progress`:
done/total, won, rate, the episodes running) and one plain line per finished episode
(:func:`episode_summary`), per retried and per failed episode.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Protocol, Sequence

from agent_shell.lm.protocol import BackboneFault
from agent_shell.results import (check_results_file, episode_record, error_record, store_record,
                                 trial_record)
from envs.protocol import Environment
from cb_io.records import EPISODE_TIMEOUT_S
from cb_io.storage import OutputError, write_json_atomic

if TYPE_CHECKING:
    from rich.progress import Progress

    from agent_shell.agents import Reflexion, Trial


@dataclass(frozen=True)
class Job:
    """One episode to play: ``agent`` on ``task_id``; ``partial``: where the process playing it keeps
    its unfinished state (None: nowhere)."""

    agent: str
    task_id: str
    partial: str | None = None


class Failure(NamedTuple):
    """A failed attempt: the exception's type name and a one-line reason."""

    type: str
    reason: str


class Executor(Protocol):
    """Plays the scheduler's jobs. ``slots``: episodes it plays at once; ``local_files``: its
    episodes run where the results folder is (they write partial states)."""

    slots: int
    local_files: bool

    def start(self, max_steps: int, meta: dict[str, Any], on_step: Callable[[Job, list], None],
              time_limit: float | None = None) -> None:
        """Get ready; ``on_step(job, trials)`` may be called after every step (progress); every job
        is played by :func:`play_job` with ``time_limit``."""

    def submit(self, job: Job) -> None:
        """Start ``job`` (called only while fewer than ``slots`` jobs run)."""

    def wait(self) -> tuple[Job, dict[str, Any] | Failure]:
        """The next job to finish and its record, or a :class:`Failure` of that attempt."""

    def close(self) -> None:
        """Release what :meth:`start` took (also after an exception)."""


# ---------------------------------------------------------------------------------------------
# the order


def round_robin_by_type(task_ids: Sequence[str], task_type_of: Callable[[str], str]) -> list[str]:
    """``task_ids`` reordered: the first task of each type (types in first-seen order), then the
    second of each, ...; within a type the given order is kept."""
    groups: dict[str, list[str]] = {}
    for t in task_ids:
        groups.setdefault(task_type_of(t), []).append(t)
    return [t for rank in zip_longest(*groups.values()) for t in rank if t is not None]


def schedule(agent_names: Sequence[str], task_ids: Sequence[str],
             task_type_of: Callable[[str], str] | None = None) -> list[tuple[str, str]]:
    """The (agent, task id) episodes of a run in the order they start: game by game (games round
    robin over task types when ``task_type_of`` is given), each game's agents in ``agent_names``
    order; duplicated names and ids count once."""
    tasks = list(dict.fromkeys(task_ids))
    if task_type_of is not None:
        tasks = round_robin_by_type(tasks, task_type_of)
    return [(agent, t) for t in tasks for agent in dict.fromkeys(agent_names)]


def partial_path(results_path: Path, agent_name: str, task_id: str) -> Path:
    """Where an unfinished episode's state lives while it runs."""
    digest = hashlib.sha1(task_id.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(task_id).parent.name or task_id)
    return _partial_root(results_path) / agent_name / f"{stem[-60:]}-{digest}.json"


def _partial_root(results_path: Path) -> Path:
    return results_path.parent / f"{results_path.name}.partial"


def _remove_empty_partial_folders(results_path: Path) -> None:
    """Remove ``<results>.partial/<agent>/`` folders that hold no state, then ``<results>.partial/``
    if it is empty: once the run's episodes are stored and its executor closed, so no worker is
    writing into a folder while it goes."""
    root = _partial_root(results_path)
    for folder in (*(sorted(root.iterdir()) if root.is_dir() else ()), root):
        try:
            folder.rmdir()
        except OSError:  # not empty (a state another run may resume), absent, or a file
            pass


# ---------------------------------------------------------------------------------------------
# the run


@dataclass
class RunSummary:
    """What :func:`play_episodes` did for one agent: finished records (this run), skipped task ids
    (finished before: ``resume``)."""

    records: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def n_won(self) -> int:
        return sum(r["success"] for r in self.records)

    @property
    def n_errors(self) -> int:
        return sum(bool(r.get("error")) for r in self.records)


def play_episodes(executor: Executor, agent_names: Sequence[str], task_ids: Sequence[str],
                  results_path: str | os.PathLike, max_steps: int, *, resume: bool = False,
                  meta: dict[str, Any] | None = None, task_type_of: Callable[[str], str] | None = None,
                  max_attempts: int = 3, progress: Progress | None = None,
                  echo: Callable[[str], None] | None = None,
                  time_limit: float | None = EPISODE_TIMEOUT_S, keep_errors: bool = False) -> dict[str, RunSummary]:
    """Play every agent on every task with ``executor`` in :func:`schedule` order, appending one
    record per finished episode to ``results_path``.

    Args:
        executor: :class:`InProcessExecutor` or :class:`agent_shell.parallel.RayExecutor`.
        agent_names, task_ids: the episodes (every agent on every task, duplicates played once).
        results_path: JSONL file (created with its folder).
        max_steps: step budget per trial, think steps included.
        resume: skip the episodes already in ``results_path``. With False an existing record of one
            of the agents on one of the tasks raises ValueError instead of being duplicated.
        meta: extra fields for every record (env, split, model, seed, ...); ``meta["split"]``, when
            given, is the split every task must belong to.
        task_type_of: task id -> task type: the order's round robin and failed episodes' records.
        max_attempts: attempts per episode before its :func:`failed_record` is stored.
        progress: a rich progress (:func:`make_progress`) to update, one bar per agent, or None.
        echo: called with one plain line per finished, retried or failed episode.
        time_limit: wall-clock seconds per episode (all its trials), past which it ends as an error
            record (:class:`cb_io.records.EpisodeTimeout`); None: no limit.
        keep_errors: with ``resume``, count the episodes whose record is an error record as
            finished instead of playing them again.

    Returns:
        agent name -> :class:`RunSummary` of this run.

    Raises:
        ValueError: the results file cannot be continued
            (:func:`agent_shell.results.check_results_file`), or ``max_attempts`` below 1.
        RuntimeError: a Ray worker cannot build its players.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts} must be >= 1")
    results_path = Path(results_path)
    meta = dict(meta or {})
    order = schedule(agent_names, task_ids, task_type_of)
    names = list(dict.fromkeys(agent_names))
    tasks = list(dict.fromkeys(t for _, t in order))
    finished = check_results_file(results_path, names, tasks, resume, {**meta, "budget": max_steps}, keep_errors)
    summaries = {name: RunSummary(skipped=[t for t in tasks if t in finished[name]]) for name in names}

    def job(agent: str, task_id: str) -> Job:
        partial = partial_path(results_path, agent, task_id) if executor.local_files else None
        return Job(agent, task_id, None if partial is None else str(partial))

    queue = deque(job(a, t) for a, t in order if t not in finished[a])
    if not queue:  # finished before (a run killed after its last record leaves emptied folders)
        _remove_empty_partial_folders(results_path)
        return summaries
    say = echo or (lambda line: None)
    status = _Status(progress, {name: len(tasks) - len(s.skipped) for name, s in summaries.items()})
    errors: dict[Job, tuple[Failure, ...]] = {}
    running = 0
    executor.start(max_steps, meta, status.step, time_limit)
    try:
        while queue or running:
            while queue and running < executor.slots:
                next_job = queue.popleft()
                executor.submit(next_job)
                running += 1
                status.started(next_job)
            done, outcome = executor.wait()
            running -= 1
            status.stopped(done)
            if isinstance(outcome, Failure):
                errors[done] = errors.get(done, ()) + (outcome,)
                if len(errors[done]) < max_attempts:
                    queue.appendleft(done)
                    say(f"{done.agent} {done.task_id} retried (attempt {len(errors[done]) + 1}/{max_attempts}): "
                        f"{outcome.reason}")
                    continue
                record = failed_record(done.agent, done.task_id, task_type_of(done.task_id) if task_type_of else None,
                                       errors[done], max_steps, meta)
                say(f"{done.agent} {done.task_id} FAILED after {max_attempts} attempts, stored as an error record: "
                    f"{outcome.reason}")
            else:
                record = outcome
                say(episode_summary(record))
            store_record(results_path, record, None if done.partial is None else Path(done.partial))
            summaries[done.agent].records.append(record)
            status.finished(done.agent, summaries[done.agent])
    finally:
        executor.close()
    _remove_empty_partial_folders(results_path)
    return summaries


class _Status:
    """The progress bars: one per agent, with the episodes it is playing right now."""

    def __init__(self, progress: Progress | None, totals: Mapping[str, int]):
        self.progress = progress
        self.bars = {} if progress is None else {
            name: progress.add_task(name, total=n, won=0, done=0, rate="-", step="") for name, n in totals.items()}
        self.running: dict[Job, str] = {}

    def started(self, job: Job) -> None:
        self.running[job] = ""
        self._show(job.agent)

    def step(self, job: Job, trials: list) -> None:
        self.running[job] = f" trial {len(trials)} step {len(trials[-1].episode.steps)}"
        self._show(job.agent)

    def stopped(self, job: Job) -> None:
        self.running.pop(job, None)
        self._show(job.agent)

    def finished(self, agent: str, summary: RunSummary) -> None:
        if self.progress is not None:
            done = len(summary.records)
            self.progress.update(self.bars[agent], advance=1, won=summary.n_won, done=done,
                                 rate=f"{100 * summary.n_won / done:.0f}%")

    def _show(self, agent: str) -> None:
        if self.progress is not None:
            step = ", ".join(j.task_id + detail for j, detail in self.running.items() if j.agent == agent)
            self.progress.update(self.bars[agent], step=step)


# ---------------------------------------------------------------------------------------------
# one episode, wherever it runs


def play_episode(env: Environment, agent: Reflexion, task_id: str, max_steps: int, meta: dict[str, Any] | None = None,
                 on_step: Callable[[list[Trial]], None] | None = None,
                 time_limit: float | None = None) -> dict[str, Any]:
    """Play one episode (all trials) of ``agent`` on ``task_id`` and return its results record
    (:func:`agent_shell.results.episode_record`); ``on_step(trials)`` runs after every step.
    ``meta["split"]``, when given, is the split the task must belong to. An
    :class:`cb_io.records.EngineError`, or the episode running past ``time_limit`` seconds of wall-clock
    time (:class:`cb_io.records.EpisodeTimeout`; None: no limit), ends the episode and its
    :func:`agent_shell.results.error_record` is returned; any other exception propagates. Writes
    nothing. A limit is kept on the main thread only (:func:`envs.episode.play_within`).
    ``meta["expert_mix"]`` > 0 (DAgger's beta, training play of ``cb-agent improve --beta``) plays
    with the adapter's expert on, each environment step executing the expert's action instead of
    the agent's with that probability (:class:`envs.episode.Episode`'s ``expert_mix``, seeded by the
    task and ``meta["concept_round"]``)."""
    from envs.episode import Episode, import_engines, play_within

    split = (meta or {}).get("split")
    mix = float((meta or {}).get("expert_mix") or 0.0)
    mixing = {"expert": True, "expert_mix": mix, "mix_seed": (meta or {}).get("concept_round", 0)} if mix else {}
    seen: list = []  # the trials so far, for an error record

    def step_done(trials: list) -> None:
        seen[:] = trials
        if on_step is not None:
            on_step(trials)

    def played() -> dict[str, Any]:
        result = agent.run(lambda: Episode(env, task_id, max_steps, split=split, **mixing), on_step=step_done)
        return episode_record(agent.name, task_id, result.trials, time.perf_counter() - start, meta or {})

    def fault(err: BaseException) -> dict[str, Any]:  # this episode ends; the run goes on
        type_of = getattr(env, "task_type_of", None)
        return error_record(agent.name, task_id, type_of(task_id) if type_of else "", seen, max_steps,
                            time.perf_counter() - start, meta or {}, err)

    import_engines(env)  # before the clock starts: a limit never interrupts a first import
    start = time.perf_counter()
    return play_within(time_limit, played, fault)


def play_job(env: Environment, agents: Mapping[str, Reflexion], job: Job, max_steps: int, meta: dict[str, Any],
             on_step: Callable[[Job, list], None] | None = None, time_limit: float | None = None) -> dict[str, Any]:
    """:func:`play_episode` of ``job`` within ``time_limit`` seconds, rewriting its partial state
    (when it has a path) after every step; what both executors run for a job."""
    agent = agents[job.agent]

    def stepped(trials: list) -> None:
        if job.partial is not None:
            write_json_atomic(Path(job.partial), {"agent": agent.name, "task_id": job.task_id, "finished": False,
                                                  "trials": [trial_record(t) for t in trials]})
        if on_step is not None:
            on_step(job, trials)

    return play_episode(env, agent, job.task_id, max_steps, meta, on_step=stepped, time_limit=time_limit)



def failure_of(err: BaseException, prefix: str = "") -> Failure:
    """The :class:`Failure` of an attempt that raised ``err``: the exception the episode raised (a
    Ray error's ``cause``, not Ray's wrapping), ``prefix`` and the exception's first line
    (at most 300 characters)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(err)):
        err = cause
    return Failure(type(err).__name__, prefix + f"{type(err).__name__}: {err}".splitlines()[0][:300])


def failed_record(agent_name: str, task_id: str, task_type: str | None, errors: Sequence[Failure],
                  max_steps: int, meta: dict[str, Any]) -> dict[str, Any]:
    """The record of an episode that failed every attempt (``errors``: one :class:`Failure` per
    attempt): :func:`agent_shell.results.error_record` with no trials (``error``: the last attempt's
    type and message, ``attempts``, every attempt's ``reasons``)."""
    record = error_record(agent_name, task_id, task_type or "unknown", [], max_steps, 0.0, meta,
                          RuntimeError(errors[-1].reason))
    record["error"].update(type=errors[-1].type, message=errors[-1].reason, attempts=len(errors),
                           reasons=[e.reason for e in errors])
    return record


class InProcessExecutor:
    """Plays the jobs in this process, one at a time, with ``agents`` (agent name -> agent) on
    ``env``. An exception other than ``KeyboardInterrupt``, an :class:`cb_io.storage.OutputError` or an
    :class:`agent_shell.lm.protocol.BackboneFault` (both stop the run) ends the attempt as a :class:`Failure`."""

    slots = 1
    local_files = True

    def __init__(self, env: Environment, agents: Mapping[str, Reflexion]):
        self.env, self.agents = env, agents
        self.pending: deque[Job] = deque()

    def start(self, max_steps: int, meta: dict[str, Any], on_step: Callable[[Job, list], None],
              time_limit: float | None = None) -> None:
        self.max_steps, self.meta, self.on_step, self.time_limit = max_steps, meta, on_step, time_limit

    def submit(self, job: Job) -> None:
        self.pending.append(job)

    def wait(self) -> tuple[Job, dict[str, Any] | Failure]:
        job = self.pending.popleft()
        try:
            return job, play_job(self.env, self.agents, job, self.max_steps, self.meta, self.on_step, self.time_limit)
        except (OutputError, BackboneFault):  # no episode's fault, and no retry helps: the run stops
            raise
        except Exception as err:  # noqa: BLE001 - retried by the scheduler's rule, then recorded
            return job, failure_of(err)

    def close(self) -> None:
        self.pending.clear()


# ---------------------------------------------------------------------------------------------
# output


def episode_summary(record: dict[str, Any]) -> str:
    """A finished episode as one plain line (agent, task, won, steps, s/step; the error if any, or
    that a trial ended with its context window full)."""
    from agent_shell.progress import episode_line

    error = record.get("error")
    full = any("window_full" in (t.get("log") or {}) for t in record.get("trials") or ())
    extra = f"ERROR {error['message']}" if error else "(context window full)" if full else ""
    return episode_line(record["agent"], record["task_id"], bool(record["success"]), record["steps"],
                        record.get("s_per_step"), extra)


def make_progress() -> Progress:
    """A rich progress bar per agent: episodes done, the running success rate, the episodes running."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("won {task.fields[won]}/{task.fields[done]}"
                   " ({task.fields[rate]})"), TimeElapsedColumn(),
        TextColumn("{task.fields[step]}"),
    )


__all__ = ["Executor", "Failure", "InProcessExecutor", "Job", "RunSummary", "episode_summary", "failed_record",
           "failure_of", "make_progress", "partial_path", "play_episode", "play_episodes", "play_job",
           "round_robin_by_type", "schedule"]
