"""Experience review: after each non-terminal transition the LM may keep one experience.

The Experience rendering (:mod:`agent_shell.history`) shows, beside a transition, an
*experience*: one concise statement of a general implication of the observation (not a plan,
not a concrete next action). A separate review call of the LM gets the task, the raw history,
the latest action and its observation, and replies either ``NO UPDATE`` or such a statement.
An invalid reply counts as ``NO UPDATE`` (:func:`parse_review` says why it is invalid).

Reviews are greedy (deterministic for a given backbone and dtype). Reviews of expert
trajectories (used for demonstrations and concept fitting under the Experience rendering) are
cached per trajectory in ``<cache>/experiences/<key>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from agent_shell.context import render_history, render_task
from agent_shell.history import StepLike
from agent_shell.lm.formatting import PLAIN
from agent_shell.lm.protocol import LanguageModel
from cb_io.records import Step, Trajectory
from cb_io.storage import write_json_atomic


#: The reply that keeps nothing.
NO_UPDATE = "NO UPDATE"


class ExperienceWriter(Protocol):
    """What writes the experiences in place of the plain review: the learned calibrator
    (:class:`agent_shell.calibration.Calibrator`), named here by what this module uses of it so
    that reviewing imports no calibration code."""

    @property
    def fingerprint(self) -> str:
        """A hash of the writer (part of the reviews' cache key)."""

    def review(self, lm: LanguageModel, instruction: str, observation: str, steps: Sequence[StepLike], index: int,
               next_candidates: Sequence[str] = (), seed: int = 0) -> Review:
        """The review of transition ``index`` (its ``experience``: the text kept, or None)."""
#: Bumped when the review prompt or the validity rules change (part of the cache key).
REVIEW_VERSION = 3

REVIEW_INSTRUCTION = (
    "Review the latest action and its observation. If the observation shows something general "
    "that is worth remembering for the rest of this task (for example, that an action has no "
    "effect here, or what a place contains), state it as one short experience sentence. Do not "
    f"write a plan or the next action. If there is nothing new, reply exactly {NO_UPDATE}."
)
#: An experience whose first this-many words occur verbatim in an observation copies it.
COPY_WORDS = 6
#: Longest experience kept, in words.
MAX_WORDS = 40
# whole words only: "Closed drawers ...", "Opening ...", "Plants ..." are no plans
_PLAN_START = re.compile(r"^(?:(?:next|then|now|i will|i'll|i should|i need|i must|let's|let me|plan|step \d+|"
                         r"you should|you need|try|go to|take|put|move|open|close|use|examine)\b|think:|>)",
                         re.IGNORECASE)
#: Wrapping an LM may put around a reply (quotes, markdown emphasis or code marks).
_WRAPPING = "\"'*`_ "


@dataclass(frozen=True)
class Review:
    """One review call's outcome.

    Attributes:
        step: index of the reviewed transition in the trajectory.
        reply: the LM's raw reply.
        experience: the kept experience, or None (``NO UPDATE`` or invalid).
        invalid: why the reply was rejected ("" when valid).
        options: a calibrated review's candidate experiences (the kept one, if any, among them;
            :meth:`agent_shell.calibration.Calibrator.review`); empty for a plain review.
    """

    step: int
    reply: str
    experience: str | None
    invalid: str = ""
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        out = {"step": self.step, "reply": self.reply, "experience": self.experience, "invalid": self.invalid}
        if self.options:
            out["options"] = list(self.options)
        return out


def review_prompt(instruction: str, observation: str, steps: Sequence[StepLike], index: int) -> str:
    """The review prompt of transition ``index``: task, raw history before it, the transition.

    The text is ordered so that consecutive reviews of one episode share their longest prefix
    (task + history), which the backend's KV cache reuses.
    """
    step = steps[index]
    history = render_history(steps[:index], "raw")
    parts = [render_task(instruction, observation)] + ([history] if history else [])
    return ("\n".join(parts) + f"\n\nLatest action: {step.action.strip()}\nObservation: "
            f"{step.observation.strip()}\n\n{REVIEW_INSTRUCTION}\nExperience:")


def parse_review(reply: str, actions: Sequence[str] = (),
                 observations: Sequence[str] = ()) -> tuple[str | None, str]:
    """(experience or None, reason it is invalid or "").

    The reply's whitespace is collapsed and surrounding quotes / markdown marks are removed.
    ``NO UPDATE`` (any case, any trailing text) keeps nothing and is valid. Invalid, hence kept as
    nothing: an empty reply; no letters; more than :data:`MAX_WORDS` words; a plan or a concrete
    next action (its first word(s) are those of one, e.g. "next", "I will", "go to", "open",
    or it starts with "> " or "think:"; "Opening ..." or "Closed ..." do not count), or it
    contains one of ``actions`` (of two or more words) verbatim, ignoring case: the candidate
    commands of the state after the reviewed step; or it copies an observation instead of stating
    an implication: its first :data:`COPY_WORDS` words (or all, if fewer) occur verbatim, ignoring
    case and punctuation, in one of ``observations`` (the initial and every shown observation).
    """
    text = " ".join(reply.split()).strip(_WRAPPING)
    if text.upper().startswith(NO_UPDATE):
        return None, ""
    if not text:
        return None, "empty"
    if not re.search(r"[A-Za-z]", text):
        return None, "no letters"
    if len(text.split()) > MAX_WORDS:
        return None, f"longer than {MAX_WORDS} words"
    if _PLAN_START.match(text):
        return None, "plan or next action"
    low = text.lower()
    for a in actions:
        if a and len(a.split()) > 1 and a.lower() in low:
            return None, f"names the action {a!r}"
    head = _words(text)[:COPY_WORDS]
    if head:
        needle = f" {' '.join(head)} "
        if any(needle in f" {' '.join(_words(o))} " for o in observations):
            return None, "copies an observation"
    return text, ""


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def review_transition(lm: LanguageModel, instruction: str, observation: str, steps: Sequence[StepLike], index: int,
                      candidates: Sequence[str] = (), max_new_tokens: int = 48) -> Review:
    """Run one review call of ``lm`` on transition ``index`` (greedy, one line).

    ``candidates``: the candidate commands of the state *after* the transition (the next
    action's options; an acting agent's ``episode.candidates()`` right after the step).
    """
    reply = lm.generate(review_prompt(instruction, observation, steps, index), max_new_tokens=max_new_tokens,
                        stop=("\n",), temperature=0.0, n=1)[0]
    shown = [observation] + [s.observation for s in steps[:index + 1]]
    experience, invalid = parse_review(reply, candidates, shown)
    return Review(index, reply, experience, invalid)


def reviewable(steps: Sequence[Step]) -> list[int]:
    """Indices of non-terminal environment transitions (the ones that get a review)."""
    return [i for i, s in enumerate(steps) if s.kind == "env" and not s.done]


def candidates_after(steps: Sequence[Step], index: int) -> list[str]:
    """The candidate set of the state after step ``index`` of a recorded trajectory: that of the
    next environment step (an acting agent sees the same set right after the step), without a
    gold action a collector appended to it (``info["expert_appended"]``); [] if none."""
    for s in steps[index + 1:]:
        if s.kind == "env":
            candidates = list(s.candidates or ())
            if (s.info or {}).get("expert_appended") and candidates and candidates[-1] == s.action:
                candidates.pop()
            return candidates
    return []


def review_trajectory(lm: LanguageModel, trajectory: Trajectory, cache_dir: str | os.PathLike | None = None,
                      calibrator: ExperienceWriter | None = None) -> dict[int, str]:
    """Experiences of every non-terminal transition of an expert ``trajectory`` (step -> text).

    ``calibrator``: a :class:`agent_shell.calibration.Calibrator` that writes the experiences
    (rendering "calibrator") instead of the plain greedy review.
    Cached in ``<cache_dir>/experiences/<key>.json``; the key hashes the backbone, its dtype,
    :data:`REVIEW_VERSION`, the calibrator's fingerprint (if any) and the trajectory's text.
    """
    steps = trajectory.steps
    tag = [calibrator.fingerprint] if calibrator is not None else []
    payload = json.dumps([REVIEW_VERSION, lm.name, PLAIN, str(getattr(lm, "dtype", "")), *tag,
                          trajectory.instruction, trajectory.observation,
                          [(s.kind, s.action, s.observation, s.done) for s in steps]], ensure_ascii=False)
    key = hashlib.sha256(payload.encode()).hexdigest()[:32]
    path = Path(cache_dir) / "experiences" / f"{key}.json" if cache_dir is not None else None
    if path is not None and path.exists():
        return {int(k): v for k, v in json.loads(path.read_text())["experiences"].items()}
    out: dict[int, str] = {}
    reviews = []
    for i in reviewable(steps):
        if calibrator is not None:
            r = calibrator.review(lm, trajectory.instruction, trajectory.observation, steps, i,
                                  candidates_after(steps, i))
        else:
            r = review_transition(lm, trajectory.instruction, trajectory.observation, steps, i,
                                  candidates_after(steps, i))
        reviews.append(r.to_dict())
        if r.experience is not None:
            out[i] = r.experience
    if path is not None:
        write_json_atomic(path, {"task_id": trajectory.task_id, "experiences": {str(k): v for k, v in out.items()},
                                 "reviews": reviews})
    return out
