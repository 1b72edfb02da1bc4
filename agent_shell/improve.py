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

Its files, training games, concept data and summary rows are :mod:`agent_shell.improve_rounds`'s.

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

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from agent_shell.concepts import TypeFeatures
from agent_shell.improve_labels import LABELS, check_labels, round_labels
from agent_shell.improve_rounds import (ROUND_SCHEMA, check_disjoint, concepts_dir, decision_states, episode_files,
                                        load_round_concepts, merged_features, own_features, round_dir, round_games,
                                        rounds_file, save_round_concepts, training_pool)
from agent_shell.results import ResumableJsonl, read_results, unique_episodes
from agent_shell.run_config import RunConfig, require_resolved

if TYPE_CHECKING:
    from rich.progress import Progress

    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.lm.protocol import LanguageModel
    from agent_shell.pipeline import Setup
    from cb_core import Concept
    from envs.protocol import Environment

#: The improve settings recorded in every round line and compared on resume (``rounds`` is not:
#: a resumed run may go on to more rounds).
IMPROVE_SETTINGS = ("labels", "beta", "games_per_round", "max_decisions", "keep_expert_data", "train_game_ids")

Echo = Callable[[str], None]


@dataclass(frozen=True)
class ImproveSettings:
    """The loop's own settings (the rest is the run's :class:`RunConfig`).

    Attributes:
        labels: where a round's targets come from (:data:`agent_shell.improve_labels.LABELS`):
            ``wins`` (the won episodes, the agent's own choices) or ``expert`` (every episode,
            the expert's action in each state the agent reached: DAgger).
        beta: DAgger's mixing (``expert`` labels only): round k >= 1 plays its training games with
            the expert's action executed instead of the agent's with probability ``beta ** k`` at
            each step (:meth:`mixing`; DAgger's decaying schedule p^(i-1), round 0 being the
            expert's own data); 0: the agent's actions only (the default).
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
        ValueError: a number out of range or unknown labels, naming it.
    """

    labels: str = "wins"
    beta: float = 0.0
    rounds: int = 3
    games_per_round: int = 6
    max_decisions: int = 2000
    keep_expert_data: bool = True
    train_games: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.labels not in LABELS:
            raise ValueError(f"labels={self.labels!r}: choose one of {', '.join(LABELS)}")
        for name, low in (("rounds", 1), ("games_per_round", 1), ("max_decisions", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {low}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"--beta {self.beta}: a probability in [0, 1]")
        if self.beta and self.labels != "expert":
            raise ValueError(f"--beta {self.beta}: mixing in the expert's actions needs --labels expert (under "
                             "--labels wins the targets are the agent's own choices)")
        object.__setattr__(self, "train_games", tuple(dict.fromkeys(self.train_games)))

    def mixing(self, k: int) -> float:
        """Round ``k``'s probability that a training step executes the expert's action: ``beta ** k``
        (round 0 is the expert's own data; 0 when ``beta`` is)."""
        return self.beta ** k if self.beta and k else 0.0

    def recorded(self) -> dict[str, Any]:
        """The settings of :data:`IMPROVE_SETTINGS`, JSON-ready."""
        return {"labels": self.labels, "beta": self.beta, "games_per_round": self.games_per_round,
                "max_decisions": self.max_decisions, "keep_expert_data": self.keep_expert_data,
                "train_game_ids": list(self.train_games)}


@dataclass
class ImproveRun:
    """What the rounds of one run share, derived once before round 0 (:func:`start`), and what
    they carry from round to round (the concepts acting, each type's own decisions so far).

    Attributes:
        config, settings, out: the run's settings, the loop's, and its output folder.
        setup: the set-up (backbone, expert data, round 0's concepts, the feature settings).
        features: the run's feature settings (``setup.feature_settings``, derived once).
        eval_ids: the evaluation games.
        pool: task type -> its training games (:func:`agent_shell.improve_rounds.training_pool`).
        expert_states: the :func:`agent_shell.improve_rounds.state_key` of every expert decision.
        compared: the settings every round line records and a resumed run must agree with.
        base_meta: what every episode record of the run carries (settings and backbone name).
        done: round -> its line, for the rounds a resumed run finished before.
        rounds: ``rounds.jsonl`` (:func:`agent_shell.improve_rounds.rounds_file`).
        echo, progress: progress lines and the optional progress bar.
        concepts: the concepts acting (the last round's).
        own: task type -> one :class:`TypeFeatures` per round that added decisions of the type.
        can_label: the environment's expert labels any state (``expert_labels_any_state``): every
            round's training episodes are labelled (the targets under ``expert``, the on-policy
            agreement under both).
    """

    config: RunConfig
    settings: ImproveSettings
    out: Path
    setup: Setup
    features: FeatureSettings
    eval_ids: list[str]
    pool: dict[str, list[str]]
    expert_states: set[str]
    compared: dict[str, Any]
    base_meta: dict[str, Any]
    done: dict[int, dict]
    rounds: ResumableJsonl
    echo: Echo
    progress: Progress | None = None
    concepts: dict = field(default_factory=dict)
    own: dict[str, list[TypeFeatures]] = field(default_factory=dict)
    can_label: bool = False


def improve(config: RunConfig, settings: ImproveSettings, out: str | Path, echo: Echo = print,
            env: Environment | None = None, lm: LanguageModel | None = None,
            progress=None) -> list[dict]:
    """Run (or resume, ``config.resume``) the loop of rounds 0..``settings.rounds`` into ``out``;
    returns the round lines (``rounds.jsonl``), one per round.

    Raises:
        ValueError: one line, before anything heavy loads: ``expert`` labels on an environment
            whose expert cannot label the agent's states, an evaluation game that is a training game, an output folder holding a run without ``config.resume``, a resumed folder whose
            finished rounds were run with other settings; after the set-up: an explicit training
            game of the expert data.
    """
    run = start(config, settings, Path(out), echo, env, lm, progress)
    return [run_round(run, k) for k in range(settings.rounds + 1)]


def run_round(run: ImproveRun, k: int) -> dict:
    """Round ``k``, in order: its concepts (round 0: the expert data's; round k: play round k-1's
    concepts on the round's training games, the won ones' decisions join the concept data, the
    types with new decisions refitted), their evaluation on the evaluation games, its line in
    ``rounds.jsonl`` (read back when a resumed run finished the round before)."""
    if k == 0:
        concepts, provenance, fields = round0_concepts(run)
    else:
        concepts, provenance, fields = play_and_refit(run, k)
    run.concepts = concepts
    # the task types whose concepts round k kept from round k-1 (none refitted: no won game of theirs)
    kept = sorted(t for t, p in provenance["types"].items() if not p.get("refitted")) if k else []
    summary = evaluate(run, k, concepts, kept)
    return record_round(run, k, provenance, fields, summary)


def start(config: RunConfig, settings: ImproveSettings, out: Path, echo: Echo, env: Environment | None,
          lm: LanguageModel | None, progress) -> ImproveRun:
    """Everything the rounds share: the games checked and the output folder claimed (or repaired
    for ``--resume``) before anything loads, then the set-up, the training pool, the expert
    decisions' states and the recorded settings, each derived once."""
    from agent_shell.configure import task_ids
    from agent_shell.pipeline import check_tasks, prepare
    from agent_shell.results import repair_for_resume
    from envs import make_env

    env = env if env is not None else make_env(config.env)
    check_labels(settings.labels, env)
    config = replace(require_resolved(config, "improve"), agents=("cb-agent",))  # resolved once, by the command
    eval_ids = task_ids(config, env)  # one line for a bad id or split
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
    features = setup.feature_settings  # the run's feature settings, derived once by the set-up
    return ImproveRun(config, settings, out, setup, features, eval_ids, pool,
                      expert_states=set(decision_states(setup.concept_trajectories, features)), compared=compared,
                      base_meta={**config.settings(), "model": setup.lm.name}, done=done, rounds=rounds, echo=echo,
                      progress=progress, own={t: [] for t in task_types},
                      can_label=bool(getattr(env, "expert_labels_any_state", False)))


def record_round(run: ImproveRun, k: int, provenance: dict, fields: dict, summary: dict) -> dict:
    """Round ``k``'s line, appended to ``rounds.jsonl`` (the line read back when a resumed run
    finished the round before)."""
    if k in run.done:
        run.echo(f"round {k}: finished before (--resume): evaluation {summary['won']}/{summary['n']} won")
        return run.done[k]
    line = {"schema": ROUND_SCHEMA, "round": k, **run.compared, "model": run.setup.lm.name, **fields,
            "concepts": str(concepts_dir(run.out, k).relative_to(run.out)),
            "provenance": {t: {"expert": len(p.get("expert", [])), "own": len(p.get("own", []))}
                           for t, p in provenance["types"].items()},
            "eval": summary}
    run.rounds.append(line)
    run.echo(f"round {k}: evaluation {summary['won']}/{summary['n']} won"
             + (f" ({100 * summary['won'] / summary['n']:.1f}%)" if summary["n"] else ""))
    return line


def round0_concepts(run: ImproveRun) -> tuple[dict, dict, dict]:
    """Round 0: the concepts fitted on the expert data (read back when saved before)."""
    fields = {"labels": run.settings.labels, "expert_mix": 0.0, "train_games": [], "won_games": [], "new_decisions": {},
              "in_expert_states": 0, "new_states": 0, "kept_last": False, "types": {}}
    try:
        return (*load_round_concepts(run.out, 0), fields)
    except FileNotFoundError:
        pass
    provenance = {"round": 0, "warm_start": None, "kept_last": False,
                  "types": {t: {"expert": list(f.task_ids), "own": []} for t, f in sorted(run.setup.features.items())}}
    save_round_concepts(run.out, 0, run.setup.concepts, provenance)
    return (*load_round_concepts(run.out, 0), fields)


def play_and_refit(run: ImproveRun, k: int) -> tuple[dict, dict, dict]:
    """Round ``k``: play the round's training games with the last concepts, label their states
    (where the environment's expert can), take the label source's targets as decisions, refit the
    types with new decisions (warm-started), save the concepts. Returns (concepts, provenance, the
    round line's fields)."""
    config, setup, finished, labels = run.config, run.setup, run.done.get(k), run.settings.labels
    games = round_games(run.pool, k, run.settings.games_per_round)
    path = round_dir(run.out, k) / "train.jsonl"
    if finished is None:
        run.echo(f"round {k}/{run.settings.rounds}: cb-agent with round {k - 1}'s concepts on {len(games)} training "
                 f"games of {config.demo_split}")
        meta = {**run.base_meta, "split": config.demo_split, "concept_round": k - 1,
                "concepts_dir": str(concepts_dir(run.out, k - 1)),
                **({"expert_mix": run.settings.mixing(k)} if run.settings.beta else {})}
        play(run, run.concepts, games, path, meta)
    source = round_labels(labels, setup.env if run.can_label else None, run.out, k, read_results(path), games,
                          run.echo)
    new = own_features(setup.lm, source.targets, run.features, setup.cache, labels == "expert")
    keys = decision_states(source.targets, run.features, labels == "expert")
    in_expert = sum(key in run.expert_states for key in keys)
    changed = sorted(t for t, f in new.items() if f.n_decisions)
    for task_type in changed:
        run.own.setdefault(task_type, []).append(new[task_type])
    types = {t: {**c, "decisions": new[t].n_decisions if t in new else 0} for t, c in source.types.items()}
    fields = {"labels": labels, "expert_mix": run.settings.mixing(k), "train_games": games,
              "won_games": source.won_games,
              "new_decisions": {t: f.n_decisions for t, f in sorted(new.items())},
              "in_expert_states": in_expert, "new_states": len(keys) - in_expert, "kept_last": not changed,
              "types": types}
    try:
        concepts, provenance = load_round_concepts(run.out, k)
    except FileNotFoundError:
        concepts, provenance = refit(run, k, new)
    if finished is None:
        agreed, labelled_n, executed = (sum(t[f] for t in types.values())
                                        for f in ("agreed", "labelled", "expert_executed"))
        run.echo(f"round {k}: won {len(fields['won_games'])}/{len(games)} training games -> {len(keys)} new decisions "
                 f"({labels}; {in_expert} in states the expert data held, {len(keys) - in_expert} new states)"
                 + (f"; the agent chose the expert's action in {agreed}/{labelled_n} labelled states" if labelled_n
                    else "")
                 + (f"; the expert's action executed in {executed} step{'s' * (executed != 1)} "
                    f"(beta^{k} = {fields['expert_mix']:.4g})"
                    if fields["expert_mix"] else "")
                 + (f"; refitted {', '.join(changed)} warm-started from round {k - 1}" if changed else
                    f"; no {'won training game' if labels == 'wins' else 'labelled state'}: round {k - 1}'s "
                    "concepts are kept"))
    return concepts, provenance, fields


def refit(run: ImproveRun, k: int, new: Mapping[str, TypeFeatures]) -> tuple[dict, dict]:
    """Round ``k``'s concepts from the data so far, saved with their provenance."""
    from agent_shell.concepts import fit_concepts

    config, settings, setup, last = run.config, run.settings, run.setup, run.concepts
    changed = sorted(t for t, f in new.items() if f.n_decisions)
    data = {t: merged_features(t, setup.features.get(t) if settings.keep_expert_data else None, run.own.get(t, []),
                               settings.max_decisions) for t in changed}
    fitted = fit_concepts(data, setup.lm, run.features, config.lam, config.gamma, env_name=config.env, warm=last)
    concepts = {**last, **fitted}
    _, previous = load_round_concepts(run.out, k - 1)
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
    provenance = {"round": k, "warm_start": k - 1 if fitted else None, "kept_last": not changed,
                  "labels": settings.labels,
                  "keep_expert_data": settings.keep_expert_data, "types": types}
    save_round_concepts(run.out, k, concepts, provenance)
    return load_round_concepts(run.out, k)


def players(config: RunConfig, setup: Setup, concepts: Mapping[str, Concept]) -> dict:
    """CB-Agent acting with ``concepts`` over the set-up's backbone and demonstrations."""
    from agent_shell.pipeline import players_of

    return players_of(config, replace(setup, concepts=dict(concepts)))


def play(run: ImproveRun, concepts: Mapping[str, Concept], games: Sequence[str], path: Path, meta: dict) -> None:
    """CB-Agent with ``concepts`` (the round's saved ones, ``meta["concepts_dir"]``) on ``games``,
    appended to ``path`` (finished episodes skipped: the scheduler's resume rule), one line per
    finished game; in this process, or with ``--workers`` > 1 on Ray workers that act with the
    concepts read back from ``meta["concepts_dir"]`` (:func:`agent_shell.parallel.play_on_ray`):
    the same deterministic episodes either way."""
    from agent_shell.parallel import play_on_ray, uses_ray
    from agent_shell.scheduler import InProcessExecutor, play_episodes

    config, setup = run.config, run.setup
    if uses_ray(config):
        task_types = sorted({setup.env.task_type_of(t) for t in games})
        acting = replace(config, concepts=meta["concepts_dir"], concept_round=meta["concept_round"])  # as resolved
        play_on_ray(acting, games, task_types, path, meta, resume=True, task_type_of=setup.env.task_type_of,
                    progress=run.progress, echo=run.echo)
        return
    play_episodes(InProcessExecutor(setup.env, players(config, setup, concepts)), ["cb-agent"], games, path,
                  config.budget, resume=True, meta=meta, task_type_of=setup.env.task_type_of, progress=run.progress,
                  echo=run.echo, time_limit=config.episode_timeout, keep_errors=config.keep_errors)


def evaluate(run: ImproveRun, k: int, concepts: Mapping[str, Concept], kept: Collection[str] = ()) -> dict:
    """Round ``k``'s concepts on the evaluation games (``round-K/results.jsonl``); returns
    ``{"won", "n", "errors"}`` over them.

    ``kept``: the task types whose concepts round ``k`` kept from round k-1 (no won training game
    of theirs refitted them). An episode reads only its own task type's concept, so round k-1's
    finished evaluation episodes of those types are round ``k``'s too: recorded again with
    ``concept_round`` k and ``evaluated_as_round`` (the same concept, played by the same
    deterministic agent, gives the same episode); only the other games are played."""
    out, eval_ids, echo = run.out, run.eval_ids, run.echo
    path = round_dir(out, k) / "results.jsonl"
    meta = {**run.base_meta, "concept_round": k, "concepts_dir": str(concepts_dir(out, k))}
    finished = {r["task_id"] for r in read_results(path) if not r.get("error")}
    type_of = run.setup.env.task_type_of
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
             f"{run.config.split}" + (f" ({len(eval_ids) - left} finished)" if left < len(eval_ids) else ""))
        play(run, concepts, eval_ids, path, meta)
    records = [r for r in unique_episodes(read_results(path))[0] if r["task_id"] in set(eval_ids)]
    ok = [r for r in records if not r.get("error")]
    return {"won": sum(bool(r["success"]) for r in ok), "n": len(ok), "errors": len(records) - len(ok)}


__all__ = ["IMPROVE_SETTINGS", "ImproveRun", "ImproveSettings", "evaluate", "improve", "play", "play_and_refit",
           "players", "record_round", "refit", "round0_concepts", "run_round", "start"]
