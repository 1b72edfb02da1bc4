"""ReAct routing and the ReAct baseline agent (seed Sec. 3.3, App. B; Yao et al. 2023).

Each step the LM replies, greedily and up to the first newline, under a ReAct prompt: a header,
demonstrations rendered from expert trajectories of the episode's task type, and the task with
its history so far. A reply beginning with ``think:`` is a *think step*: recorded with feedback
``OK.``, it never reaches the environment, yet it counts toward the step budget. Any other reply
makes the step an *environment-action step*, whose action :meth:`ReActAgent.choose_action`
decides. The baseline executes the LM's own action string exactly as the published ReAct does:
unchanged and unchecked, so an action outside the candidate set reaches the engine, which
answers it (ALFWorld: ``Nothing happens.``).

Malformed replies (see :func:`agent_shell.candidates.parse_reply`) in the ReAct baseline: an
empty reply, a reply without letters ("no action") and ``think:`` without a thought all make
the step an environment step that executes the fallback action ``look``; each is counted in
``AgentLog.format_errors`` with its reason. (The published ReAct would send the empty string to
the engine; ``look`` spends the step just as uselessly but is valid in every benchmark.)

Control flow uses a small exception hierarchy: :class:`EpisodeDone` and :class:`LimitReached`
end the loop; :class:`agent_shell.candidates.FormatError` marks a malformed reply. The
``on_step`` callback runs in a ``finally`` after every step, so a crash never loses a step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from agent_shell import context as ctx
from agent_shell.candidates import FALLBACK_ACTION, FormatError, parse_reply


class AgentStop(Exception):
    """Ends an episode's step loop (never an error)."""


class EpisodeDone(AgentStop):
    """The environment reported ``done``."""


class LimitReached(AgentStop):
    """The step budget (think steps included) is spent."""


#: ReAct headers per environment name; ``{n_demos}`` is filled in.
HEADERS: dict[str, str] = {
    "alfworld": "Interact with a household to solve a task. Here are {n_demos} examples.",
    "textworld": "Interact with a text game to solve a task. Here are {n_demos} examples.",
    "scienceworld": "Interact with a science simulator to solve a task. Here are {n_demos} examples.",
}


@dataclass(frozen=True)
class AgentConfig:
    """Everything an agent's behaviour depends on besides the LM, demos and concepts.

    Attributes:
        header: ReAct prompt header; ``{n_demos}`` is replaced by the number of demonstrations.
        task_header: line between the demonstrations and the current task.
        reply_tokens: max new tokens of a routing reply (a transcript line).
        rendering: history rendering name (:data:`agent_shell.history.RENDERINGS`); the same
            rendering serves the routing prompt, the scoring context and the reflection prompt.
        layout: "text" (one prompt) or "chat" (user / assistant messages), see
            :mod:`agent_shell.context`.
        review_tokens: max new tokens of an experience review (rendering "experience").
        action_space: CB-Agent only: "fixed" (environment candidates) or "open" (sampled).
        n_samples: open action space: replies sampled per decision (seed: 20, duplicates kept).
        sample_temperature: open action space: sampling temperature (seed: 0.7).
        gamma, eps: prior length-normalisation exponent and feature standardisation epsilon,
            used for prior-only scoring; a concept's own fit settings take precedence.
        reflection_instruction, reflection_tokens: Reflexion's reflection prompt and length.
        seed: base seed of sampled generations (step index is added).
    """

    header: str = HEADERS["alfworld"]
    task_header: str = "Here is the task."
    reply_tokens: int = 48
    rendering: str = "raw"
    layout: str = "text"
    review_tokens: int = 48
    action_space: str = "fixed"
    n_samples: int = 20
    sample_temperature: float = 0.7
    gamma: float = 0.8
    eps: float = 1e-6
    reflection_instruction: str = (
        "You did not complete the task above. In two or three sentences, say what went wrong "
        "and give a new, concise, high-level plan that avoids it."
    )
    reflection_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        ctx.check_rendering(self.rendering)
        ctx.check_layout(self.layout)
        if self.action_space not in ("fixed", "open"):
            raise ValueError(f"action_space must be 'fixed' or 'open', got {self.action_space!r}")
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")

    @classmethod
    def for_env(cls, env_name: str, **overrides: Any) -> "AgentConfig":
        """The default config with the ReAct header of ``env_name`` (generic if unknown)."""
        header = HEADERS.get(env_name, "Interact with an environment to solve a task. "
                                       "Here are {n_demos} examples.")
        return cls(header=header, **overrides)


@dataclass
class AgentLog:
    """What an agent records about one trial beyond the trajectory itself.

    Attributes:
        replies: the raw routing reply of every step, in order.
        decisions: one dict per environment-action step: ``step`` (index in the trajectory),
            ``n_candidates``, ``chosen`` (index or None), ``action`` and, for CB-Agent, ``p_chosen``.
        format_errors: one dict per malformed reply: ``step``, ``reason``, ``reply``.
        experiences: rendering "experience": step index -> kept experience of that transition.
        reviews: rendering "experience": every review call (:meth:`Review.to_dict`), in order.
        memory: Reflexion reflections that were in this trial's context.
        seconds: wall time by phase, summed over the trial: ``route`` (routing generation),
            ``choose`` (candidate set and scoring; CB-Agent), ``env`` (environment steps).
    """

    replies: list[str] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    format_errors: list[dict] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)
    experiences: dict = field(default_factory=dict)
    reviews: list[dict] = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: {"route": 0.0, "choose": 0.0, "env": 0.0, "review": 0.0})

    def to_dict(self) -> dict:
        return {"replies": self.replies, "decisions": self.decisions, "format_errors": self.format_errors,
                "memory": self.memory, "experiences": {str(k): v for k, v in self.experiences.items()},
                "reviews": self.reviews, "seconds": {k: round(v, 4) for k, v in self.seconds.items()}}


class ReActAgent:
    """The ReAct baseline: the LM routes and writes its own actions.

    Args:
        lm: an :class:`agent_shell.lm.protocol.LanguageModel`.
        demos: task type -> rendered demonstrations (:func:`agent_shell.context.render_demo`).
        config: :class:`AgentConfig`.
        reviewer: the LM view that writes experience reviews (default ``lm``); a separate view
            keeps its own prefix KV cache (:meth:`LanguageModel.fork`).

    Attributes:
        reference: a :class:`agent_shell.context.Reference` shown in every context (reference-
            history recovery), or None.
    """

    name = "react"

    def __init__(self, lm: Any, demos: Mapping[str, Sequence[str]], config: AgentConfig = AgentConfig(),
                 reviewer: Any = None):
        self.lm = lm
        self.demos = {k: list(v) for k, v in demos.items()}
        self.config = config
        self.reviewer = lm if reviewer is None else reviewer
        self.reference: ctx.Reference | None = None

    # -- the episode loop ------------------------------------------------------------------
    def run(self, episode: Any, memory: Sequence[str] = (),
            on_step: Callable[[Any, AgentLog], None] | None = None) -> AgentLog:
        """Play ``episode`` (an :class:`envs.episode.Episode`) until done or out of budget.

        ``on_step(episode, log)`` runs after every step, also when a step raises.
        """
        log = AgentLog(memory=list(memory))
        while True:
            try:
                self.step(episode, log)
            except AgentStop:
                return log
            finally:
                if on_step is not None:
                    on_step(episode, log)

    def step(self, episode: Any, log: AgentLog) -> None:
        """One step: route, then think or act. Raises EpisodeDone / LimitReached at the end."""
        if episode.done:
            raise EpisodeDone()
        if episode.budget_left <= 0:
            raise LimitReached()
        t0 = time.perf_counter()
        reply = self.route(self.prompt(episode, log.memory, log.experiences))
        t1 = time.perf_counter()
        log.seconds["route"] += t1 - t0
        log.replies.append(reply)
        try:
            kind, text = parse_reply(reply)
        except FormatError as err:
            log.format_errors.append({"step": len(episode.steps), "reason": err.reason, "reply": reply})
            kind, text = "malformed", ""
        if kind == "think":
            episode.act(f"{ctx.THINK_PREFIX} {text}")
            return
        decision = {"step": len(episode.steps)}
        action = self.choose_action(episode, kind, text, log, decision)
        t2 = time.perf_counter()
        log.seconds["choose"] += t2 - t1
        log.decisions.append({**decision, "action": action})
        episode.act(action)
        t3 = time.perf_counter()
        log.seconds["env"] += t3 - t2
        if self.config.rendering == "experience" and not episode.done:
            self.review(episode, log)
            log.seconds["review"] += time.perf_counter() - t3

    def route(self, prompt: Any) -> str:
        """The routing reply: greedy, one transcript line."""
        return self.lm.generate(prompt, max_new_tokens=self.config.reply_tokens, stop=("\n",),
                                temperature=0.0, n=1, seed=self.config.seed)[0]

    def review(self, episode: Any, log: AgentLog) -> None:
        """Experience review of the latest transition (rendering "experience"); see
        :mod:`agent_shell.experience`. A kept experience enters ``log.experiences``."""
        from agent_shell.experience import review_transition

        start = episode.start
        index = len(episode.steps) - 1
        r = review_transition(self.reviewer, start.instruction, start.observation, episode.steps, index,
                              episode.candidates(), self.config.review_tokens)
        log.reviews.append(r.to_dict())
        if r.experience is not None:
            log.experiences[index] = r.experience

    # -- what differs between agents -----------------------------------------------------------
    def choose_action(self, episode: Any, kind: str, text: str, log: AgentLog, decision: dict) -> str:
        """The ReAct baseline's action: the reply itself, or ``look`` for a malformed reply."""
        decision.update(n_candidates=None, chosen=None)
        return text if kind == "action" else FALLBACK_ACTION

    # -- contexts ------------------------------------------------------------------------------
    def scoring_context(self, episode: Any, memory: Sequence[str] = (),
                        experiences: Mapping[int, str] | None = None) -> ctx.Context:
        """Task + rendered history (thoughts included) without demonstrations (seed App. B)."""
        start = episode.start
        cfg = self.config
        return ctx.scoring_context(start.instruction, start.observation, episode.steps, cfg.rendering, memory,
                                   layout=cfg.layout, experiences=experiences, seed=cfg.seed,
                                   reference=self.reference)

    def prompt(self, episode: Any, memory: Sequence[str] = (),
               experiences: Mapping[int, str] | None = None) -> ctx.Context:
        """The ReAct routing prompt with the demonstrations of the episode's task type."""
        task_type = episode.start.task_type
        if task_type not in self.demos:
            raise ValueError(f"no demonstrations for task type {task_type!r}; have {sorted(self.demos)}")
        return ctx.react_prompt(self.config.header, self.demos[task_type],
                                self.scoring_context(episode, memory, experiences), self.config.task_header)
