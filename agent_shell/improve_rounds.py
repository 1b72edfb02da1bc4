"""What a round of ``cb-agent improve`` reads and writes (:mod:`agent_shell.improve` runs the
rounds): its files, its training games, its concept data (the won episodes' decisions merged with
the expert decisions) and the rows of its summary table.

Files under the output folder (every one written atomically or appended one line at a time):

* ``round-K/concepts/``: the round's ``<task type>.safetensors`` and ``provenance.json`` (which
  games, expert or own, each type's data came from; written as one folder, complete or absent);
  each concept's metadata carries the same ``provenance``. ``cb-agent run --concepts`` acts with it.
* ``round-K/train.jsonl`` (K >= 1): the training episodes, ``round-K/results.jsonl``: the
  evaluation episodes (results records of :mod:`agent_shell.results`, with ``concept_round``).
* ``rounds.jsonl``: one line per finished round (:func:`rounds_file`): its training games and
  wins, its new decisions, how many of them were states the expert data already held
  (:func:`state_key`), its concepts, its evaluation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from agent_shell.concepts import TypeFeatures
from agent_shell.results import ResumableJsonl, read_results
from cb_io.records import Trajectory
from cb_io.storage import iter_jsonl

if TYPE_CHECKING:
    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.lm.protocol import LanguageModel
    from cb_core import Concept
    from envs.protocol import Environment

#: ``schema`` of a line of ``rounds.jsonl``.
ROUND_SCHEMA = "cb-agent/improve-round-v1"


# ---------------------------------------------------------------------------------------------
# files


def round_dir(out: Path, k: int) -> Path:
    """``<out>/round-<k>``."""
    return Path(out) / f"round-{k}"


def concepts_dir(out: Path, k: int) -> Path:
    """Where round ``k``'s concepts are saved: ``<out>/round-<k>/concepts``."""
    return round_dir(out, k) / "concepts"


def _round_line(record: object) -> dict:
    if not isinstance(record, dict) or record.get("schema") != ROUND_SCHEMA or not isinstance(record.get("round"), int):
        raise ValueError("not a round line of cb-agent improve")
    return record


def read_rounds(path: Path) -> list[dict]:
    """The round lines of ``rounds.jsonl`` ([] when it does not exist; a torn line is skipped)."""
    if not Path(path).exists():
        return []
    return [r for _, r, err in iter_jsonl(path, _round_line) if err is None]


def rounds_file(out: Path) -> ResumableJsonl:
    """``<out>/rounds.jsonl`` as a :class:`agent_shell.results.ResumableJsonl` (key: the round)."""
    return ResumableJsonl(Path(out) / "rounds.jsonl", read_rounds, lambda r: r["round"], "rounds",
                          lambda r: f"round {r['round']}", "choose another --out-dir", _round_line)


def episode_files(out: Path) -> list[Path]:
    """Every episodes file of an improve folder (training and evaluation, all rounds)."""
    return sorted(Path(out).glob("round-*/*.jsonl"))


# ---------------------------------------------------------------------------------------------
# games


def check_disjoint(eval_ids: Sequence[str], train_ids: Sequence[str]) -> None:
    """Raise ValueError (one line) when an evaluation game is also a training game."""
    shared = sorted(set(eval_ids) & set(train_ids))
    if shared:
        raise ValueError(f"evaluation game {shared[0]!r} is also a training game ({len(shared)} such game(s)): "
                         "a round would be evaluated on games its concepts learned from; refusing")


def training_pool(env: Environment, split: str, task_types: Sequence[str], expert_ids: set[str],
                  explicit: Sequence[str] = ()) -> dict[str, list[str]]:
    """Task type -> its training games in the environment's order: ``explicit`` ids, or every
    game of ``split`` of ``task_types``; the expert data's games left out.

    Raises:
        ValueError: an explicit game the expert data used (one line).
    """
    type_of = env.task_type_of
    used = sorted(set(explicit) & expert_ids)
    if used:
        raise ValueError(f"training game {used[0]!r} is one of the expert data's games: own episodes must come "
                         "from games the expert data did not use")
    ids = list(explicit) if explicit else [t for t in env.tasks(split) if type_of(t) in set(task_types)]
    pool: dict[str, list[str]] = {t: [] for t in task_types}
    for task_id in ids:
        if task_id not in expert_ids:
            pool.setdefault(type_of(task_id), []).append(task_id)
    return pool


def round_games(pool: Mapping[str, Sequence[str]], k: int, per_type: int) -> list[str]:
    """Round ``k``'s training games (k >= 1): the k-th slice of ``per_type`` games of each type's
    pool (wrapping around once the pool runs out), types round robin."""
    slices = []
    for task_type in sorted(pool):
        games = list(pool[task_type])
        if games:
            start = (k - 1) * per_type
            slices.append([games[(start + i) % len(games)] for i in range(min(per_type, len(games)))])
    return [g for rank in range(per_type) for s in slices if rank < len(s) for g in [s[rank]]]


# ---------------------------------------------------------------------------------------------
# the concept data


def own_features(lm: LanguageModel, trajectories: Sequence[Trajectory], features: FeatureSettings,
                 cache: Path | None, relabelled: bool = False) -> dict[str, TypeFeatures]:
    """The decisions of the agent's episodes as concept data, through the expert decisions' own
    feature path (:func:`agent_shell.concepts.collect_features` under the run's ``features``
    settings; cached alike): every environment step of a won episode with the agent's chosen
    action as the target, or (``relabelled``) every labelled step of an episode, won or lost,
    with the expert's label as the target. The one place the loop computes features."""
    from agent_shell.concepts import collect_features

    return collect_features(lm, trajectories, features, cache_dir=cache, relabelled=relabelled)


def state_key(observation: str, candidates: Sequence[str]) -> str:
    """What makes two decisions the same state, whatever game they come from: the last
    observation before the decision and its (filtered) candidate set, as a hash."""
    text = json.dumps([observation.strip(), sorted(candidates)], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def decision_states(trajectories: Sequence[Trajectory], features: FeatureSettings,
                    relabelled: bool = False) -> list[str]:
    """:func:`state_key` of every fitting decision of ``trajectories``, the decisions of the
    feature path (:func:`agent_shell.concepts.decision_inputs` under ``features``, ``relabelled``
    as :func:`own_features`), in its order."""
    from agent_shell.concepts import decision_inputs

    keys = []
    for traj in trajectories:
        for d, _ in decision_inputs(traj, features, relabelled=relabelled)[0]:
            last = next((s.observation for s in reversed(d.history) if s.kind == "env"), d.observation)
            keys.append(state_key(last, d.candidates))
    return keys


def merged_features(task_type: str, expert: TypeFeatures | None, own: Sequence[TypeFeatures],
                    max_decisions: int) -> TypeFeatures:
    """One type's concept data: the expert decisions (``expert``, None: none) then the own
    decisions of ``own`` (oldest first), of which the newest ``max_decisions`` are kept (0: all).
    ``task_ids`` lists the games that kept a decision."""
    out = TypeFeatures(task_type)
    parts = [expert] if expert is not None else []
    own_rows = [(tf, i) for tf in own for i in range(tf.n_decisions)]
    if max_decisions and len(own_rows) > max_decisions:
        own_rows = own_rows[-max_decisions:]
    for tf in parts:
        out.phi += tf.phi
        out.log_q += tf.log_q
        out.n_tokens += tf.n_tokens
        out.expert += tf.expert
        out.task_ids += tf.task_ids
        out.decision_task_ids += tf.decision_task_ids
        out.n_env_steps += tf.n_env_steps
        out.skipped_actions.update(tf.skipped_actions)
        out.max_candidates = tf.max_candidates
    kept = {id(tf) for tf, _ in own_rows}
    for tf, i in own_rows:
        out.phi.append(tf.phi[i])
        out.log_q.append(tf.log_q[i])
        out.n_tokens.append(tf.n_tokens[i])
        out.expert.append(tf.expert[i])
        if len(tf.decision_task_ids) == tf.n_decisions:
            out.decision_task_ids.append(tf.decision_task_ids[i])
    for tf in own:
        if id(tf) in kept:
            out.task_ids += tf.task_ids
            out.n_env_steps += tf.n_env_steps
            out.skipped_actions.update(tf.skipped_actions)
            out.max_candidates = tf.max_candidates
    return out


# ---------------------------------------------------------------------------------------------
# concepts on disk


def save_round_concepts(out: Path, k: int, concepts: Mapping[str, Concept], provenance: dict) -> Path:
    """Write round ``k``'s concepts, each with ``provenance`` (its type's part, and the round's
    fields) in its metadata, and ``provenance.json``, as one folder (complete or absent)."""
    import cb_core

    from cb_io.storage import atomic_folder

    folder = concepts_dir(out, k)
    with atomic_folder(folder) as staging:
        for task_type, c in sorted(concepts.items()):
            mine = {**{key: v for key, v in provenance.items() if key != "types"},
                    **provenance["types"].get(task_type, {})}
            concept = cb_core.Concept(c.alpha, c.gamma, c.eps, {**c.metadata, "provenance": mine})
            (staging / f"{task_type}.safetensors").write_bytes(concept.to_bytes())
        (staging / "provenance.json").write_text(json.dumps(provenance, indent=1, sort_keys=True) + "\n")
    return folder


def load_round_concepts(out: Path, k: int) -> tuple[dict[str, Concept], dict]:
    """Round ``k``'s concepts and provenance (FileNotFoundError when the folder is absent)."""
    from agent_shell.concepts import load_concepts

    folder = concepts_dir(out, k)
    return load_concepts(folder), json.loads((folder / "provenance.json").read_text())


# ---------------------------------------------------------------------------------------------
# the summary


def evaluation_records(out: Path) -> list[dict]:
    """Every round's evaluation episodes (``round-K/results.jsonl``), round by round."""
    paths = sorted(Path(out).glob("round-*/results.jsonl"), key=lambda p: int(p.parent.name.split("-")[1]))
    return [r for p in paths for r in read_results(p)]


def round_rows(lines: Sequence[dict], records: Sequence[dict]) -> list[dict]:
    """Per round: training games and wins, new decisions (in expert states / new states), the
    evaluation's won/n with its 95% Wilson interval, and the same games paired against round 0
    (only round k won, only round 0 won, the exact sign test's p)."""
    from agent_shell.statistics import sign_test, wilson_interval

    outcome: dict[int, dict[str, bool]] = {}
    for r in records:
        if not r.get("error"):
            outcome.setdefault(int(r.get("concept_round") or 0), {})[r["task_id"]] = bool(r["success"])
    rows = []
    for line in lines:
        k = line["round"]
        games = outcome.get(k, {})
        won, n = sum(games.values()), len(games)
        base = outcome.get(0, {})
        shared = set(games) & set(base)
        only_k = sum(games[t] and not base[t] for t in shared)
        only_0 = sum(base[t] and not games[t] for t in shared)
        types = line.get("types") or {}
        labelled = sum(t.get("labelled", 0) for t in types.values())
        rows.append({"round": k, "labels": line.get("labels", "wins"), "train_games": len(line["train_games"]),
                     "train_won": len(line["won_games"]), "labelled": labelled,
                     "agreed": sum(t.get("agreed", 0) for t in types.values()),
                     "expert_mix": float(line.get("expert_mix") or 0.0),
                     "expert_executed": sum(t.get("expert_executed", 0) for t in types.values()),
                     "unlabelled": sum(n for t in types.values() for n in t.get("unlabelled", {}).values()),
                     "new_decisions": sum(line["new_decisions"].values()),
                     "in_expert_states": line["in_expert_states"], "new_states": line["new_states"],
                     "kept_last": line["kept_last"], "won": won, "n": n, "ci": wilson_interval(won, n),
                     "paired_games": len(shared), "only_round": only_k, "only_round0": only_0,
                     "p_value": sign_test(only_k, only_k + only_0) if k else None})
    return rows


ROUND_COLUMNS = ("round", "labels", "training games won", "new decisions", "in expert states", "new states",
                 "on-policy agreement", "unlabelled states", "eval won/n", "rate", "95% CI",
                 "vs round 0: only k / only 0", "sign test p")


def agreement_cell(agreed: int, labelled: int) -> str:
    """On-policy agreement as ``agreed/labelled (rate)``; ``-`` without labelled states."""
    return f"{agreed}/{labelled} ({100 * agreed / labelled:.1f}%)" if labelled else "-"


def round_cells(row: dict) -> list[str]:
    """One row of :func:`round_rows` as the cells of :data:`ROUND_COLUMNS`."""
    rate = row["won"] / row["n"] if row["n"] else 0.0
    steps = "step" if row["expert_executed"] == 1 else "steps"
    mixed = f", mix {row['expert_mix']:.3g}: {row['expert_executed']} expert {steps}" if row["expert_mix"] else ""
    return [str(row["round"]), row["labels"] + mixed,
            f"{row['train_won']}/{row['train_games']}" if row["round"] else "-",
            str(row["new_decisions"]) + (" (concepts kept)" if row["kept_last"] else ""),
            str(row["in_expert_states"]), str(row["new_states"]), agreement_cell(row["agreed"], row["labelled"]),
            str(row["unlabelled"]) if row["round"] else "-", f"{row['won']}/{row['n']}", f"{100 * rate:.1f}%",
            f"[{100 * row['ci'][0]:.1f}, {100 * row['ci'][1]:.1f}]",
            f"{row['only_round']} / {row['only_round0']}" if row["round"] else "-",
            f"{row['p_value']:.3g}" if row["p_value"] is not None else "-"]


def round_tables(lines: Sequence[dict], records: Sequence[dict], title: str) -> list[tuple[str, Sequence[str],
                                                                                          list[list[str]], str]]:
    """The rounds as tables: (title, columns, rows of cells, caption) of the rounds paired against
    round 0 (:func:`round_rows`) and of each round's training play per task type
    (:func:`type_cells`), for ``cb-agent improve`` and ``cb-agent report --rounds``."""
    caption = ("new decisions: environment steps of the won training games (labels wins) or the expert-labelled "
               "states of every training game, one per distinct state a round (labels expert); in expert states: "
               "a state the expert data held, same last observation and candidate set; on-policy agreement: the "
               "agent's action was the expert's, of the labelled states of the round's training play; sign test: "
               "exact two-sided binomial test on the games only one of the two rounds won")
    rows = round_rows(lines, records)
    if any(row["expert_mix"] for row in rows):
        caption += ("; mix (--beta): the probability that a training step executed the expert's action instead of "
                    "the agent's, and the steps where it did")
    tables = [(f"{title}: rounds (paired against round 0 on the same evaluation games)", ROUND_COLUMNS,
               [round_cells(row) for row in rows], caption)]
    per_type = type_cells(lines)
    if per_type:
        tables.append((f"{title}: training play per round and task type", TYPE_COLUMNS, per_type,
                       "unlabelled states: the expert gave up, answered nothing, answered outside the candidate "
                       "set or an action the agent's filter removes, the replay differed, or (labels expert) the "
                       "state came up before in the round"))
    return tables


#: The columns of :func:`type_cells`: a round's training play per task type.
TYPE_COLUMNS = ("round", "task type", "training games won", "decisions added", "on-policy agreement",
                "unlabelled states (why)")


def type_cells(lines: Sequence[dict]) -> list[list[str]]:
    """Per round >= 1 and task type (the round line's ``types``): training games won, decisions
    added, on-policy agreement (the agent's choice was the expert's, of the labelled states) and
    the states without a label with their reasons, as the cells of :data:`TYPE_COLUMNS`."""
    rows = []
    for line in lines:
        for t, c in (line.get("types") or {}).items():
            why = ", ".join(f"{reason} {n}" for reason, n in c["unlabelled"].items())
            rows.append([str(line["round"]), t, f"{c['won']}/{c['games']}", str(c["decisions"]),
                         agreement_cell(c["agreed"], c["labelled"]),
                         f"{sum(c['unlabelled'].values())}" + (f" ({why})" if why else "")])
    return rows


__all__ = ["ROUND_COLUMNS", "TYPE_COLUMNS", "agreement_cell", "round_tables", "type_cells", "ROUND_SCHEMA", "check_disjoint", "concepts_dir", "decision_states", "episode_files",
           "evaluation_records", "load_round_concepts", "merged_features", "own_features", "read_rounds",
           "round_cells", "round_dir", "round_games", "round_rows", "rounds_file", "save_round_concepts", "state_key",
           "training_pool"]
