"""The results record and its files: one owner for what an episode line holds and how it is read,
written and resumed.

* **The record**: :func:`episode_record` (one finished episode, all Reflexion trials, schema
  :data:`RESULT_SCHEMA`), :func:`trial_record`, :func:`error_record` (an episode an engine fault
  ended) and the loop statistics every record carries (:func:`loop_statistics`).
* **The recorded settings** (:data:`RUN_SETTINGS`) and the one table of their values in records
  written before a field existed (:data:`SETTING_DEFAULTS`, read through :func:`setting`).
* **Reading**: :func:`read_results` (a torn or NUL-padded line is skipped with a warning naming its
  line; :func:`repair_for_resume` moves such lines aside before a resume),
  :func:`unique_episodes` (an episode stored twice counts once) and :func:`scored_candidates` (the
  candidates behind a decision's recorded terms).
* **Optional fields** (records written before them still load): a trial log's decision may carry
  per candidate ``prior``, ``concept`` (absent when alpha = 0) and ``log_p`` (nats, 3 decimals;
  :meth:`agent_shell.agents.step.Decision.terms_record`), ``candidates`` when they were sampled,
  and ReAct's ``reply``.
* **Writing**: :func:`store_record` (one atomic line, then the episode's partial state file goes).
* **Resuming**: :class:`ResumableJsonl`, the one check every resumable JSONL output goes through
  (episode results, study lines, calibration labels, ICAL outputs): it claims the file for this
  process (a second writer is refused with one line naming the holder), refuses a file that is a
  symbolic link or whose first line is not a line of its kind (it would append to an unrelated
  file), refuses to duplicate a finished key, and compares the finished lines' settings with the run's by one rule: a field a
  line lacks takes its value from :data:`SETTING_DEFAULTS`; a field without a value there (None)
  is not compared.

Imports neither the scheduler nor the reporting (both import this module).
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Hashable, Iterable, Mapping, Sequence

from agent_shell.history import StepLike
from agent_shell.run_config import RECORDED_SETTINGS
from cb_io.storage import append_jsonl, claim_writer, iter_jsonl, refuse_link, repair_jsonl

if TYPE_CHECKING:
    from agent_shell.agents import Trial

#: Version of the episode record layout (``record["schema"]``).
RESULT_SCHEMA = "cb-agent/episode-v1"


#: Record fields that must agree between a results file and a run that resumes it, and that label
#: the rows of a report when they differ: the backbone's name and :data:`RECORDED_SETTINGS`.
RUN_SETTINGS = ("model", *RECORDED_SETTINGS)


class SameAs(str):
    """A default that is another field's value (:data:`SETTING_DEFAULTS`)."""


#: The value a record without the field was run with (records of older versions); a concept was
#: fitted on the demonstrations (``demos_per_type``) before ``concept_per_type`` existed; a round of
#: ``cb-agent improve`` learned from its wins before it could learn from the expert's labels. A field
#: that is neither recorded nor here has no known value (None) and is never compared.
SETTING_DEFAULTS: dict[str, Any] = {"rendering": "raw", "layout": "text", "features": "lm-hidden",
                                   "fit_candidates": 0, "concept_per_type": SameAs("demos_per_type"),
                                   "concept_round": 0, "labels": "wins", "beta": 0.0}


def setting(record: Mapping[str, Any], key: str) -> object:
    """The record's value of setting ``key``: the recorded one, else the default of
    :data:`SETTING_DEFAULTS`, else None."""
    if key in record:
        return record[key]
    default = SETTING_DEFAULTS.get(key)
    return record.get(default) if isinstance(default, SameAs) else default


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


def error_record(agent_name: str, task_id: str, task_type: str, trials: Sequence[Trial], budget: int,
                 wall_s: float, meta: dict[str, Any], err: BaseException) -> dict[str, Any]:
    """The results line of an episode that an engine fault ended: the trials played so far (none when
    the first reset failed), ``success`` False, and ``error`` (type, one-line message, trial, step,
    and the fault's own ``details`` when it has them: a pass out of memory gives ``context_tokens``
    and ``bytes_asked``, :class:`agent_shell.lm.faults.PassOutOfMemory`)."""
    from cb_io.records import one_line

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
                         "step": len(last) + 1, **dict(getattr(err, "details", None) or {})})
    return record


# ---------------------------------------------------------------------------------------------
# reading and writing


def read_results(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every episode record of a results file, plain or gzip-compressed (``.gz``, as committed
    under ``results/``); [] when it does not exist.

    A malformed, torn or NUL-padded line is skipped with a warning naming its line number (its
    episode is not finished and a resumed run redoes it); nothing is dropped silently.
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, record, err in iter_jsonl(path, _episode_record):  # .gz read through gzip
        if err is not None:
            warnings.warn(f"{path}:{number}: skipped malformed results line: {err}", stacklevel=2)
            continue
        out.append(record)
    return out


def scored_candidates(decision: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[str] | None:
    """The candidate set a recorded decision (an entry of a trial log's ``decisions``) scored, in
    the order of its ``prior`` / ``concept`` / ``log_p`` terms: its own ``candidates`` when recorded
    (sampled, open action space), else the fixed action space of its trajectory step's candidates
    (``steps``: the trial's ``trajectory["steps"]``). None when the decision has no terms (ReAct, a
    single candidate, records written before the terms existed) or they cannot be matched."""
    if "prior" not in decision:
        return None
    candidates = decision.get("candidates")
    if candidates is None:
        from agent_shell.candidates import fixed_action_space

        step = decision.get("step")
        if not isinstance(step, int) or not 0 <= step < len(steps) or steps[step].get("candidates") is None:
            return None
        candidates = fixed_action_space(steps[step]["candidates"])
    return list(candidates) if len(candidates) == len(decision["prior"]) else None


def _episode_record(record: object) -> dict[str, Any]:
    if not isinstance(record, dict) or not {"task_id", "agent", "success"} <= record.keys():
        study = f" (a {record['study']} study line?)" if isinstance(record, dict) and "study" in record else ""
        raise ValueError(f"not an episode record of cb-agent run{study}")
    return record


def repair_for_resume(path: str | os.PathLike, echo: Callable[[str], None] | None = None) -> None:
    """What every ``--resume`` does first: claim ``path`` for this process, then move its unreadable
    lines (a torn last line of an interrupted write, NUL padding) to ``<path>.torn``
    (:func:`cb_io.storage.repair_jsonl`), saying so in one plain line per line moved (``echo``,
    default ``click.echo``); the rest of the file stays byte for byte.

    Raises:
        click.ClickException: ``path`` is a symbolic link, or another process is writing it (one
            line naming it).
    """
    import click

    try:  # claimed first: another writer's line in progress would look torn
        refuse_link(path)
        claim_writer(path)
    except ValueError as err:  # FileBusy too
        raise click.ClickException(str(err)) from None
    for line in repair_jsonl(path):
        (echo or click.echo)(f"repaired {path}: line {line.line_number} ({line.error}) moved to {path}.torn")


def unique_episodes(records: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The records with every episode once: a record whose agent, task id and recorded settings
    (:data:`RUN_SETTINGS`, by :func:`setting`) repeat an earlier record's is left out (two writers
    on one file, or one file given twice), except that an error record (:func:`is_error_record`)
    gives way to the episode's later record that is none (its replay by ``--resume``), silently.
    Returns (the records kept, in the order of each episode's first record; one warning line per
    episode recorded twice without an error record between)."""
    first: dict[tuple, int] = {}
    kept: list[dict[str, Any]] = []
    repeats: dict[tuple, int] = {}
    for r in records:
        key = (r["agent"], r["task_id"], *(repr(setting(r, k)) for k in RUN_SETTINGS))
        if key not in first:
            first[key] = len(kept)
            kept.append(r)
        elif is_error_record(kept[first[key]]) and not is_error_record(r):
            kept[first[key]] = r
        elif not is_error_record(r):
            repeats[key] = repeats.get(key, 1) + 1
    warnings_ = [f"{agent} on {task_id} is recorded {n} times with the same settings: counted once"
                 for (agent, task_id, *_), n in repeats.items()]
    return kept, warnings_


def store_record(results_path: Path, record: dict[str, Any], partial: Path | None = None) -> None:
    """Append ``record`` as one atomic line (:meth:`ResumableJsonl.append`: FileBusy when another
    process writes the file, ValueError when it is a link or not a results file), then remove the
    episode's partial state file (its emptied folders go when the run ends:
    :func:`agent_shell.scheduler.play_episodes`)."""
    results_file(results_path).append(record)
    if partial is not None:
        partial.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# resuming


class ResumableJsonl:
    """A JSONL output that one process fills with one line per key and a later run may resume.

    Args:
        path: the file.
        read: ``read(path)``: the file's lines of this kind ([] when it does not exist), each
            reader reporting its malformed lines its own way.
        key: the key of a line (an episode's (agent, task id), a study cell, a transition, ...).
        what: the lines in a message (``"episodes"``).
        name: how a message names one line.
        elsewhere: what to do instead of resuming (``"choose another --out"``).
        line: ``line(record)`` raises ValueError when a JSON value is not a line of this kind; the
            file's first line must pass it (None: not checked).
        superseded: ``superseded(record)`` is True for a line that a later line of its key
            replaces (an episode's error record, followed by its replay); None: the first line of
            a key stands.
    """

    def __init__(self, path: str | os.PathLike, read: Callable[[Path], Iterable[dict]], key: Callable[[dict], Hashable],
                 what: str, name: Callable[[dict], str], elsewhere: str = "choose another --out",
                 line: Callable[[Any], Any] | None = None, superseded: Callable[[dict], bool] | None = None):
        self.path, self.read, self.key = Path(path), read, key
        self.what, self.name, self.elsewhere, self.line = what, name, elsewhere, line
        self.superseded = superseded or (lambda record: False)

    def claim(self) -> None:
        """Refuse (ValueError, one line) a file that is a symbolic link (:func:`refuse_link`), claim
        it for this process (:func:`cb_io.storage.claim_writer`: FileBusy when another process
        writes it), then refuse it when its first line is not a line of this kind (appending would
        mix records into an unrelated file)."""
        refuse_link(self.path, self.elsewhere)
        claim_writer(self.path)  # before reading: another writer's line in progress would look torn
        if self.line is None or not self.path.exists():
            return
        for number, _record, err in iter_jsonl(self.path, self.line):
            if err is not None:
                raise ValueError(f"{self.path}: line {number} is not one of its {self.what} ({err}); refusing to "
                                 f"append to it: {self.elsewhere}")
            return

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one line atomically (:func:`cb_io.storage.append_jsonl`) under this process's claim
        (:meth:`claim`)."""
        self.claim()
        append_jsonl(self.path, record)

    def finished(self, wanted: Collection[Hashable], resume: bool, settings: Mapping[str, Any] | None = None,
                 compared: Callable[[dict], bool] | None = None) -> dict[Hashable, dict]:
        """Claim the file for this process's writes (:meth:`claim`), then return its finished
        lines (key -> the first line of that key that is not ``superseded``, else its first line;
        lines of every key, not only ``wanted``).

        ``settings`` (field -> this run's value) must agree with every finished line that
        ``compared`` selects (default: the lines of ``wanted`` keys), by the one rule: a field a
        line lacks takes its value from :data:`SETTING_DEFAULTS` (:func:`setting`); a line's value
        None (unknown) is not compared.

        Raises:
            cb_io.storage.FileBusy: another process is writing the file (naming its pid and
                command line).
            ValueError: the file is a link or not of this kind (:meth:`claim`); without ``resume``,
                the file already holds one of ``wanted`` (never duplicated); with ``resume``, a
                compared line was written with other
                ``settings`` (naming the line, the field and both values).
        """
        self.claim()
        done: dict[Hashable, dict] = {}
        for r in self.read(self.path):
            key = self.key(r)
            if key not in done or (self.superseded(done[key]) and not self.superseded(r)):
                done[key] = r
        overlap = [k for k in done if k in wanted]
        if overlap and not resume:
            raise ValueError(f"{self.path} already holds {len(overlap)} of these {self.what}; pass --resume to "
                             f"continue it, or {self.elsewhere}")
        selected = compared or (lambda r: self.key(r) in wanted)
        for r in done.values():
            if not selected(r):
                continue
            for field, value in (settings or {}).items():
                recorded = setting(r, field)
                if recorded is not None and recorded != value:
                    raise ValueError(f"{self.path} holds {self.name(r)} with {field}={recorded!r}, but this run "
                                     f"uses {field}={value!r}; resuming would mix them: {self.elsewhere}")
        return done


def results_file(path: str | os.PathLike) -> ResumableJsonl:
    """The episode results file ``path`` of ``cb-agent run`` as a :class:`ResumableJsonl`."""
    return ResumableJsonl(path, read_results, lambda r: (r["agent"], r["task_id"]), "episodes",
                          lambda r: f"{r['agent']} episodes", "choose another output directory", _episode_record,
                          superseded=is_error_record)


def is_error_record(record: Mapping[str, Any]) -> bool:
    """True for an episode that an engine fault, its time limit or every attempt's failure ended
    (:func:`error_record`): ``--resume`` plays it again unless told to keep it, and a later record
    of the same episode replaces it."""
    return bool(record.get("error"))


def check_results_file(results_path: str | os.PathLike, agent_names: Sequence[str], task_ids: Sequence[str],
                       resume: bool, settings: Mapping[str, Any], keep_errors: bool = False) -> dict[str, set[str]]:
    """The task ids each of ``agent_names`` already finished in ``results_path`` (agent name ->
    set of task ids, every name a key), after claiming the file for this process and checking that
    it may be continued (:meth:`ResumableJsonl.finished`); the file is read once for all the agents.
    An episode whose only records are error records (:func:`is_error_record`: an engine fault, a
    time limit, a restart may fix it) is not finished, so ``--resume`` plays it again, unless
    ``keep_errors``.

    Every record of one of the agents, whatever its task, must agree with ``settings`` (the
    :data:`RUN_SETTINGS`: rendering, layout, budget, model, seed, lam, ...; others are ignored).

    Raises:
        cb_io.storage.FileBusy: another process is writing the file.
        ValueError: the file is a symbolic link, or its first line is not an episode record; without
            ``resume``, the file already holds an episode of one of the agents on
            one of ``task_ids``; with ``resume``, one of the agents' records was run with other
            settings, naming the field.
    """
    finished: dict[str, set[str]] = {name: set() for name in agent_names}
    wanted = {(name, t) for name in agent_names for t in task_ids}
    compared = {k: settings[k] for k in RUN_SETTINGS if k in settings}
    for (agent, task_id), record in results_file(results_path).finished(wanted, resume, compared,
                                                                        lambda r: r["agent"] in finished).items():
        if agent in finished and (keep_errors or not is_error_record(record)):
            finished[agent].add(task_id)
    return finished


__all__ = ["RECORDED_SETTINGS", "RESULT_SCHEMA", "RUN_SETTINGS", "SETTING_DEFAULTS", "ResumableJsonl", "SameAs",
           "check_results_file", "episode_record", "error_record", "is_error_record", "longest_repeat_cycle",
           "loop_statistics", "read_results", "refuse_link", "repair_for_resume", "results_file", "scored_candidates",
           "setting", "store_record", "trial_record", "unique_episodes"]
