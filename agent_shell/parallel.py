"""Episodes in parallel on a Ray cluster (``cb-agent run --workers N``), with the runner's guarantees.

Each worker is a Ray actor that builds its own players once (environment instance, backbone,
agents: ``make_players()``) and then plays one episode at a time
(:func:`agent_shell.runner.play_episode`). Only the driver writes: it appends every finished
record as one atomic line (:func:`agent_shell.results.store_record`), so results go to the same
``results.jsonl`` as a sequential run and ``--resume`` works the same way. Workers write no
partial state.

Failures: an engine fault (:class:`envs.EngineError`) ends its episode as in the sequential
runner (its error record comes back from the worker). When a worker dies (killed, out of
memory, a crashed engine taking the process down) its episode is played again on a fresh
worker; an episode that raises anything else is played again too. After ``max_attempts`` failed
attempts the episode is stored as an *error record* (:func:`failed_record`: ``success`` false,
no steps, ``error`` with the last type and message and every attempt's reason), so it is never
dropped silently nor duplicated,
and a resumed run skips it like any finished episode (delete its line to retry it). An episode
is stored once, by the driver, only after it finished.

An episode depends only on its agent, task, budget and seed (greedy routing; sampled candidate
sets are seeded per step), so a parallel run gives the same per-episode records as a sequential
one, up to timing fields and line order (lines are appended as episodes finish).

Ray is imported only here and only when a parallel run starts: ``--workers 1`` never needs it
(``pip install 'cb-agent[ray]'``). Must not be imported by the agents or the LM backends.
"""

from __future__ import annotations

import os
import time
from collections import deque
from itertools import zip_longest
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agent_shell.results import check_results_file, store_record
from agent_shell.runner import RunSummary, episode_summary, play_episode

if TYPE_CHECKING:
    from rich.progress import Progress

#: ``make_players() -> (env, {agent name: Reflexion})``: picklable; called once in each worker.
MakePlayers = Callable[[], tuple[Any, Mapping[str, Any]]]
INSTALL_HINT = "parallel episodes need Ray: pip install 'cb-agent[ray]' (or run with --workers 1)"


class EpisodeWorker:
    """What runs inside one Ray actor: its own players, one episode at a time."""

    def __init__(self, make_players: MakePlayers, max_steps: int, meta: dict[str, Any]):
        self.env, self.agents = make_players()
        self.max_steps = max_steps
        self.meta = meta

    def ready(self) -> int:
        """The worker's process id, once its players are built (raises what building raised)."""
        return os.getpid()

    def play(self, agent_name: str, task_id: str) -> dict[str, Any]:
        return play_episode(self.env, self.agents[agent_name], task_id, self.max_steps, self.meta)


def failed_record(agent_name: str, task_id: str, task_type: str | None, errors: Sequence[tuple[str, str]],
                  max_steps: int, meta: dict[str, Any]) -> dict[str, Any]:
    """The record of an episode that failed every attempt (``errors``: (exception type, one-line
    reason) per attempt): :func:`agent_shell.results.error_record` with no trials (``error``: the
    last attempt's type and message, ``attempts``, every attempt's ``reasons``)."""
    from agent_shell.results import error_record

    record = error_record(agent_name, task_id, task_type or "unknown", [], max_steps, 0.0, meta,
                          RuntimeError(errors[-1][1]))
    record["error"].update(type=errors[-1][0], message=errors[-1][1], attempts=len(errors),
                           reasons=[reason for _, reason in errors])
    return record


@dataclass
class _Job:
    agent: str
    task_id: str
    errors: tuple[tuple[str, str], ...] = ()  # (exception type, reason) per failed attempt


def start_ray(workers: int, address: str | None = None) -> bool:
    """Connect to the cluster at ``address`` or start a local one with ``workers`` CPUs; False when
    this process was already connected (then the caller must not shut it down).

    Raises:
        ModuleNotFoundError: Ray is not installed (the message says how to install it).
    """
    try:
        import ray
    except ImportError as err:
        raise ModuleNotFoundError(INSTALL_HINT) from err
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return True


def round_robin_by_type(task_ids: Sequence[str], task_type_of: Callable[[str], str]) -> list[str]:
    """``task_ids`` reordered: the first task of each type (types in first-seen order), then the
    second of each, ...; within a type the given order is kept."""
    groups: dict[str, list[str]] = {}
    for t in task_ids:
        groups.setdefault(task_type_of(t), []).append(t)
    return [t for rank in zip_longest(*groups.values()) for t in rank if t is not None]


def run_parallel(make_players: MakePlayers, agent_names: Sequence[str], task_ids: Sequence[str],
                 results_path: str | os.PathLike, max_steps: int, *, workers: int, resume: bool = False,
                 meta: dict[str, Any] | None = None, ray_address: str | None = None, max_attempts: int = 3,
                 task_type_of: Callable[[str], str] | None = None, progress: Progress | None = None,
                 on_event: Callable[[str], None] | None = None) -> dict[str, RunSummary]:
    """Play every (agent, task) on ``workers`` Ray actors; the driver appends the records.

    Episodes start task by task, each task's agents in ``agent_names`` order (a partial run is a
    paired comparison on the tasks it reached), the tasks in their given order or, with
    ``task_type_of``, round robin over task types (the first task of each type, then the second,
    ...: a partial run covers every type alike); records are appended in finishing order.

    Args:
        make_players: builds ``(env, {agent name: Reflexion})`` inside each worker (picklable).
        agent_names, task_ids: the episodes (every agent on every task, duplicates played once).
        results_path, max_steps, resume, meta: as :func:`agent_shell.runner.run_episodes`.
        workers: number of actors (>= 1), each with one CPU.
        ray_address: join this Ray cluster instead of starting a local one.
        max_attempts: attempts per episode before its error record is stored.
        task_type_of: task id -> task type, for error records.
        progress: a rich progress to update (one bar per agent), or None.
        on_event: called with a plain line per finished, retried or failed episode.

    Returns:
        agent name -> :class:`RunSummary` of this run.

    Raises:
        ValueError: the results file cannot be continued (as in the sequential runner), or
            ``workers`` / ``max_attempts`` below 1.
        RuntimeError: a worker cannot build its players (the error it raised, once).
    """
    if workers < 1 or max_attempts < 1:
        raise ValueError(f"workers={workers} and max_attempts={max_attempts} must be >= 1")
    results_path = Path(results_path)
    meta = dict(meta or {})
    todo = list(dict.fromkeys(task_ids))
    if task_type_of is not None:
        todo = round_robin_by_type(todo, task_type_of)
    finished = check_results_file(results_path, list(dict.fromkeys(agent_names)), todo, resume,
                                  {**meta, "budget": max_steps})
    summaries = {name: RunSummary(skipped=[t for t in todo if t in done]) for name, done in finished.items()}
    # game-major: every agent plays a game before the next game starts, so a run stopped part-way
    # holds a paired comparison of the agents on the games it reached
    queue: deque[_Job] = deque(_Job(name, t) for t in todo for name in summaries if t not in finished[name])
    if not queue:
        return summaries
    bars = {}
    if progress is not None:
        for name, summary in summaries.items():
            bars[name] = progress.add_task(name, total=len(todo) - len(summary.skipped), won=0, done=0, rate="-",
                                           step="")
    event = on_event or (lambda line: None)

    owns_ray = start_ray(workers, ray_address)
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    actor_class = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=1)(EpisodeWorker)

    def new_actor() -> Any:
        actor = actor_class.remote(make_players, max_steps, meta)
        try:
            ray.get(actor.ready.remote())
        except RayActorError as err:
            raise RuntimeError(f"a worker could not build its players: {_reason(err)}") from None
        return actor

    started: list[Any] = []

    def fresh_actor() -> Any:
        started.append(new_actor())
        return started[-1]

    try:
        running: dict[Any, tuple[Any, _Job]] = {}  # object ref -> (actor, job)
        idle = [fresh_actor() for _ in range(min(workers, len(queue)))]
        while queue or running:
            while idle and queue:
                actor, job = idle.pop(), queue.popleft()
                running[actor.play.remote(job.agent, job.task_id)] = (actor, job)
                if progress is not None:
                    progress.update(bars[job.agent], step=f"{len(running)} running")
            (ref,), _ = ray.wait(list(running), num_returns=1)
            actor, job = running.pop(ref)
            try:
                record = ray.get(ref)
            except (RayActorError, RayTaskError) as err:
                died = isinstance(err, RayActorError)
                if died:
                    ray.kill(actor)
                    actor = fresh_actor()
                idle.append(actor)
                errors = job.errors + ((_type(err), ("worker died: " if died else "") + _reason(err)),)
                if len(errors) < max_attempts:
                    queue.appendleft(_Job(job.agent, job.task_id, errors))
                    event(f"{job.agent} {job.task_id} retried (attempt {len(errors) + 1}/{max_attempts}): "
                          f"{errors[-1][1]}")
                    continue
                record = failed_record(job.agent, job.task_id, task_type_of(job.task_id) if task_type_of else None,
                                      errors, max_steps, meta)
                event(f"{job.agent} {job.task_id} FAILED after {max_attempts} attempts, stored as an error record: "
                      f"{errors[-1][1]}")
            else:
                idle.append(actor)
                event(episode_summary(record))
            store_record(results_path, record)
            summary = summaries[job.agent]
            summary.records.append(record)
            if progress is not None:
                done = len(summary.records)
                progress.update(bars[job.agent], advance=1, won=summary.n_won, done=done,
                                rate=f"{100 * summary.n_won / done:.0f}%")
    finally:
        for actor in started:
            ray.kill(actor)
        if owns_ray:
            ray.shutdown()
    return summaries


def _type(err: BaseException) -> str:
    """The name of the exception that failed an attempt (the worker's, not Ray's wrapping)."""
    cause = getattr(err, "cause", None)
    return type(cause if isinstance(cause, BaseException) and not isinstance(cause, type(err)) else err).__name__


def _reason(err: BaseException) -> str:
    """One line saying why an attempt failed (the worker's exception, not Ray's wrapping)."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and not isinstance(cause, type(err)):
        return f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


__all__ = ["EpisodeWorker", "INSTALL_HINT", "MakePlayers", "failed_record", "run_parallel", "start_ray"]
