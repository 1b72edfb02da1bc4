"""Reference-history recovery: can an agent finish a failed game from a third of the way?

An item is an unsuccessful recorded trajectory of ``L`` steps (thoughts included) with at least
:data:`MIN_ENV_STEPS` environment steps. A fresh :class:`envs.episode.Episode` is restored to step
``k = L // 3`` by replaying the first ``k`` recorded actions (thoughts replay as thoughts; every
replayed environment observation is compared with the recorded one and a mismatch is recorded,
never raised), then the agent plays at most ``new_actions`` new steps (the episode's budget is
``k + new_actions``) with its own loop (:meth:`ReActAgent.run`). Conditions: ``"history"`` (a:
the replayed history only) and ``"reference"`` (b: plus the recorded steps ``k .. 2L // 3`` shown
as a :class:`agent_shell.context.Reference` block at position ``k``, passed into every context).
Under the Experience rendering the replayed transitions are reviewed first, so the agent starts
with the experiences it would have kept had it played them itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agent_shell.agents import AgentLog, ReActAgent, View
from agent_shell.context import Reference
from agent_shell.experience import candidates_after, reviewable
from agent_shell.history import REVIEWED, action_line
from agent_shell.results import loop_statistics
from agent_shell.studies.recorded import AgentFactory, RecordedTrial, norm, run_cells
from agent_shell.studies.tables import RateRow, rate_rows
from envs.episode import Episode
from envs.protocol import Environment

RECOVER_SCHEMA = "cb-agent/recover-v1"
#: Recovery conditions: (a) the replayed history only, (b) plus the recorded reference segment.
CONDITIONS = ("history", "reference")
#: Recovery items need at least this many recorded environment steps.
MIN_ENV_STEPS = 6


@dataclass(frozen=True)
class RecoveryItem:
    """An unsuccessful recorded trajectory of ``L`` steps: restore to ``k = L // 3``; reference
    segment ``steps[k : 2L // 3]``."""

    recorded: RecordedTrial

    @property
    def key(self) -> str:
        return self.recorded.name

    @property
    def length(self) -> int:
        return len(self.recorded.trajectory.steps)

    @property
    def k(self) -> int:
        return self.length // 3

    @property
    def segment_end(self) -> int:
        return 2 * self.length // 3

    @property
    def segment(self) -> tuple:
        return tuple(self.recorded.trajectory.steps[self.k:self.segment_end])


def select_recovery_items(trials: Sequence[RecordedTrial], max_items: int | None = 20,
                          min_env_steps: int = MIN_ENV_STEPS) -> list[RecoveryItem]:
    """Unsuccessful trials with at least ``min_env_steps`` environment steps, in input order,
    deduplicated by (agent, task, trial), at most ``max_items`` (None or 0: no cap)."""
    seen, out = set(), []
    for t in trials:
        item = RecoveryItem(t)
        if t.trajectory.won or t.trajectory.n_env_steps < min_env_steps or item.key in seen:
            continue
        seen.add(item.key)
        out.append(item)
    return out[:max_items] if max_items else out


def replay(env: Environment, item: RecoveryItem, max_steps: int) -> tuple[Episode, list[int], bool]:
    """A fresh :class:`envs.episode.Episode` of ``item``'s task after its first ``k`` recorded actions.

    Returns (episode, indices of replayed environment steps whose observation differs from the
    recorded one, whether the episode ended during the replay). ``max_steps`` must exceed ``k``.
    """
    if max_steps <= item.k:
        raise ValueError(f"max_steps ({max_steps}) must exceed the replayed steps k={item.k}")
    episode = Episode(env, item.recorded.trajectory.task_id, max_steps)
    mismatches, ended = [], False
    for i, step in enumerate(item.recorded.trajectory.steps[:item.k]):
        if episode.done:
            ended = True
            break
        if step.kind == "think":
            episode.think(action_line(step))
        else:
            episode.act(step.action)
        if step.kind == "env" and norm(episode.steps[-1].observation) != norm(step.observation):
            mismatches.append(i)
    return episode, mismatches, ended or episode.done


def review_replayed(agent: ReActAgent, episode: Episode, item: RecoveryItem) -> AgentLog:
    """A log holding the experience reviews of the replayed transitions (as the agent's own
    reviews would have been); the candidates after step i are the recorded ones, the live set
    for the last replayed step when none is recorded."""
    log = AgentLog()
    for i in reviewable(episode.steps):
        cands = candidates_after(item.recorded.trajectory.steps, i) or episode.candidates()
        log.add_review(agent.review(View(episode.start, tuple(episode.steps[:i + 1]), tuple(cands))))
    return log


def recovery_record(env: Environment, item: RecoveryItem, condition: str, actor: str, agent: ReActAgent,
                    new_actions: int = 30,
                    on_step: Callable[[Episode, AgentLog], None] | None = None) -> dict[str, Any]:
    """Replay ``item`` to step k, let ``agent`` continue for at most ``new_actions`` steps under
    ``condition`` ("history" or "reference"), and return the result line."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown recovery condition {condition!r}; known: {list(CONDITIONS)}")
    if new_actions < 1:
        raise ValueError(f"new_actions must be >= 1, got {new_actions}")
    t0 = time.perf_counter()
    k = item.k
    episode, mismatches, ended = replay(env, item, k + new_actions)
    reference = Reference(at=k, steps=item.segment) if condition == "reference" else None
    log = review_replayed(agent, episode, item) if agent.config.rendering in REVIEWED else AgentLog()
    log = agent.run(episode, reference=reference, log=log, on_step=on_step)
    new = episode.steps[k:]
    segment_actions = {norm(s.action) for s in item.segment if s.kind == "env"}
    new_env = [s for s in new if s.kind == "env"]
    traj = item.recorded.trajectory
    return {
        "schema": RECOVER_SCHEMA, "study": "recover", "item": item.key, "agent": actor, "condition": condition,
        "rendering": agent.config.rendering, "layout": agent.config.layout, "task_id": traj.task_id,
        "task_type": traj.task_type, "source": item.recorded.source, "source_agent": item.recorded.agent,
        "trial": item.recorded.trial, "L": item.length, "k": k, "segment_end": item.segment_end,
        "new_actions": new_actions, "recovered": bool(episode.won), "new_steps": len(new),
        "new_env_steps": len(new_env), "new_think_steps": len(new) - len(new_env),
        "loop": loop_statistics(new), "replay_mismatch": bool(mismatches), "mismatch_steps": mismatches,
        "replay_ended": ended, "reference_actions_reused": sum(norm(s.action) in segment_actions for s in new_env),
        "format_errors": len(log.format_errors), "wall_s": round(time.perf_counter() - t0, 3),
        "log": log.to_dict(), "trajectory": episode.trajectory().to_record(),
    }


def run_recovery(env: Environment, items: Sequence[RecoveryItem], renderings: Sequence[str],
                 conditions: Sequence[str], actors: Sequence[str], make_agent: AgentFactory, out: str | Path,
                 resume: bool = False, new_actions: int = 30, meta: Mapping[str, Any] | None = None,
                 on_record: Callable[[dict | None], None] | None = None, time_limit: float | None = None,
                 on_skip: Callable[[str], None] | None = None) -> list[dict]:
    """Reference-history recovery: one line per (item, condition, rendering, actor) appended to ``out``.

    ``make_agent(rendering, actor)`` builds the agent (built once per rendering and actor, on
    demand); ``resume`` and ``on_record`` as in :func:`agent_shell.studies.probe.run_probe`. Each
    line's episode (replay and continuation) runs within ``time_limit`` seconds (None: no limit);
    one that runs past it or whose engine faults is skipped with a line to ``on_skip``
    (:func:`agent_shell.studies.recorded.run_cells`). Returns the records written.
    """
    for c in conditions:
        if c not in CONDITIONS:
            raise ValueError(f"unknown recovery condition {c!r}; known: {list(CONDITIONS)}")
    cells = [(item, condition, rendering, actor) for rendering in renderings for actor in actors
             for condition in conditions for item in items]
    return run_cells(Path(out), "recover", cells, resume, make_agent, meta, on_record,
                     lambda item, condition, _, actor, agent: recovery_record(env, item, condition, actor, agent,
                                                                              new_actions), time_limit, on_skip)


def recovery_rows(records: Sequence[dict]) -> list[RateRow]:
    """Recovery rate per (condition, rendering, actor), with mean new steps and replay mismatches."""
    return rate_rows(records, ("condition", "rendering", "agent"), "recovered", {
        "new steps": lambda rs: f"{sum(r['new_steps'] for r in rs) / len(rs):.1f}",
        "cycle": lambda rs: f"{sum(r['loop']['longest_cycle']['span'] for r in rs) / len(rs):.1f}",
        "mismatch": lambda rs: sum(bool(r["replay_mismatch"]) for r in rs),
    })


__all__ = ["CONDITIONS", "MIN_ENV_STEPS", "RECOVER_SCHEMA", "RecoveryItem", "recovery_record", "recovery_rows",
           "replay", "review_replayed", "run_recovery", "select_recovery_items"]
