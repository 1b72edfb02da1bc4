"""Example third-party agent (the documented agent plug-in seam): ``first-candidate`` takes the
first action of the fixed action space at every step and never asks the LM.

A package registers an :class:`agent_shell.agents.AgentEntry`, named as its entry point, in its
``pyproject.toml``::

    [project.entry-points."cb_agent.agents"]
    first-candidate = "first_candidate_agent:ENTRY"

and ``cb-agent run --agent first-candidate`` plays it. ``CONCEPT_ENTRY`` is the same agent
declaring that it needs a concept set (the pipeline then fits concepts, and building it without
them is refused).
"""

from __future__ import annotations

from agent_shell.agents import AgentEntry, AgentParts, Decision, ReActAgent, View
from agent_shell.candidates import fixed_action_space


class FirstCandidate(ReActAgent):
    name = "first-candidate"

    def next_action(self, view: View) -> Decision:
        candidates = tuple(fixed_action_space(view.candidates))
        return Decision("env", candidates[0], candidates=candidates, chosen=0)


class FirstCandidateWithConcepts(FirstCandidate):
    name = "first-candidate-concepts"


def build(parts: AgentParts) -> FirstCandidate:
    return FirstCandidate(parts.lm, parts.demos, config=parts.config)


ENTRY = AgentEntry("first-candidate", build, summary="the first candidate, always")
CONCEPT_ENTRY = AgentEntry("first-candidate-concepts", lambda p: FirstCandidateWithConcepts(p.lm, p.demos,
                                                                                            config=p.config),
                           needs={"concepts"})
#: A mis-registered entry: named other than its entry point.
MISNAMED = AgentEntry("something-else", build)
