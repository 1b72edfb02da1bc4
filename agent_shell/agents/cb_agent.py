"""CB-Agent and its prior-only control (seed Sec. 3.3, Eq. (3); App. B).

Routing is ReAct's (:class:`agent_shell.agents.react.ReActAgent`): a ``think:`` reply is a think
step. On an environment-action step the agent builds a candidate set, scores it with the frozen
LM on the *scoring context* (task + history with thoughts, no demonstrations) and takes

    argmax_a  log Qbar(a | x) + alpha . phi(x, a; A)

with the concept alpha of the episode's task type (prior-only: alpha = None, i.e. the prior).

Candidate sets:
* fixed action space: the environment's candidates minus ``look`` / ``inventory`` / ``help``,
  ``look`` when nothing is left (:func:`agent_shell.candidates.fixed_action_space`);
* open action space: ``n_samples`` replies sampled at ``sample_temperature`` under the same
  ReAct prompt, parsed into action strings, duplicates kept (seed); thoughts and malformed
  samples are dropped, and ``look`` is the set when none is left.

Malformed routing replies: CB-Agent never executes the routing reply's text, so an empty or
letterless reply, or ``think:`` without a thought, simply makes the step an environment-action
step (counted in ``AgentLog.format_errors``); an action outside the candidate set cannot be
chosen in the fixed action space.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from agent_shell.agents.react import AgentConfig, AgentLog, ReActAgent
from agent_shell.candidates import FALLBACK_ACTION, fixed_action_space, parse_actions
from agent_shell.context import THINK_PREFIX, action_prefix

#: Tokens of a routing reply CB-Agent reads before it knows the step is no think step.
ROUTE_PEEK_TOKENS = 2


class CBAgent(ReActAgent):
    """CB-Agent: ReAct routing, concept-guided choice among candidates.

    Args:
        lm: an :class:`agent_shell.lm.protocol.LanguageModel`.
        demos: task type -> rendered demonstrations for the routing prompt.
        concepts: task type -> :class:`cb_core.Concept`, or None for the prior-only control.
            A task type without a concept raises ValueError at its first decision.
        config: :class:`AgentConfig`.
        scorer: the LM that scores candidate sets (default ``lm``). Passing a second view of the
            same backbone with its own prefix cache keeps routing prompts (with demonstrations)
            and scoring contexts (without) from evicting each other's KV cache every step.
    """

    name = "cb-agent"

    def __init__(self, lm: Any, demos: Mapping[str, Sequence[str]], concepts: Mapping[str, Any] | None,
                 config: AgentConfig = AgentConfig(), scorer: Any = None, reviewer: Any = None):
        super().__init__(lm, demos, config, reviewer)
        self.scorer = lm if scorer is None else scorer
        self.concepts = None if concepts is None else dict(concepts)
        if concepts is None:
            self.name = "prior-only"

    def route(self, prompt: Any) -> str:
        """The routing reply, read only as far as needed: CB-Agent never executes the reply's
        action text, so generation stops after :data:`ROUTE_PEEK_TOKENS` tokens unless they can
        still begin ``think:`` (then the whole line is generated, as ReAct does). The step's kind
        is the same as with the whole reply; only the recorded reply is shorter, and a reply
        whose first letters come after the peeked tokens counts as an action, not as malformed.
        """
        peek = self.lm.generate(prompt, max_new_tokens=ROUTE_PEEK_TOKENS, stop=("\n",), temperature=0.0,
                                n=1, seed=self.config.seed)[0]
        # read the peek as parse_reply reads a reply: leading ">" marks are no part of it
        head = peek.split("\n", 1)[0].strip().lstrip(">").strip().lower()
        if not head or THINK_PREFIX.startswith(head) or head.startswith(THINK_PREFIX.rstrip(":")):
            return super().route(prompt)
        return peek

    def candidate_set(self, episode: Any, log: AgentLog) -> list[str]:
        """The decision's candidate set A (fixed or open action space)."""
        if self.config.action_space == "fixed":
            return fixed_action_space(episode.candidates())
        samples = self.lm.generate(self.prompt(episode, log.memory, log.experiences),
                                   max_new_tokens=self.config.reply_tokens,
                                   stop=("\n",), temperature=self.config.sample_temperature,
                                   n=self.config.n_samples, seed=self.config.seed + len(episode.steps))
        return parse_actions(samples) or [FALLBACK_ACTION]

    def concept_of(self, task_type: str) -> tuple[np.ndarray | None, float, float]:
        """(alpha, gamma, eps) for a task type; the concept's fit settings win over the config."""
        if self.concepts is None:
            return None, self.config.gamma, self.config.eps
        if task_type not in self.concepts:
            raise ValueError(f"no concept for task type {task_type!r}; have {sorted(self.concepts)}")
        concept = self.concepts[task_type]
        meta = concept.metadata
        return (np.asarray(concept.alpha), float(meta.get("gamma", self.config.gamma)),
                float(meta.get("eps", self.config.eps)))

    def choose_action(self, episode: Any, kind: str, text: str, log: AgentLog, decision: dict) -> str:
        import cb_core  # JAX is imported only when an agent actually scores

        candidates = self.candidate_set(episode, log)
        decision.update(n_candidates=len(candidates))
        if len(candidates) == 1:
            decision.update(chosen=0, p_chosen=1.0)
            return candidates[0]
        alpha, gamma, eps = self.concept_of(episode.start.task_type)
        scores = self.scorer.score(self.scoring_context(episode, log.memory, log.experiences), candidates,
                                   action_prefix(self.config.layout))
        logp = np.asarray(cb_core.candidate_log_probs(scores.hidden, scores.log_q, scores.n_tokens,
                                                      alpha, gamma, eps))
        chosen = int(np.argmax(logp))
        decision.update(chosen=chosen, p_chosen=float(np.exp(logp[chosen])))
        return candidates[chosen]
