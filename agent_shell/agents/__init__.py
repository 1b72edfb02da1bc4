"""The agents: ReAct, CB-Agent, prior-only, and their Reflexion variants, built by name.

Every agent answers ``next_action(view) -> Decision`` (:mod:`agent_shell.agents.step`) and is
run through :class:`Reflexion` (one trial for the plain agents), so the runner handles all of
them alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agent_shell.agents.cb_agent import CBAgent
from agent_shell.agents.config import AgentConfig
from agent_shell.agents.joint import JointCBAgent, JointReActAgent
from agent_shell.agents.react import ReActAgent
from agent_shell.agents.reflexion import Reflexion, ReflexionResult, Trial
from agent_shell.agents.step import AgentLog, AgentStop, Decision, EpisodeDone, LimitReached, View
from agent_shell.candidates import FormatError
from agent_shell.features import FeatureSet
from agent_shell.lm.protocol import LanguageModel

if TYPE_CHECKING:
    from cb_core import Concept

#: Agent names accepted by :func:`build_agent` and ``cb-agent run --agent``.
AGENT_NAMES = ("cb-agent", "prior-only", "react", "reflexion-cb-agent", "reflexion-prior-only",
               "reflexion-react", "joint-react", "joint-cb-agent")


def needs_concepts(name: str) -> bool:
    """True for agents that use fitted concepts (CB-Agent and its Reflexion variant)."""
    return name.removeprefix("reflexion-").removeprefix("joint-") == "cb-agent"


def build_agent(name: str, lm: LanguageModel, demos: Mapping[str, Sequence[str]],
                concepts: Mapping[str, Concept] | None = None, config: AgentConfig = AgentConfig(),
                reflexion_trials: int = 2, scorer: LanguageModel | None = None,
                reviewer: LanguageModel | None = None, calibrator: Any = None,
                features: FeatureSet | None = None) -> Reflexion:
    """The agent called ``name`` (see :data:`AGENT_NAMES`), wrapped in its trial loop.

    ``scorer`` (CB-Agent and prior-only): the LM view that scores candidates (default ``lm``);
    ``reviewer``: the LM view that writes experience reviews (default ``lm``); ``calibrator``:
    rendering "calibrator" (:class:`agent_shell.calibration.Calibrator`); ``features``
    (CB-Agent): the :class:`agent_shell.features.FeatureSet` the concepts were fitted with
    (default ``lm-hidden``). ``joint-react`` / ``joint-cb-agent``: the joint actor
    (:mod:`agent_shell.agents.joint`).

    Raises ValueError for an unknown name, or for ``cb-agent`` without concepts.
    """
    if name not in AGENT_NAMES:
        raise ValueError(f"unknown agent {name!r}; known: {list(AGENT_NAMES)}")
    base = name.removeprefix("reflexion-")
    if base == "react":
        agent: ReActAgent = ReActAgent(lm, demos, config, reviewer, calibrator)
    elif base == "joint-react":
        agent = JointReActAgent(lm, demos, config, reviewer, calibrator)
    elif base == "prior-only":
        agent = CBAgent(lm, demos, None, config, scorer, reviewer, calibrator)
    else:
        if concepts is None:
            raise ValueError(f"agent {name!r} needs fitted concepts, got None")
        cls = JointCBAgent if base == "joint-cb-agent" else CBAgent
        agent = cls(lm, demos, concepts, config, scorer, reviewer, calibrator, features)
    return Reflexion(agent, trials=reflexion_trials if name.startswith("reflexion-") else 1)


__all__ = ["AGENT_NAMES", "AgentConfig", "AgentLog", "AgentStop", "CBAgent", "Decision", "EpisodeDone",
           "FormatError", "JointCBAgent", "JointReActAgent", "LimitReached", "ReActAgent", "Reflexion",
           "ReflexionResult", "Trial", "View", "build_agent", "needs_concepts"]
