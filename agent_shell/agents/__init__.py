"""The agents: ReAct, CB-Agent, prior-only, the joint actors and their Reflexion variants, built
by name from the registry (:mod:`agent_shell.agents.registry`, open to plug-ins).

Every agent answers ``next_action(view) -> Decision`` (:mod:`agent_shell.agents.step`) and is
run through :class:`Reflexion` (one trial for the plain agents), so the scheduler handles all of
them alike.
"""

from __future__ import annotations

from agent_shell.agents.cb_agent import CBAgent
from agent_shell.agents.config import ACTION_SPACES, AgentConfig
from agent_shell.agents.joint import JointCBAgent, JointReActAgent
from agent_shell.agents.react import ReActAgent
from agent_shell.agents.reflexion import Reflexion, ReflexionResult, Trial
from agent_shell.agents.registry import (AgentEntry, AgentParts, agent_entry, agent_names, available_agents,
                                         build_agent, needs_concepts)
from agent_shell.agents.step import AgentLog, AgentStop, Decision, EpisodeDone, LimitReached, View
from agent_shell.candidates import FormatError

__all__ = ["ACTION_SPACES", "AgentConfig", "AgentEntry", "AgentLog", "AgentParts", "AgentStop", "CBAgent", "Decision",
           "EpisodeDone", "FormatError", "JointCBAgent", "JointReActAgent", "LimitReached", "ReActAgent", "Reflexion",
           "ReflexionResult", "Trial", "View", "agent_entry", "agent_names", "available_agents", "build_agent",
           "needs_concepts"]
