"""CB-Agent and its prior-only control (seed Sec. 3.3, Eq. (3); App. B).

Routing is ReAct's (:class:`agent_shell.agents.react.ReActAgent`): a ``think:`` reply is a think
step. On an environment-action step the agent builds a candidate set, scores it with the frozen
LM on the *scoring context* (task + history with thoughts, no demonstrations) and takes

    argmax_a  log Qbar(a | x) + alpha . phi(x, a; A)

with the concept alpha of the episode's task type (prior-only: alpha = None, i.e. the prior).
``phi`` is built from the agent's :class:`agent_shell.features.FeatureSet` (default the seed's
``lm-hidden``: the LM's hidden states from the same scoring call), which must be the set the
concepts were fitted with.

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

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from agent_shell import context as ctx
from agent_shell.agents.config import AgentConfig
from agent_shell.agents.react import ReActAgent
from agent_shell.agents.step import Decision, View
from agent_shell.candidates import FALLBACK_ACTION, fixed_action_space, parse_actions, read_reply
from agent_shell.decision_scorer import DecisionRequest, DecisionScorer
from agent_shell.features import DecisionInput, FeatureSet
from agent_shell.lm.protocol import Context, Decided, LanguageModel

if TYPE_CHECKING:
    from agent_shell.calibration.calibrator import Calibrator
    from cb_core import Concept

#: Most tokens of a routing reply CB-Agent reads before it knows the step is no think step (it
#: stops at the first token that shows letters: one token for most replies).
ROUTE_PEEK_TOKENS = 2


class CBAgent(ReActAgent):
    """CB-Agent: ReAct routing, concept-guided choice among candidates.

    Args:
        lm: the backbone (routing and open-action-space sampling).
        demos: task type -> rendered demonstrations for the routing prompt.
        concepts: task type -> :class:`cb_core.Concept`, or None for the prior-only control.
            A task type without a concept raises ValueError at its first decision.
        config: :class:`AgentConfig`.
        scoring_lm: the LM view that scores candidate sets, the prior and the features (default
            ``lm``). Passing ``lm.fork()``, a
            second view of the same backbone with its own prefix cache, keeps routing prompts
            (with demonstrations) and scoring contexts (without) from evicting each other's KV
            cache every step.
        reviewer, calibrator: see :class:`ReActAgent`.
        features: what the concepts see (:class:`agent_shell.features.FeatureSet`; default
            ``lm-hidden``); extracted only when a concept is used (never for prior-only).
    """

    name = "cb-agent"
    #: The name of the agent built without concepts (the prior-only control).
    prior_only_name = "prior-only"

    def __init__(self, lm: LanguageModel, demos: Mapping[str, Sequence[str]], *,
                 concepts: Mapping[str, Concept] | None, config: AgentConfig = AgentConfig(),
                 scoring_lm: LanguageModel | None = None, reviewer: LanguageModel | None = None,
                 calibrator: Calibrator | None = None, features: FeatureSet | None = None):
        super().__init__(lm, demos, config=config, reviewer=reviewer, calibrator=calibrator)
        self.scoring_lm = lm if scoring_lm is None else scoring_lm
        self.features = features if features is not None else FeatureSet.from_spec()
        self.concepts = None if concepts is None else dict(concepts)
        self.name = type(self).name if concepts is not None else self.prior_only_name
        # the prior-only control reads no features (alpha = 0): its scorer extracts none
        self.decision_scorer = DecisionScorer(self.scoring_lm, self.features if concepts is not None else None)

    def next_action(self, view: View) -> Decision:
        """Route (unless ``view.route`` is False); a thought is a think step, anything else an
        environment step whose action is the argmax of log P over the candidate set (Eq. 3).
        The scoring context is built once and serves the routing prompt, the open action
        space's samples and the scores."""
        t0 = time.perf_counter()
        context = self.scoring_context(view)
        prompt, reply, error = None, None, None
        if view.route:
            prompt = self.prompt(view, context)
            reply = self.route(prompt)
            kind, text, error = read_reply(reply)
            if kind == "think":
                return Decision("think", f"{ctx.THINK_PREFIX} {text}", reply, seconds={"route": time.perf_counter() - t0})
        t1 = time.perf_counter()
        decision = self.choose(view.start.task_type, context, self.candidate_set(view, context, prompt), view)
        return replace(decision, reply=reply, format_error=error,
                       seconds={"route": t1 - t0, "choose": time.perf_counter() - t1})

    def route(self, prompt: Context) -> str:
        """The routing reply, read only as far as needed: CB-Agent never executes the reply's
        action text, so generation stops after the first token that shows letters (at most
        :data:`ROUTE_PEEK_TOKENS` tokens) unless they can still begin ``think:`` (then the whole
        line is generated, as ReAct does). The step's kind is the same as with the whole reply;
        only the recorded reply is shorter, and a reply whose first letters come after the
        peeked tokens counts as an action, not as malformed. A second peek (a first token without
        letters, e.g. a ``>`` mark) reuses the prompt's cache: two one-token passes.
        """
        for budget in range(1, ROUTE_PEEK_TOKENS + 1):
            peek = self.lm.generate(prompt, max_new_tokens=budget, stop=("\n",), temperature=0.0,
                                    n=1, seed=self.config.seed)[0]
            # read the peek as parse_reply reads a reply: leading ">" marks are no part of it
            head = peek.split("\n", 1)[0].strip().lstrip(ctx.ACTION_MARK).strip().lower()
            if head or not peek:  # letters, or the reply ended
                break
        if not head or ctx.THINK_PREFIX.startswith(head) or head.startswith(ctx.THINK_PREFIX.rstrip(":")):
            return super().route(prompt)
        return peek

    def candidate_set(self, view: View, context: Context, prompt: Context | None = None) -> list[str]:
        """The decision's candidate set A: the fixed action space of ``view.candidates``, or
        ``n_samples`` replies sampled under the routing prompt (built from ``context`` unless
        given), parsed into actions."""
        if self.config.action_space == "fixed":
            return fixed_action_space(view.candidates)
        prompt = self.prompt(view, context) if prompt is None else prompt
        samples = self.lm.generate(prompt, max_new_tokens=self.config.reply_tokens, stop=("\n",),
                                   temperature=self.config.sample_temperature, n=self.config.n_samples,
                                   seed=self.config.seed + len(view.steps))
        return parse_actions(samples) or [FALLBACK_ACTION]

    def choose(self, task_type: str, context: Context, candidates: Sequence[str], view: View) -> Decision:
        """The environment step that takes argmax_a log P(a | x) among ``candidates`` scored on
        ``context`` (a single candidate is taken without scoring); ``view``: the task and history
        the feature extractors read."""
        candidates = tuple(candidates)
        if len(candidates) == 1:
            return Decision("env", candidates[0], candidates=candidates, chosen=0, p_chosen=1.0)
        request = self.decision_scorer.request(DecisionInput(context, view.start.instruction, view.start.observation,
                                                             view.steps, candidates, ctx.action_prefix(self.config.layout)))
        decided = self.decide(task_type, request)
        chosen, logp = decided.chosen, decided.log_p
        term = None if self.concepts is None else tuple(float(x) for x in decided.concept_term)  # prior-only: none
        return Decision("env", candidates[chosen], candidates=candidates, chosen=chosen,
                        log_probs=tuple(float(x) for x in logp), p_chosen=float(np.exp(logp[chosen])),
                        prior=tuple(float(x) for x in decided.prior), concept_term=term,
                        sampled=self.config.action_space != "fixed")

    def decide(self, task_type: str, request: DecisionRequest) -> Decided:
        """The request's decision under the concept of ``task_type`` (the argmax of log P over its
        candidates, the lowest index on ties, with log P and its terms), through
        :meth:`agent_shell.decision_scorer.DecisionScorer.decide` (on the backend's device when it
        has one: one fetch, after the argmax).

        Raises:
            ValueError: no concept for ``task_type``; what scoring, the extractors or the kernel raise.
        """
        return self.decision_scorer.decide(request, self.concept_of(task_type, self.scoring_lm.hidden_size))

    def concept_of(self, task_type: str, hidden_size: int) -> Concept:
        """The :class:`cb_core.Concept` acting for a task type (it carries its own gamma and eps);
        the prior-only control acts with alpha = 0 and the config's gamma and eps."""
        import cb_core  # JAX is imported only when an agent actually scores

        if self.concepts is None:
            return cb_core.Concept.prior_only(hidden_size, self.config.gamma, self.config.eps)
        if task_type not in self.concepts:
            raise ValueError(f"no concept for task type {task_type!r}; have {sorted(self.concepts)}")
        return self.concepts[task_type]


__all__ = ["CBAgent", "ROUTE_PEEK_TOKENS"]
