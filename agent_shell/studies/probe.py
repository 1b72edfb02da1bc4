"""The repetition probe: does an actor repeat an action that just did nothing?

An *item* is a position ``j`` of a recorded trajectory where steps ``j-1`` and ``j`` are
environment steps with the same action, step ``j``'s feedback does not support repeating it
(:data:`NOTHING_HAPPENS`, or the same observation as step ``j-1``), and step ``j+1`` is an
environment step, whose saved candidate set is the candidate set of the state after step ``j``
(:func:`unsupported_repeats`). The fixed history is ``steps[:j+1]``; under each rendering, each
actor is asked once for its next action on that history (:meth:`ReActAgent.next_action` on a
:class:`~agent_shell.agents.View` with ``route=False``), without replaying the environment:

* ReAct: its routing reply, parsed; a thought is recorded as kind ``"think"`` (not a repeat), a
  malformed reply as ``"malformed"``.
* CB-Agent / prior-only: the argmax candidate of the fixed action space (routing skipped: the
  step is known to be an environment step); CB-Agent uses the concept fitted under that rendering.

An answer *repeats* when its action equals the repeated action (whitespace collapsed, case
ignored). ``repeat_available`` says whether the repeated action is in the fixed action space at
all (CB-Agent cannot choose an action outside it; ReAct can write one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from agent_shell.agents import Decision, ReActAgent, View
from agent_shell.candidates import fixed_action_space
from agent_shell.experience import Review, candidates_after, review_transition, reviewable
from agent_shell.history import RENDERINGS, REVIEWED, StepLike
from agent_shell.lm.protocol import LanguageModel
from agent_shell.studies.recorded import AgentFactory, RecordedTrial, norm, run_cells
from agent_shell.studies.tables import RateRow, rate_rows
from cb_io.feedback import ALFWORLD_NOTHING

if TYPE_CHECKING:
    from agent_shell.calibration.calibrator import Calibrator

PROBE_SCHEMA = "cb-agent/probe-v1"
#: ALFWorld's answer to an action without effect.
NOTHING_HAPPENS = ALFWORLD_NOTHING
#: Actors of the studies (agent names of ``cb-agent run`` without Reflexion).
STUDY_ACTORS = ("react", "prior-only", "cb-agent")


def unsupported_repeats(steps: Sequence[StepLike]) -> list[int]:
    """Positions ``j`` where environment steps ``j-1`` and ``j`` take the same action, step ``j``'s
    observation does not support repeating it (:data:`NOTHING_HAPPENS` or equal to step ``j-1``'s)
    and step ``j+1`` is an environment step (it holds the candidate set after step ``j``)."""
    out = []
    for j in range(1, len(steps) - 1):
        before, step, after = steps[j - 1], steps[j], steps[j + 1]
        if not (before.kind == step.kind == after.kind == "env") or step.done:
            continue
        if norm(before.action) != norm(step.action):
            continue
        obs = norm(step.observation)
        if obs == norm(NOTHING_HAPPENS) or obs == norm(before.observation):
            out.append(j)
    return out


@dataclass(frozen=True)
class ProbeItem:
    """A fixed history ``recorded.trajectory.steps[:j+1]`` that ends in an unsupported repeat."""

    recorded: RecordedTrial
    j: int

    @property
    def key(self) -> str:
        return f"{self.recorded.trajectory.task_id}@{self.j}"

    @property
    def action(self) -> str:
        """The repeated action."""
        return self.recorded.trajectory.steps[self.j].action

    @property
    def next_candidates(self) -> list[str]:
        return list(self.recorded.trajectory.steps[self.j + 1].candidates)

    def view(self, experiences: Mapping[int, str] | None = None) -> View:
        """The fixed history as an agent sees it, with the candidate set after step ``j``; the
        step is known to be an environment step (``route=False``)."""
        return View(self.recorded.start, tuple(self.recorded.trajectory.steps[:self.j + 1]),
                    tuple(self.next_candidates), experiences=experiences or {}, route=False)


def mine_probe_items(trials: Sequence[RecordedTrial], max_items: int | None = 30) -> list[ProbeItem]:
    """The probe items of ``trials``, deduplicated by (task id, j), at most ``max_items``.

    Order (deterministic): round robin over the trials in input order - the first position of
    every trial, then the second, ... - so a cap keeps items from many trajectories rather than
    many positions of one long loop. ``max_items`` None or 0: no cap.
    """
    per_trial = [[ProbeItem(t, j) for j in unsupported_repeats(t.trajectory.steps)] for t in trials]
    seen, out = set(), []
    for r in range(max((len(p) for p in per_trial), default=0)):
        for positions in per_trial:
            if r < len(positions) and positions[r].key not in seen:
                seen.add(positions[r].key)
                out.append(positions[r])
    return out[:max_items] if max_items else out


class ReviewCache:
    """Experience reviews of recorded transitions, each reviewed once per trajectory.

    A review of transition ``i`` reads only steps ``0..i`` (:func:`agent_shell.experience.review_prompt`),
    so all items of one trajectory share them. The candidates checked against the review are the
    saved candidate set after step ``i`` (:func:`agent_shell.experience.candidates_after`).
    """

    def __init__(self, lm: LanguageModel, review_tokens: int = 48):
        self.lm = lm
        self.review_tokens = review_tokens
        self.reviews: dict[tuple, Review] = {}
        self.calls = 0

    def experiences(self, recorded: RecordedTrial, n_steps: int,
                    calibrator: Calibrator | None = None) -> tuple[dict[int, str], list[Review]]:
        """(step -> kept experience, the reviews) of the non-terminal transitions of ``steps[:n_steps]``;
        ``calibrator`` (rendering "calibrator"): its calibrated reviews instead (cached apart)."""
        traj = recorded.trajectory
        out, reviews = {}, []
        tag = calibrator.fingerprint if calibrator is not None else ""
        for i in reviewable(traj.steps[:n_steps]):
            key = (tag, recorded.key, i)
            if key not in self.reviews:
                if calibrator is not None:
                    self.reviews[key] = calibrator.review(self.lm, traj.instruction, traj.observation, traj.steps, i,
                                                          candidates_after(traj.steps, i))
                else:
                    self.reviews[key] = review_transition(self.lm, traj.instruction, traj.observation, traj.steps,
                                                          i, candidates_after(traj.steps, i), self.review_tokens)
                self.calls += 1
            r = self.reviews[key]
            reviews.append(r)
            if r.experience is not None:
                out[i] = r.experience
        return out, reviews


def probe_answer(decision: Decision) -> dict[str, Any]:
    """The answer fields of a probe line: ``kind`` ("action", "think" or "malformed"), ``action``
    (None unless an action), ``reply``, then ``n_candidates``, ``p_chosen``, ``candidates`` and the
    per-candidate terms (:meth:`Decision.terms_record`: ``prior``, ``concept``, ``log_p``) when the
    agent chose among candidates, ``thought`` for a think step, ``reason`` for a malformed reply."""
    kind = "think" if decision.kind == "think" else "malformed" if decision.format_error else "action"
    out: dict[str, Any] = {"kind": kind, "action": decision.action if kind == "action" else None,
                           "reply": decision.reply}
    if decision.candidates is not None:
        out.update(n_candidates=len(decision.candidates), p_chosen=decision.p_chosen,
                   candidates=list(decision.candidates), **decision.terms_record())
    if kind == "think":
        out["thought"] = decision.thought
    elif kind == "malformed":
        out["reason"] = decision.format_error
    return out


def probe_record(item: ProbeItem, rendering: str, actor: str, agent: ReActAgent,
                 reviews: ReviewCache | None = None) -> dict[str, Any]:
    """Ask ``agent`` (built for ``rendering``) for its next action on ``item``'s fixed history."""
    t0 = time.perf_counter()
    traj = item.recorded.trajectory
    experiences, kept = None, None
    if rendering in REVIEWED:
        if reviews is None:
            raise ValueError(f"rendering {rendering!r} needs a ReviewCache (the reviewer LM)")
        calibrator = getattr(agent, "calibrator", None) if rendering == "calibrator" else None
        if rendering == "calibrator" and calibrator is None:
            raise ValueError("rendering 'calibrator' needs a fitted calibrator (--calibrator FILE)")
        experiences, reviewed = reviews.experiences(item.recorded, item.j + 1, calibrator)
        kept = f"{len(experiences)}/{len(reviewed)}"
    answer = probe_answer(agent.next_action(item.view(experiences)))
    space = {norm(c) for c in fixed_action_space(item.next_candidates)}
    return {
        "schema": PROBE_SCHEMA, "study": "probe", "item": item.key, "agent": actor, "rendering": rendering,
        "layout": agent.config.layout, "task_id": traj.task_id, "task_type": traj.task_type, "j": item.j,
        "source": item.recorded.source, "source_agent": item.recorded.agent, "trial": item.recorded.trial,
        "repeated_action": item.action, "observation": traj.steps[item.j].observation,
        **answer,
        "repeat": answer["kind"] == "action" and norm(answer["action"]) == norm(item.action),
        "repeat_available": norm(item.action) in space,
        "experiences": None if experiences is None else {str(k): v for k, v in experiences.items()},
        "experiences_kept": kept,
        "wall_s": round(time.perf_counter() - t0, 3),
    }


def run_probe(items: Sequence[ProbeItem], renderings: Sequence[str], actors: Sequence[str],
              make_agent: AgentFactory, out: str | Path, resume: bool = False,
              reviews: ReviewCache | None = None, meta: Mapping[str, Any] | None = None,
              on_record: Callable[[dict | None], None] | None = None) -> list[dict]:
    """The repetition probe: one line per (item, rendering, actor) appended to ``out``.

    Args:
        items: from :func:`mine_probe_items`.
        renderings, actors: the conditions (each rendering's agents are built once, on demand).
        make_agent: ``(rendering, actor) -> agent`` (a ReActAgent or CBAgent whose config has that
            rendering and the fixed action space).
        out: JSONL file (created with its folder).
        resume: skip finished keys; without it, a finished key raises ValueError (never a duplicate).
        reviews: the review cache (needed for renderings "experience" and "calibrator").
        meta: extra fields for every line (model, dtype, seed, ...).
        on_record: called after each line with its record (None for a skipped key).

    Returns the records written by this call.
    """
    for r in renderings:
        if r not in RENDERINGS:
            raise ValueError(f"unknown history rendering {r!r}; known: {sorted(RENDERINGS)}")
    for a in actors:
        if a not in STUDY_ACTORS:
            raise ValueError(f"unknown probe actor {a!r}; known: {list(STUDY_ACTORS)}")
    cells = [(item, "", rendering, actor) for rendering in renderings for actor in actors for item in items]
    return run_cells(Path(out), "probe", cells, resume, make_agent, meta, on_record,
                     lambda item, _, rendering, actor, agent: probe_record(item, rendering, actor, agent, reviews))


def probe_rows(records: Sequence[dict]) -> list[RateRow]:
    """Repeat rate per (rendering, actor), with think / malformed answers and how often the
    repeated action was in the fixed action space."""
    return rate_rows(records, ("rendering", "agent"), "repeat", {
        "think": lambda rs: sum(r["kind"] == "think" for r in rs),
        "malformed": lambda rs: sum(r["kind"] == "malformed" for r in rs),
        "in set": lambda rs: sum(bool(r["repeat_available"]) for r in rs),
    })


__all__ = ["NOTHING_HAPPENS", "PROBE_SCHEMA", "STUDY_ACTORS", "ProbeItem", "ReviewCache", "mine_probe_items",
           "probe_answer", "probe_record", "probe_rows", "run_probe", "unsupported_repeats"]
