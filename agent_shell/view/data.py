"""What the decision explorer's page holds: the data ``cb-agent view`` embeds, built from results
files (:mod:`agent_shell.results`) and ``eval-decisions --out`` files.

* :func:`read_inputs` reads the files the way ``report`` does (a torn line skipped with a warning
  naming it, an episode recorded twice counted once) and tells an eval-decisions file by its
  ``schema``;
* :func:`summary` is the top of the page: ``report``'s success table (its Markdown cells) and bar
  chart (inline SVG), the settings that differ between the runs and each run's settings;
* :func:`episode_index` is one short row per episode (the list and its filters), labelled as
  ``report`` labels its rows (:func:`agent_shell.reporting.agent_label`, so mixed settings never
  share a label); :func:`episode_detail` is one episode's steps and scored decisions, each text
  once in the episode's own string table (``strings``; steps and candidates hold indices into it),
  parsed by the page only when the episode is opened.

Imports no LM, no JAX and no game engine.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import orjson

from agent_shell.charts import chart_figure
from agent_shell.expert_decisions import EXPERT_LABEL
from agent_shell.reporting import agent_label, describe_run, differing_settings, summarize, table_cells
from agent_shell.results import RUN_SETTINGS, read_results, scored_candidates, setting, unique_episodes

#: ``schema`` of an ``eval-decisions --out`` file (:data:`agent_shell.commands.eval_decisions.EVAL_SCHEMA`).
EVAL_SCHEMA = "cb-agent/eval-decisions-v1"


@dataclass
class Inputs:
    """What the page shows: episode records, held-out expert decisions, and one line per problem
    met while reading (a skipped line, an episode counted once, an eval file without decisions)."""

    records: list[dict] = field(default_factory=list)
    heldout: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    expert: dict[str, list[str]] = field(default_factory=dict)  # task id -> the expert's actions
    accuracy: list[list[str]] = field(default_factory=list)  # eval-decisions rows as cells


def eval_file(path: Path) -> Any | None:
    """The parsed content of an ``eval-decisions --out`` file (a JSON object with :data:`EVAL_SCHEMA`,
    or the bare list of rows older versions wrote), else None (a results file)."""
    if path.suffix != ".json":
        return None
    try:
        data = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and data.get("schema") == EVAL_SCHEMA:
        return data
    if isinstance(data, list) and all(isinstance(r, dict) and "acc_prior" in r for r in data):
        return data
    return None


def accuracy_cells(rows: Sequence[Mapping[str, Any]], model: str | None) -> list[list[str]]:
    """eval-decisions accuracy rows as the cells ``eval-decisions`` prints: model, task type,
    decisions, alpha = 0 and concept accuracy with their 95% Wilson intervals."""
    from agent_shell.decision_scorer import accuracy_cell

    return [[str(model), r["task_type"], str(r["decisions"]), accuracy_cell(r, "prior"), accuracy_cell(r, "concept")]
            for r in rows]


def read_inputs(paths: Sequence[str | Path], experts: Sequence[str | Path] = ()) -> Inputs:
    """Read results files (plain or ``.gz``) and eval-decisions files, and the expert trajectory
    files ``experts`` (JSONL of :class:`cb_io.records.Trajectory`, as ``cb-agent collect`` and the
    cache write them; won ones only). Every warning of the readers (a torn or malformed line,
    naming it) is warned again and kept in ``notes``.

    Raises:
        ValueError: nothing to show (no finished episode and no held-out decision), naming the files.
    """
    out = Inputs()
    records = []
    for path in map(Path, paths):
        data = eval_file(path)
        if data is None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                records += read_results(path)
            for w in caught:
                out.notes.append(str(w.message))
                warnings.warn(str(w.message), stacklevel=2)
        elif isinstance(data, list):
            out.notes.append(f"{path}: accuracy rows only (written before eval-decisions kept its decisions)")
        else:
            out.heldout += [dict(d, model=data.get("model")) for d in data.get("decisions", [])]
            out.accuracy += accuracy_cells(data.get("rows", []), data.get("model"))
    for path in experts:
        from cb_io.records import read_trajectories

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trajectories = read_trajectories(path, on_error="skip")
        for w in caught:
            out.notes.append(str(w.message))
            warnings.warn(str(w.message), stacklevel=2)
        out.expert.update((t.task_id, [s.action for s in t.steps if s.kind == "env"]) for t in trajectories if t.won)
    out.records, repeated = unique_episodes(records)
    for line in repeated:
        warnings.warn(line, stacklevel=2)
        out.notes.append(line)
    if not out.records and not out.heldout:
        raise ValueError(f"no finished episodes and no held-out decisions in {', '.join(map(str, paths))}")
    return out


def chart_svg(rows) -> str:
    """``report``'s bar chart (:func:`agent_shell.charts.chart_figure`) as inline SVG text (text
    kept as text, so the page stays small)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig = chart_figure(rows, "Success rate by task type")
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def summary(records: Sequence[dict]) -> dict[str, Any]:
    """The top of the page: ``title``, the ``differing`` settings, the success ``table`` (``head``
    and ``rows`` of cells), the ``chart`` (SVG text) and ``settings``: per row label, each
    :data:`agent_shell.results.RUN_SETTINGS` value (several joined by ``/``)."""
    if not records:
        return {"title": "", "differing": [], "table": None, "chart": "", "settings": {}}
    rows = summarize(records)
    differing = differing_settings(records)
    head, cells = table_cells(rows)  # report's table, plain cells
    values: dict[str, dict[str, set]] = {}
    for r in records:
        per = values.setdefault(agent_label(r, differing), {})
        for key in RUN_SETTINGS:
            per.setdefault(key, set()).add(str(setting(r, key)))
    settings = {label: {k: " / ".join(sorted(v)) for k, v in per.items()} for label, per in values.items()}
    return {"title": describe_run(records), "differing": differing, "table": {"head": head, "rows": cells},
            "chart": chart_svg(rows), "settings": settings}


def outcome(record: Mapping[str, Any]) -> str:
    """``won``, ``lost`` or ``error`` (an engine fault ended the episode; never won or lost)."""
    return "error" if record.get("error") else "won" if record["success"] else "lost"


def episode_index(records: Sequence[dict]) -> list[dict]:
    """One row per episode, in record order: ``agent`` (the row label of ``report``), ``task_type``,
    ``task_id``, ``outcome``, ``steps``, ``trials`` and ``scored`` (decisions with recorded terms)."""
    differing = differing_settings(records)
    return [{"agent": agent_label(r, differing), "task_type": r.get("task_type"), "task_id": r["task_id"],
             "outcome": outcome(r), "steps": r.get("steps", 0), "trials": r.get("n_trials", len(r.get("trials", ()))),
             "scored": sum("prior" in d for t in r.get("trials", ()) for d in t.get("log", {}).get("decisions", ()))}
            for r in records]


class Strings:
    """An episode's string table: each distinct text once, referred to by index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        return self.index.setdefault(text, len(self.index))

    def table(self) -> list[str]:
        return list(self.index)


def decision_entry(decision: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], strings: Strings) -> dict:
    """A step's decision for the page: the scored candidates (string indices) with ``prior``,
    ``concept`` (None: alpha = 0), ``log_p``, ``chosen`` and ``p_chosen``; or ReAct's ``reply``."""
    out: dict[str, Any] = {}
    if "reply" in decision:
        out["reply"] = decision["reply"]
    candidates = scored_candidates(decision, steps)
    if candidates is not None:
        out.update(candidates=[strings(c) for c in candidates], prior=decision["prior"],
                   concept=decision.get("concept"), log_p=decision["log_p"], chosen=decision.get("chosen"),
                   p_chosen=decision.get("p_chosen"))
    elif decision.get("n_candidates"):
        out.update(n_candidates=decision["n_candidates"], p_chosen=decision.get("p_chosen"))
    return out


def expert_actions(steps: Sequence[Mapping[str, Any]], expert: Sequence[str]) -> dict[int, str]:
    """Step index -> the expert's action there, for the steps taken from a state the expert's own
    trajectory passed through: while the environment actions so far are the expert's first ones
    (``look``, ``inventory`` and ``help`` left out on both sides: they change no state; think
    steps never reach the environment). ``expert``: the expert trajectory's actions in order."""
    from agent_shell.candidates import drop_excluded

    expert = drop_excluded(expert)
    out, done = {}, 0
    for i, s in enumerate(steps):
        if s["kind"] != "env":
            continue
        if done >= len(expert):
            break
        out[i] = expert[done]
        if drop_excluded([s["action"]]):
            if s["action"] != expert[done]:
                break
            done += 1
    return out


def episode_detail(record: Mapping[str, Any], expert: Sequence[str] | None = None) -> dict:
    """One episode for the page: ``instruction`` and ``observation`` (o0) as string indices, and per
    trial ``won``, ``reflection``, ``memory`` and ``steps``: ``k`` (kind), ``a`` (action) and ``o``
    (observation) as string indices, ``d`` the decision (:func:`decision_entry`) when one is
    recorded, ``e`` the expert's action there (string index) when ``expert`` (the expert
    trajectory's actions on this game) tells it (:func:`expert_actions`) or the step carries the
    expert's label (a relabelled episode, ``cb-agent improve``'s ``labelled.jsonl``), and then ``d["expert"]``
    its index among the scored candidates (-1: not among them); ``strings`` the table the indices
    refer to, ``error`` the engine fault if any."""
    strings = Strings()
    trials, start = [], None
    for trial in record.get("trials", ()):
        traj = trial.get("trajectory") or {}
        start = start or traj
        steps = traj.get("steps") or []
        decisions = {d.get("step"): d for d in (trial.get("log") or {}).get("decisions", ())}
        known = expert_actions(steps, expert) if expert else {}
        known.update((i, s["info"][EXPERT_LABEL]) for i, s in enumerate(steps)  # an episode the expert relabelled
                     if (s.get("info") or {}).get(EXPERT_LABEL))
        out_steps = []
        for i, s in enumerate(steps):
            step: dict[str, Any] = {"k": s["kind"], "a": strings(s["action"]), "o": strings(s.get("observation") or "")}
            if i in decisions:
                entry = decision_entry(decisions[i], steps, strings)
                if entry:
                    step["d"] = entry
            if i in known:
                step["e"] = strings(known[i])
                if "candidates" in step.get("d", {}):
                    d = step["d"]
                    d["expert"] = d["candidates"].index(step["e"]) if step["e"] in d["candidates"] else -1
            out_steps.append(step)
        trials.append({"won": bool(trial.get("won")), "reflection": trial.get("reflection"),
                       "memory": (trial.get("log") or {}).get("memory") or [], "steps": out_steps})
    start = start or {}
    return {"instruction": strings(start.get("instruction") or ""),
            "observation": strings(start.get("observation") or ""),
            "trials": trials, "error": record.get("error"), "strings": strings.table()}


def heldout_entries(decisions: Iterable[Mapping[str, Any]]) -> list[dict]:
    """The held-out expert decisions as the page lists them (the eval file's fields)."""
    keep = ("task_type", "task_id", "step", "instruction", "observation", "candidates", "expert", "prior", "concept",
            "log_p", "model")
    return [{k: d.get(k) for k in keep} for d in decisions]


__all__ = ["EVAL_SCHEMA", "Inputs", "chart_svg", "decision_entry", "episode_detail", "episode_index", "eval_file",
           "expert_actions", "heldout_entries", "outcome", "read_inputs", "summary"]
