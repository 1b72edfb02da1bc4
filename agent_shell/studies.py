"""The two studies of history renderings (issue 5): the repetition probe and reference-history recovery.

Both read results files written by ``cb-agent run`` (:func:`agent_shell.runner.episode_record`:
``trials[i]["trajectory"]`` is an :class:`envs.trajectory.Trajectory` record) and write one
JSON line per (item, condition, actor), appended atomically with
:func:`envs.trajectory.append_jsonl`; a rerun with ``resume=True`` skips every finished key, so
an interrupted study loses and duplicates nothing.

**Repetition probe** (:func:`run_probe`). An *item* is a position ``j`` of a recorded trajectory
where steps ``j-1`` and ``j`` are environment steps with the same action, step ``j``'s feedback
does not support repeating it (:data:`NOTHING_HAPPENS`, or the same observation as step
``j-1``), and step ``j+1`` is an environment step, whose saved candidate set is the candidate set
of the state after step ``j`` (:func:`unsupported_repeats`). The fixed history is
``steps[:j+1]``; under each rendering, each actor is asked once for its next action on that
history, without replaying the environment (:class:`FixedHistory`):

* ReAct: the greedy routing reply parsed by :func:`agent_shell.candidates.parse_reply`; a think
  reply is recorded as kind ``"think"`` (not a repeat), a malformed one as ``"malformed"``.
* CB-Agent / prior-only: the argmax candidate of ``choose_action`` in the fixed action space
  (routing is irrelevant); CB-Agent uses the concept fitted under that rendering.

An answer *repeats* when its action equals the repeated action (whitespace collapsed, case
ignored). ``repeat_available`` says whether the repeated action is in the fixed action space at
all (CB-Agent cannot choose an action outside it; ReAct can write one).

**Reference-history recovery** (:func:`run_recovery`). An item is an unsuccessful recorded
trajectory of ``L`` steps (thoughts included) with at least :data:`MIN_ENV_STEPS` environment
steps. A fresh :class:`envs.episode.Episode` is restored to step ``k = L // 3`` by replaying the
first ``k`` recorded actions (thoughts replay as thoughts; every replayed environment observation
is compared with the recorded one and a mismatch is recorded, never raised), then the agent plays
at most ``new_actions`` new steps (the episode's budget is ``k + new_actions``). Conditions:
``"history"`` (a: the replayed history only) and ``"reference"`` (b: plus the recorded steps
``k .. 2L // 3`` shown as a :class:`agent_shell.context.Reference` block at position ``k``).
Under the Experience rendering the replayed transitions are reviewed first, so the agent starts
with the experiences it would have kept had it played them itself.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from agent_shell.agents.cb_agent import CBAgent
from agent_shell.agents.react import AgentLog, AgentStop
from agent_shell.candidates import FormatError, fixed_action_space, parse_reply
from agent_shell.context import Reference
from agent_shell.experience import Review, candidates_after, review_transition, reviewable
from agent_shell.history import RENDERINGS, action_line
from agent_shell.reporting import wilson_interval
from agent_shell.runner import loop_statistics, read_results
from envs.protocol import TaskStart
from envs.trajectory import Trajectory, append_jsonl

PROBE_SCHEMA = "cb-agent/probe-v1"
RECOVER_SCHEMA = "cb-agent/recover-v1"
#: ALFWorld's answer to an action without effect.
NOTHING_HAPPENS = "Nothing happens."
#: Actors of the studies (agent names of ``cb-agent run`` without Reflexion).
STUDY_ACTORS = ("react", "prior-only", "cb-agent")
#: Recovery conditions: (a) the replayed history only, (b) plus the recorded reference segment.
CONDITIONS = ("history", "reference")
#: Recovery items need at least this many recorded environment steps.
MIN_ENV_STEPS = 6


def _norm(text: str) -> str:
    return " ".join(text.split()).lower()


# ---------------------------------------------------------------------------------------------
# recorded trajectories


@dataclass(frozen=True)
class RecordedTrial:
    """One recorded trial of a results file.

    Attributes:
        source: the results file it came from.
        agent: the agent that played it (the record's ``agent``).
        trial: its index in the record's ``trials``.
        trajectory: the played :class:`envs.trajectory.Trajectory`.
    """

    source: str
    agent: str
    trial: int
    trajectory: Trajectory

    @property
    def key(self) -> tuple[str, str, str, int]:
        return self.source, self.agent, self.trajectory.task_id, self.trial


def recorded_trials(paths: Iterable[str | Path]) -> list[RecordedTrial]:
    """Every trial of every episode record in ``paths``, in file, line and trial order.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: a record's trajectory is malformed (naming the file and task).
    """
    out = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"no results file {str(path)!r}")
        for record in read_results(path):
            for i, trial in enumerate(record.get("trials") or []):
                try:
                    traj = Trajectory.from_record(trial["trajectory"])
                except (KeyError, ValueError) as err:
                    raise ValueError(f"{path}: task {record['task_id']!r} trial {i}: bad trajectory: {err}") from None
                out.append(RecordedTrial(str(path), str(record["agent"]), i, traj))
    return out


def env_name_of(trials: Sequence[RecordedTrial]) -> str:
    """The one environment name of ``trials`` (ValueError when none or several)."""
    names = sorted({t.trajectory.env for t in trials})
    if len(names) != 1:
        raise ValueError(f"the results must come from exactly one environment, got {names or 'none'}")
    return names[0]


# ---------------------------------------------------------------------------------------------
# repetition probe: items


def unsupported_repeats(steps: Sequence[Any]) -> list[int]:
    """Positions ``j`` where environment steps ``j-1`` and ``j`` take the same action, step ``j``'s
    observation does not support repeating it (:data:`NOTHING_HAPPENS` or equal to step ``j-1``'s)
    and step ``j+1`` is an environment step (it holds the candidate set after step ``j``)."""
    out = []
    for j in range(1, len(steps) - 1):
        before, step, after = steps[j - 1], steps[j], steps[j + 1]
        if not (before.kind == step.kind == after.kind == "env") or step.done:
            continue
        if _norm(before.action) != _norm(step.action):
            continue
        obs = _norm(step.observation)
        if obs == _norm(NOTHING_HAPPENS) or obs == _norm(before.observation):
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


class FixedHistory:
    """A read-only stand-in for :class:`envs.episode.Episode` holding a fixed history.

    Agents read ``start``, ``steps``, ``candidates()``, ``done`` and ``budget_left``; ``act``
    raises RuntimeError (the probe never replays the environment).
    """

    done = False
    won = False
    budget_left = 1

    def __init__(self, trajectory: Trajectory, n_steps: int, candidates: Sequence[str]):
        self.start = TaskStart(trajectory.task_id, trajectory.task_type, trajectory.instruction,
                               trajectory.observation)
        self.task_id = trajectory.task_id
        self.steps = list(trajectory.steps[:n_steps])
        self.max_steps = n_steps + 1
        self._candidates = list(candidates)

    def candidates(self) -> list[str]:
        return list(self._candidates)

    def act(self, text: str) -> None:
        raise RuntimeError("FixedHistory is read-only: the probe asks for an action, it never executes one")


class ReviewCache:
    """Experience reviews of recorded transitions, each reviewed once per trajectory.

    A review of transition ``i`` reads only steps ``0..i`` (:func:`agent_shell.experience.review_prompt`),
    so all items of one trajectory share them. The candidates checked against the review are the
    saved candidate set after step ``i`` (:func:`agent_shell.experience.candidates_after`).
    """

    def __init__(self, lm: Any, review_tokens: int = 48):
        self.lm = lm
        self.review_tokens = review_tokens
        self.reviews: dict[tuple, Review] = {}
        self.calls = 0

    def experiences(self, recorded: RecordedTrial, n_steps: int) -> tuple[dict[int, str], list[Review]]:
        """(step -> kept experience, the reviews) of the non-terminal transitions of ``steps[:n_steps]``."""
        traj = recorded.trajectory
        out, reviews = {}, []
        for i in reviewable(traj.steps[:n_steps]):
            key = (recorded.key, i)
            if key not in self.reviews:
                self.reviews[key] = review_transition(self.lm, traj.instruction, traj.observation, traj.steps, i,
                                                      candidates_after(traj.steps, i), self.review_tokens)
                self.calls += 1
            r = self.reviews[key]
            reviews.append(r)
            if r.experience is not None:
                out[i] = r.experience
        return out, reviews


def next_action(agent: Any, episode: Any, experiences: Mapping[int, str] | None = None) -> dict[str, Any]:
    """What ``agent`` does next on ``episode`` (nothing is executed).

    CB-Agent / prior-only (:class:`CBAgent`): the argmax of ``choose_action`` (kind "action",
    with ``n_candidates`` and ``p_chosen``). ReAct: its routing reply, parsed (kind "think",
    "action" or "malformed" with ``reason``).
    """
    if isinstance(agent, CBAgent):
        decision: dict = {}
        action = agent.choose_action(episode, "action", "", AgentLog(experiences=dict(experiences or {})), decision)
        return {"kind": "action", "action": action, "reply": None, "n_candidates": decision.get("n_candidates"),
                "p_chosen": decision.get("p_chosen")}
    reply = agent.route(agent.prompt(episode, (), experiences))
    try:
        kind, text = parse_reply(reply)
    except FormatError as err:
        return {"kind": "malformed", "action": None, "reply": reply, "reason": err.reason}
    return {"kind": kind, "action": text if kind == "action" else None, "reply": reply,
            **({"thought": text} if kind == "think" else {})}


def probe_record(item: ProbeItem, rendering: str, actor: str, agent: Any,
                 reviews: ReviewCache | None = None) -> dict[str, Any]:
    """Ask ``agent`` (built for ``rendering``) for its next action on ``item``'s fixed history."""
    t0 = time.perf_counter()
    traj = item.recorded.trajectory
    episode = FixedHistory(traj, item.j + 1, item.next_candidates)
    experiences, kept = None, None
    if rendering == "experience":
        if reviews is None:
            raise ValueError("rendering 'experience' needs a ReviewCache (the reviewer LM)")
        experiences, reviewed = reviews.experiences(item.recorded, item.j + 1)
        kept = f"{len(experiences)}/{len(reviewed)}"
    answer = next_action(agent, episode, experiences)
    space = {_norm(c) for c in fixed_action_space(item.next_candidates)}
    return {
        "schema": PROBE_SCHEMA, "study": "probe", "item": item.key, "agent": actor, "rendering": rendering,
        "layout": agent.config.layout, "task_id": traj.task_id, "task_type": traj.task_type, "j": item.j,
        "source": item.recorded.source, "source_agent": item.recorded.agent, "trial": item.recorded.trial,
        "repeated_action": item.action, "observation": traj.steps[item.j].observation,
        **answer,
        "repeat": answer["kind"] == "action" and _norm(answer["action"]) == _norm(item.action),
        "repeat_available": _norm(item.action) in space,
        "experiences": None if experiences is None else {str(k): v for k, v in experiences.items()},
        "experiences_kept": kept,
        "wall_s": round(time.perf_counter() - t0, 3),
    }


# ---------------------------------------------------------------------------------------------
# resume


def read_study(path: str | Path, study: str) -> list[dict]:
    """Every line of ``study`` ("probe" or "recover") in ``path`` ([] when it does not exist).

    A malformed or torn line is skipped with a warning naming its line number (its key is not
    finished and a resumed study redoes it); lines of another study are left out.
    """
    import warnings

    from envs.trajectory import iter_jsonl

    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, record, err in iter_jsonl(path):
        if err is None and not (isinstance(record, dict) and {"item", "rendering", "agent"} <= record.keys()):
            err = "not a study line"
        if err is not None:
            warnings.warn(f"{path}:{number}: skipped malformed study line: {err}", stacklevel=2)
            continue
        if record.get("study") == study:
            out.append(record)
    return out


def finished_keys(path: str | Path, study: str) -> set[tuple[str, str, str, str]]:
    """(item, condition, rendering, actor) of every finished line of ``study`` in ``path``."""
    return {(r["item"], r.get("condition", ""), r["rendering"], r["agent"]) for r in read_study(path, study)}


def pending_keys(path: str | Path, study: str, todo: set[tuple[str, str, str, str]],
                 resume: bool) -> set[tuple[str, str, str, str]]:
    """The (item, condition, rendering, actor) keys of ``todo`` not yet in ``path`` (condition ""
    for the probe), checked before anything heavy loads.

    Raises:
        ValueError: without ``resume``, ``path`` already holds one of ``todo`` (never a duplicate).
    """
    done = finished_keys(path, study) & todo
    if done and not resume:
        raise ValueError(f"{path} already holds {len(done)} of these results; pass --resume to "
                         "continue it, or choose another --out")
    return todo - done


def run_probe(items: Sequence[ProbeItem], renderings: Sequence[str], actors: Sequence[str],
              make_agent: Callable[[str, str], Any], out: str | Path, resume: bool = False,
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
        reviews: the review cache (needed for rendering "experience").
        meta: extra fields for every line (model, dtype, seed, ...).
        on_record: called after each line with its record (None for a skipped key).

    Returns the records written by this call.
    """
    out = Path(out)
    for r in renderings:
        if r not in RENDERINGS:
            raise ValueError(f"unknown history rendering {r!r}; known: {sorted(RENDERINGS)}")
    for a in actors:
        if a not in STUDY_ACTORS:
            raise ValueError(f"unknown probe actor {a!r}; known: {list(STUDY_ACTORS)}")
    cells = [(item, "", rendering, actor) for rendering in renderings for actor in actors for item in items]
    return _run_cells(out, "probe", cells, resume, make_agent, meta, on_record,
                      lambda item, _, rendering, actor, agent: probe_record(item, rendering, actor, agent, reviews))


def _run_cells(out: Path, study: str, cells: Sequence[tuple[Any, str, str, str]], resume: bool,
               make_agent: Callable[[str, str], Any], meta: Mapping[str, Any] | None,
               on_record: Callable[[dict | None], None] | None,
               line: Callable[[Any, str, str, str, Any], dict]) -> list[dict]:
    """Play the (item, condition, rendering, actor) ``cells`` in order, appending one line each to
    ``out``; finished keys are skipped (``on_record(None)``), agents are built once per
    (rendering, actor) and only when needed."""
    pending = pending_keys(out, study, {(i.key, c, r, a) for i, c, r, a in cells}, resume)
    agents: dict[tuple[str, str], Any] = {}
    written = []
    for item, condition, rendering, actor in cells:
        if (item.key, condition, rendering, actor) not in pending:
            if on_record is not None:
                on_record(None)
            continue
        if (rendering, actor) not in agents:
            agents[rendering, actor] = make_agent(rendering, actor)
        record = {**(meta or {}), **line(item, condition, rendering, actor, agents[rendering, actor])}
        append_jsonl(out, record)
        written.append(record)
        if on_record is not None:
            on_record(record)
    return written


# ---------------------------------------------------------------------------------------------
# reference-history recovery


@dataclass(frozen=True)
class RecoveryItem:
    """An unsuccessful recorded trajectory of ``L`` steps: restore to ``k = L // 3``; reference
    segment ``steps[k : 2L // 3]``."""

    recorded: RecordedTrial

    @property
    def key(self) -> str:
        r = self.recorded
        return f"{r.agent}:{r.trajectory.task_id}#{r.trial}"

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


def replay(env: Any, item: RecoveryItem, max_steps: int) -> tuple[Any, list[int], bool]:
    """A fresh :class:`envs.episode.Episode` of ``item``'s task after its first ``k`` recorded actions.

    Returns (episode, indices of replayed environment steps whose observation differs from the
    recorded one, whether the episode ended during the replay). ``max_steps`` must exceed ``k``.
    """
    from envs.episode import Episode

    if max_steps <= item.k:
        raise ValueError(f"max_steps ({max_steps}) must exceed the replayed steps k={item.k}")
    episode = Episode(env, item.recorded.trajectory.task_id, max_steps)
    mismatches, ended = [], False
    for i, step in enumerate(item.recorded.trajectory.steps[:item.k]):
        if episode.done:
            ended = True
            break
        episode.act(action_line(step))
        if step.kind == "env" and _norm(episode.steps[-1].observation) != _norm(step.observation):
            mismatches.append(i)
    return episode, mismatches, ended or episode.done


def review_replayed(agent: Any, episode: Any, item: RecoveryItem, log: AgentLog) -> None:
    """Experience reviews of the replayed transitions into ``log`` (as the agent's own reviews
    would have been); the candidates after step i are the recorded ones, the live set for the
    last replayed step when none is recorded."""
    start = episode.start
    for i in reviewable(episode.steps):
        cands = candidates_after(item.recorded.trajectory.steps, i) or episode.candidates()
        r = review_transition(agent.reviewer, start.instruction, start.observation, episode.steps, i, cands,
                              agent.config.review_tokens)
        log.reviews.append(r.to_dict())
        if r.experience is not None:
            log.experiences[i] = r.experience


def recovery_record(env: Any, item: RecoveryItem, condition: str, actor: str, agent: Any,
                    new_actions: int = 30,
                    on_step: Callable[[Any, AgentLog], None] | None = None) -> dict[str, Any]:
    """Replay ``item`` to step k, let ``agent`` continue for at most ``new_actions`` steps under
    ``condition`` ("history" or "reference"), and return the result line."""
    if condition not in CONDITIONS:
        raise ValueError(f"unknown recovery condition {condition!r}; known: {list(CONDITIONS)}")
    if new_actions < 1:
        raise ValueError(f"new_actions must be >= 1, got {new_actions}")
    t0 = time.perf_counter()
    k = item.k
    episode, mismatches, ended = replay(env, item, k + new_actions)
    agent.reference = Reference(at=k, steps=item.segment) if condition == "reference" else None
    log = AgentLog()
    try:
        if agent.config.rendering == "experience":
            review_replayed(agent, episode, item, log)
        while True:
            try:
                agent.step(episode, log)
            except AgentStop:
                break
            finally:
                if on_step is not None:
                    on_step(episode, log)
    finally:
        agent.reference = None
    new = episode.steps[k:]
    segment_actions = {_norm(s.action) for s in item.segment if s.kind == "env"}
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
        "replay_ended": ended, "reference_actions_reused": sum(_norm(s.action) in segment_actions for s in new_env),
        "format_errors": len(log.format_errors), "wall_s": round(time.perf_counter() - t0, 3),
        "log": log.to_dict(), "trajectory": episode.trajectory().to_record(),
    }


def run_recovery(env: Any, items: Sequence[RecoveryItem], renderings: Sequence[str], conditions: Sequence[str],
                 actors: Sequence[str], make_agent: Callable[[str, str], Any], out: str | Path,
                 resume: bool = False, new_actions: int = 30, meta: Mapping[str, Any] | None = None,
                 on_record: Callable[[dict | None], None] | None = None) -> list[dict]:
    """Reference-history recovery: one line per (item, condition, rendering, actor) appended to ``out``.

    ``make_agent(rendering, actor)`` builds the agent (built once per rendering and actor, on
    demand); ``resume`` and ``on_record`` as in :func:`run_probe`. Returns the records written.
    """
    out = Path(out)
    for c in conditions:
        if c not in CONDITIONS:
            raise ValueError(f"unknown recovery condition {c!r}; known: {list(CONDITIONS)}")
    cells = [(item, condition, rendering, actor) for rendering in renderings for actor in actors
             for condition in conditions for item in items]
    return _run_cells(out, "recover", cells, resume, make_agent, meta, on_record,
                      lambda item, condition, _, actor, agent: recovery_record(env, item, condition, actor, agent,
                                                                               new_actions))


# ---------------------------------------------------------------------------------------------
# tables


@dataclass(frozen=True)
class RateRow:
    """One cell of a study table: ``k`` of ``n`` with a 95% Wilson interval, plus counts."""

    group: tuple[str, ...]
    k: int
    n: int
    low: float
    high: float
    extra: dict

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else 0.0


def rate_rows(records: Iterable[dict], group_by: Sequence[str], success: str,
              extra: Mapping[str, Callable[[list[dict]], Any]] | None = None) -> list[RateRow]:
    """Rows of ``success`` rates grouped by the ``group_by`` fields (first-seen order, renderings
    in :data:`agent_shell.history.RENDERINGS` order); ``extra`` name -> function of the group's
    records."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[tuple(str(r.get(g, "")) for g in group_by)].append(r)
    order = list(RENDERINGS)

    def sort_key(key: tuple) -> tuple:
        return tuple(order.index(v) if g == "rendering" and v in order else 0 for g, v in zip(group_by, key))

    rows = []
    for key in sorted(groups, key=sort_key):  # stable: first-seen order within a rendering
        rs = groups[key]
        k = sum(bool(r[success]) for r in rs)
        rows.append(RateRow(key, k, len(rs), *wilson_interval(k, len(rs)),
                            {name: fn(rs) for name, fn in (extra or {}).items()}))
    return rows


def probe_rows(records: Iterable[dict]) -> list[RateRow]:
    """Repeat rate per (rendering, actor), with think / malformed answers and how often the
    repeated action was in the fixed action space."""
    return rate_rows(records, ("rendering", "agent"), "repeat", {
        "think": lambda rs: sum(r["kind"] == "think" for r in rs),
        "malformed": lambda rs: sum(r["kind"] == "malformed" for r in rs),
        "in set": lambda rs: sum(bool(r["repeat_available"]) for r in rs),
    })


def recovery_rows(records: Iterable[dict]) -> list[RateRow]:
    """Recovery rate per (condition, rendering, actor), with mean new steps and replay mismatches."""
    return rate_rows(records, ("condition", "rendering", "agent"), "recovered", {
        "new steps": lambda rs: f"{sum(r['new_steps'] for r in rs) / len(rs):.1f}",
        "cycle": lambda rs: f"{sum(r['loop']['longest_cycle']['span'] for r in rs) / len(rs):.1f}",
        "mismatch": lambda rs: sum(bool(r["replay_mismatch"]) for r in rs),
    })


def rate_table(rows: Sequence[RateRow], columns: Sequence[str], rate_name: str, title: str,
               caption: str = "") -> Any:
    """A :class:`rich.table.Table`: the group columns, k/n, rate, 95% Wilson interval, extras."""
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for c in (f"{rate_name} k/n", "rate", "95% CI"):
        table.add_column(c, justify="right")
    extras = list(rows[0].extra) if rows else []
    for c in extras:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r.group, f"{r.k}/{r.n}", f"{100 * r.rate:.1f}%", f"[{100 * r.low:.1f}, {100 * r.high:.1f}]",
                      *[str(r.extra[c]) for c in extras])
    table.caption = caption or None
    return table


__all__ = ["CONDITIONS", "FixedHistory", "MIN_ENV_STEPS", "NOTHING_HAPPENS", "PROBE_SCHEMA", "ProbeItem",
           "RECOVER_SCHEMA", "RateRow", "RecordedTrial", "RecoveryItem", "ReviewCache", "STUDY_ACTORS",
           "env_name_of", "finished_keys", "mine_probe_items", "next_action", "pending_keys", "probe_record",
           "probe_rows", "rate_rows", "rate_table", "read_study", "recorded_trials", "recovery_record",
           "recovery_rows", "replay", "review_replayed", "run_probe", "run_recovery", "select_recovery_items",
           "unsupported_repeats"]
