"""The environment-grounded judge of paired next actions (action calibration, Sec. 6, step 2):
which of the two actions leaves fewer expert steps to the goal (:class:`ExpertDistanceJudge`,
``--judge expert-distance``), behind the judges' one interface (:mod:`agent_shell.calibration.judges`).

The handcoded expert's plan (ALFWorld) is asked from the state after each action. An action that
wins is best; otherwise the action that leaves fewer expert steps to the goal wins; equal counts
are ties. The state after an action is rebuilt by replaying the recorded action prefix in a fresh
episode reset with its expert (ALFWorld's TextWorld engine offers no state cloning), then taking
the action, then letting the expert play until it wins (its step count), gives up or reaches
``max_expert_steps`` (unknown distance, worse than any known one). Distances are memoised per
(task, prefix, action); a think step and an action the engine answers ``Nothing happens.`` leave
the state unchanged and share one rollout.

It plays the game (:class:`envs.episode.Episode` on the environment handed in), so it is the one
module of the calibration package that imports the games; the calibrator and the other judges
read the records only.
"""

from __future__ import annotations

from typing import Any, Sequence

from agent_shell.calibration.judges import Pair, Verdict, executable, norm_action
from agent_shell.history import StepLike
from cb_io.feedback import ALFWORLD_NOTHING
from cb_io.records import is_think
from envs.episode import Episode, time_limit
from envs.protocol import Environment

#: The engine's answer to an action without effect (ALFWorld; the scripted test game too).
INVALID_FEEDBACK = ALFWORLD_NOTHING


class ExpertDistanceJudge:
    """Environment-grounded judge: which action leaves fewer expert steps to the goal (or wins).

    Args:
        env: an adapter whose ``reset(task_id, expert=True)`` runs an expert (ALFWorld's
            handcoded expert); one episode at a time is replayed on it.
        max_expert_steps: the expert's cap after the action; beyond it (or when the expert gives
            up) the distance is unknown (None), worse than any known distance.
        time_limit: wall-clock seconds of one rollout (replay, action, expert), past which
            :meth:`distance` raises :class:`cb_io.records.EpisodeTimeout` (:func:`envs.episode.time_limit`)
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
            cb_io.records.EngineError: the engine failed, or the rollout ran past ``time_limit``
                (:class:`cb_io.records.EpisodeTimeout`); nothing is memoised.
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


__all__ = ["INVALID_FEEDBACK", "ExpertDistanceJudge"]
