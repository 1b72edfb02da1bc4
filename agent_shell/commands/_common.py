"""What the commands that load a backbone share: their options, gathered into one validated
:class:`agent_shell.run_config.RunConfig`, and the set-up of the environment, the backbone, expert
demonstrations and concepts (all cached)."""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import click

from agent_shell.agents import AGENT_NAMES
from agent_shell.history import RENDERINGS, REVIEWED
from agent_shell.lm.protocol import LanguageModel
from agent_shell.run_config import ACTION_SPACES, RunConfig
from envs.protocol import Environment
from envs.trajectory import Trajectory
from envs.registry import ENVIRONMENTS

ENV_NAMES = sorted(ENVIRONMENTS)
#: ``--history`` choices.
RENDERING_NAMES = tuple(RENDERINGS)

#: The options of every command that loads a backbone (``config`` field -> click option).
COMMON_OPTIONS = {
    "env": click.option("--env", "env", type=click.Choice(ENV_NAMES), default="alfworld", show_default=True,
                        help="Benchmark (task ids: `cb-agent tasks --env ENV`)."),
    "model": click.option("--model", default=None, help="Backbone name or local path (default: the offline "
                          "SmolLM2-135M-Instruct), or BACKEND:ARG for another LM backend (vllm:PATH, or a "
                          "plug-in; `cb-agent backends` lists them)."),
    "dtype": click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto",
                          show_default=True, help="Backbone dtype; auto = bfloat16 on a GPU or a CPU with native "
                          "bf16 (avx512_bf16/amx), else float32 (emulated bf16 is several times slower)."),
    "demo_split": click.option("--demo-split", default="train", show_default=True,
                               help="Split the expert demonstrations come from."),
    "demos_per_type": click.option("--demos-per-type", type=click.IntRange(min=1), default=2, show_default=True,
                                   help="Won expert trajectories per task type (ReAct demos and concept data)."),
    "rendering": click.option("--history", "--rendering", "rendering", type=click.Choice(list(RENDERING_NAMES)),
                              default="raw", show_default=True,
                              help="History rendering, the same for demonstrations, fitting and acting: raw, "
                                   "causal (outcome labels), check (re-check reminder), experience (LM review "
                                   "calls, NO UPDATE), calibrator (experiences chosen by the learned calibrator, "
                                   "--calibrator), and the interventions recent3, obs-only, shuffle-all, "
                                   "shuffle-old."),
    "layout": click.option("--layout", type=click.Choice(["text", "chat"]), default="text", show_default=True,
                           help="One text prompt, or user/assistant chat messages (chat template)."),
    "lam": click.option("--lam", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
                        help="L2 strength of the concept fit (Eq. 6)."),
    "gamma": click.option("--gamma", type=float, default=0.8, show_default=True,
                          help="Prior length-normalisation exponent (App. B)."),
    "features": click.option("--features", default="lm-hidden", show_default=True,
                             help="What the concept sees, comma-separated: lm-hidden (the seed's last-layer state), "
                                  "lm-layer:K[:mean] (decoder layer K at the final action token or averaged), "
                                  "goal-similarity (MiniLM cosines with the task and the latest observation, "
                                  "names in the task), novelty (repeats and their outcomes), or a third-party "
                                  "extractor (entry-point group cb_agent.feature_extractors)."),
    "calibrator": click.option("--calibrator", type=click.Path(exists=True, dir_okay=False), default=None,
                               help="Fitted calibrator file (`cb-agent calibrate fit`); needed by --history "
                                    "calibrator, which shows the experiences it writes."),
    "cache_dir": click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                              help="Cache for expert trajectories, features and concepts "
                                   "(default: $CB_AGENT_CACHE or ~/.cache/cb-agent)."),
}
#: The options of ``cb-agent run`` besides :data:`COMMON_OPTIONS`.
RUN_OPTIONS = {
    "agents": click.option("--agent", "agents", type=click.Choice(AGENT_NAMES), multiple=True, default=("cb-agent",),
                           show_default=True, help="Agent(s) to run (repeatable; all share one backbone load)."),
    "split": click.option("--split", default="valid_unseen", show_default=True, help="Evaluation split (every "
                          "--game must belong to it; list ids with `cb-agent tasks --env ENV --split SPLIT`)."),
    "per_type": click.option("--per-type", type=click.IntRange(min=0), default=1, show_default=True,
                             help="Evaluation games per task type (first in sorted order); 0 = all."),
    "all_games": click.option("--all-games", is_flag=True, help="Evaluate the whole split (--per-type 0 --games 0)."),
    "games": click.option("--games", type=click.IntRange(min=0), default=2, show_default=True,
                          help="Cap on the number of games after --per-type (the default slice: the first game "
                               "of the first two task types); 0 = no cap."),
    "game_ids": click.option("--game", "game_ids", multiple=True, help="Explicit game/task id(s) of --split "
                             "(repeatable; overrides --per-type/--games; checked before anything loads)."),
    "budget": click.option("--max-steps", "budget", type=click.IntRange(min=1), default=50, show_default=True,
                           help="Step budget per episode (trial), think steps included."),
    "action_space": click.option("--action-space", type=click.Choice(ACTION_SPACES), default="fixed",
                                 show_default=True, help="CB-Agent candidates: environment set, or 20 sampled replies."),
    "reflexion_trials": click.option("--reflexion-trials", type=click.IntRange(min=2), default=2, show_default=True,
                                     help="Trials per episode of the reflexion-* agents (a reflection after each "
                                          "failed trial; success = a won trial)."),
    "seed": click.option("--seed", type=int, default=0, show_default=True, help="Seed of sampled generations."),
    "out_dir": click.option("--out-dir", type=click.Path(file_okay=False), default=None,
                            help="Results folder (default: runs/<env>-<split>)."),
    "resume": click.option("--resume/--no-resume", default=False, show_default=True,
                           help="Skip episodes already in the results file (after moving a torn last line "
                                "aside); without it a file that already holds these episodes is refused."),
    "demos": click.option("--demos", default="expert", show_default=True,
                          help="ReAct demonstrations: 'expert' (fixed, per task type), 'ical:MEMORY' (the "
                               "--demos-per-type examples retrieved from an ICAL memory for each game's instruction, "
                               "their annotations as thoughts) or 'ical-actions:MEMORY' (the same without annotations)."),
    "concept_per_type": click.option("--concept-per-type", type=click.IntRange(min=0), default=0, show_default=True,
                                     help="Won expert trajectories per task type that the concept is fitted on "
                                          "(the first of --demo-split, as the demonstrations); 0 = --demos-per-type. "
                                          "The ReAct demonstrations stay --demos-per-type (the scorer sees none)."),
    "fit_candidates": click.option("--fit-candidates", type=click.IntRange(min=0), default=0, show_default=True,
                                   help="Cap each expert decision's candidate set in the concept's fit at this many "
                                        "(the expert's action and a seeded sample of the others); 0 = no cap. "
                                        "ScienceWorld's ~1,000 valid combinations a state need one (e.g. 64)."),
    "concept_data": click.option("--concept-data", type=click.Choice(["expert", "ical"]), default="expert",
                                 show_default=True, help="CB-Agent's concept fitting data: the expert demonstrations, "
                                 "or the won ICAL examples of the --demos memory (with their thoughts)."),
    "workers": click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
                            help="Episodes played at once, each worker with its own env and backbone, on a local "
                                 "Ray cluster (needs the ray extra when > 1)."),
    "shared_lm": click.option("--shared-lm", is_flag=True,
                              help="With --workers: one backbone per device behind a Ray actor that batches the "
                                   "workers' scoring calls; workers never load the model."),
    "ray_address": click.option("--ray-address", default=None,
                                help="Join this Ray cluster (e.g. ray://head:10001 or auto) instead of starting a "
                                     "local one."),
}


def config_options(*names: str, **overrides: Callable) -> Callable[[Callable], Callable]:
    """Add the options ``names`` (keys of :data:`COMMON_OPTIONS` / :data:`RUN_OPTIONS`, or
    ``overrides`` given as name -> click option) to a command; it receives them as one validated
    ``config:`` :class:`RunConfig` (other fields keep their defaults). ``--all-games`` sets
    ``per_type`` and ``games`` to 0. An invalid value is a usage error naming the field."""
    options = {**COMMON_OPTIONS, **RUN_OPTIONS, **overrides}
    fields = set(RunConfig.field_names())

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names if name in fields}
            if kwargs.pop("all_games", False):
                values.update(per_type=0, games=0)
            try:
                config = RunConfig(**values)
            except ValueError as err:
                raise click.UsageError(str(err)) from None
            return fn(config=config, **kwargs)

        for name in reversed(names):
            command = options[name](command)
        return command

    return decorate


#: The options of ``fit-concepts`` and ``eval-decisions``.
common_options = config_options(*COMMON_OPTIONS)


def make_console():
    """A rich console; wide when output is not a terminal (logs, pipes), so tables never wrap."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


@dataclass
class Setup:
    """Everything a command built: env, backbone, demonstrations, features and concepts."""

    env: Environment
    lm: LanguageModel | None = None
    demo_trajectories: list = field(default_factory=list)
    demos: dict = field(default_factory=dict)
    features: dict = field(default_factory=dict)
    concepts: dict | None = None
    concepts_dir: Path | None = None
    calibrator: Any = None
    cache: Path | None = None
    timings: dict = field(default_factory=dict)


def resolve_cache(cache_dir: str | None) -> Path:
    """``cache_dir`` (created), else the project's cache root (:func:`envs.paths.cache_dir`)."""
    if cache_dir is not None:
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from envs.paths import cache_dir as default_cache

    return default_cache()


def prepare(config: RunConfig, need_concepts: bool, echo: Callable[[str], None] = click.echo,
            env: Environment | None = None, lm: LanguageModel | None = None,
            task_types: Collection[str] | None = None) -> Setup:
    """Make the env (unless given), collect (or read) demonstrations (of ``task_types`` only, when
    given), load the backbone (unless given), render the demonstrations (rendering "experience":
    after reviewing them, cached), fit (or read) concepts when ``need_concepts``."""
    from agent_shell.commands.tasks import validated_tasks
    from agent_shell.demos import expert_demos, rendered_demos
    from envs import make_env

    cache = resolve_cache(config.cache_dir)
    setup = Setup(env=env if env is not None else make_env(config.env), cache=cache)
    validated_tasks(setup.env, config.demo_split, [])  # before any engine or model loads
    t = time.perf_counter()
    n_concept = config.concept_per_type if need_concepts else 0
    collected = expert_demos(
        setup.env, max(config.demos_per_type, n_concept), split=config.demo_split,
        path=cache / "expert" / config.env / f"{config.demo_split}.jsonl", task_types=task_types,
        on_task=lambda tid: echo(f"collecting expert trajectory {tid}"))
    setup.demo_trajectories = first_per_type(collected, config.demos_per_type)
    concept_trajectories = first_per_type(collected, n_concept)
    for line in shortfalls(collected, task_types, max(config.demos_per_type, n_concept), config.demo_split):
        echo(line)
    setup.timings["demos_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if lm is None:
        from agent_shell.lm import load_language_model

        lm = load_language_model(config.model, dtype=config.dtype)
    setup.lm = lm
    setup.timings["load_lm_s"] = time.perf_counter() - t
    if config.calibrator is not None:
        setup.calibrator = load_calibrator(config.calibrator, lm)
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
    if need_concepts:
        if n_concept != config.demos_per_type:
            echo(f"concept data: {len(concept_trajectories)} won trajectories ({n_concept} per type)")
        setup.features, setup.concepts, setup.concepts_dir = fit_from_trajectories(
            config, setup.lm, concept_trajectories, cache, echo, setup.timings, setup.calibrator)
    return setup


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
    seen: Counter = Counter()
    out = []
    for traj in trajectories:
        seen[traj.task_type] += 1
        if seen[traj.task_type] <= k:
            out.append(traj)
    return out


def load_calibrator(path: str, lm: LanguageModel) -> Any:
    """The calibrator file at ``path``, checked against ``lm`` (click.ClickException on a bad file
    or a mismatch: another backbone, dtype or review prompt)."""
    from agent_shell.calibration import Calibrator

    try:
        calibrator = Calibrator.load(path)
        calibrator.check(lm)
    except (ValueError, FileNotFoundError) as err:
        raise click.ClickException(f"calibrator {path}: {err}") from None
    return calibrator


def fit_from_trajectories(config: RunConfig, lm: LanguageModel, trajectories: list, cache: Path,
                          echo: Callable[[str], None] = click.echo,
                          timings: dict | None = None, calibrator: Any = None) -> tuple[dict, dict, Path | None]:
    """Features (cached) and concepts (cached) of ``trajectories`` under ``config``'s rendering,
    layout, feature set, lam and gamma; reports skipped expert steps. ``calibrator`` (rendering
    "calibrator") writes the trajectories' experiences; its concepts are cached apart per calibrator."""
    from agent_shell.concepts import cached_concepts, check_concept_matches, collect_features, skipped_summary
    from cb_core.cache import enable_persistent_cache

    enable_persistent_cache(cache / "jax")  # fits compile once per machine, not per run
    timings = timings if timings is not None else {}
    t = time.perf_counter()
    done = []

    def on_trajectory(traj: Trajectory) -> None:
        done.append(traj.task_id)
        echo(f"features {len(done)}/{len(trajectories)}: {traj.task_id}")

    features = collect_features(lm, trajectories, config.rendering, cache_dir=cache, on_trajectory=on_trajectory,
                                layout=config.layout, feature_set=config.feature_set, calibrator=calibrator,
                                max_candidates=config.fit_candidates, seed=config.seed)
    timings["features_s"] = time.perf_counter() - t
    timings["features_lm_s"] = sum(f.lm_seconds for f in features.values())
    echo(f"features: {sum(f.n_decisions for f in features.values())} decisions "
         f"({timings['features_lm_s']:.1f} s of LM and extractor time; 0 when cached); {skipped_summary(features)}")
    t = time.perf_counter()
    concept_cache = cache if calibrator is None else cache / "calibrated" / calibrator.fingerprint
    concepts, folder = cached_concepts(features, lm, config.rendering, config.lam, config.gamma, env_name=config.env,
                                       cache_dir=concept_cache, layout=config.layout, feature_set=config.feature_set)
    for concept in concepts.values():
        check_concept_matches(concept, lm, config.rendering, config.layout, config.feature_set)
    timings["fit_s"] = time.perf_counter() - t
    echo(f"concepts: {len(concepts)} task type{'' if len(concepts) == 1 else 's'} -> {folder}")
    return features, concepts, folder
