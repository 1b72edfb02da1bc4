"""The settings of a pipeline run as one frozen, validated value: :class:`RunConfig`, and the same
settings resolved: :class:`ResolvedRun`.

Every command that takes an environment, a backbone or an output folder builds one ``RunConfig``
from the shared options (:func:`agent_shell.commands._common.config_options`) and resolves it once
(:func:`agent_shell.configure.resolve`) into a :class:`ResolvedRun`; everything downstream (set-up,
agents, the scheduler) reads that and resolves nothing again. A ``RunConfig`` is a plain value:
building one reads nothing from disk and queries no device. The :meth:`ResolvedRun.settings` are
recorded in every results line and compared when a results file is resumed
(:func:`agent_shell.results.check_results_file`), so a file never mixes episodes of different
settings.

This module sits beneath the agents: plain values and their validation only. It imports no agent,
no results reader, no feature extractor, no LM and no environment (a test walks its imports).
What needs those (the environment's default split, the backbone's device and dtype rule, the
registries of agents and feature extractors, the agents' :class:`~agent_shell.agents.AgentConfig`)
is :mod:`agent_shell.configure`, one layer up.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_shell.history import check_rendering
from cb_io.records import EPISODE_TIMEOUT_S

#: float32's smallest normal and largest finite numbers (numpy.finfo): the range of a strength the
#: concepts' float32 fit can hold (cb_core's fit refuses the rest as well).
FLOAT32_TINY, FLOAT32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38

#: Where CB-Agent's concepts are fitted from (``concept_data``).
CONCEPT_DATA = ("expert", "ical")
#: The action spaces of a CB-Agent decision: the environment's candidates, or sampled replies.
ACTION_SPACES = ("fixed", "open")
#: The run's settings its agents' config holds (:func:`agent_shell.configure.agent_config`).
AGENT_SETTINGS = ("rendering", "layout", "action_space", "gamma", "seed")
#: The run's settings recorded in every results line and compared on resume, in order (with
#: ``model``, the loaded backbone's name); :mod:`agent_shell.results` reads records by them.
RECORDED_SETTINGS = ("env", "split", "dtype", "seed", "rendering", "layout", "action_space", "demos_per_type",
                     "demo_split", "lam", "gamma", "features", "reflexion_trials", "budget", "demos", "concept_data",
                     "calibrator", "concept_per_type", "fit_candidates", "concept_round")
#: ``--demos`` value prefix that selects an ICAL memory.
DEMOS_PREFIX = "ical:"
#: ``--demos ical-actions:MEMORY``: the examples without their annotations (actions and observations).
ACTIONS_PREFIX = "ical-actions:"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run depends on besides the code (each field is a ``cb-agent run`` option).

    Made here, a value is checked for everything plain values allow (ranges, known renderings
    and action spaces, consistent combinations), reading nothing from disk;
    :func:`agent_shell.configure.resolve` completes it into a :class:`ResolvedRun` (default split,
    backbone device and dtype, the concept round) and checks the rest against the registries and
    the disk (agent and feature names, the context layouts, the ICAL memory and concept folders).

    Attributes:
        env: environment name (:func:`envs.make_env`; the CLI offers :data:`envs.registry.ENVIRONMENTS`).
        split: evaluation split (None: the environment's, filled in by
            :func:`agent_shell.configure.resolve` from :func:`envs.registry.default_split`).
        demo_split, demos_per_type: where the expert demonstrations (and concept data) come
            from, and how many won ones per task type.
        concept_per_type: won expert trajectories per task type the concept is fitted on (the
            first ones of ``demo_split``, a superset or subset of the demonstrations); 0 on input
            means ``demos_per_type``, stored resolved.
        fit_candidates: cap on each expert decision's candidate set in the concept's fit (the
            expert's action and a seeded sample of the others; 0: the whole set). ScienceWorld's
            sets of about 1,000 valid combinations need one (``scripts/make_results.sh table2``: 64).
        model: backbone name or folder (None: the offline default).
        dtype: the backbone dtype; :func:`agent_shell.configure.resolve` applies the model's
            backend's rule (:func:`agent_shell.lm.factory.device_and_dtype`: ``"auto"`` becomes
            ``"bfloat16"`` or ``"float32"`` on ``device``).
        device: where the backbone loads (resolved by the same function: ``"auto"``/None becomes
            ``"cuda"`` when torch sees a GPU, else ``"cpu"``; or ``"cuda:N"``; with ``jax:``, what
            ``jax.devices()`` offers, ``"tpu"`` too).
        rendering, layout: history rendering and context layout (fitting and acting alike).
        lam: L2 strength of the concept fit (Eq. 6), > 0, or ``"auto"``: per task type by
            cross-validation over the expert trajectories (:func:`cb_core.select_strengths`).
        gamma: the prior's length exponent (the concept's fit and prior-only acting).
        features: what the concept sees, a comma-separated selection of feature extractors
            (:mod:`agent_shell.features`; default the seed's ``lm-hidden``), normalised by
            :func:`agent_shell.configure.resolve`.
        agents: agent names, duplicates dropped (checked against the registry,
            :func:`agent_shell.agents.agent_names`, by :func:`agent_shell.configure.resolve`).
        action_space: "fixed" (environment candidates) or "open" (sampled replies).
        reflexion_trials: trials of the Reflexion agents.
        budget: step budget per trial, think steps included.
        seed: base seed of sampled generations and shuffle renderings.
        per_type, games, game_ids: which evaluation games (:meth:`task_ids`): the first
            ``per_type`` of each task type (0: all), at most ``games`` of them (0: no cap), or
            exactly ``game_ids``.
        cache_dir: cache root (None: :func:`cb_io.paths.cache_dir`).
        out_dir: results folder (None: ``runs/<env>-<split>``).
        resume: continue the results file (skip finished episodes; an episode whose record is an
            error record is played again unless ``keep_errors``).
        keep_errors: with ``resume``, keep the error records as finished episodes (not a recorded
            setting).
        demos: ReAct demonstrations: ``"expert"`` (fixed per task type) or ``"ical:MEMORY"``
            (``demos_per_type`` examples retrieved from an ICAL memory per game).
        concept_data: CB-Agent's concept fitting data: ``"expert"`` or ``"ical"`` (the won
            examples of the ``demos`` memory; needs ``demos="ical:..."``).
        workers: episodes played at once on Ray workers (1: in this process, no Ray).
        ray_address: a Ray cluster to join (None: start a local one when ``workers > 1``).
        shared_lm: workers share one backbone per device behind a batching Ray actor
            (:mod:`agent_shell.lm.server`) instead of loading their own; turned on by
            :func:`agent_shell.configure.resolve` when ``device`` is CUDA and the episodes run on
            Ray (its workers hold no GPU).
        episode_timeout: wall-clock seconds one episode may take (all its trials) before it ends as
            an error record (:func:`envs.episode.time_limit`); not a recorded setting (it changes
            no action, only whether a hung episode ends).
        calibrator: rendering "calibrator": the fitted calibrator file (``cb-agent calibrate fit``);
            required by that rendering (``cb-agent run`` refuses it with any other; the studies
            use it for their "calibrator" rendering only).
        concepts: a folder of concept files (``<task type>.safetensors``: a round of ``cb-agent
            improve``, or ``fit-concepts --out-dir``) that CB-Agent acts with instead of concepts
            fitted on the expert demonstrations (checked against the run's settings when loaded).

    Raises:
        ValueError: an unknown name or an out-of-range number, naming the field.
    """

    env: str = "alfworld"
    split: str | None = None
    demo_split: str = "train"
    demos_per_type: int = 2
    concept_per_type: int = 0
    fit_candidates: int = 0
    model: str | None = None
    dtype: str = "auto"
    device: str | None = None
    rendering: str = "raw"
    layout: str = "text"
    lam: float | str = 1.0
    gamma: float = 0.8
    features: str = "lm-hidden"
    agents: tuple[str, ...] = ("cb-agent",)
    action_space: str = "fixed"
    reflexion_trials: int = 2
    budget: int = 50
    seed: int = 0
    per_type: int = 1
    games: int = 2
    game_ids: tuple[str, ...] = ()
    cache_dir: str | None = None
    out_dir: str | None = None
    resume: bool = False
    keep_errors: bool = False
    demos: str = "expert"
    concept_data: str = "expert"
    workers: int = 1
    ray_address: str | None = None
    shared_lm: bool = False
    episode_timeout: float = EPISODE_TIMEOUT_S
    calibrator: str | None = None
    concepts: str | None = None

    #: Fields recorded in every results line and compared on resume (:data:`RECORDED_SETTINGS`;
    #: :meth:`ResolvedRun.settings`).
    SETTINGS = RECORDED_SETTINGS

    def __post_init__(self) -> None:
        if not self.env or not isinstance(self.env, str):
            raise ValueError(f"env={self.env!r} must name an environment (envs.make_env checks which)")
        check_rendering(self.rendering)
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"action_space={self.action_space!r} is not one of {list(ACTION_SPACES)}")
        for name, low in (("demos_per_type", 1), ("concept_per_type", 0), ("reflexion_trials", 1), ("budget", 1),
                          ("per_type", 0), ("games", 0), ("workers", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)} must be >= {low}")
        if self.fit_candidates == 1 or self.fit_candidates < 0:
            raise ValueError(f"fit_candidates={self.fit_candidates} must be 0 (no cap) or >= 2 (a choice "
                             "needs the expert's action and another)")
        if not self.episode_timeout > 0:
            raise ValueError(f"episode_timeout={self.episode_timeout} must be > 0 seconds")
        if self.lam != "auto" and not (isinstance(self.lam, (int, float)) and self.lam > 0):
            raise ValueError(f"lam={self.lam!r} must be > 0 (the fit is strongly convex only then) or 'auto'")
        if self.lam != "auto" and not FLOAT32_TINY <= self.lam <= FLOAT32_MAX:  # the concepts are fitted in float32
            raise ValueError(f"lam={self.lam!r} {'overflows' if self.lam > FLOAT32_MAX else 'underflows'} float32, "
                             f"the concepts' dtype (it holds {FLOAT32_TINY:.4g} to {FLOAT32_MAX:.4g})")
        if parse_demos(self.demos) is None and self.concept_data == "ical":
            raise ValueError("concept_data='ical' needs demos='ical:MEMORY'")
        if self.rendering == "calibrator" and self.calibrator is None:
            raise ValueError("calibrator: --history calibrator needs --calibrator FILE (cb-agent calibrate fit)")
        if self.concepts is not None and self.concept_data != "expert":
            raise ValueError(f"concepts: --concepts {self.concepts} and --concept-data {self.concept_data} name two "
                             "sources of the concepts; give one")
        if self.concept_data not in CONCEPT_DATA:
            raise ValueError(f"concept_data={self.concept_data!r} is not one of {list(CONCEPT_DATA)}")
        object.__setattr__(self, "concept_per_type", self.concept_per_type or self.demos_per_type)
        if self.lam == "auto" and self.concepts is None and self.concept_data == "expert" and self.concept_per_type < 2:
            raise ValueError(f"lam: --lam auto holds trajectories out of the concept's {self.concept_per_type} per "
                             "task type, and cross-validation needs 2 (raise --demos-per-type or --concept-per-type, "
                             "or pass a number to --lam)")
        object.__setattr__(self, "agents", tuple(dict.fromkeys(self.agents)))
        object.__setattr__(self, "game_ids", tuple(self.game_ids))

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """The settings' arguments (the ``cb-agent run`` options), in declaration order."""
        return tuple(inspect.signature(RunConfig).parameters)

    def to_dict(self) -> dict[str, Any]:
        """Every settings argument (:meth:`field_names`), flat and JSON-ready."""
        out = {name: getattr(self, name) for name in self.field_names()}
        out["agents"], out["game_ids"] = list(self.agents), list(self.game_ids)
        return out

    @property
    def ical_memory(self) -> str | None:
        """The ICAL memory folder of ``demos`` (None: fixed expert demonstrations)."""
        return parse_demos(self.demos)

    @property
    def results_path(self) -> Path:
        """``<out_dir>/results.jsonl`` (default folder ``runs/<env>-<split>``)."""
        return Path(self.out_dir or f"runs/{self.env}-{self.split}") / "results.jsonl"


@dataclass(frozen=True)
class ResolvedRun(RunConfig):
    """A :class:`RunConfig` resolved for this machine, once per command, by
    :func:`agent_shell.configure.resolve` (the only maker of one): ``split`` set (the environment's
    default), ``device`` and ``dtype`` by the backbone's rule (when the command has a backbone),
    ``features`` normalised, ``agents`` checked against the registry, ``shared_lm`` set, the ICAL
    memory and concept folders found, the concept round read from the concepts' provenance.

    Attributes:
        concept_round: the round of ``cb-agent improve`` whose concepts act: 0 without
            ``concepts`` (fitted on the expert demonstrations), the round its ``provenance.json``
            names with them, None when the folder has none (unknown).

    Resolving one again changes nothing and queries nothing; a changed copy
    (``dataclasses.replace``) keeps what was resolved.
    """

    concept_round: int | None = 0

    def settings(self) -> dict[str, Any]:
        """The recorded settings (:data:`SETTINGS`), in that order."""
        return {name: getattr(self, name) for name in self.SETTINGS}


def require_resolved(config: RunConfig, what: str) -> ResolvedRun:
    """``config`` when it is a :class:`ResolvedRun`; TypeError (one line) naming ``what`` otherwise
    (settings are resolved once, by the command: :func:`agent_shell.configure.resolve`)."""
    if not isinstance(config, ResolvedRun):
        raise TypeError(f"{what} takes resolved settings (agent_shell.configure.resolve(config)), got a "
                        f"{type(config).__name__}")
    return config


def parse_demos(value: str) -> str | None:
    """The memory folder of a ``--demos`` value (``ical:FOLDER`` or ``ical-actions:FOLDER``), or
    None for ``expert``.

    Raises ValueError for anything else."""
    if value == "expert":
        return None
    for prefix in (DEMOS_PREFIX, ACTIONS_PREFIX):
        if value.startswith(prefix) and value[len(prefix):]:
            return value[len(prefix):]
    raise ValueError(f"--demos must be 'expert', 'ical:MEMORY_FOLDER' or 'ical-actions:MEMORY_FOLDER', got {value!r}")


def demos_with_thoughts(value: str) -> bool:
    """Whether a ``--demos`` value shows the ICAL examples' annotations (``ical:``, not ``ical-actions:``)."""
    return not value.startswith(ACTIONS_PREFIX)


def concepts_round(folder: str | Path) -> int | None:
    """The round of ``cb-agent improve`` whose concepts ``folder`` holds (its ``provenance.json``'s
    ``round``), None when it has no such file (a folder of ``fit-concepts --out-dir``).

    Raises:
        ValueError: one line: the folder does not exist, holds no concept file, or its
            provenance cannot be read.
    """
    folder = Path(folder)
    if not folder.is_dir() or not any(folder.glob("*.safetensors")):
        raise ValueError(f"concepts: {folder} is no folder of concept files (*.safetensors)")
    provenance = folder / "provenance.json"
    if not provenance.exists():
        return None
    try:
        value = json.loads(provenance.read_text())["round"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"concepts: {provenance} cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"concepts: {provenance} names round {value!r}, not a round number")
    return value


def check_not_demos(task_ids: list[str], demo_ids: list[str]) -> None:
    """Raise ValueError (one line) when a played game is one of the demonstrations' games."""
    shared = sorted(set(task_ids) & set(demo_ids))
    if shared:
        raise ValueError(f"game {shared[0]!r} is one of the expert demonstrations ({len(shared)} such game(s)): "
                         "the agents would play the games of their own demonstrations; choose other --game ids")


__all__ = ["ACTIONS_PREFIX", "ACTION_SPACES", "AGENT_SETTINGS", "CONCEPT_DATA", "DEMOS_PREFIX", "RECORDED_SETTINGS",
           "ResolvedRun", "RunConfig", "check_not_demos", "concepts_round", "demos_with_thoughts", "parse_demos",
           "require_resolved"]
