"""ReAct routing and the ReAct baseline agent (seed Sec. 3.3, App. B; Yao et al. 2023).

Each step the LM replies, greedily and up to the first newline, under a ReAct prompt: a header,
demonstrations rendered from expert trajectories of the episode's task type, and the task with
its history so far. A reply beginning with ``think:`` is a *think step*: recorded with feedback
``OK.``, it never reaches the environment, yet it counts toward the step budget. Any other reply
makes the step an *environment-action step*. The baseline executes the LM's own action string
exactly as the published ReAct does: unchanged and unchecked, so an action outside the candidate
set reaches the engine, which answers it (ALFWorld: ``Nothing happens.``).

Malformed replies (see :func:`agent_shell.candidates.parse_reply`) in the ReAct baseline: an
empty reply, a reply without letters ("no action") and ``think:`` without a thought all make
the step an environment step that executes the fallback action ``look``; each is counted in
``AgentLog.format_errors`` with its reason. (The published ReAct would send the empty string to
the engine; ``look`` spends the step just as uselessly but is valid in every benchmark.)

An agent's step is :meth:`ReActAgent.next_action` ``(view) -> Decision``, a pure question to the
LM; :meth:`ReActAgent.run` is the loop that executes decisions on an episode. Control flow uses a
small exception hierarchy (:mod:`agent_shell.agents.step`): :class:`EpisodeDone` and
:class:`LimitReached` end the loop. The ``on_step`` callback runs in a ``finally`` after every
step, so a crash never loses a step.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agent_shell import context as ctx
from agent_shell.agents.config import AgentConfig
from agent_shell.agents.step import (AgentLog, AgentStop, Decision, EpisodeDone, EpisodeLike, LimitReached, View,
                                    WindowFull)
from agent_shell.candidates import FALLBACK_ACTION, read_reply
from agent_shell.decision_scorer import decision_context
from agent_shell.experience import Review, review_transition
from agent_shell.history import REVIEWED
from agent_shell.lm.protocol import Context, ContextWindowFull, LanguageModel

if TYPE_CHECKING:
    from agent_shell.calibration.calibrator import Calibrator


class ReActAgent:
    """The ReAct baseline: the LM routes and writes its own actions.

    Args:
        lm: the backbone.
        demos: task type -> rendered demonstrations (:func:`agent_shell.context.render_demo`), or
            an object whose ``for_task(start)`` gives an episode's demonstrations (ICAL's retrieved
            examples, :class:`agent_shell.ical.acting.RetrievedDemos`).
        config: :class:`AgentConfig`.
        reviewer: the LM view that writes experience reviews (default ``lm``); a separate view
            keeps its own prefix KV cache (:meth:`LanguageModel.fork`).
        calibrator: rendering "calibrator": the :class:`agent_shell.calibration.Calibrator` that
            chooses the experience among the reviewer's sampled candidates (or NO UPDATE).
    """

    name = "react"
    #: Renderings "experience" / "calibrator": review each transition in a separate call after the
    #: step (the joint actor reviews inside its own reply instead).
    separate_review = True

    def __init__(self, lm: LanguageModel, demos: Mapping[str, Sequence[str]], *, config: AgentConfig = AgentConfig(),
                 reviewer: LanguageModel | None = None, calibrator: Calibrator | None = None):
        self.lm = lm
        self.calibrator = calibrator
        self.demo_source = demos if hasattr(demos, "for_task") else None
        self.demos = {} if self.demo_source is not None else {k: list(v) for k, v in demos.items()}
        self.config = config
        self.reviewer = lm if reviewer is None else reviewer

    # -- the episode loop ------------------------------------------------------------------
    def run(self, episode: EpisodeLike, *, memory: Sequence[str] = (), reference: ctx.Reference | None = None,
            log: AgentLog | None = None, on_step: Callable[[EpisodeLike, AgentLog], None] | None = None) -> AgentLog:
        """Play ``episode`` until done or out of budget and return the trial's log.

        Args:
            memory: Reflexion reflections shown in every context.
            reference: a recorded stretch shown in every context as not executed (recovery).
            log: a log to continue (e.g. holding reviews of replayed steps); default a new one.
            on_step: ``on_step(episode, log)`` runs after every step, also when a step raises.
        """
        log = log if log is not None else AgentLog(memory=list(memory))
        t0 = time.perf_counter()
        self.pin_head(episode.start.task_type)
        log.seconds["route"] += time.perf_counter() - t0
        while True:
            try:
                self.step(episode, log, reference)
            except AgentStop:
                return log
            finally:
                if on_step is not None:
                    on_step(episode, log)

    def step(self, episode: EpisodeLike, log: AgentLog, reference: ctx.Reference | None = None) -> None:
        """One step: decide (:meth:`next_action`), execute, record, then review the transition
        (renderings "experience" and "calibrator"). Raises EpisodeDone / LimitReached at the end,
        and WindowFull (recorded in ``log.window_full``) when the backbone's context window cannot
        hold the next prompt: the transcript has outgrown it, and the episode ends unfinished."""
        if episode.done:
            raise EpisodeDone()
        if episode.budget_left <= 0:
            raise LimitReached()
        try:
            decision = self.next_action(View.of(episode, log.memory, log.experiences, reference))
        except ContextWindowFull as err:
            log.window_full = str(err)
            raise WindowFull() from err
        log.add(decision, len(episode.steps))
        t0 = time.perf_counter()
        if decision.kind == "think":  # a thought, as what it is: never parsed back from text
            episode.think(decision.action)
            return
        episode.act(decision.action)
        t1 = time.perf_counter()
        log.seconds["env"] += t1 - t0
        if self.separate_review and self.config.rendering in REVIEWED and not episode.done:
            log.add_review(self.review(View.of(episode)))
            log.seconds["review"] += time.perf_counter() - t1

    # -- one decision ----------------------------------------------------------------------
    def next_action(self, view: View) -> Decision:
        """ReAct's step on ``view``: the routing reply; a thought is a think step, an action is
        executed verbatim, a malformed reply spends the step on ``look``. Nothing is executed."""
        t0 = time.perf_counter()
        reply = self.route(self.prompt(view))
        t1 = time.perf_counter()
        kind, text, error = read_reply(reply)
        if kind == "think":
            return Decision("think", f"{ctx.THINK_PREFIX} {text}", reply, seconds={"route": t1 - t0})
        return Decision("env", text if kind == "action" else FALLBACK_ACTION, reply, error,
                        seconds={"route": t1 - t0, "choose": time.perf_counter() - t1})

    def pin_head(self, task_type: str) -> None:
        """Let the LM keep the KV cache of this task type's routing-prompt head (header and
        demonstrations, :func:`agent_shell.context.react_head`), so every episode of the type
        encodes only its own tokens (a no-op for backends without a prefix cache)."""
        from agent_shell.lm.protocol import pin_prefix

        if task_type in self.demos:  # an unknown type fails in prompt() with its own message
            cfg = self.config
            pin_prefix(self.lm, ctx.react_head(cfg.header, self.demos[task_type], cfg.task_header, cfg.layout))

    def route(self, prompt: Context) -> str:
        """The routing reply: greedy, one transcript line."""
        return self.lm.generate(prompt, max_new_tokens=self.config.reply_tokens, stop=("\n",),
                                temperature=0.0, n=1, seed=self.config.seed)[0]

    def review(self, view: View) -> Review:
        """Experience review of the latest transition of ``view.steps`` (rendering "experience";
        "calibrator": the calibrator's choice among sampled candidates); ``view.candidates`` are
        the options after it. See :mod:`agent_shell.experience`.

        Raises ValueError for rendering "calibrator" without a calibrator."""
        if self.config.rendering == "calibrator":
            if self.calibrator is None:
                raise ValueError("rendering 'calibrator' needs a fitted calibrator (--calibrator FILE)")
            return self.calibrator.review(self.reviewer, view.start.instruction, view.start.observation, view.steps,
                                          len(view.steps) - 1, view.candidates, self.config.seed)
        return review_transition(self.reviewer, view.start.instruction, view.start.observation, view.steps,
                                 len(view.steps) - 1, view.candidates, self.config.review_tokens)

    # -- contexts ------------------------------------------------------------------------------
    def scoring_context(self, view: View) -> Context:
        """Task + rendered history (thoughts included) without demonstrations (seed App. B)."""
        cfg = self.config
        return decision_context(view.start.instruction, view.start.observation, view.steps, rendering=cfg.rendering,
                                layout=cfg.layout, seed=cfg.seed, memory=view.memory, experiences=view.experiences,
                                reference=view.reference)

    def prompt(self, view: View, context: Context | None = None) -> Context:
        """The ReAct routing prompt with the demonstrations of the task type, around ``context``
        (default: :meth:`scoring_context` of ``view``)."""
        context = self.scoring_context(view) if context is None else context
        return ctx.react_prompt(self.config.header, self.task_demos(view), context, self.config.task_header)

    def task_demos(self, view: View) -> Sequence[str]:
        """The rendered demonstrations for ``view``'s task (ValueError when its type has none)."""
        task_type = view.start.task_type
        if self.demo_source is not None:
            return self.demo_source.for_task(view.start)
        if task_type not in self.demos:
            raise ValueError(f"no demonstrations for task type {task_type!r}; have {sorted(self.demos)}")
        return self.demos[task_type]


__all__ = ["ReActAgent"]
