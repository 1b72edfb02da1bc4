"""The agents by name: the built-in entries and third-party ones from an entry-point group.

An :class:`AgentEntry` declares an agent's name, what it needs (:data:`REQUIREMENTS`: a concept
set, a scoring or review view of the backbone), whether it plays Reflexion trials, and how it is
built from a run's parts (:class:`AgentParts`). :func:`build_agent` builds any entry by name,
``cb-agent run --agent`` offers :func:`agent_names`, and :func:`needs_concepts` tells the
pipeline and the reports which agents act by a concept.

Third-party agents register an :class:`AgentEntry` (named as its entry point) under the
entry-point group :data:`ENTRY_POINT_GROUP` (:mod:`agent_shell.plugins`). In a package's
``pyproject.toml``::

    [project.entry-points."cb_agent.agents"]
    my-agent = "my_package.agents:ENTRY"

(``tests/agents/test_agent_registry.py`` has a complete example.) Built-in names cannot be
overridden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from agent_shell.agents.cb_agent import CBAgent
from agent_shell.agents.config import AgentConfig
from agent_shell.agents.joint import JointCBAgent, JointReActAgent
from agent_shell.agents.react import ReActAgent
from agent_shell.agents.reflexion import Reflexion
from agent_shell.features import FeatureSet
from agent_shell.lm.protocol import LanguageModel

if TYPE_CHECKING:
    from agent_shell.calibration import Calibrator
    from cb_core import Concept

#: The entry-point group third-party agents register under.
ENTRY_POINT_GROUP = "cb_agent.agents"

#: What an entry may need -> what it is. An agent needing ``concepts`` is refused without them;
#: the views default to the backbone itself when none is given.
REQUIREMENTS = {
    "concepts": "fitted concepts per task type (cb_core.Concept), and the FeatureSet they were fitted with",
    "scoring_lm": "an LM view that scores candidate sets (its own prefix cache)",
    "reviewer": "an LM view that writes the experience reviews of renderings experience / calibrator",
}


@dataclass(frozen=True)
class AgentParts:
    """What an agent is built from.

    Attributes:
        lm: the backbone (routing, generation).
        demos: task type -> rendered demonstrations, or an object with ``for_task(start)``
            (:class:`agent_shell.ical.acting.RetrievedDemos`).
        config: the agent's :class:`AgentConfig`.
        concepts: task type -> :class:`cb_core.Concept` (None: no concept set).
        scoring_lm, reviewer: LM views for scoring and reviews (None: ``lm``).
        calibrator: rendering "calibrator": the fitted :class:`agent_shell.calibration.Calibrator`.
        features: the :class:`agent_shell.features.FeatureSet` the concepts were fitted with
            (None: ``lm-hidden``).
    """

    lm: LanguageModel
    demos: Mapping[str, Sequence[str]]
    config: AgentConfig = AgentConfig()
    concepts: Mapping[str, Concept] | None = None
    scoring_lm: LanguageModel | None = None
    reviewer: LanguageModel | None = None
    calibrator: Calibrator | None = None
    features: FeatureSet | None = None


@dataclass(frozen=True)
class AgentEntry:
    """One agent of the registry.

    Attributes:
        name: the ``--agent`` name, also the agent's name in the results records.
        build: ``build(parts) -> agent`` (a :class:`ReActAgent` or anything with its ``name``,
            ``config``, ``lm``, ``run`` and ``scoring_context``), named ``name`` (without the
            ``reflexion-`` of a ``trials`` entry).
        needs: keys of :data:`REQUIREMENTS`.
        trials: the agent plays ``reflexion_trials`` trials with a reflection after each failed
            one (:class:`Reflexion`); otherwise one trial.
        summary: one line for listings.

    Raises:
        ValueError: an unknown requirement.
    """

    name: str
    build: Callable[[AgentParts], ReActAgent]
    needs: frozenset[str] = frozenset()
    trials: bool = False
    summary: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "needs", frozenset(self.needs))
        unknown = sorted(self.needs - set(REQUIREMENTS))
        if unknown:
            raise ValueError(f"agent {self.name!r} needs {unknown[0]!r}, which is none of {sorted(REQUIREMENTS)}")

    def make(self, parts: AgentParts, reflexion_trials: int = 2) -> Reflexion:
        """The agent built from ``parts``, wrapped in its trial loop (``reflexion_trials`` trials
        for a ``trials`` entry, else one).

        Raises:
            ValueError: the entry needs concepts and ``parts`` has none, or the built agent's
                name (as recorded) is not ``name``.
        """
        if "concepts" in self.needs and parts.concepts is None:
            raise ValueError(f"agent {self.name!r} needs fitted concepts, got None")
        trials = reflexion_trials if self.trials else 1
        agent = Reflexion(self.build(parts), trials=trials)
        if agent.name != self.name and not (self.trials and trials == 1):  # one trial: the plain agent's name
            raise ValueError(f"agent {self.name!r}: its build made an agent named {agent.name!r}; the records "
                             "name an agent as the registry does")
        return agent


def _react(p: AgentParts) -> ReActAgent:
    return ReActAgent(p.lm, p.demos, config=p.config, reviewer=p.reviewer, calibrator=p.calibrator)


def _prior_only(p: AgentParts) -> CBAgent:
    return CBAgent(p.lm, p.demos, concepts=None, config=p.config, scoring_lm=p.scoring_lm, reviewer=p.reviewer,
                   calibrator=p.calibrator)


def _cb_agent(p: AgentParts) -> CBAgent:
    return CBAgent(p.lm, p.demos, concepts=p.concepts, config=p.config, scoring_lm=p.scoring_lm, reviewer=p.reviewer,
                   calibrator=p.calibrator, features=p.features)


def _joint_react(p: AgentParts) -> JointReActAgent:
    return JointReActAgent(p.lm, p.demos, config=p.config, reviewer=p.reviewer, calibrator=p.calibrator)


def _joint_cb_agent(p: AgentParts) -> JointCBAgent:
    return JointCBAgent(p.lm, p.demos, concepts=p.concepts, config=p.config, scoring_lm=p.scoring_lm,
                        reviewer=p.reviewer, calibrator=p.calibrator, features=p.features)


_CB = frozenset({"concepts", "scoring_lm", "reviewer"})
_PRIOR = frozenset({"scoring_lm", "reviewer"})
#: The built-in agents by name, in the order ``--agent`` lists them.
BUILTIN: dict[str, AgentEntry] = {e.name: e for e in (
    AgentEntry("cb-agent", _cb_agent, _CB, summary="ReAct routing, concept-guided choice among candidates"),
    AgentEntry("prior-only", _prior_only, _PRIOR, summary="CB-Agent with alpha = 0 (the LM prior)"),
    AgentEntry("react", _react, {"reviewer"}, summary="ReAct: the LM writes its own actions"),
    AgentEntry("reflexion-cb-agent", _cb_agent, _CB, trials=True, summary="cb-agent with Reflexion trials"),
    AgentEntry("reflexion-prior-only", _prior_only, _PRIOR, trials=True, summary="prior-only with Reflexion trials"),
    AgentEntry("reflexion-react", _react, {"reviewer"}, trials=True, summary="react with Reflexion trials"),
    AgentEntry("joint-react", _joint_react, summary="calibrate and act in one reply, ReAct's action"),
    AgentEntry("joint-cb-agent", _joint_cb_agent, _CB - {"reviewer"},
               summary="calibrate and route in one reply, CB-Agent's choice"),
)}


def available_agents() -> dict[str, str]:
    """Agent name -> where it comes from (``"built-in"`` or the entry point's target); the
    built-ins first, then the plug-ins by name. Loads no plug-in."""
    from agent_shell.plugins import registered

    return {**{n: "built-in" for n in BUILTIN},
            **{n: ep.value for n, ep in sorted(registered(ENTRY_POINT_GROUP, BUILTIN).items())}}


def agent_names() -> tuple[str, ...]:
    """The selectable agent names (:func:`available_agents`' keys)."""
    return tuple(available_agents())


def agent_entry(name: str) -> AgentEntry:
    """The entry registered as ``name`` (a plug-in is loaded).

    Raises:
        ValueError: one line: an unknown name (listing the known ones and the entry-point group),
            a plug-in that fails to import, or one that is no :class:`AgentEntry` named ``name``.
    """
    if name in BUILTIN:
        return BUILTIN[name]
    from agent_shell.plugins import load_registered

    entry = load_registered(ENTRY_POINT_GROUP, name, BUILTIN, what="agent")
    if not isinstance(entry, AgentEntry):
        raise ValueError(f"agent {name!r}: its entry point gives a {type(entry).__name__}, not an "
                         "agent_shell.agents.AgentEntry")
    if entry.name != name:
        raise ValueError(f"agent {name!r}: its entry point gives the entry of {entry.name!r}; a plug-in agent's "
                         "entry must be named as its entry point")
    return entry


def needs_concepts(name: str) -> bool:
    """True for agents that act by fitted concepts (their entry needs ``concepts``); False for a
    name no entry has (e.g. ``joint-prior-only``, the name a joint CB-Agent without concepts
    records, or a plug-in agent's name in results read without the plug-in installed)."""
    if name in BUILTIN:
        return "concepts" in BUILTIN[name].needs
    from agent_shell.plugins import registered

    return name in registered(ENTRY_POINT_GROUP, BUILTIN) and "concepts" in agent_entry(name).needs


def build_agent(name: str, lm: LanguageModel, demos: Mapping[str, Sequence[str]], *,
                concepts: Mapping[str, Concept] | None = None, config: AgentConfig = AgentConfig(),
                reflexion_trials: int = 2, scoring_lm: LanguageModel | None = None,
                reviewer: LanguageModel | None = None, calibrator: Calibrator | None = None,
                features: FeatureSet | None = None) -> Reflexion:
    """The agent registered as ``name`` (:func:`agent_entry`) built from the given parts
    (:class:`AgentParts`), wrapped in its trial loop (:meth:`AgentEntry.make`).

    Raises:
        ValueError: an unknown name, or an agent that needs concepts built without them.
    """
    parts = AgentParts(lm=lm, demos=demos, config=config, concepts=concepts, scoring_lm=scoring_lm,
                       reviewer=reviewer, calibrator=calibrator, features=features)
    return agent_entry(name).make(parts, reflexion_trials)


__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "REQUIREMENTS", "AgentEntry", "AgentParts", "agent_entry", "agent_names",
           "available_agents", "build_agent", "needs_concepts"]
