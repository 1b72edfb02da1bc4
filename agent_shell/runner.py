"""Episodes of an agent on a list of tasks, with durable results, resume and a progress bar.

Results are JSON Lines, one *finished* episode per line (all Reflexion trials together),
appended atomically with :func:`envs.storage.append_jsonl`. While an episode runs, its state
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

Every record carries loop statistics (:func:`loop_statistics`): the number of distinct
environment actions and the longest repeated cycle (e.g. ``open X`` / ``close X`` three times).
"""

from __future__ import annotations

import hashlib
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from agent_shell.history import StepLike
from agent_shell.run_config import RunConfig
from envs.protocol import Environment
from envs.storage import append_jsonl, iter_jsonl, write_json_atomic

if TYPE_CHECKING:
    from rich.progress import Progress

    from agent_shell.agents import Reflexion, Trial

#: Version of the episode record layout (``record["schema"]``).
RESULT_SCHEMA = "cb-agent/episode-v1"


# ---------------------------------------------------------------------------------------------
# loop statistics


def longest_repeat_cycle(actions: Sequence[str]) -> dict[str, int]:
    """The longest stretch where one block of actions repeats back to back.

    Returns ``{"period": p, "repeats": r, "span": p * r}`` for the block of length p repeated r
    >= 2 times in a row that covers the most actions (ties: the shortest period); all zeros when
    no action or block repeats. ``a b a b a`` -> period 2, repeats 2, span 4.
    """
    n = len(actions)
    best = (0, 0, 0)  # span, -period, repeats (compared as a tuple)
    for p in range(1, n // 2 + 1):
        for i in range(0, n - 2 * p + 1):
            block = actions[i:i + p]
            r = 1
            while actions[i + r * p:i + (r + 1) * p] == block:
                r += 1
            if r >= 2 and (r * p, -p) > best[:2]:
                best = (r * p, -p, r)
    span, neg_p, repeats = best
    return {"period": -neg_p, "repeats": repeats, "span": span}


def loop_statistics(steps: Iterable[StepLike]) -> dict[str, Any]:
    """Distinct environment actions and the longest repeated cycle of one trial's steps."""
    actions = [s.action for s in steps if s.kind == "env"]
    return {"distinct_actions": len(set(actions)), "longest_cycle": longest_repeat_cycle(actions)}


# ---------------------------------------------------------------------------------------------
# records


def trial_record(trial: Trial) -> dict[str, Any]:
    """A trial as JSON: outcome, counts, loop statistics, agent log and the whole trajectory."""
    ep = trial.episode
    steps = ep.steps
    return {
        "won": bool(ep.won),
        "steps": len(steps),
        "think_steps": sum(1 for s in steps if s.kind == "think"),
        "env_steps": sum(1 for s in steps if s.kind == "env"),
        "budget": ep.max_steps,
        **loop_statistics(steps),
        "reflection": trial.reflection,
        "log": trial.log.to_dict(),
        "trajectory": ep.trajectory().to_record(),
    }


def episode_record(agent_name: str, task_id: str, trials: Sequence[Trial], wall_s: float,
                   meta: dict[str, Any]) -> dict[str, Any]:
    """One results line. Counts add up over trials; loop statistics are the last trial's;
    ``wall_s`` is the episode's wall time (s) and ``finished_at`` its end (Unix time, s, the
    clock of the process that played it): together they give a run's running time
    (:func:`agent_shell.reporting.running_time`)."""
    records = [trial_record(t) for t in trials]
    last = records[-1]
    steps = sum(r["steps"] for r in records)
    n_candidates = [d["n_candidates"] for r in records for d in r["log"]["decisions"]
                    if d.get("n_candidates") is not None]
    start = trials[0].episode.start
    return {
        "schema": RESULT_SCHEMA,
        "agent": agent_name,
        "task_id": task_id,
        "task_type": start.task_type,
        "success": any(r["won"] for r in records),
        "steps": steps,
        "think_steps": sum(r["think_steps"] for r in records),
        "env_steps": sum(r["env_steps"] for r in records),
        "budget": last["budget"],
        "n_trials": len(records),
        "n_candidates": n_candidates,
        "format_errors": sum(len(r["log"]["format_errors"]) for r in records),
        "reviews": sum(len(r["log"].get("reviews", ())) for r in records),
        "experiences": sum(1 for r in records for rv in r["log"].get("reviews", ()) if rv.get("experience")),
        "seconds": {k: round(sum(r["log"]["seconds"][k] for r in records), 3) for k in records[0]["log"]["seconds"]},
        "distinct_actions": last["distinct_actions"],
        "longest_cycle": last["longest_cycle"],
        "wall_s": round(wall_s, 3),
        "s_per_step": round(wall_s / steps, 4) if steps else None,
        "finished_at": round(time.time(), 1),
        **meta,
        "trials": records,
    }


def error_record(agent_name: str, task_id: str, task_type: str, trials: Sequence[Any], budget: int,
                 wall_s: float, meta: dict[str, Any], err: BaseException) -> dict[str, Any]:
    """The results line of an episode that an engine fault ended: the trials played so far (none when
    the first reset failed), ``success`` False, and ``error`` (type, one-line message, trial, step)."""
    from envs.protocol import one_line

    if trials:
        record = episode_record(agent_name, task_id, trials, wall_s, meta)
    else:
        record = {"schema": RESULT_SCHEMA, "agent": agent_name, "task_id": task_id, "steps": 0, "think_steps": 0,
                  "env_steps": 0, "budget": budget, "n_trials": 0, "n_candidates": [], "format_errors": 0,
                  "reviews": 0, "experiences": 0, "seconds": {}, "distinct_actions": 0,
                  "longest_cycle": longest_repeat_cycle([]), "wall_s": round(wall_s, 3), "s_per_step": None,
                  "finished_at": round(time.time(), 1), **meta, "trials": []}
    last = trials[-1].episode.steps if trials else []
    record.update(task_type=task_type, success=False,
                  error={"type": type(err).__name__, "message": one_line(err), "trial": max(len(trials), 1),
                         "step": len(last) + 1})
    return record


def read_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every episode record of a results file ([] when it does not exist).

    A malformed or torn line is skipped with a warning naming its line number (its episode is
    not finished and a resumed run redoes it); nothing is dropped silently.
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, record, err in iter_jsonl(path, _episode_record):
        if err is not None:
            warnings.warn(f"{path}:{number}: skipped malformed results line: {err}", stacklevel=2)
            continue
        out.append(record)
    return out


def _episode_record(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict) or not {"task_id", "agent", "success"} <= record.keys():
        study = f" (a {record['study']} study line?)" if isinstance(record, dict) and "study" in record else ""
        raise ValueError(f"not an episode record of cb-agent run{study}")
    return record


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


def store_record(results_path: Path, record: dict[str, Any], partial: Path | None = None) -> None:
    """Append ``record`` as one atomic line, then remove the episode's partial state (and the
    partial folders it leaves empty)."""
    append_jsonl(results_path, record)
    if partial is None:
        return
    partial.unlink(missing_ok=True)
    for folder in (partial.parent, partial.parent.parent):  # <agent>/, then <results>.partial/
        try:
            folder.rmdir()
        except OSError:  # not empty (or absent): other agents' or tasks' episodes are still running
            break


#: Record fields that must agree between a results file and a run that resumes it: the
#: :class:`agent_shell.run_config.RunConfig` settings and the backbone's name.
RUN_SETTINGS = ("model", *RunConfig.SETTINGS)


def check_results_file(results_path: str | os.PathLike, agent_names: Sequence[str], task_ids: Sequence[str],
                       resume: bool, settings: dict[str, Any]) -> dict[str, set[str]]:
    """The task ids each of ``agent_names`` already finished in ``results_path`` (agent name ->
    set of task ids, every name a key), after checking that the file may be continued; the file
    is read once for all the agents.

    Raises:
        ValueError: without ``resume``, the file already holds an episode of one of the agents on
            one of ``task_ids`` (never duplicated); with ``resume``, one of the agents' records
            was run with other settings (:data:`RUN_SETTINGS`: rendering, layout, budget, model,
            seed, lam, ...; a field missing from a record, as in files of older versions, counts
            as the value it had before it was recorded (:func:`agent_shell.reporting.setting`:
            ``fit_candidates`` 0, rendering raw, ...) or, without one, is not compared), naming
            the field.
    """
    from agent_shell.reporting import setting

    finished: dict[str, set[str]] = {name: set() for name in agent_names}
    wanted = set(task_ids)
    for r in read_results(results_path):
        if r["agent"] not in finished:
            continue
        if not resume and r["task_id"] in wanted:
            raise ValueError(f"{results_path} already holds {r['agent']} episodes; pass --resume to "
                             "continue it, or choose another output directory")
        for key in RUN_SETTINGS:
            recorded = setting(r, key)  # a field older records lack: its value then, or None (not compared)
            if recorded is not None and key in settings and recorded != settings[key]:
                raise ValueError(f"{results_path} holds {r['agent']} episodes run with {key}={recorded!r}, "
                                 f"but this run uses {key}={settings[key]!r}; resuming would mix them: "
                                 "choose another output directory")
        finished[r["agent"]].add(r["task_id"])
    return finished


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
