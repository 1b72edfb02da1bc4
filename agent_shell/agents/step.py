"""One agent step as data: what the agent sees (:class:`View`), what it decides (:class:`Decision`),
and what a trial records (:class:`AgentLog`); the exceptions that end a step loop; what an agent
needs of the episode it plays (:class:`EpisodeLike`).

Every agent answers :meth:`agent_shell.agents.react.ReActAgent.next_action` ``(view) -> Decision``
without touching an environment; the loop (:meth:`~agent_shell.agents.react.ReActAgent.run`)
executes the decision and records it, and the studies (:mod:`agent_shell.studies`) ask the same
question of recorded histories.

Imports no LM, no game (the records only: :mod:`cb_io.records`) and not cb_core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Mapping, Protocol, Sequence

from agent_shell.context import Reference
from agent_shell.history import THINK_PREFIX, StepLike
from cb_io.records import Step, StepResult, TaskStart, Trajectory

if TYPE_CHECKING:
    from agent_shell.experience import Review


class EpisodeLike(Protocol):
    """What an agent reads from and does to the episode it plays, and the record a trial keeps of
    it (duck-typed; the games' episode, :class:`envs.episode.Episode`, fits): the task, the steps
    so far (thoughts included), the state's candidate set, the budget (``max_steps`` steps in all,
    ``budget_left`` of them left), one step at a time, and the episode so far as a
    :class:`~cb_io.records.Trajectory`.

    ``think(thought)`` records a think step (feedback ``OK.``, one unit of budget, no engine call);
    ``act(text)`` executes one environment action (``text`` starting ``think:`` is a think step).
    Both return the :class:`~cb_io.records.StepResult`, and raise when the episode is over or the
    engine failed (:class:`~cb_io.records.EngineError`).
    """

    @property
    def start(self) -> TaskStart: ...

    @property
    def steps(self) -> Sequence[Step]: ...

    @property
    def done(self) -> bool: ...

    @property
    def won(self) -> bool: ...

    @property
    def max_steps(self) -> int: ...

    @property
    def budget_left(self) -> int: ...

    def candidates(self) -> list[str]: ...

    def think(self, thought: str) -> StepResult: ...

    def act(self, text: str) -> StepResult: ...

    def trajectory(self, meta: dict | None = None) -> Trajectory: ...


class AgentStop(Exception):
    """Ends an episode's step loop (never an error)."""


class EpisodeDone(AgentStop):
    """The environment reported ``done``."""


class LimitReached(AgentStop):
    """The step budget (think steps included) is spent."""


class WindowFull(AgentStop):
    """The next prompt no longer fits the backbone's context window
    (:class:`agent_shell.lm.protocol.ContextWindowFull`): the episode ends there, unfinished, and
    its log says so (:attr:`AgentLog.window_full`)."""


@dataclass(frozen=True)
class View:
    """What an agent sees before a step: the task, the steps so far and the current candidate set,
    plus what its contexts add.

    Attributes:
        start: the task (instruction and initial observation o0).
        steps: the steps so far (thoughts included), oldest first.
        candidates: the environment's candidate set in the current state (unfiltered, engine
            order); empty when the caller has none (a reflection on a finished trial).
        memory: Reflexion reflections shown in the routing prompt and the scoring context.
        experiences: rendering "experience": step index -> kept experience of that transition.
        reference: a recorded stretch shown in every context as not executed (recovery study).
        route: False when the caller already knows the step is an environment step (the
            repetition probe asks for the next action): an agent that routes only to tell a
            think step from an environment step (CB-Agent) then skips routing; ReAct writes its
            action in its routing reply, so it replies as always.
    """

    start: TaskStart
    steps: tuple[StepLike, ...] = ()
    candidates: tuple[str, ...] = ()
    memory: tuple[str, ...] = ()
    experiences: Mapping[int, str] = field(default_factory=lambda: MappingProxyType({}))
    reference: Reference | None = None
    route: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "candidates", tuple(self.candidates))
        object.__setattr__(self, "memory", tuple(self.memory))
        object.__setattr__(self, "experiences", MappingProxyType(dict(self.experiences or {})))

    @classmethod
    def of(cls, episode: EpisodeLike, memory: Sequence[str] = (), experiences: Mapping[int, str] | None = None,
           reference: Reference | None = None) -> "View":
        """The view of a live episode's current state."""
        return cls(episode.start, tuple(episode.steps), tuple(episode.candidates()), tuple(memory),
                   experiences or {}, reference)


#: Decimals kept of a recorded per-candidate term (nats): enough to rank and to draw the bars, and
#: the results file grows by less than about 60% on Table 1's games (``docs/explorer.md``).
TERM_DECIMALS = 3


def rounded(values: Sequence[float]) -> list[float]:
    """``values`` (float32 terms, nats) as Python floats rounded to :data:`TERM_DECIMALS` decimals."""
    return [round(float(x), TERM_DECIMALS) for x in values]


@dataclass(frozen=True)
class Decision:
    """What an agent does at one step (nothing is executed yet).

    Attributes:
        kind: ``"think"`` (recorded with feedback ``OK.``, never reaches the engine) or ``"env"``.
        action: the text the episode executes: ``think: <thought>`` for a think step, else the
            environment action.
        reply: the routing reply as generated (CB-Agent: possibly only its first tokens), or
            None when the agent did not route.
        format_error: why the reply was malformed ("empty reply", "no action", "empty thought"),
            or None; the step is then an environment step.
        candidates: the candidate set the action was chosen from, or None when the LM wrote the
            action itself (ReAct).
        chosen: index of the action in ``candidates`` (None for ReAct).
        log_probs: log P(a | x) of every candidate (seed Eq. 3; a single candidate: None).
        p_chosen: P(chosen | x) (1.0 for a single candidate; None for ReAct).
        prior: the prior term log Qbar(a | x) of every candidate (length-normalised, normalised
            over the set; a single candidate: None).
        concept_term: the concept term alpha . phi(x, a; A) of every candidate, or None when the
            agent acts without a concept (prior-only: alpha = 0) or took a single candidate.
        sampled: the candidates are samples (open action space), not the fixed action space of
            the state's candidate set: :meth:`record` then keeps them, since the trajectory
            cannot give them back.
        seconds: wall time by phase: ``route`` (contexts and routing) and ``choose`` (candidate
            set and scoring).
        review: the joint actor's calibration block as a :class:`Review` of the preceding
            transition (recorded in the log, a kept experience enters its experiences), or None.
    """

    kind: Literal["think", "env"]
    action: str
    reply: str | None = None
    format_error: str | None = None
    candidates: tuple[str, ...] | None = None
    chosen: int | None = None
    log_probs: tuple[float, ...] | None = None
    p_chosen: float | None = None
    prior: tuple[float, ...] | None = None
    concept_term: tuple[float, ...] | None = None
    sampled: bool = False
    seconds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    review: Review | None = None

    @property
    def thought(self) -> str | None:
        """A think step's thought (without the ``think:`` prefix), else None."""
        return self.action[len(THINK_PREFIX):].strip() if self.kind == "think" else None

    def record(self, step: int) -> dict:
        """The entry of :attr:`AgentLog.decisions` of an environment step at index ``step``, with
        :meth:`terms_record`."""
        out: dict = {"step": step, "n_candidates": None if self.candidates is None else len(self.candidates),
                     "chosen": self.chosen}
        if self.candidates is not None:
            out["p_chosen"] = self.p_chosen
        out["action"] = self.action
        out.update(self.terms_record())
        return out

    def terms_record(self) -> dict:
        """What a record keeps to show why the action was chosen: a scored candidate set's per
        candidate terms (``prior``, ``concept`` unless alpha = 0, ``log_p``: lists of floats
        rounded to :data:`TERM_DECIMALS` decimals, in candidate order) and, for sampled
        candidates, ``candidates``; for an action the LM wrote itself (ReAct), its ``reply``;
        nothing for a single candidate taken without scoring."""
        out: dict = {}
        if self.candidates is None:
            if self.reply is not None:
                out["reply"] = self.reply
            return out
        if self.prior is not None:
            out["prior"] = rounded(self.prior)
            if self.concept_term is not None:
                out["concept"] = rounded(self.concept_term)
            out["log_p"] = rounded(self.log_probs)
        if self.sampled:
            out["candidates"] = list(self.candidates)
        return out


@dataclass
class AgentLog:
    """What an agent records about one trial beyond the trajectory itself.

    Attributes:
        replies: the raw routing reply of every step, in order.
        decisions: one dict per environment-action step (:meth:`Decision.record`): ``step`` (index
            in the trajectory), ``n_candidates``, ``chosen`` (index or None), for CB-Agent
            ``p_chosen``, ``action``, then the terms of :meth:`Decision.terms_record` (``prior``,
            ``concept``, ``log_p``, sampled ``candidates``; ReAct's ``reply``).
        format_errors: one dict per malformed reply: ``step``, ``reason``, ``reply``.
        experiences: rendering "experience": step index -> kept experience of that transition.
        reviews: rendering "experience": every review call (:meth:`Review.to_dict`), in order.
        memory: Reflexion reflections that were in this trial's context.
        seconds: wall time by phase, summed over the trial: ``route`` (contexts and routing
            generation), ``choose`` (candidate set and scoring; CB-Agent), ``env``
            (environment steps), ``review`` (experience reviews).
        window_full: the backend's message when the trial ended because its next prompt did not
            fit the context window (:class:`WindowFull`), else None (then not in :meth:`to_dict`).
    """

    replies: list[str] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)
    format_errors: list[dict] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)
    experiences: dict = field(default_factory=dict)
    reviews: list[dict] = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: {"route": 0.0, "choose": 0.0, "env": 0.0, "review": 0.0})
    window_full: str | None = None

    def add(self, decision: Decision, step: int) -> None:
        """Record ``decision``, taken at trajectory index ``step``."""
        if decision.reply is not None:
            self.replies.append(decision.reply)
        if decision.format_error is not None:
            self.format_errors.append({"step": step, "reason": decision.format_error, "reply": decision.reply})
        if decision.kind == "env":
            self.decisions.append(decision.record(step))
        for phase, seconds in decision.seconds.items():
            self.seconds[phase] += seconds
        if decision.review is not None:
            self.add_review(decision.review)

    def add_review(self, review: Review) -> None:
        """Record an experience review; a kept experience enters :attr:`experiences`."""
        self.reviews.append(review.to_dict())
        if review.experience is not None:
            self.experiences[review.step] = review.experience

    def to_dict(self) -> dict:
        out = {"replies": self.replies, "decisions": self.decisions, "format_errors": self.format_errors,
               "memory": self.memory, "experiences": {str(k): v for k, v in self.experiences.items()},
               "reviews": self.reviews, "seconds": {k: round(v, 4) for k, v in self.seconds.items()}}
        if self.window_full is not None:
            out["window_full"] = self.window_full
        return out


__all__ = ["AgentLog", "AgentStop", "Decision", "EpisodeDone", "EpisodeLike", "LimitReached", "TERM_DECIMALS", "View",
           "WindowFull", "rounded"]
