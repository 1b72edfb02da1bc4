"""The pipeline from a benchmark to agents: expert demonstrations -> features -> concepts -> agents.

:func:`prepare` builds a :class:`Setup` from one :class:`agent_shell.run_config.ResolvedRun` (the
settings, resolved once by the command): the environment, won expert trajectories (collected once
into the cache), the backbone, the demonstrations rendered for the ReAct prompt and, when asked,
per-task-type concepts fitted on the trajectories' features (:func:`fit_from_trajectories`; features
and concepts cached).
:func:`set_up` adds an ICAL memory's retrieved demonstrations (and concepts fitted on its won
examples); :func:`players_of` turns a set-up into the named agents, :func:`build_players` does the
same in a parallel worker from the caches the driver filled, and :class:`StudyAgents` builds a
study's actors per rendering. ``cb-agent run``, ``fit-concepts``, ``eval-decisions``, the studies,
the calibrator's labelling and the benchmarks all go through here.

Errors a user can fix (an unknown split, a bad calibrator file, an empty ICAL memory) are raised
as ValueError or FileNotFoundError with a one-line message (:class:`UnknownTasks` for a split or
task id); the commands turn them into click errors. Progress goes to an ``echo(line)`` callback.
Importing this module loads no LM, engine nor JAX.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Collection, Mapping, Sequence, Union

from agent_shell.configure import agent_config, feature_settings
from agent_shell.history import REVIEWED
from agent_shell.lm.protocol import LanguageModel
from agent_shell.run_config import ResolvedRun, RunConfig, demos_with_thoughts, require_resolved
from cb_io.records import Trajectory
from envs.protocol import Environment

if TYPE_CHECKING:
    from agent_shell.agents import ReActAgent, Reflexion
    from agent_shell.calibration import Calibrator
    from agent_shell.concepts import TypeFeatures
    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.features import FeatureSet
    from agent_shell.ical.acting import RetrievedDemos
    from cb_core import Concept

    #: ReAct demonstrations: task type -> rendered demonstrations, or an ICAL memory's
    #: per-episode retrieval (duck-typed ``for_task(start)``).
    Demos = Union[Mapping[str, Sequence[str]], RetrievedDemos]

Echo = Callable[[str], None]


def _quiet(line: str) -> None:
    """The default ``echo``: progress lines are dropped."""


class UnknownTasks(ValueError):
    """An unknown split, or a task id the split does not hold (:func:`envs.check_tasks`'s one-line
    message); ``env`` and ``split`` say where the valid ids can be listed."""

    def __init__(self, err: ValueError, env: Environment, split: str) -> None:
        super().__init__(str(err))
        self.env, self.split = env, split


@dataclass
class Setup:
    """Everything :func:`prepare` (and :func:`set_up`) built for one configuration.

    Attributes:
        env: the environment the games are played in.
        lm: the backbone (None only in a parallel driver whose workers load their own).
        demo_trajectories: the won expert trajectories shown as ReAct demonstrations, the first
            ``demos_per_type`` of each task type in sorted task order.
        concept_trajectories: the won expert trajectories the concepts were fitted on (the first
            ``concept_per_type`` of each type; empty when no concept was fitted from them).
        demos: task type -> rendered demonstrations (the run's history rendering), or an ICAL
            memory's :class:`agent_shell.ical.acting.RetrievedDemos`.
        features: task type -> the concept data's features (empty when no concept was fitted).
        concepts: task type -> fitted concept (None when no agent needs one).
        concepts_dir: the cache folder the concepts were read from or written to.
        calibrator: the learned calibrator (``--calibrator``; rendering "calibrator").
        feature_settings: the run's :class:`agent_shell.feature_settings.FeatureSettings`, derived
            once (:func:`agent_shell.configure.feature_settings`) when the backbone and calibrator
            are loaded; what the concepts are fitted, checked and acted with.
        cache: the cache root (expert trajectories, reviews, features, concepts, JAX programs).
        timings: phase -> seconds (``demos_s``, ``load_lm_s``, ``reviews_s``, ``features_s``,
            ``features_lm_s``, ``fit_s``), in the order the phases ran.
    """

    env: Environment
    lm: LanguageModel | None = None
    demo_trajectories: list[Trajectory] = field(default_factory=list)
    concept_trajectories: list[Trajectory] = field(default_factory=list)
    demos: Demos = field(default_factory=dict)
    features: dict[str, TypeFeatures] = field(default_factory=dict)
    concepts: dict[str, Concept] | None = None
    concepts_dir: Path | None = None
    calibrator: Calibrator | None = None
    feature_settings: FeatureSettings | None = None
    cache: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)


def resolve_cache(cache_dir: str | None) -> Path:
    """``cache_dir`` (created), else the project's cache root (:func:`cb_io.paths.cache_dir`); a
    folder that cannot be created is a one-line ValueError (:func:`cb_io.paths.writable_folder`)."""
    from cb_io.paths import cache_root, writable_folder

    return writable_folder(cache_dir if cache_dir is not None else cache_root())


def check_tasks(env: Environment, split: str, task_ids: Sequence[str] = ()) -> list[str]:
    """:func:`envs.check_tasks` (``split`` exists, each id belongs to it; no engine starts).

    Raises:
        UnknownTasks: an unknown split, an unknown id, or an id of another split.
    """
    from envs import check_tasks as check

    try:
        return check(env, split, task_ids)
    except ValueError as err:
        raise UnknownTasks(err, env, split) from None


def prepare(config: ResolvedRun, need_concepts: bool, echo: Echo = _quiet, env: Environment | None = None,
            lm: LanguageModel | None = None, task_types: Collection[str] | None = None,
            feature_set: FeatureSet | None = None) -> Setup:
    """From the resolved settings ``config`` (:func:`agent_shell.configure.resolve`): make the env (unless given),
    collect (or read) demonstrations (of ``task_types`` only, when given), load the backbone
    (unless given), derive the run's feature settings once (``feature_set``: the extractors to
    share, None: new ones), render the demonstrations (rendering "experience":
    after reviewing them, cached), fit (or read) concepts when ``need_concepts`` (on the first
    ``config.concept_per_type`` won trajectories of each type), or read them from
    ``config.concepts`` when it names a folder (:func:`concepts_from_folder`).

    Raises:
        TypeError: ``config`` is not resolved.
        UnknownTasks: ``config.demo_split`` is not a split of the env (checked before any engine
            or model loads).
        ValueError, FileNotFoundError: a calibrator file that cannot be read or was made with
            another backbone (:func:`load_calibrator`).
    """
    from agent_shell.demos import expert_demos, rendered_demos
    from envs import make_env

    config = require_resolved(config, "prepare")
    cache = resolve_cache(config.cache_dir)
    setup = Setup(env=env if env is not None else make_env(config.env), cache=cache)
    check_tasks(setup.env, config.demo_split)  # before any engine or model loads
    t = time.perf_counter()
    fit = need_concepts and config.concepts is None  # else the concepts are read from config.concepts
    n_concept = config.concept_per_type if fit else 0
    collected = expert_demos(
        setup.env, max(config.demos_per_type, n_concept), split=config.demo_split,
        path=cache / "expert" / config.env / f"{config.demo_split}.jsonl", task_types=task_types,
        on_task=lambda tid: echo(f"collecting expert trajectory {tid}"), time_limit=config.episode_timeout)
    setup.demo_trajectories = first_per_type(collected, config.demos_per_type)
    concept_trajectories = setup.concept_trajectories = first_per_type(collected, n_concept)
    for line in shortfalls(collected, task_types, max(config.demos_per_type, n_concept), config.demo_split):
        echo(line)
    setup.timings["demos_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if lm is None:
        from agent_shell.lm import load_language_model

        lm = load_language_model(config.model, dtype=config.dtype, device=config.device)
        mesh = getattr(getattr(lm, "placement", None), "size", 1)  # a JAX backbone over several devices
        echo(f"backbone: {lm.name} ({config.dtype}) on {config.device}" + (f", a mesh of {mesh}" if mesh > 1 else ""))
    setup.lm = lm
    setup.timings["load_lm_s"] = time.perf_counter() - t
    if config.calibrator is not None:
        setup.calibrator = load_calibrator(config.calibrator, lm)
    setup.feature_settings = feature_settings(config, setup.calibrator, feature_set)  # the run's, once
    experiences_of = None
    if config.rendering in REVIEWED:
        from agent_shell.experience import review_trajectory

        t = time.perf_counter()
        reviewed = {}
        for i, traj in enumerate(setup.demo_trajectories, 1):
            echo(f"experience reviews {i}/{len(setup.demo_trajectories)}: {traj.task_id}")
            reviewed[traj.task_id] = review_trajectory(lm, traj, cache, setup.calibrator)
        experiences_of = lambda traj: reviewed.get(traj.task_id)  # noqa: E731
        setup.timings["reviews_s"] = time.perf_counter() - t
    setup.demos = rendered_demos(setup.demo_trajectories, config.rendering, experiences_of)
    echo(f"expert demonstrations: {len(setup.demo_trajectories)} won trajectories over {len(setup.demos)} task "
         f"types ({config.demo_split}, {config.demos_per_type} per type), history {config.rendering}")
    if fit:
        if n_concept != config.demos_per_type:
            echo(f"concept data: {len(concept_trajectories)} won trajectories ({n_concept} per type)")
        setup.features, setup.concepts, setup.concepts_dir = fit_from_trajectories(
            config, setup.lm, setup.feature_settings, concept_trajectories, cache, echo, setup.timings)
    elif need_concepts:
        setup.concepts = concepts_from_folder(config, setup.lm, setup.feature_settings, task_types)
        setup.concepts_dir = Path(config.concepts)
        echo(f"concepts: {len(setup.concepts)} task type{'' if len(setup.concepts) == 1 else 's'} <- "
             f"{config.concepts} (round {config.concept_round if config.concept_round is not None else 'unknown'})")
    return setup


def concepts_from_folder(config: RunConfig, lm: LanguageModel, settings: FeatureSettings,
                         task_types: Collection[str] | None = None) -> dict[str, Concept]:
    """The concepts of ``config.concepts`` (``<task type>.safetensors``), each checked against the
    run's feature ``settings`` and ``lm`` (:func:`agent_shell.concepts.check_concept_matches`).

    Raises:
        ValueError: a concept file that cannot be read or was fitted with other settings, or a
            type of ``task_types`` without a concept (one line naming the folder).
        FileNotFoundError: a folder without concept files.
    """
    from agent_shell.concepts import check_concept_matches, load_concepts

    concepts = load_concepts(config.concepts)
    for task_type, concept in concepts.items():
        try:
            check_concept_matches(concept, lm, settings)
        except ValueError as err:
            raise ValueError(f"concepts {config.concepts}: {err}") from None
    missing = sorted(set(task_types or ()) - set(concepts))
    if missing:
        raise ValueError(f"concepts {config.concepts} hold no concept for task type {', '.join(missing)} "
                         f"(they have {', '.join(sorted(concepts))})")
    return concepts


def shortfalls(trajectories: Sequence[Trajectory], task_types: Collection[str] | None, wanted: int,
               split: str) -> list[str]:
    """Warning lines for the played ``task_types`` with fewer than ``wanted`` won expert
    trajectories in ``split`` (the expert lost the tasks tried): a type with none has no ReAct
    demonstrations nor concept, so each of its episodes ends as an error record."""
    if task_types is None:
        return []
    won = Counter(t.task_type for t in trajectories)
    none = sorted(t for t in set(task_types) if won[t] == 0)
    few = sorted(t for t in set(task_types) if 0 < won[t] < wanted)
    lines = []
    if none:
        lines.append(f"warning: no won expert trajectory in {split} for {len(none)} task type"
                     f"{'' if len(none) == 1 else 's'} ({', '.join(none)}): without demonstrations their "
                     "episodes end as error records (counted in the report's errors)")
    if few:
        lines.append(f"warning: fewer than {wanted} won expert trajectories in {split} for "
                     + ", ".join(f"{t} ({won[t]})" for t in few) + ": they use what there is")
    return lines


def first_per_type(trajectories: Sequence[Trajectory], k: int) -> list[Trajectory]:
    """The first ``k`` of each task type, in the given order (``expert_demos`` returns the won
    trajectories of each type in sorted task order, so these are what it returns for ``k``)."""
    seen: Counter[str] = Counter()
    out = []
    for traj in trajectories:
        seen[traj.task_type] += 1
        if seen[traj.task_type] <= k:
            out.append(traj)
    return out


def load_calibrator(path: str | Path, lm: LanguageModel) -> Calibrator:
    """The calibrator file at ``path``, checked against ``lm``.

    Raises:
        ValueError, FileNotFoundError: ``calibrator PATH: why`` for a bad or missing file, or a
            mismatch (another backbone, dtype or review prompt).
    """
    from agent_shell.calibration import Calibrator

    try:
        calibrator = Calibrator.load(path)
        calibrator.check(lm)
    except (ValueError, FileNotFoundError) as err:
        raise type(err)(f"calibrator {path}: {err}") from None
    return calibrator


def fit_from_trajectories(config: RunConfig, lm: LanguageModel, settings: FeatureSettings,
                          trajectories: Sequence[Trajectory], cache: Path, echo: Echo = _quiet,
                          timings: dict[str, float] | None = None
                          ) -> tuple[dict[str, TypeFeatures], dict[str, Concept], Path | None]:
    """Features (cached) and concepts (cached) of ``trajectories`` under the run's feature
    ``settings`` (:attr:`Setup.feature_settings`) and ``config``'s lam and gamma; reports skipped
    expert steps. The settings' calibrator (rendering "calibrator") writes the trajectories'
    experiences; its fingerprint is part of the concepts' cache key.

    Returns (task type -> features, task type -> concept, the concepts' cache folder); phase
    times go into ``timings`` (``features_s``, ``features_lm_s``, ``fit_s``).

    Raises:
        ValueError: a cached concept fitted with other settings than ``config``'s.
    """
    from agent_shell.concepts import cached_concepts, check_concept_matches, collect_features, skipped_summary
    from cb_core.cache import enable_persistent_cache
    from cb_io.storage import write_bytes_atomic

    enable_persistent_cache(cache / "jax", write_bytes_atomic)  # fits compile once per machine, not per run
    timings = timings if timings is not None else {}
    t = time.perf_counter()
    done = []

    def on_trajectory(traj: Trajectory) -> None:
        done.append(traj.task_id)
        echo(f"features {len(done)}/{len(trajectories)}: {traj.task_id}")

    features = collect_features(lm, trajectories, settings, cache_dir=cache, on_trajectory=on_trajectory)
    timings["features_s"] = time.perf_counter() - t
    timings["features_lm_s"] = sum(f.lm_seconds for f in features.values())
    echo(f"features: {sum(f.n_decisions for f in features.values())} decisions "
         f"({timings['features_lm_s']:.1f} s of LM and extractor time; 0 when cached); {skipped_summary(features)}")
    t = time.perf_counter()
    concepts, folder = cached_concepts(features, lm, settings, config.lam, config.gamma, env_name=config.env,
                                       cache_dir=cache)
    for concept in concepts.values():
        check_concept_matches(concept, lm, settings)
    timings["fit_s"] = time.perf_counter() - t
    echo(f"concepts: {len(concepts)} task type{'' if len(concepts) == 1 else 's'} -> {folder}")
    return features, concepts, folder


def set_up(config: ResolvedRun, env: Environment | None, task_types: Collection[str] | None, echo: Echo = _quiet,
           lm: LanguageModel | None = None) -> Setup:
    """The run's set-up (:func:`prepare`; with an ICAL memory, its retrieved demonstrations and,
    concept data "ical", concepts fitted on its won examples); the driver and every parallel
    worker build it alike (the workers from the caches the driver filled).

    Raises:
        ValueError, FileNotFoundError: as :func:`prepare` and :func:`ical_setup`.
    """
    from agent_shell.agents import needs_concepts

    config = require_resolved(config, "set_up")
    need_concepts = any(needs_concepts(a) for a in config.agents)
    setup = prepare(config, need_concepts and config.concept_data == "expert", echo=echo, env=env,
                    task_types=task_types, lm=lm)
    if config.ical_memory is not None:
        setup.demos, ical_trajectories = ical_setup(config, task_types, need_concepts)
        kept = ("; the expert trajectories above stay the concept's data"
                if need_concepts and config.concept_data == "expert" else "")
        echo(f"ReAct demonstrations: {config.demos_per_type} retrieved per game from the ICAL memory "
             f"{config.ical_memory} ({len(setup.demos.memory)} examples) in place of the expert ones{kept}")
        if need_concepts and config.concept_data == "ical":
            setup.features, setup.concepts, setup.concepts_dir = fit_from_trajectories(
                config, setup.lm, setup.feature_settings, ical_trajectories, setup.cache, echo, setup.timings)
    return setup


def ical_setup(config: RunConfig, task_types: Collection[str] | None,
               need_concepts: bool) -> tuple[RetrievedDemos, list[Trajectory]]:
    """(retrieved demonstrations, the memory's won trajectories of ``task_types`` as concept data)
    of ``config``'s ICAL memory; an unreadable line of the memory is reported on stderr.

    Raises:
        ValueError: an empty memory, or (concept data "ical") a played task type without an example.
    """
    from agent_shell.embeddings import SentenceEmbedder
    from agent_shell.ical import Memory
    from agent_shell.ical.acting import RetrievedDemos, examples_by_type

    memory = Memory(config.ical_memory, SentenceEmbedder(), on_malformed=lambda msg: print(msg, file=sys.stderr))
    demos = RetrievedDemos(memory, k=config.demos_per_type, rendering=config.rendering,
                           thoughts=demos_with_thoughts(config.demos))
    groups = examples_by_type(memory)
    missing = sorted(set(task_types or ()) - set(groups))
    if need_concepts and config.concept_data == "ical" and missing:
        raise ValueError(f"the ICAL memory {config.ical_memory} has no example of {', '.join(missing)} to "
                         "fit its concept; use --concept-data expert")
    return demos, [e.trajectory for t in sorted(groups) if task_types is None or t in task_types for e in groups[t]]


def players_of(config: RunConfig, setup: Setup) -> dict[str, Reflexion]:
    """Agent name -> agent (each of ``config.agents``, in its trial loop) over ``setup``'s
    backbone (routing, scoring and reviews on separate KV caches), demonstrations and concepts."""
    from agent_shell.agents import build_agent

    agents = agent_config(config)  # prior-only acts with the run's gamma (a concept carries its own fit's gamma)
    features = setup.feature_settings or feature_settings(config, setup.calibrator)  # the features fitted with
    scoring_lm = setup.lm.fork()  # scoring contexts and routing prompts keep separate KV caches
    reviewer = setup.lm.fork() if config.rendering in REVIEWED else None
    return {name: build_agent(name, setup.lm, setup.demos, concepts=setup.concepts, config=agents,
                              reflexion_trials=config.reflexion_trials, scoring_lm=scoring_lm, reviewer=reviewer,
                              calibrator=setup.calibrator, features=features.feature_set) for name in config.agents}


def build_players(config: ResolvedRun, task_types: list[str] | None,
                  server: object = None) -> tuple[Environment, dict[str, Reflexion]]:
    """A parallel worker's env and agents (:data:`agent_shell.parallel.MakePlayers`): the same
    set-up as the driver's, read from the caches the driver filled; with ``server`` (an
    :class:`agent_shell.lm.server.LMServer` handle) the agents use it and no model is loaded."""
    import torch

    torch.set_num_threads(1)  # one CPU per worker
    lm = None
    if server is not None:
        from agent_shell.lm.server import RemoteLM

        lm = RemoteLM(server)
    setup = set_up(config, None, task_types, _quiet, lm)
    return setup.env, players_of(config, setup)


class StudyAgents:
    """A study's actors on demand (:data:`agent_shell.studies.recorded.AgentFactory`): one
    :func:`prepare` per rendering (demonstrations, and concepts when ``need_concepts``), one
    shared backbone with scoring and review views.

    Raises (on a call): ValueError for an unknown actor's set-up (``cb-agent`` without concepts),
    and what :func:`prepare` raises."""

    def __init__(self, config: ResolvedRun, env: Environment, need_concepts: bool, task_types: Collection[str],
                 echo: Echo = _quiet):
        from agent_shell.features import FeatureSet
        from agent_shell.lm import load_language_model

        self.config, self.env = require_resolved(config, "StudyAgents"), env
        self.feature_set = FeatureSet.from_spec(config.features)  # every rendering's concepts see these
        self.need_concepts, self.task_types, self.echo = need_concepts, task_types, echo
        self.lm: LanguageModel = load_language_model(config.model, dtype=config.dtype, device=config.device)
        self.scoring_lm = self.lm.fork()  # each stream of contexts keeps its own KV cache
        self.reviewer = self.lm.fork()
        self.setups: dict[str, Setup] = {}

    def setup(self, rendering: str) -> Setup:
        """The set-up of ``rendering`` (built on first use; the calibrator only for "calibrator")."""
        if rendering not in self.setups:
            calibrator = self.config.calibrator if rendering == "calibrator" else None
            self.setups[rendering] = prepare(replace(self.config, rendering=rendering, calibrator=calibrator),
                                             self.need_concepts, echo=self.echo, env=self.env, lm=self.lm,
                                             task_types=self.task_types, feature_set=self.feature_set)
        return self.setups[rendering]

    def __call__(self, rendering: str, actor: str) -> ReActAgent:
        from agent_shell.agents import CBAgent, ReActAgent

        setup = self.setup(rendering)
        config = agent_config(replace(self.config, rendering=rendering))  # the run's agent settings, this rendering
        if actor == "react":
            return ReActAgent(setup.lm, setup.demos, config=config, reviewer=self.reviewer,
                              calibrator=setup.calibrator)
        concepts = setup.concepts if actor == "cb-agent" else None
        if actor == "cb-agent" and concepts is None:
            raise ValueError("cb-agent needs concepts (internal: the factory was built without them)")
        return CBAgent(setup.lm, setup.demos, concepts=concepts, config=config, scoring_lm=self.scoring_lm,
                       reviewer=self.reviewer, calibrator=setup.calibrator,
                       features=self.feature_set)  # the features the concepts were fitted on


__all__ = ["Setup", "StudyAgents", "UnknownTasks", "build_players", "check_tasks", "concepts_from_folder",
           "first_per_type",
           "fit_from_trajectories", "ical_setup", "load_calibrator", "players_of", "prepare", "resolve_cache",
           "set_up", "shortfalls"]
