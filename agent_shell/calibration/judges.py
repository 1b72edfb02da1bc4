"""Judges of paired next actions (action calibration, Sec. 6, step 2), behind one interface.

A recipient actor answers the same history twice: without and with a candidate experience. A
*judge* says which of the two next actions is better: :meth:`Judge.compare` ``(pair) ->
Verdict`` with outcome ``"with"`` (the experience improved the action), ``"without"`` (it
degraded it) or ``"tie"``. :func:`judge_pair` is the one entry point: identical executable
actions (the same environment command, whitespace and case ignored, or two think steps, which
execute nothing) are ties without any judge call; otherwise it calls the judge. Every verdict
records the judge's name (``verdict.judge``), so labels say which judge produced them.

* :class:`LMJudge` - blind A/B question to a language model, asked twice with the order of the
  two actions reversed; the choice is read by scoring the answers ``A`` / ``B`` after the
  prompt (no sampling). Inconsistent verdicts (the model prefers position, not action) are ties.
* :class:`~agent_shell.calibration.expert_distance.ExpertDistanceJudge` - environment-grounded
  (ALFWorld): the handcoded expert's plan from the state after each action; it plays the game,
  so it lives in its own module (:mod:`agent_shell.calibration.expert_distance`).

Imports no LM backend (it is handed in) and no game: the records only (:mod:`cb_io.records`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from agent_shell.context import render_history, render_task
from agent_shell.history import StepLike
from agent_shell.lm.protocol import LanguageModel
from cb_io.records import TaskStart, is_think

Outcome = Literal["with", "without", "tie"]
#: Outcome of a verdict -> what it counts as in the labels.
EFFECT = {"with": "improvement", "without": "degradation", "tie": "tie"}


def norm_action(text: str) -> str:
    """An action as compared across answers: whitespace collapsed, case ignored."""
    return " ".join(text.split()).lower()


def executable(action: str) -> str | None:
    """What an action executes: the normalised command, or None for a think step (nothing)."""
    return None if is_think(action) else norm_action(action)


@dataclass(frozen=True)
class Pair:
    """Two next actions of one actor on one history: without and with a candidate experience.

    Attributes:
        start: the task (instruction and initial observation).
        steps: the history before the next action (a recorded trajectory's prefix), oldest first.
        without: the action taken without the experience (``think: ...`` for a thought).
        with_: the action taken with the experience.
    """

    start: TaskStart
    steps: tuple[StepLike, ...]
    without: str
    with_: str


@dataclass(frozen=True)
class Verdict:
    """A judge's answer on a :class:`Pair`.

    Attributes:
        outcome: ``"with"`` (better with the experience), ``"without"`` or ``"tie"``.
        judge: the judge's name (``"same-action"`` when no judge was called).
        reason: why, in a few words (``"identical executable actions"``, ``"inconsistent"``...).
        detail: judge-specific numbers (the LM's two answers, the expert distances).
    """

    outcome: Outcome
    judge: str
    reason: str = ""
    detail: dict = field(default_factory=dict)

    @property
    def effect(self) -> str:
        """"improvement", "degradation" or "tie"."""
        return EFFECT[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "effect": self.effect, "judge": self.judge, "reason": self.reason,
                "detail": self.detail}


class Judge(Protocol):
    """Compares the two actions of a :class:`Pair` whose executable actions differ."""

    name: str

    def compare(self, pair: Pair) -> Verdict: ...


def judge_pair(judge: Judge, pair: Pair) -> Verdict:
    """The verdict on ``pair``: a tie without a call when both actions execute the same thing
    (the same command, or both think steps), else ``judge.compare(pair)``."""
    if executable(pair.without) == executable(pair.with_):
        return Verdict("tie", "same-action", "identical executable actions")
    return judge.compare(pair)


# ---------------------------------------------------------------------------------------------
# the blind LM judge

JUDGE_QUESTION = ("Two possible next actions for the task above:\nA: {a}\nB: {b}\n"
                  "Which action makes more progress toward completing the task? Answer A or B.\nAnswer:")


class LMJudge:
    """Blind A/B judge: the LM sees the task, the raw history and the two actions labelled A and
    B (which one had the experience is never shown), and its answer is the likelier of ``A`` /
    ``B`` (summed log-probability after the prompt). Asked twice, the second time with the order
    reversed; the verdict stands only when both answers name the same action, else a tie.

    Args:
        lm: the judge's language model (its own view: :meth:`LanguageModel.fork`).
    """

    name = "lm"

    def __init__(self, lm: LanguageModel):
        self.lm = lm
        self.calls = 0

    def prompt(self, pair: Pair, a: str, b: str) -> str:
        """The judge prompt with ``a`` as A and ``b`` as B."""
        history = render_history(pair.steps, "raw")
        head = render_task(pair.start.instruction, pair.start.observation)
        return "\n".join(p for p in (head, history) if p) + "\n\n" + JUDGE_QUESTION.format(a=a.strip(), b=b.strip())

    def ask(self, pair: Pair, a: str, b: str) -> tuple[str, float]:
        """("A" or "B", log p(A) - log p(B)) for one order."""
        scores = self.lm.score(self.prompt(pair, a, b), ["A", "B"], " ")
        self.calls += 1
        margin = float(scores.log_q[0] - scores.log_q[1])
        return ("A" if margin >= 0 else "B"), margin

    def compare(self, pair: Pair) -> Verdict:
        first, m1 = self.ask(pair, pair.without, pair.with_)   # A = without
        second, m2 = self.ask(pair, pair.with_, pair.without)  # A = with
        pick1 = "without" if first == "A" else "with"
        pick2 = "with" if second == "A" else "without"
        detail = {"order1": {"A": "without", "answer": first, "margin": round(m1, 4)},
                  "order2": {"A": "with", "answer": second, "margin": round(m2, 4)}}
        if pick1 != pick2:
            return Verdict("tie", self.name, "inconsistent across orders", detail)
        return Verdict(pick1, self.name, "consistent in both orders", detail)  # type: ignore[arg-type]


#: ``--judge`` names.
JUDGES = ("expert-distance", "lm")


__all__ = ["EFFECT", "JUDGES", "JUDGE_QUESTION", "Judge", "LMJudge", "Pair", "Verdict",
           "executable", "judge_pair", "norm_action"]
