"""From a run's settings (:class:`agent_shell.run_config.RunConfig`) to what they select: the one
layer that reads the settings together with the registries and the backbone's rules.

* :func:`resolve`: the settings completed and checked against what is installed, once per
  command, into a :class:`~agent_shell.run_config.ResolvedRun`: the environment's default split,
  the backbone's device and dtype (the model's backend's rule), the agent names (the agent
  registry), the feature selection normalised (the extractor registry), the shared backbone of a
  Ray run on CUDA, the ICAL memory and concept folders checked and the concept round read. What
  runs a command (set-up, rounds, workers) takes the resolved value and resolves nothing again.
* :func:`agent_config`: the agents' :class:`agent_shell.agents.AgentConfig` of the settings.
* :func:`feature_settings`: the run's :class:`agent_shell.feature_settings.FeatureSettings`,
  derived once per set-up (:func:`agent_shell.pipeline.prepare`) and passed down.
* :func:`task_ids`: the evaluation games the settings name, checked without starting an engine.

The settings module imports none of these; this module imports them only inside its functions,
so importing it loads no LM, engine nor JAX.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agent_shell.run_config import ResolvedRun, RunConfig, concepts_round

if TYPE_CHECKING:
    from agent_shell.agents import AgentConfig
    from agent_shell.calibration import Calibrator
    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.features import FeatureSet
    from envs.protocol import Environment


def resolve(config: RunConfig, backbone: bool = True) -> ResolvedRun:
    """``config`` resolved (a :class:`ResolvedRun` is returned as it is: nothing is queried again):
    ``split`` (None: the environment's evaluation split, :func:`envs.registry.default_split`),
    ``features`` normalised (:meth:`FeatureSet.from_spec`), ``agents`` checked against the registry
    (:func:`agent_shell.agents.agent_names`), the ICAL memory folder of ``demos`` found,
    ``concept_round`` read from the ``concepts`` folder (:func:`agent_shell.run_config.concepts_round`)
    and, with ``backbone``, ``device`` and ``dtype`` by the model's backend's rule
    (:func:`agent_shell.lm.factory.device_and_dtype`; imports torch to resolve ``"auto"``) and
    ``shared_lm`` on when the device is CUDA and the episodes run on Ray (its workers hold no GPU).

    Raises:
        ValueError: an unknown agent, feature extractor, layout, device or dtype, a missing ICAL
            memory folder, a concepts folder without concept files or with an unreadable
            provenance (one line naming it).
        agent_shell.lm.jax_platforms.JaxPlatformError: a ``jax:`` model on a machine whose JAX
            platform setting is unusable.
    """
    if isinstance(config, ResolvedRun):
        return config
    from agent_shell.agents import agent_names
    from agent_shell.context import check_layout
    from agent_shell.features import FeatureSet
    from envs.registry import default_split

    check_layout(config.layout)
    memory = config.ical_memory
    if memory is not None and not Path(memory).is_dir():
        raise ValueError(f"demos: the ICAL memory folder {memory} does not exist (cb-agent ical build-memory "
                         "makes one)")
    known = agent_names()
    for name in config.agents:
        if name not in known:
            raise ValueError(f"unknown agent {name!r}; known: {list(known)}")
    changes: dict[str, object] = {"split": config.split or default_split(config.env),
                                  "features": FeatureSet.from_spec(config.features).spec,
                                  "concept_round": 0 if config.concepts is None else concepts_round(config.concepts)}
    if backbone:
        from agent_shell.lm.factory import device_and_dtype

        changes["device"], changes["dtype"] = device_and_dtype(config.model, config.device, config.dtype)
        if changes["device"].startswith("cuda") and (config.workers > 1 or config.ray_address):
            changes["shared_lm"] = True
    return ResolvedRun(**{**{name: getattr(config, name) for name in RunConfig.field_names()}, **changes})


def agent_config(config: RunConfig) -> AgentConfig:
    """The agents' :class:`agent_shell.agents.AgentConfig`: the environment's ReAct header and the
    run's ``rendering``, ``layout``, ``action_space``, ``gamma`` and ``seed``
    (:data:`agent_shell.run_config.AGENT_SETTINGS`); everything else AgentConfig's defaults."""
    from agent_shell.agents import AgentConfig
    from agent_shell.run_config import AGENT_SETTINGS

    return AgentConfig.for_env(config.env, **{name: getattr(config, name) for name in AGENT_SETTINGS})


def feature_settings(config: RunConfig, calibrator: Calibrator | None = None,
                     feature_set: FeatureSet | None = None) -> FeatureSettings:
    """The run's :class:`agent_shell.feature_settings.FeatureSettings`: its rendering, layout,
    seed, feature selection (``feature_set``, None: a new :class:`FeatureSet` of
    ``config.features``), ``fit_candidates`` cap and the loaded ``calibrator`` of
    ``config.calibrator`` (:func:`agent_shell.pipeline.load_calibrator`).

    Raises:
        ValueError: rendering ``"calibrator"`` without ``calibrator``.
    """
    from agent_shell.feature_settings import FeatureSettings
    from agent_shell.features import FeatureSet

    if feature_set is None:
        feature_set = FeatureSet.from_spec(config.features)
    return FeatureSettings(rendering=config.rendering, layout=config.layout, seed=config.seed, feature_set=feature_set,
                           max_candidates=config.fit_candidates, calibrator=calibrator)


def task_ids(config: RunConfig, env: Environment) -> list[str]:
    """The evaluation games: ``game_ids`` if given, else the first ``per_type`` tasks of each
    task type of ``split`` (0: all), at most ``games`` (0: no cap). Checked without starting
    the engine (:func:`envs.check_tasks`).

    Raises:
        ValueError: one line: an unknown split or game id, a game of another split than
            ``split``, or ``demo_split == split`` without explicit ``game_ids`` (a slice would
            evaluate the agents on the games of their own demonstrations). With explicit
            ``game_ids`` the split may be the demonstrations' (e.g. recording training runs for
            the calibrator, :mod:`agent_shell.calibration`); the caller then refuses any game
            that is a demonstration (:func:`agent_shell.run_config.check_not_demos`) once they
            are known.
    """
    from envs import check_tasks
    from envs.collect import select_tasks

    config = resolve(config, backbone=False)  # as it is when resolved (a library caller may pass settings)
    if config.demo_split == config.split and not config.game_ids:
        raise ValueError(f"--demo-split {config.demo_split} is the evaluation split: the agents would be evaluated "
                         "on the games of their own demonstrations; choose another split (or name games "
                         "with --game that are no demonstrations)")
    check_tasks(env, config.demo_split, [])
    if config.game_ids:
        return check_tasks(env, config.split, config.game_ids)
    check_tasks(env, config.split, [])
    ids = select_tasks(env, config.split, config.per_type or None)
    return ids[:config.games] if config.games else ids


__all__ = ["agent_config", "feature_settings", "resolve", "task_ids"]
