"""What ``run``, ``fit-concepts`` and ``eval-decisions`` share: options and the set-up of the
environment, the backbone, expert demonstrations and concepts (all cached)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

ENV_NAMES = ["alfworld", "scienceworld", "textworld"]
#: ``--history`` choices (kept here so ``--help`` imports nothing heavy; checked in tests).
RENDERING_NAMES = ("raw", "causal", "check", "experience", "recent3", "obs-only", "shuffle-all", "shuffle-old")


def common_options(fn: Callable) -> Callable:
    """Options of every command that loads a backbone and fits concepts."""
    options = [
        click.option("--env", "env_name", type=click.Choice(ENV_NAMES), default="alfworld", show_default=True),
        click.option("--model", default=None, help="Backbone name or local path (default: the offline "
                     "SmolLM2-135M-Instruct)."),
        click.option("--dtype", type=click.Choice(["auto", "bfloat16", "float32"]), default="auto", show_default=True,
                     help="Backbone dtype; auto = bfloat16 on a GPU or a CPU with native bf16 "
                          "(avx512_bf16/amx), else float32 (emulated bf16 is several times slower)."),
        click.option("--demo-split", default="train", show_default=True,
                     help="Split the expert demonstrations come from."),
        click.option("--demos-per-type", type=click.IntRange(min=1), default=2, show_default=True,
                     help="Won expert trajectories per task type (ReAct demos and concept data)."),
        click.option("--history", "--rendering", "rendering", type=click.Choice(list(RENDERING_NAMES)),
                     default="raw", show_default=True,
                     help="History rendering, the same for demonstrations, fitting and acting: raw, causal "
                          "(outcome labels), check (re-check reminder), experience (LM review calls, NO "
                          "UPDATE), and the interventions recent3, obs-only, shuffle-all, shuffle-old."),
        click.option("--layout", type=click.Choice(["text", "chat"]), default="text", show_default=True,
                     help="One text prompt, or user/assistant chat messages (chat template)."),
        click.option("--lam", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
                     help="L2 strength of the concept fit (Eq. 6)."),
        click.option("--gamma", type=float, default=0.8, show_default=True,
                     help="Prior length-normalisation exponent (App. B)."),
        click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
                     help="Cache for expert trajectories, features and concepts "
                          "(default: $CB_AGENT_CACHE or ~/.cache/cb-agent)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def make_console():
    """A rich console; wide when output is not a terminal (logs, pipes), so tables never wrap."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=160)


@dataclass
class Setup:
    """Everything a command built: env, backbone, demonstrations, features and concepts."""

    env: Any
    lm: Any = None
    demo_trajectories: list = field(default_factory=list)
    demos: dict = field(default_factory=dict)
    features: dict = field(default_factory=dict)
    concepts: dict | None = None
    concepts_dir: Path | None = None
    cache: Path | None = None
    timings: dict = field(default_factory=dict)


def resolve_cache(cache_dir: str | None) -> Path:
    if cache_dir is not None:
        path = Path(cache_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    from envs._paths import cache_dir as default_cache

    return default_cache()


def prepare(env_name: str, model: str | None, dtype: str, demo_split: str, demos_per_type: int,
            rendering: str, lam: float, gamma: float, cache_dir: str | None, need_concepts: bool,
            echo: Callable[[str], None] = click.echo, env: Any = None, lm: Any = None,
            task_types: Any = None, layout: str = "text") -> Setup:
    """Make the env (unless given), collect (or read) demonstrations (of ``task_types`` only, when
    given), load the backbone (unless given), render the demonstrations (rendering "experience":
    after reviewing them, cached), fit (or read) concepts."""
    from agent_shell.demos import expert_demos, rendered_demos
    from envs import make_env

    cache = resolve_cache(cache_dir)
    setup = Setup(env=env if env is not None else make_env(env_name), cache=cache)
    t = time.perf_counter()
    setup.demo_trajectories = expert_demos(
        setup.env, demos_per_type, split=demo_split,
        path=cache / "expert" / env_name / f"{demo_split}.jsonl", task_types=task_types,
        on_task=lambda tid: echo(f"collecting expert trajectory {tid}"))
    setup.timings["demos_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if lm is None:
        from agent_shell.lm import load_language_model

        lm = load_language_model(model, dtype=dtype)
    setup.lm = lm
    setup.timings["load_lm_s"] = time.perf_counter() - t
    experiences_of = None
    if rendering == "experience":
        from agent_shell.experience import review_trajectory

        t = time.perf_counter()
        reviewed = {}
        for i, traj in enumerate(setup.demo_trajectories, 1):
            echo(f"experience reviews {i}/{len(setup.demo_trajectories)}: {traj.task_id}")
            reviewed[traj.task_id] = review_trajectory(lm, traj, cache)
        experiences_of = lambda traj: reviewed.get(traj.task_id)  # noqa: E731
        setup.timings["reviews_s"] = time.perf_counter() - t
    setup.demos = rendered_demos(setup.demo_trajectories, rendering, experiences_of)
    echo(f"expert demonstrations: {len(setup.demo_trajectories)} won trajectories over "
         f"{len(setup.demos)} task types ({demo_split}, {demos_per_type} per type), history {rendering}")
    if need_concepts:
        setup.features, setup.concepts, setup.concepts_dir = fit_from_trajectories(
            setup.lm, setup.demo_trajectories, rendering, lam, gamma, cache, env_name, echo, setup.timings,
            layout)
    return setup


def fit_from_trajectories(lm: Any, trajectories: list, rendering: str, lam: float, gamma: float,
                          cache: Path, env_name: str, echo: Callable[[str], None] = click.echo,
                          timings: dict | None = None, layout: str = "text") -> tuple[dict, dict, Path | None]:
    """Features (cached) and concepts (cached) of ``trajectories``; reports skipped expert steps."""
    import cb_core
    from agent_shell.concepts import cached_concepts, check_concept_matches, collect_features, skipped_summary

    cb_core.enable_persistent_cache(cache / "jax")  # fits compile once per machine, not per run
    timings = timings if timings is not None else {}
    t = time.perf_counter()
    done = []

    def on_trajectory(traj: Any) -> None:
        done.append(traj.task_id)
        echo(f"features {len(done)}/{len(trajectories)}: {traj.task_id}")

    features = collect_features(lm, trajectories, rendering, cache_dir=cache, on_trajectory=on_trajectory,
                                layout=layout)
    timings["features_s"] = time.perf_counter() - t
    timings["features_lm_s"] = sum(f.lm_seconds for f in features.values())
    echo(f"features: {sum(f.n_decisions for f in features.values())} decisions "
         f"({timings['features_lm_s']:.1f} s of LM time; 0 when cached); {skipped_summary(features)}")
    t = time.perf_counter()
    concepts, folder = cached_concepts(features, lm, rendering, lam, gamma, env_name=env_name, cache_dir=cache,
                                       layout=layout)
    for concept in concepts.values():
        check_concept_matches(concept, lm, rendering, layout)
    timings["fit_s"] = time.perf_counter() - t
    echo(f"concepts: {len(concepts)} task types -> {folder}")
    return features, concepts, folder
