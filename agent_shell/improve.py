"""A concept that learns from its own wins: rounds of play on training games, the won episodes
added to the concept data, refits (``cb-agent improve``).

Round 0 is the concept of ``cb-agent run``: fitted on the won expert demonstrations of the
training split (:func:`agent_shell.pipeline.prepare`). Round k (1..R) plays CB-Agent with round
k-1's concepts on ``games_per_round`` training games of each task type that the expert data did
not use, keeps the episodes the environment scores as won, and turns their environment steps into
decisions through the expert decisions' feature path (:func:`own_features`: the agent's chosen
action is the target). They join the concept data of their task type (after the expert data
unless ``keep_expert_data`` is off; the newest ``max_decisions`` own decisions of a type are kept),
and the types with new decisions are refitted, each fit started at round k-1's alpha
(:func:`agent_shell.concepts.fit_concepts`'s ``warm``; Eq. 6 is strongly convex, so the start
changes the path, not the optimum). Every round's concepts are then played on the evaluation games.
A round that wins no training game keeps round k-1's concepts and says so.

Files under the output folder (every one written atomically or appended one line at a time):

* ``round-K/concepts/``: the round's ``<task type>.safetensors`` and ``provenance.json`` (which
  games, expert or own, each type's data came from; written as one folder, complete or absent);
  each concept's metadata carries the same ``provenance``. ``cb-agent run --concepts`` acts with it.
* ``round-K/train.jsonl`` (K >= 1): the training episodes, ``round-K/results.jsonl``: the
  evaluation episodes (results records of :mod:`agent_shell.results`, with ``concept_round``).
* ``rounds.jsonl``: one line per finished round (:func:`rounds_file`): its training games and
  wins, its new decisions, how many of them were states the expert data already held
  (:func:`state_key`), its concepts, its evaluation.

Resume (``--resume``): everything a round needs is read back from these files, so a run killed
anywhere continues where it stopped: finished episodes are never played again (the scheduler's
rule, :func:`agent_shell.scheduler.play_episodes`), finished rounds are skipped, a round's
concepts are read back when they were written and refitted from its training episodes (features
cached) otherwise, to the same values as an uninterrupted run. Each file is resumed by the
project's one rule (:class:`agent_shell.results.ResumableJsonl`): the run's settings must agree
with the finished lines'.

Guard: an evaluation game is never a training game (:func:`check_disjoint`, one line).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from agent_shell.concepts import TypeFeatures
from agent_shell.results import ResumableJsonl, read_results, unique_episodes
from agent_shell.run_config import RunConfig
from cb_io.records import Trajectory
from cb_io.storage import iter_jsonl

if TYPE_CHECKING:
    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.lm.protocol import LanguageModel
    from agent_shell.pipeline import Setup
    from cb_core import Concept
    from envs.protocol import Environment

#: ``schema`` of a line of ``rounds.jsonl``.
ROUND_SCHEMA = "cb-agent/improve-round-v1"
#: The improve settings recorded in every round line and compared on resume (``rounds`` is not:
#: a resumed run may go on to more rounds).
IMPROVE_SETTINGS = ("games_per_round", "max_decisions", "keep_expert_data", "train_game_ids")

Echo = Callable[[str], None]


@dataclass(frozen=True)
class ImproveSettings:
    """The loop's own settings (the rest is the run's :class:`RunConfig`).

    Attributes:
        rounds: rounds of play and refit after round 0 (>= 1).
        games_per_round: training games per task type played each round (>= 1); round k plays the
            k-th slice of each type's training games, from the start again once they run out.
        max_decisions: cap on the own decisions in a type's concept data, the newest kept (0: no
            cap; the expert decisions are not counted).
        keep_expert_data: the expert decisions stay in the concept data (off: round k >= 1 is
            fitted on own decisions alone, warm-started from round k-1).
        train_games: explicit training games (of the demonstrations' split); empty: every game
            of the evaluated task types that the expert data did not use.

    Raises:
        ValueError: a number out of range, naming it.
    """

    rounds: int = 3
    games_per_round: int = 6
    max_decisions: int = 2000
    keep_expert_data: bool = True
    train_games: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, low in (("rounds", 1), ("games_per_round", 1), ("max_decisions", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {low}")
        object.__setattr__(self, "train_games", tuple(dict.fromkeys(self.train_games)))

    def recorded(self) -> dict[str, Any]:
        """The settings of :data:`IMPROVE_SETTINGS`, JSON-ready."""
        return {"games_per_round": self.games_per_round, "max_decisions": self.max_decisions,
                "keep_expert_data": self.keep_expert_data, "train_game_ids": list(self.train_games)}


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


def won_trajectories(records: Sequence[dict], games: Sequence[str]) -> list[Trajectory]:
    """The won trial of each won episode of ``records`` (error records left out), in the order of
    ``games``."""
    won = {}
    for r in unique_episodes(records)[0]:
        if r["success"] and not r.get("error"):
            trial = next(t for t in r["trials"] if t["won"])
            won[r["task_id"]] = Trajectory.from_record(trial["trajectory"])
    return [won[g] for g in dict.fromkeys(games) if g in won]


# ---------------------------------------------------------------------------------------------
# the concept data


def own_features(lm: LanguageModel, trajectories: Sequence[Trajectory], features: FeatureSettings,
                 cache: Path | None) -> dict[str, TypeFeatures]:
    """The decisions of the agent's won episodes as concept data: every environment step a
    decision with the agent's chosen action as the target, through the expert decisions' own
    feature path (:func:`agent_shell.concepts.collect_features` under the run's ``features``
    settings; cached alike). The one place the loop computes features."""
    from agent_shell.concepts import collect_features

    return collect_features(lm, trajectories, features, cache_dir=cache)


def state_key(observation: str, candidates: Sequence[str]) -> str:
    """What makes two decisions the same state, whatever game they come from: the last
    observation before the decision and its (filtered) candidate set, as a hash."""
    text = json.dumps([observation.strip(), sorted(candidates)], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def decision_states(trajectories: Sequence[Trajectory], features: FeatureSettings) -> list[str]:
    """:func:`state_key` of every fitting decision of ``trajectories``, the decisions of the
    feature path (:func:`agent_shell.concepts.decision_inputs` under ``features``), in its order."""
    from agent_shell.concepts import decision_inputs

    keys = []
    for traj in trajectories:
        for d, _ in decision_inputs(traj, features)[0]:
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
        out.n_env_steps += tf.n_env_steps
        out.skipped_actions.update(tf.skipped_actions)
        out.max_candidates = tf.max_candidates
    kept = {id(tf) for tf, _ in own_rows}
    for tf, i in own_rows:
        out.phi.append(tf.phi[i])
        out.log_q.append(tf.log_q[i])
        out.n_tokens.append(tf.n_tokens[i])
        out.expert.append(tf.expert[i])
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
# the loop


@dataclass
class RoundState:
    """What the loop carries from round to round: the run's feature settings (built once), the
    concepts acting, and per type the own decisions collected so far (one :class:`TypeFeatures`
    per round that won a game of the type)."""

    features: FeatureSettings
    concepts: dict
    own: dict[str, list[TypeFeatures]]


def improve(config: RunConfig, settings: ImproveSettings, out: str | Path, echo: Echo = print,
            env: Environment | None = None, lm: LanguageModel | None = None,
            progress=None) -> list[dict]:
    """Run (or resume, ``config.resume``) the loop of rounds 0..``settings.rounds`` into ``out``;
    returns the round lines (``rounds.jsonl``), one per round.

    Raises:
        ValueError: one line, before anything heavy loads: an evaluation game that is a training
            game, an output folder holding a run without ``config.resume``, a resumed folder whose
            finished rounds were run with other settings; after the set-up: an explicit training
            game of the expert data.
    """
    from agent_shell.pipeline import check_tasks, prepare
    from agent_shell.results import repair_for_resume
    from envs import make_env

    out = Path(out)
    config = replace(config, agents=("cb-agent",))
    env = env if env is not None else make_env(config.env)
    eval_ids = config.task_ids(env)  # one line for a bad id or split
    type_of = env.task_type_of
    task_types = sorted({type_of(t) for t in eval_ids})
    if settings.train_games:
        check_tasks(env, config.demo_split, settings.train_games)
    check_disjoint(eval_ids, settings.train_games or [t for t in env.tasks(config.demo_split)
                                                      if type_of(t) in set(task_types)])
    compared = {**{k: v for k, v in config.settings().items() if k != "concept_round"}, **settings.recorded()}
    rounds = rounds_file(out)
    if not config.resume and (rounds.path.exists() or episode_files(out)):
        raise ValueError(f"{out} already holds an improve run; pass --resume to continue it, or choose another "
                         "--out-dir")
    if config.resume:
        for path in [rounds.path, *episode_files(out)]:
            if path.exists():
                repair_for_resume(path, echo)
    done = {r["round"]: r for r in rounds.finished(set(range(settings.rounds + 1)), True, compared,
                                                    lambda r: True).values()}

    setup = prepare(config, need_concepts=True, echo=echo, env=env, lm=lm, task_types=task_types)
    expert_ids = {t.task_id for t in setup.demo_trajectories} | {i for f in setup.features.values() for i in f.task_ids}
    pool = training_pool(env, config.demo_split, task_types, expert_ids, settings.train_games)
    n_pool = {t: len(g) for t, g in pool.items()}
    echo(f"training games: {sum(n_pool.values())} of {config.demo_split} the expert data did not use ("
         + ", ".join(f"{t} {n}" for t, n in n_pool.items()) + f"); {settings.games_per_round} per type a round")
    from agent_shell.feature_settings import FeatureSettings

    features = FeatureSettings.from_config(config, setup.calibrator)  # the run's feature settings, once
    expert_states = set(decision_states(setup.concept_trajectories, features))
    base_meta = {**config.settings(), "model": setup.lm.name}
    lines: list[dict] = []
    state = RoundState(features, {}, {t: [] for t in task_types})

    for k in range(settings.rounds + 1):
        if k == 0:
            concepts, provenance = round0_concepts(out, setup)
            line = {"train_games": [], "won_games": [], "new_decisions": {}, "in_expert_states": 0, "new_states": 0,
                    "kept_last": False}
        else:
            concepts, provenance, line = play_and_refit(config, settings, out, k, setup, pool, state, expert_states,
                                                        base_meta, done.get(k), echo, progress)
        state.concepts = concepts
        # the task types whose concepts round k kept from round k-1 (none refitted: no won game of theirs)
        kept = sorted(t for t, p in provenance["types"].items() if not p.get("refitted")) if k else []
        summary = evaluate(config, out, k, setup, concepts, eval_ids, base_meta, echo, progress, kept)
        if k in done:
            echo(f"round {k}: finished before (--resume): evaluation {summary['won']}/{summary['n']} won")
            lines.append(done[k])
            continue
        line = {"schema": ROUND_SCHEMA, "round": k, **compared, "model": setup.lm.name, **line,
                "concepts": str(concepts_dir(out, k).relative_to(out)),
                "provenance": {t: {"expert": len(p.get("expert", [])), "own": len(p.get("own", []))}
                               for t, p in provenance["types"].items()},
                "eval": summary}
        rounds.append(line)
        lines.append(line)
        echo(f"round {k}: evaluation {summary['won']}/{summary['n']} won"
             + (f" ({100 * summary['won'] / summary['n']:.1f}%)" if summary["n"] else ""))
    return lines


def round0_concepts(out: Path, setup: Setup) -> tuple[dict, dict]:
    """Round 0: the concepts fitted on the expert data (read back when saved before)."""
    try:
        return load_round_concepts(out, 0)
    except FileNotFoundError:
        pass
    provenance = {"round": 0, "warm_start": None, "kept_last": False,
                  "types": {t: {"expert": list(f.task_ids), "own": []} for t, f in sorted(setup.features.items())}}
    save_round_concepts(out, 0, setup.concepts, provenance)
    return load_round_concepts(out, 0)


def play_and_refit(config: RunConfig, settings: ImproveSettings, out: Path, k: int, setup: Setup,
                   pool: Mapping[str, Sequence[str]], state: RoundState, expert_states: set[str],
                   base_meta: dict, finished: dict | None, echo: Echo, progress) -> tuple[dict, dict, dict]:
    """Round ``k``: play the round's training games with the last concepts, turn the won ones into
    decisions, refit the types with new decisions (warm-started), save the concepts. Returns
    (concepts, provenance, the round line's fields)."""
    games = round_games(pool, k, settings.games_per_round)
    path = round_dir(out, k) / "train.jsonl"
    if finished is None:
        echo(f"round {k}/{settings.rounds}: cb-agent with round {k - 1}'s concepts on {len(games)} training games "
             f"of {config.demo_split}")
        meta = {**base_meta, "split": config.demo_split, "concept_round": k - 1,
                "concepts_dir": str(concepts_dir(out, k - 1))}
        play(config, setup, state.concepts, games, path, meta, echo, progress)
    won = won_trajectories(read_results(path), games)
    new = own_features(setup.lm, won, state.features, setup.cache)
    keys = decision_states(won, state.features)
    in_expert = sum(key in expert_states for key in keys)
    for task_type, tf in new.items():
        if tf.n_decisions:
            state.own.setdefault(task_type, []).append(tf)
    fields = {"train_games": games, "won_games": [t.task_id for t in won],
              "new_decisions": {t: f.n_decisions for t, f in sorted(new.items())},
              "in_expert_states": in_expert, "new_states": len(keys) - in_expert, "kept_last": not won}
    try:
        concepts, provenance = load_round_concepts(out, k)
    except FileNotFoundError:
        concepts, provenance = refit(config, settings, out, k, setup, state, new, won, echo)
    if finished is None:
        changed = sorted(t for t, f in new.items() if f.n_decisions)
        echo(f"round {k}: won {len(won)}/{len(games)} training games -> {len(keys)} new decisions "
             f"({in_expert} in states the expert data held, {len(keys) - in_expert} new states)"
             + (f"; refitted {', '.join(changed)} warm-started from round {k - 1}" if changed else
                f"; no won training game: round {k - 1}'s concepts are kept"))
    return concepts, provenance, fields


def refit(config: RunConfig, settings: ImproveSettings, out: Path, k: int, setup: Setup, state: RoundState,
          new: Mapping[str, TypeFeatures], won: Sequence[Trajectory], echo: Echo) -> tuple[dict, dict]:
    """Round ``k``'s concepts from the data so far, saved with their provenance."""
    from agent_shell.concepts import fit_concepts

    last = state.concepts
    changed = sorted(t for t, f in new.items() if f.n_decisions)
    data = {t: merged_features(t, setup.features.get(t) if settings.keep_expert_data else None, state.own.get(t, []),
                               settings.max_decisions) for t in changed}
    fitted = fit_concepts(data, setup.lm, state.features, config.lam,
                          config.gamma, env_name=config.env, warm=last)
    concepts = {**last, **fitted}
    _, previous = load_round_concepts(out, k - 1)
    types = {}
    for t in sorted(concepts):
        if t in fitted:
            own_ids = data[t].task_ids[len(setup.features[t].task_ids) if settings.keep_expert_data
                                       and t in setup.features else 0:]
            types[t] = {"expert": list(setup.features[t].task_ids) if settings.keep_expert_data
                        and t in setup.features else [], "own": own_ids,
                        "decisions": data[t].n_decisions, "refitted": True}
        else:
            types[t] = {**previous["types"].get(t, {}), "refitted": False}
    provenance = {"round": k, "warm_start": k - 1 if fitted else None, "kept_last": not won,
                  "keep_expert_data": settings.keep_expert_data, "types": types}
    save_round_concepts(out, k, concepts, provenance)
    return load_round_concepts(out, k)


def players(config: RunConfig, setup: Setup, concepts: Mapping[str, Concept]) -> dict:
    """CB-Agent acting with ``concepts`` over the set-up's backbone and demonstrations."""
    from agent_shell.pipeline import players_of

    return players_of(config, replace(setup, concepts=dict(concepts)))


def play(config: RunConfig, setup: Setup, concepts: Mapping[str, Concept], games: Sequence[str], path: Path,
         meta: dict, echo: Echo, progress) -> None:
    """CB-Agent with ``concepts`` on ``games``, appended to ``path`` (finished episodes skipped:
    the scheduler's resume rule), one line per finished game."""
    from agent_shell.scheduler import InProcessExecutor, play_episodes

    play_episodes(InProcessExecutor(setup.env, players(config, setup, concepts)), ["cb-agent"], games, path,
                  config.budget, resume=True, meta=meta, task_type_of=setup.env.task_type_of, progress=progress,
                  echo=echo, time_limit=config.episode_timeout, keep_errors=config.keep_errors)


def evaluate(config: RunConfig, out: Path, k: int, setup: Setup, concepts: Mapping[str, Concept],
             eval_ids: Sequence[str], base_meta: dict, echo: Echo, progress, kept: Collection[str] = ()) -> dict:
    """Round ``k``'s concepts on the evaluation games (``round-K/results.jsonl``); returns
    ``{"won", "n", "errors"}`` over them.

    ``kept``: the task types whose concepts round ``k`` kept from round k-1 (no won training game
    of theirs refitted them). An episode reads only its own task type's concept, so round k-1's
    finished evaluation episodes of those types are round ``k``'s too: recorded again with
    ``concept_round`` k and ``evaluated_as_round`` (the same concept, played by the same
    deterministic agent, gives the same episode); only the other games are played."""
    path = round_dir(out, k) / "results.jsonl"
    meta = {**base_meta, "concept_round": k, "concepts_dir": str(concepts_dir(out, k))}
    finished = {r["task_id"] for r in read_results(path) if not r.get("error")}
    type_of = setup.env.task_type_of
    reusable = {t for t in eval_ids if type_of(t) in set(kept)} - finished
    if reusable:
        from agent_shell.results import store_record

        earlier = [r for r in unique_episodes(read_results(round_dir(out, k - 1) / "results.jsonl"))[0]
                   if r["task_id"] in reusable and not r.get("error")]
        for r in earlier:
            store_record(path, {**r, **meta, "evaluated_as_round": r.get("evaluated_as_round", k - 1)})
        finished |= {r["task_id"] for r in earlier}
        echo(f"round {k}: the concepts of {', '.join(kept)} are round {k - 1}'s: its {len(earlier)} evaluation "
             f"episodes of those types are round {k}'s (the same deterministic play; not played again)")
    if not set(eval_ids) <= finished:
        left = len(set(eval_ids) - finished)
        echo(f"round {k}: cb-agent with round {k}'s concepts on {left} evaluation game{'s' if left > 1 else ''} of "
             f"{config.split}" + (f" ({len(eval_ids) - left} finished)" if left < len(eval_ids) else ""))
        play(config, setup, concepts, eval_ids, path, meta, echo, progress)
    records = [r for r in unique_episodes(read_results(path))[0] if r["task_id"] in set(eval_ids)]
    ok = [r for r in records if not r.get("error")]
    return {"won": sum(bool(r["success"]) for r in ok), "n": len(ok), "errors": len(records) - len(ok)}


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
        rows.append({"round": k, "train_games": len(line["train_games"]), "train_won": len(line["won_games"]),
                     "new_decisions": sum(line["new_decisions"].values()),
                     "in_expert_states": line["in_expert_states"], "new_states": line["new_states"],
                     "kept_last": line["kept_last"], "won": won, "n": n, "ci": wilson_interval(won, n),
                     "paired_games": len(shared), "only_round": only_k, "only_round0": only_0,
                     "p_value": sign_test(only_k, only_k + only_0) if k else None})
    return rows


ROUND_COLUMNS = ("round", "training games won", "new decisions", "in expert states", "new states", "eval won/n",
                 "rate", "95% CI", "vs round 0: only k / only 0", "sign test p")


def round_cells(row: dict) -> list[str]:
    """One row of :func:`round_rows` as the cells of :data:`ROUND_COLUMNS`."""
    rate = row["won"] / row["n"] if row["n"] else 0.0
    return [str(row["round"]), f"{row['train_won']}/{row['train_games']}" if row["round"] else "-",
            str(row["new_decisions"]) + (" (concepts kept)" if row["kept_last"] else ""),
            str(row["in_expert_states"]), str(row["new_states"]), f"{row['won']}/{row['n']}", f"{100 * rate:.1f}%",
            f"[{100 * row['ci'][0]:.1f}, {100 * row['ci'][1]:.1f}]",
            f"{row['only_round']} / {row['only_round0']}" if row["round"] else "-",
            f"{row['p_value']:.3g}" if row["p_value"] is not None else "-"]


__all__ = ["IMPROVE_SETTINGS", "ROUND_COLUMNS", "ROUND_SCHEMA", "ImproveSettings", "RoundState", "check_disjoint",
           "concepts_dir", "decision_states", "evaluate", "evaluation_records", "improve", "load_round_concepts",
           "merged_features", "own_features", "read_rounds", "round_cells", "round_dir", "round_games", "round_rows",
           "rounds_file", "save_round_concepts", "state_key", "training_pool", "won_trajectories"]
