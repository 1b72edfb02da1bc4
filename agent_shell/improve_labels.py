"""Where a round of ``cb-agent improve`` gets its targets: the two label sources of one loop
(:data:`LABEL_SOURCES`, ``--labels``).

* ``wins``: the won training episodes, the agent's own choices as targets (detours included).
* ``expert`` (DAgger, Ross, Gordon and Bagnell 2011): every training episode, won or lost, each
  environment step a decision whose target is the expert's action in the state the agent reached
  (its candidate set and context are the agent's). The expert is asked by replaying the episode
  with the expert running alongside (:func:`envs.collect.expert_answers`: the engines offer no
  state cloning; the replay follows the actions executed, mixed ones included). Only an
  environment whose expert answers off its own path (``expert_labels_any_state``: ALFWorld's
  handcoded expert, TextWorld's winning policy) can label; ScienceWorld's gold path cannot
  (:func:`check_labels`).

Labelling (both sources, where the environment can label): ``round-K/labelled.jsonl`` holds the
round's training episodes as results records whose environment steps carry the expert's action
(``info["expert_action"]``, :data:`agent_shell.expert_decisions.EXPERT_LABEL`) or why there is none
(``info["expert_unlabelled"]``: the expert gave up, answered nothing, answered outside the
candidate set, the acting filter removes its action (ALFWorld's ``look``), the replay differed, an
engine fault). Appended one episode at a time, so a killed run labels only what is left. Under
``wins`` the labels only measure on-policy agreement; ``cb-agent view`` shows them beside the
agent's actions.

A loop repeats its states: under ``expert`` one decision per distinct state a round (the last
observation without its bookkeeping, :func:`cb_io.feedback.normalise`, which cuts TextWorld's move
counter; the candidate set; the label), the first visit kept and the others counted as
``repeated state``, so the 20 states of one lost loop count once, not twenty times against a
type's other decisions.

Per task type a round reports (:func:`type_counts`): training games and wins, decisions added,
labelled states, on-policy agreement (the agent's choice was the expert's) and the unlabelled
states by reason.

Mixing (``--beta``, DAgger's beta): round k's training play executes the expert's action instead of
the agent's with probability beta^k at each step (:class:`envs.episode.Episode`'s ``expert_mix``);
such a step records the executed action and the agent's own choice (``info["agent_action"]``,
:data:`envs.episode.AGENT_ACTION`). The replay follows the executed actions, so the states labelled
are those the mixed policy reached; agreement compares the expert's label with the agent's own
choice, and the steps where the expert's action was executed are counted per type
(``expert_executed``).
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from agent_shell.expert_decisions import EXPERT_LABEL
from agent_shell.improve_rounds import round_dir, state_key
from agent_shell.results import read_results, store_record, unique_episodes
from cb_io.feedback import normalise
from cb_io.records import EngineError, Trajectory, one_line
from envs.episode import AGENT_ACTION

if TYPE_CHECKING:
    from envs.protocol import Environment

#: ``--labels`` values: the round's targets.
LABELS = ("wins", "expert")
#: The key of a step's ``info`` saying why the expert gave no label there.
UNLABELLED = "expert_unlabelled"
#: Why a label was removed from the decisions: the state came up before in the round.
REPEATED = "repeated state"
#: Why a label is no decision: the acting agent's candidate filter removes the expert's action.
FILTERED = "filtered out"

def check_labels(labels: str, env: Environment) -> None:
    """Raise ValueError (one line) for an unknown ``labels`` or ``expert`` labels on an
    environment whose expert cannot label states off its own path."""
    if labels not in LABELS:
        raise ValueError(f"--labels {labels!r}: choose one of {', '.join(LABELS)}")
    if labels == "expert" and not getattr(env, "expert_labels_any_state", False):
        raise ValueError(f"--labels expert: the {env.name} expert ({getattr(env, 'expert_name', 'none')}) answers "
                         "only along its own path and cannot label the agent's states; use --labels wins")


def labelled_path(out: Path, k: int) -> Path:
    """``<out>/round-<k>/labelled.jsonl``: round ``k``'s training episodes with the expert's labels."""
    return round_dir(out, k) / "labelled.jsonl"


def label_record(env: Environment, record: dict) -> dict:
    """``record`` (a training episode) with every environment step of every trial labelled: its
    ``info`` gets the expert's action (:data:`EXPERT_LABEL`) or why there is none
    (:data:`UNLABELLED`); an engine fault during a replay leaves that trial unlabelled."""
    from agent_shell.candidates import drop_excluded
    from envs.collect import expert_answers

    out = copy.deepcopy(record)
    for trial in out.get("trials", ()):
        steps = trial["trajectory"]["steps"]
        env_steps = [s for s in steps if s["kind"] == "env"]
        try:
            answers = expert_answers(env, Trajectory.from_record(trial["trajectory"]))
        except EngineError as err:
            answers = [(None, f"engine error: {one_line(err)}")] * len(env_steps)
        for step, (action, why) in zip(env_steps, answers):
            if action is not None and not drop_excluded([action]):
                action, why = None, FILTERED
            step["info"] = {**step.get("info", {}), **({EXPERT_LABEL: action} if action else {UNLABELLED: why})}
    return out


def label_round(env: Environment, out: Path, k: int, episodes: Sequence[dict], games: Sequence[str],
                echo: Callable[[str], None]) -> list[dict]:
    """Round ``k``'s training ``episodes`` (each once: :func:`agent_shell.results.unique_episodes`)
    labelled (:func:`label_record`), in the order of ``games``: read back from ``labelled.jsonl``,
    the episodes not yet there labelled and appended."""
    path = labelled_path(out, k)
    done = {r["task_id"] for r in read_results(path)}
    todo = [r for r in episodes if not r.get("error") and r["task_id"] not in done]
    if todo:
        echo(f"round {k}: the expert labels the states of {len(todo)} training episode{'s' * (len(todo) > 1)}")
    for r in todo:
        store_record(path, {**label_record(env, r), "labels": "expert"})
    by_id = {r["task_id"]: r for r in unique_episodes(read_results(path))[0]}
    return [by_id[g] for g in dict.fromkeys(games) if g in by_id]


def _trajectories(records: Sequence[dict]) -> list[Trajectory]:
    return [Trajectory.from_record(t["trajectory"]) for r in records for t in r["trials"]]


def expert_targets(labelled: Sequence[dict]) -> tuple[list[Trajectory], Counter]:
    """The ``expert`` source: every trial of every labelled episode, its labels the targets, the
    repeated states of the round unlabelled (first visit kept); returns the trajectories and the
    repeated states per task type."""
    seen: set[str] = set()
    repeated: Counter = Counter()
    out = []
    for traj in _trajectories(labelled):
        steps, last = [], traj.observation
        for s in traj.steps:
            if s.kind == "env" and s.info.get(EXPERT_LABEL):
                key = state_key(normalise(last), s.candidates or []) + "\0" + s.info[EXPERT_LABEL]
                if key in seen:
                    s = replace(s, info={**{k: v for k, v in s.info.items() if k != EXPERT_LABEL}, UNLABELLED: REPEATED})
                    repeated[traj.task_type] += 1
                seen.add(key)
            if s.kind == "env":
                last = s.observation
            steps.append(s)
        out.append(Trajectory(traj.env, traj.task_id, traj.task_type, traj.instruction, traj.observation, steps,
                              traj.won, traj.score, traj.meta))
    return out, repeated


def won_trajectories(episodes: Sequence[dict], games: Sequence[str]) -> list[Trajectory]:
    """The ``wins`` source: the won trial of each won episode of ``episodes`` (each once; error
    records left out), in the order of ``games``, the agent's choices the targets."""
    won = {}
    for r in episodes:
        if r["success"] and not r.get("error"):
            trial = next(t for t in r["trials"] if t["won"])
            won[r["task_id"]] = Trajectory.from_record(trial["trajectory"])
    return [won[g] for g in dict.fromkeys(games) if g in won]


@dataclass
class RoundLabels:
    """What a label source made of a round's training episodes (:func:`round_labels`).

    Attributes:
        targets: the trajectories whose decisions join the concept data (their targets: the
            agent's actions under ``wins``, the steps' expert labels under ``expert``).
        won_games: the won training games, in the round's order.
        types: task type -> :func:`type_counts` (``decisions`` still 0: set once featurised).
    """

    targets: list[Trajectory]
    won_games: list[str]
    types: dict[str, dict]


def round_labels(labels: str, env: Environment | None, out: Path, k: int, records: Sequence[dict],
                 games: Sequence[str], echo: Callable[[str], None]) -> RoundLabels:
    """Round ``k``'s targets from source ``labels`` (:data:`LABELS`): the training episodes
    labelled by the expert first (:func:`label_round`; ``env`` None: the environment cannot
    label, nothing labelled), then :func:`won_trajectories` or :func:`expert_targets`, and the
    round's counts per task type."""
    episodes = unique_episodes(records)[0]
    labelled = label_round(env, out, k, episodes, games, echo) if env is not None else []
    if labels == "expert":
        targets, repeated = expert_targets(labelled)
    else:
        targets, repeated = won_trajectories(episodes, games), Counter()
    won = {r["task_id"] for r in episodes if r["success"] and not r.get("error")}
    type_of = {r["task_id"]: r["task_type"] for r in episodes}
    return RoundLabels(targets, [g for g in games if g in won], type_counts(episodes, labelled, repeated, type_of))


def type_counts(episodes: Sequence[dict], labelled: Sequence[dict], repeated: Mapping[str, int],
                type_of: Mapping[str, str]) -> dict[str, dict]:
    """Per task type of the round's ``episodes``: ``games``, ``won``, ``decisions`` (0 here: the
    decisions added, set by the caller), ``labelled`` (environment steps the expert labelled),
    ``agreed`` (of those, the agent's own choice was the expert's: on-policy agreement = agreed /
    labelled), ``expert_executed`` (steps where mixing executed the expert's action instead of the
    agent's), ``unlabelled`` (reason -> states; :data:`REPEATED` under ``expert``). ``labelled``:
    [] when the environment cannot label."""
    out: dict[str, dict] = {}
    for r in episodes:
        row = out.setdefault(type_of[r["task_id"]], {"games": 0, "won": 0, "decisions": 0, "labelled": 0,
                                                      "agreed": 0, "expert_executed": 0, "unlabelled": {}})
        row["games"] += 1
        row["won"] += bool(r["success"]) and not r.get("error")
    for r in labelled:
        row = out[type_of[r["task_id"]]]
        for t in r["trials"]:
            for s in t["trajectory"]["steps"]:
                info = s.get("info") or {}
                row["expert_executed"] += AGENT_ACTION in info
                if info.get(EXPERT_LABEL):
                    row["labelled"] += 1
                    row["agreed"] += info[EXPERT_LABEL] == info.get(AGENT_ACTION, s["action"])
                elif UNLABELLED in info:
                    why = info[UNLABELLED].split(":")[0]
                    row["unlabelled"][why] = row["unlabelled"].get(why, 0) + 1
    for t, n in repeated.items():
        if n:
            out[t]["unlabelled"][REPEATED] = n
    return {t: {**row, "unlabelled": dict(sorted(row["unlabelled"].items()))} for t, row in sorted(out.items())}


__all__ = ["FILTERED", "LABELS", "REPEATED", "UNLABELLED", "RoundLabels", "check_labels", "expert_targets",
           "label_record", "label_round", "labelled_path", "round_labels", "type_counts", "won_trajectories"]
