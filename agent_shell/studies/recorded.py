"""What the studies share: recorded trials read from results files, and study lines on disk.

Both studies read results files written by ``cb-agent run`` (:func:`agent_shell.results.episode_record`:
``trials[i]["trajectory"]`` is an :class:`cb_io.records.Trajectory` record) and write one JSON
line per (item, condition, rendering, actor) cell, appended atomically by one process at a time
(:class:`agent_shell.results.ResumableJsonl`); a rerun with ``resume=True`` skips every finished
key, so an interrupted study loses and duplicates nothing (:func:`run_cells`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from agent_shell.agents import ReActAgent
from agent_shell.results import ResumableJsonl, read_results
from cb_io.records import TaskStart, Trajectory
from cb_io.storage import iter_jsonl

#: A cell of a study: (item key, condition ("" for the probe), rendering, actor).
Key = tuple[str, str, str, str]


def norm(text: str) -> str:
    """An action compared across recordings: whitespace collapsed, case ignored."""
    return " ".join(text.split()).lower()


@dataclass(frozen=True)
class RecordedTrial:
    """One recorded trial of a results file.

    Attributes:
        source: the results file it came from.
        agent: the agent that played it (the record's ``agent``).
        trial: its index in the record's ``trials``.
        trajectory: the played :class:`cb_io.records.Trajectory`.
    """

    source: str
    agent: str
    trial: int
    trajectory: Trajectory

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.source, self.agent, self.trajectory.task_id, self.trial

    @property
    def name(self) -> str:
        """``"AGENT:TASK_ID#TRIAL"``, how study and label lines name the trial."""
        return f"{self.agent}:{self.trajectory.task_id}#{self.trial}"

    @property
    def start(self) -> TaskStart:
        """The task as the agent saw it when the recording began."""
        t = self.trajectory
        return TaskStart(t.task_id, t.task_type, t.instruction, t.observation)


def recorded_trials(paths: Iterable[str | Path]) -> list[RecordedTrial]:
    """Every trial of every episode record in ``paths``, in file, line and trial order.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a record's trajectory is malformed (naming the file and task).
    """
    out = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no results file {str(path)!r}")
        for record in read_results(path):
            for i, trial in enumerate(record.get("trials") or []):
                try:
                    traj = Trajectory.from_record(trial["trajectory"])
                except (KeyError, ValueError) as err:
                    raise ValueError(f"{path}: task {record['task_id']!r} trial {i}: bad trajectory: {err}") from None
                out.append(RecordedTrial(str(path), str(record["agent"]), i, traj))
    return out


def env_name_of(trials: Sequence[RecordedTrial]) -> str:
    """The one environment name of ``trials`` (ValueError when none or several)."""
    names = sorted({t.trajectory.env for t in trials})
    if len(names) != 1:
        raise ValueError(f"the results must come from exactly one environment, got {names or 'none'}")
    return names[0]


# ---------------------------------------------------------------------------------------------
# study lines on disk


def read_study(path: str | Path, study: str) -> list[dict]:
    """Every line of ``study`` ("probe" or "recover") in ``path`` ([] when it does not exist).

    A malformed or torn line is skipped with a warning naming its line number (its key is not
    finished and a resumed study redoes it); lines of another study are left out.
    """
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, record, err in iter_jsonl(path):
        if err is None and not (isinstance(record, dict) and {"item", "rendering", "agent"} <= record.keys()):
            err = "not a study line"
        if err is not None:
            warnings.warn(f"{path}:{number}: skipped malformed study line: {err}", stacklevel=2)
            continue
        if record.get("study") == study:
            out.append(record)
    return out


def finished_keys(path: str | Path, study: str) -> set[Key]:
    """(item, condition, rendering, actor) of every finished line of ``study`` in ``path``."""
    return {_key(r) for r in read_study(path, study)}


def study_file(path: str | Path, study: str) -> ResumableJsonl:
    """The lines of ``study`` in ``path`` as a :class:`agent_shell.results.ResumableJsonl`, keyed by
    (item, condition, rendering, actor)."""
    return ResumableJsonl(path, lambda p: read_study(p, study), _key, "results", lambda r: repr(r.get("item")))


def pending_keys(path: str | Path, study: str, todo: set[Key], resume: bool,
                 settings: Mapping[str, Any] | None = None) -> set[Key]:
    """The (item, condition, rendering, actor) keys of ``todo`` not yet in ``path`` (condition ""
    for the probe), checked before anything heavy loads; claims ``path`` for this process.

    ``settings`` (field -> value, e.g. dtype, seed, layout, new_actions, model) must agree with every
    finished line of ``todo`` by the rule of :meth:`agent_shell.results.ResumableJsonl.finished` (a
    field a line lacks takes its recorded default, e.g. layout "text"; a value None is not compared).

    Raises:
        cb_io.storage.FileBusy: another process is writing ``path``.
        ValueError: without ``resume``, ``path`` already holds one of ``todo`` (never a duplicate);
            with ``resume``, one of its finished lines was played with other ``settings`` (naming
            the line's key and the field: resuming would mix them).
    """
    return todo - set(study_file(path, study).finished(todo, resume, settings))


def _key(record: Mapping[str, Any]) -> Key:
    return record["item"], record.get("condition", ""), record["rendering"], record["agent"]


class Item(Protocol):
    """A study item: anything with a stable ``key``."""

    @property
    def key(self) -> str: ...


#: ``make_agent(rendering, actor)``: the agent of one (rendering, actor) pair.
AgentFactory = Callable[[str, str], ReActAgent]


def run_cells(out: Path, study: str, cells: Sequence[tuple[Item, str, str, str]], resume: bool,
              make_agent: AgentFactory, meta: Mapping[str, Any] | None,
              on_record: Callable[[dict | None], None] | None,
              line: Callable[[Item, str, str, str, ReActAgent], dict], time_limit: float | None = None,
              on_skip: Callable[[str], None] | None = None) -> list[dict]:
    """Play the (item, condition, rendering, actor) ``cells`` in order, appending one line each to
    ``out``; finished keys are skipped (``on_record(None)``), agents are built once per
    (rendering, actor) and only when needed. Returns the records written.

    Each cell's ``line`` runs within ``time_limit`` seconds of wall-clock time
    (:func:`envs.episode.play_within`; None: no limit). A cell whose engine faults or runs past
    the limit (:class:`cb_io.records.EngineError`) writes no line: it is skipped with one line to
    ``on_skip`` (default: a warning) naming its key and the fault, counts as done for
    ``on_record(None)``, and a resumed study plays it again."""
    from cb_io.records import one_line
    from envs.episode import play_within

    lines = study_file(out, study)
    todo = {(i.key, c, r, a) for i, c, r, a in cells}
    pending = todo - set(lines.finished(todo, resume, meta))
    agents: dict[tuple[str, str], ReActAgent] = {}
    written = []
    skip = on_skip or (lambda msg: warnings.warn(msg, stacklevel=3))
    for item, condition, rendering, actor in cells:
        key = (item.key, condition, rendering, actor)
        if key not in pending:
            if on_record is not None:
                on_record(None)
            continue
        if (rendering, actor) not in agents:
            agents[rendering, actor] = make_agent(rendering, actor)
        agent = agents[rendering, actor]

        def skipped(err: BaseException) -> None:
            skip(f"{study} skipped {key[0]} [{' '.join(k for k in key[1:] if k)}]: {type(err).__name__}: "
                 f"{one_line(err)}; --resume plays it again")

        played = play_within(time_limit, lambda: line(item, condition, rendering, actor, agent), skipped)
        if played is None:  # skipped
            if on_record is not None:
                on_record(None)
            continue
        record = {**(meta or {}), **played}
        lines.append(record)
        written.append(record)
        if on_record is not None:
            on_record(record)
    return written


__all__ = ["AgentFactory", "Item", "Key", "RecordedTrial", "env_name_of", "finished_keys", "norm", "pending_keys",
           "read_study", "recorded_trials", "run_cells", "study_file"]
