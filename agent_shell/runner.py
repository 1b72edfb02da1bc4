"""Episode records: durable results, resume checks and loop statistics.

Results are JSON Lines, one *finished* episode per line (all Reflexion trials together),
appended atomically with :func:`envs.storage.append_jsonl`; the episode's partial state
(:mod:`agent_shell.scheduler`, which plays the episodes) is removed once its line is stored.
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

import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from agent_shell.history import StepLike
from agent_shell.run_config import RunConfig
from envs.storage import append_jsonl, iter_jsonl

if TYPE_CHECKING:
    from agent_shell.agents import Trial

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
