"""Calibration labels from the effect of experiences on actors' next actions (Sec. 6, steps 1-3).

For every completed, non-terminal environment transition ``i`` of a recorded trial (results
files of ``cb-agent run`` on TRAINING games) that the recording continues with an environment
step (whose saved candidate set is the one after step ``i``):

1. **Candidates.** The reviewer LM is asked the Experience review (:func:`agent_shell.experience.review_prompt`)
   ``k`` times at a sampling temperature; replies are parsed with the review's own validity rules
   (:func:`agent_shell.experience.parse_review`), invalid replies and ``NO UPDATE`` propose nothing,
   duplicates are merged. The options of the transition are the distinct valid experiences plus
   ``NO UPDATE`` (always last).
2. **Paired next actions.** Each recipient actor answers the fixed history ``steps[:i+1]`` once
   without any experience and once per candidate with that experience shown beside transition
   ``i`` (rendering "experience"); a judge compares each pair (:func:`agent_shell.calibration.judges.judge_pair`:
   identical executable actions are ties without a call).
3. **Labels.** A candidate is *retained* when improvements outnumber degradations across actors,
   or when no actor degrades (all-unchanged permits retention): ``I > D or D == 0``. The
   transition's label is the retained candidate with the largest ``I - D`` (then the most
   ``I``, then the earliest), or ``NO UPDATE`` when none is retained.

The ablation *content screening* skips step 2: the judge LM reads the transition and one
candidate and answers whether it is a true, general and useful implication (the likelier of
``yes`` / ``no``); a candidate is retained when ``yes`` is likelier, and the transition's
content-screening label is the retained candidate with the largest margin, else ``NO UPDATE``.

One JSON line per transition (:data:`LABEL_SCHEMA`) holds the history, the options, every
actor's actions with and without each candidate, the verdicts with the judge that gave them,
both labels and the split and role of its task (``"split": "train"``, ``"role":
"calibrator-training"``). Appended by one process at a time (:func:`labels_file`); ``resume`` skips
finished transitions.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from agent_shell.agents import ReActAgent, View
from agent_shell.calibration.calibrator import effect_key
from agent_shell.calibration.judges import Judge, Pair, Verdict, judge_pair, norm_action
from agent_shell.context import render_history, render_task
from agent_shell.experience import NO_UPDATE, candidates_after, parse_review, review_prompt, reviewable
from agent_shell.lm.protocol import LanguageModel
from agent_shell.studies.probe import probe_answer
from agent_shell.results import ResumableJsonl
from agent_shell.studies.recorded import RecordedTrial
from cb_io.storage import iter_jsonl

LABEL_SCHEMA = "cb-agent/calibration-label-v1"
#: What the labelled tasks are for (stated in every record).
ROLE = "calibrator-training"


@dataclass(frozen=True)
class Transition:
    """Transition ``i`` of a recorded trial (history ``steps[:i+1]``, options after it)."""

    recorded: RecordedTrial
    i: int

    @property
    def key(self) -> str:
        return f"{self.recorded.name}@{self.i}"

    @property
    def steps(self) -> tuple:
        return tuple(self.recorded.trajectory.steps[:self.i + 1])

    @property
    def history(self) -> list[dict[str, str]]:
        """:attr:`steps` as label records hold them (kind, action, observation)."""
        return [{"kind": s.kind, "action": s.action, "observation": s.observation} for s in self.steps]

    @property
    def next_candidates(self) -> list[str]:
        return candidates_after(self.recorded.trajectory.steps, self.i)

    def view(self, experience: str | None = None) -> View:
        """The fixed history as an actor sees it; ``experience`` shown beside transition ``i``."""
        return View(self.recorded.start, self.steps, tuple(self.next_candidates),
                    experiences={self.i: experience} if experience else {}, route=False)


def mine_transitions(trials: Sequence[RecordedTrial], max_items: int | None = None) -> list[Transition]:
    """Reviewable transitions (non-terminal environment steps) followed by an environment step,
    round robin over ``trials`` (first transition of every trial, then the second, ...), at most
    ``max_items`` (None or 0: all), deduplicated by key."""
    per_trial = []
    for t in trials:
        steps = t.trajectory.steps
        per_trial.append([Transition(t, i) for i in reviewable(steps)
                          if any(s.kind == "env" for s in steps[i + 1:]) and candidates_after(steps, i)])
    seen, out = set(), []
    for r in range(max((len(p) for p in per_trial), default=0)):
        for items in per_trial:
            if r < len(items) and items[r].key not in seen:
                seen.add(items[r].key)
                out.append(items[r])
    return out[:max_items] if max_items else out


def propose(lm: LanguageModel, transition: Transition, k: int = 4, temperature: float = 0.8, seed: int = 0,
            max_new_tokens: int = 48) -> tuple[list[str], list[dict]]:
    """(distinct valid candidate experiences, every proposal ``{"reply", "experience", "invalid"}``).

    ``k`` sampled review replies (one generate call, ``seed`` + the transition index); each is
    parsed with :func:`agent_shell.experience.parse_review` against the candidates after the step
    and the shown observations. Raises ValueError for ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k (review samples per transition) must be >= 1, got {k}")
    traj = transition.recorded.trajectory
    steps = traj.steps
    replies = lm.generate(review_prompt(traj.instruction, traj.observation, steps, transition.i),
                          max_new_tokens=max_new_tokens, stop=("\n",), temperature=temperature, n=k,
                          seed=seed + transition.i)
    shown = [traj.observation] + [s.observation for s in steps[:transition.i + 1]]
    proposals, candidates, seen = [], [], set()
    for reply in replies:
        experience, invalid = parse_review(reply, transition.next_candidates, shown)
        proposals.append({"reply": reply, "experience": experience, "invalid": invalid})
        if experience is not None and norm_action(experience) not in seen:
            seen.add(norm_action(experience))
            candidates.append(experience)
    return candidates, proposals


def retained(improvements: int, degradations: int) -> bool:
    """The label rule: retain when improvements outnumber degradations, or nothing degrades."""
    return improvements > degradations or degradations == 0


def transition_label(scores: Sequence[tuple[bool, tuple]]) -> int:
    """Index of the chosen option among ``len(scores)`` candidates + NO UPDATE (index
    ``len(scores)``): the retained candidate with the largest sort key (ties: the earliest), or
    NO UPDATE when none is retained. ``scores``: (retained, sort key) per candidate."""
    best = None
    for j, (keep, key) in enumerate(scores):
        if keep and (best is None or key > scores[best][1]):
            best = j
    return len(scores) if best is None else best


# ---------------------------------------------------------------------------------------------
# content screening (the ablation)

SCREEN_QUESTION = ("Proposed experience: {experience}\nIs this experience true in this task, general, and useful "
                   "for choosing later actions? Answer yes or no.\nAnswer:")


class ContentScreen:
    """Content screening: the LM judges a candidate by its content alone (no actor, no action)."""

    name = "content-lm"

    def __init__(self, lm: LanguageModel):
        self.lm = lm
        self.calls = 0

    def prompt(self, transition: Transition, experience: str) -> str:
        traj = transition.recorded.trajectory
        step = traj.steps[transition.i]
        history = render_history(traj.steps[:transition.i], "raw")
        head = render_task(traj.instruction, traj.observation)
        return ("\n".join(p for p in (head, history) if p) + f"\n\nLatest action: {step.action.strip()}\n"
                f"Observation: {step.observation.strip()}\n\n" + SCREEN_QUESTION.format(experience=experience.strip()))

    def margin(self, transition: Transition, experience: str) -> float:
        """log p(yes) - log p(no) after the screening prompt."""
        s = self.lm.score(self.prompt(transition, experience), ["yes", "no"], " ")
        self.calls += 1
        return float(s.log_q[0] - s.log_q[1])


# ---------------------------------------------------------------------------------------------
# one record


def _answer(decision) -> dict[str, Any]:
    a = probe_answer(decision)
    return {"kind": a["kind"], "action": decision.action, "reply": a["reply"]}


def label_record(transition: Transition, actors: Mapping[str, ReActAgent], judge: Judge, reviewer: LanguageModel,
                 screen: ContentScreen | None, k: int = 4, temperature: float = 0.8, seed: int = 0,
                 review_tokens: int = 48) -> dict[str, Any]:
    """Propose candidates for ``transition``, ask every actor with and without each, judge, label.

    ``actors``: name -> agent whose config has rendering "experience" (so a shown experience
    enters its context). Returns the JSON line (see the module docstring).
    """
    t0 = time.perf_counter()
    traj = transition.recorded.trajectory
    candidates, proposals = propose(reviewer, transition, k, temperature, seed, review_tokens)
    answers: dict[str, dict] = {}
    for name, agent in actors.items():
        without = agent.next_action(transition.view())
        answers[name] = {"without": _answer(without),
                         "with": [_answer(agent.next_action(transition.view(c))) for c in candidates]}
    per_candidate, effect_scores, screen_scores = [], [], []
    for j, experience in enumerate(candidates):
        verdicts: dict[str, dict] = {}
        counts = Counter()
        for name in actors:
            v: Verdict = judge_pair(judge, Pair(transition.recorded.start, transition.steps,
                                                answers[name]["without"]["action"], answers[name]["with"][j]["action"]))
            verdicts[name] = v.to_dict()
            counts[v.effect] += 1
        keep = retained(counts["improvement"], counts["degradation"])
        effect_scores.append((keep, effect_key(counts["improvement"], counts["degradation"])))
        entry = {"experience": experience, "verdicts": verdicts, "improvements": counts["improvement"],
                 "degradations": counts["degradation"], "ties": counts["tie"], "retained": keep}
        if screen is not None:
            margin = screen.margin(transition, experience)
            entry["screen"] = {"margin": round(margin, 4), "retained": margin > 0, "judge": screen.name}
            screen_scores.append((margin > 0, (margin,)))
        per_candidate.append(entry)
    options = candidates + [NO_UPDATE]
    label = transition_label(effect_scores)
    record = {
        "schema": LABEL_SCHEMA, "item": transition.key, "split": traj.meta.get("split", "train"), "role": ROLE,
        "env": traj.env, "task_id": traj.task_id, "task_type": traj.task_type, "source": transition.recorded.source,
        "source_agent": transition.recorded.agent, "trial": transition.recorded.trial, "i": transition.i,
        "instruction": traj.instruction, "observation": traj.observation,
        "history": transition.history,
        "next_candidates": transition.next_candidates,
        "proposals": proposals, "options": options, "candidates": per_candidate,
        "actors": answers, "judge": judge.name,
        "label": label, "label_text": options[label],
        "wall_s": 0.0,
    }
    if screen is not None:
        record["content_label"] = transition_label(screen_scores)
        record["content_label_text"] = options[record["content_label"]]
    record["wall_s"] = round(time.perf_counter() - t0, 3)
    return record


# ---------------------------------------------------------------------------------------------
# the file


def read_labels(path: str | Path, on_bad: Callable[[str], None] | None = None) -> list[dict]:
    """The label records of ``path`` ([] when missing); malformed lines are reported via ``on_bad``
    (default: skipped silently is never done - a ValueError names the first one)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for number, record, err in iter_jsonl(path):
        if err is None and not (isinstance(record, dict) and record.get("schema") == LABEL_SCHEMA):
            err = "not a calibration label line"
        if err is not None:
            if on_bad is None:
                raise ValueError(f"{path}:{number}: {err}")
            on_bad(f"{path}:{number}: skipped: {err}")
            continue
        out.append(record)
    return out


def labels_file(path: str | Path) -> ResumableJsonl:
    """The label file ``path`` as a :class:`agent_shell.results.ResumableJsonl` keyed by transition
    (malformed lines are skipped: their transitions are labelled again)."""
    return ResumableJsonl(path, lambda p: read_labels(p, on_bad=lambda _msg: None), lambda r: r["item"],
                          "transitions", lambda r: repr(r["item"]))


def pending(path: str | Path, items: Sequence[Transition], resume: bool,
            settings: Mapping[str, Any] | None = None) -> list[Transition]:
    """``items`` not yet labelled in ``path``.

    A finished line must show the same transition (instruction, first observation and history:
    the recorded runs it was labelled on) and agree with ``settings`` (field -> value: dtype,
    seed, k, recipients, model, ...) by the rule of :meth:`agent_shell.results.ResumableJsonl.finished`.
    Claims ``path`` for this process.

    Raises:
        cb_io.storage.FileBusy: another process is writing ``path``.
        ValueError: without ``resume``, ``path`` already holds one of them (never a duplicate);
            with ``resume``, a finished line shows another transition than the recorded runs
            now give under its key, or was labelled with other ``settings`` (naming the item and
            the field: resuming would mix them).
    """
    by_key = {t.key: t for t in items}
    finished = labels_file(path).finished(by_key, resume, settings)
    for key, r in finished.items():
        t = by_key.get(key)
        if t is None:
            continue
        traj = t.recorded.trajectory
        for field, now in (("instruction", traj.instruction), ("observation", traj.observation),
                           ("history", t.history)):
            if field in r and r[field] != now:
                raise ValueError(f"{path} holds {r['item']!r} labelled on another recording (its {field} differs "
                                 f"from {t.recorded.source}'s); resuming would mix them: label these runs into "
                                 "another --out")
    return [t for t in items if t.key not in finished]


def run_labels(items: Sequence[Transition], out: str | Path, label: Callable[[Transition], dict],
               resume: bool = False, meta: Mapping[str, Any] | None = None,
               on_record: Callable[[dict], None] | None = None,
               on_skip: Callable[[str], None] | None = None) -> list[dict]:
    """Label every pending transition of ``items`` with ``label`` and append its line to ``out``.
    Returns the records written by this call.

    A transition whose label cannot be computed because a game it plays failed or ran past its
    wall-clock limit (``label`` raised :class:`cb_io.records.EngineError`, e.g. the expert-distance judge's
    :class:`cb_io.records.EpisodeTimeout`) writes no line: it is skipped with one line to ``on_skip``
    (default: a warning) naming it, and a resumed labelling tries it again."""
    import warnings

    from cb_io.records import EngineError, one_line

    skip = on_skip or (lambda msg: warnings.warn(msg, stacklevel=3))
    written = []
    for t in pending(out, items, resume, meta):
        try:
            labelled = label(t)
        except EngineError as err:  # this transition is skipped; the labelling goes on
            skip(f"skipped {t.key}: {type(err).__name__}: {one_line(err)}; --resume labels it again")
            continue
        record = {**(meta or {}), **labelled}
        labels_file(out).append(record)
        written.append(record)
        if on_record is not None:
            on_record(record)
    return written


def label_counts(records: Sequence[dict]) -> dict[str, Any]:
    """Counts over label records: transitions, candidates, verdict effects per actor and judge,
    retained candidates, labels that retain, and (when present) content-screening agreement."""
    effects: Counter = Counter()
    by_actor: dict[str, Counter] = {}
    by_judge: Counter = Counter()
    n_cand = n_kept = n_label_keep = n_screen_keep = n_agree = n_screened = 0
    for r in records:
        for c in r["candidates"]:
            n_cand += 1
            n_kept += bool(c["retained"])
            for actor, v in c["verdicts"].items():
                effects[v["effect"]] += 1
                by_actor.setdefault(actor, Counter())[v["effect"]] += 1
                by_judge[v["judge"]] += 1
            if "screen" in c:
                n_screen_keep += bool(c["screen"]["retained"])
        n_label_keep += r["label_text"] != NO_UPDATE
        if "content_label" in r:
            n_screened += 1
            n_agree += r["content_label"] == r["label"]
    return {"transitions": len(records), "candidates": n_cand,
            "transitions_without_candidate": sum(not r["candidates"] for r in records),
            "improvements": effects["improvement"], "degradations": effects["degradation"], "ties": effects["tie"],
            "by_actor": {a: dict(c) for a, c in sorted(by_actor.items())}, "verdicts_by_judge": dict(by_judge),
            "candidates_retained": n_kept, "labels_retaining": n_label_keep,
            "screen_retained": n_screen_keep, "content_label_agrees": n_agree, "screened_transitions": n_screened,
            "splits": sorted({r["split"] for r in records}),
            "tasks": len({r["task_id"] for r in records}),
            "wall_s": round(sum(r["wall_s"] for r in records), 1)}


__all__ = ["ContentScreen", "LABEL_SCHEMA", "ROLE", "SCREEN_QUESTION", "Transition", "label_counts", "label_record",
           "labels_file", "mine_transitions", "pending", "propose", "read_labels", "retained",
           "run_labels", "transition_label"]
