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
* :class:`ExpertDistanceJudge` - environment-grounded (ALFWorld): the handcoded expert's plan
  from the state after each action. An action that wins is best; otherwise the action that
  leaves fewer expert steps to the goal wins; equal counts are ties. The state after an action
  is rebuilt by replaying the recorded action prefix in a fresh episode reset with its expert
  (ALFWorld's TextWorld engine offers no state cloning), then taking the action, then letting
  the expert play until it wins (its step count), gives up or reaches ``max_expert_steps``
  (unknown distance, worse than any known one). Distances are memoised per (task, prefix,
  action); a think step and an action the engine answers ``Nothing happens.`` leave the state
  unchanged and share one rollout.

Imports no LM backend and no game engine (both are handed in).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

from agent_shell.context import render_history, render_task
from agent_shell.history import StepLike
from agent_shell.lm.protocol import LanguageModel
from envs.episode import Episode, is_think, time_limit
from envs.protocol import Environment, TaskStart

Outcome = Literal["with", "without", "tie"]
#: The engine's answer to an action without effect (ALFWorld; the scripted test game too).
INVALID_FEEDBACK = "Nothing happens."
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


# ---------------------------------------------------------------------------------------------
# the environment-grounded judge


class ExpertDistanceJudge:
    """Environment-grounded judge: which action leaves fewer expert steps to the goal (or wins).

    Args:
        env: an adapter whose ``reset(task_id, expert=True)`` runs an expert (ALFWorld's
            handcoded expert); one episode at a time is replayed on it.
        max_expert_steps: the expert's cap after the action; beyond it (or when the expert gives
            up) the distance is unknown (None), worse than any known distance.
        time_limit: wall-clock seconds of one rollout (replay, action, expert), past which
            :meth:`distance` raises :class:`envs.EpisodeTimeout` (:func:`envs.episode.time_limit`)
            and the verdict cannot be given; None: no limit.

    Raises:
        ValueError: ``env`` has no expert (``expert_name`` missing) or the cap is < 1.
    """

    name = "expert-distance"

    def __init__(self, env: Environment, max_expert_steps: int = 40, time_limit: float | None = None):
        if not getattr(env, "expert_name", None):
            raise ValueError(f"environment {getattr(env, 'name', env)!r} has no expert: the expert-distance judge "
                             "needs one (use the lm judge)")
        if max_expert_steps < 1:
            raise ValueError(f"max_expert_steps must be >= 1, got {max_expert_steps}")
        self.env = env
        self.max_expert_steps = max_expert_steps
        self.time_limit = time_limit
        self.memo: dict[tuple, dict] = {}
        self.replays = 0

    def distance(self, task_id: str, steps: Sequence[StepLike], action: str) -> dict[str, Any]:
        """Expert steps to the goal after replaying ``steps`` and taking ``action``.

        Returns ``{"distance": int | None, "won_by_action": bool, "mismatch": bool, "gave_up": bool}``;
        ``distance`` 0 when the action itself wins, None when unknown (expert gave up or hit the
        cap). ``mismatch``: a replayed observation differed from the recorded one. A think step,
        or an action the engine answers ``Nothing happens.``, leaves the state as the prefix left
        it: such actions share one expert rollout (key ``None``).

        Raises:
            envs.EngineError: the engine failed, or the rollout ran past ``time_limit``
                (:class:`envs.EpisodeTimeout`); nothing is memoised.
        """
        prefix = tuple(s.action for s in steps if s.kind == "env")
        key = (task_id, prefix, executable(action))
        if key in self.memo:
            return self.memo[key]
        self.replays += 1
        with time_limit(self.time_limit, "expert-distance rollout"):
            return self._rollout(task_id, steps, action, prefix, key)

    def _rollout(self, task_id: str, steps: Sequence[StepLike], action: str, prefix: tuple, key: tuple
                 ) -> dict[str, Any]:
        unchanged = (task_id, prefix, None)
        episode = Episode(self.env, task_id, len(prefix) + 2 + self.max_expert_steps, expert=True)
        mismatch = False
        for s in steps:
            if s.kind != "env" or episode.done:
                continue
            episode.act(s.action)
            mismatch = mismatch or norm_action(episode.steps[-1].observation) != norm_action(s.observation)
        no_op = is_think(action) or episode.done
        if not no_op:
            episode.act(action)
            no_op = norm_action(episode.steps[-1].observation) == norm_action(INVALID_FEEDBACK)
        if episode.won:
            out = {"distance": 0, "won_by_action": not no_op, "mismatch": mismatch, "gave_up": False}
        elif no_op and unchanged in self.memo:
            out = {**self.memo[unchanged], "mismatch": mismatch}
        else:
            out = {"distance": None, "won_by_action": False, "mismatch": mismatch, "gave_up": False}
            n = 0
            while not episode.done and n < self.max_expert_steps:
                expert = episode.expert_action()
                if expert is None:
                    out["gave_up"] = True
                    break
                episode.act(expert)
                n += 1
                if episode.won:
                    out["distance"] = n
                    break
        self.memo[key] = out
        if no_op:
            self.memo.setdefault(unchanged, out)
        return out

    def compare(self, pair: Pair) -> Verdict:
        task_id = pair.start.task_id
        without = self.distance(task_id, pair.steps, pair.without)
        with_ = self.distance(task_id, pair.steps, pair.with_)
        detail = {"without": without, "with": with_}
        a, b = without["distance"], with_["distance"]
        if a == b:
            return Verdict("tie", self.name, "same expert distance" if a is not None else "both unknown", detail)
        if b is not None and (a is None or b < a):
            return Verdict("with", self.name, "fewer expert steps with the experience", detail)
        return Verdict("without", self.name, "fewer expert steps without the experience", detail)


#: ``--judge`` names.
JUDGES = ("expert-distance", "lm")


__all__ = ["EFFECT", "ExpertDistanceJudge", "JUDGES", "JUDGE_QUESTION", "Judge", "LMJudge", "Pair", "Verdict",
           "executable", "judge_pair", "norm_action"]
