"""The learned calibrator: when to write an experience and which one (Sec. 6, step 4).

A convex ragged-candidate choice model, the concept model of :mod:`cb_core` applied to reviews:
per completed transition the *options* are the reviewer's candidate experiences plus ``NO
UPDATE`` (always last). The context is the Experience review prompt of the transition
(:func:`agent_shell.experience.review_prompt`, ending ``Experience:``), each option is scored as
its continuation after one space (:meth:`LanguageModel.score`: log Q, token count and the frozen
LM's last-layer hidden state at the option's final token, exactly the features of a concept), and

    P(option | transition) ∝ exp(log Qbar(option) + alpha . phi(option))      (seed Eq. 3)

with one alpha fitted by :func:`cb_core.fit` on the training labels (``label``: effect labels of
:mod:`agent_shell.studies.labels`, or ``content_label``: content screening). WHEN and WHAT
both come from the argmax: ``NO UPDATE`` means no update (WHEN), otherwise the chosen candidate
is the experience written (WHAT). Transitions whose only option is ``NO UPDATE`` decide nothing
and are left out of fitting and accuracy (counted).

The calibrator is one safetensors file (:class:`cb_core.Concept` format: ``alpha`` + JSON
metadata with ``task_type = "calibrator"``, the backbone, the feature spec, the labels field,
the judge, the fitting and held-out task ids and splits, and the proposal settings k /
temperature / review tokens that acting reuses). Loading it for another backbone, dtype, review
prompt version or formatting is refused (:meth:`Calibrator.check`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agent_shell.decision_scorer import DecisionRequest, DecisionScorer, ScoredDecision, choices
from agent_shell.experience import NO_UPDATE, REVIEW_VERSION, Review, parse_review, review_prompt
from agent_shell.features import DecisionInput
from agent_shell.history import StepLike
from agent_shell.lm.formatting import PLAIN
from agent_shell.lm.protocol import LanguageModel, backbone_dtype

if TYPE_CHECKING:
    from cb_core import Concept

#: ``task_type`` of a calibrator file (tells it from a concept).
KIND = "calibrator"
#: What goes between the review prompt and an option.
OPTION_PREFIX = " "
#: Label fields a calibrator can be fitted on.
LABEL_FIELDS = ("label", "content_label")


@dataclass(frozen=True)
class _Step:
    kind: str
    action: str
    observation: str


def effect_key(improvements: int, degradations: int) -> tuple[int, int]:
    """The label rule's sort key of a candidate: improvements minus degradations, then improvements."""
    return improvements - degradations, improvements


def record_steps(record: dict) -> list[_Step]:
    """The history of a label record as steps (``kind`` / ``action`` / ``observation``)."""
    return [_Step(s["kind"], s["action"], s["observation"]) for s in record["history"]]


def calibrator_feature_spec(lm: LanguageModel) -> dict[str, Any]:
    """How the calibrator's features are built; acting must use the same."""
    return {"formatting": PLAIN, "dtype": backbone_dtype(lm), "context": "experience review prompt",
            "review_version": REVIEW_VERSION, "option_prefix": OPTION_PREFIX,
            "options": "candidate experiences + NO UPDATE (last)"}


def option_request(instruction: str, observation: str, steps: Sequence[StepLike], index: int,
                   candidates: Sequence[str]) -> DecisionRequest:
    """The decision of transition ``index``'s review: options ``candidates + [NO UPDATE]`` after its
    review prompt (context), the history up to that transition."""
    prompt = review_prompt(instruction, observation, steps, index)
    return DecisionRequest(DecisionInput(prompt, instruction, observation, tuple(steps[:index + 1]),
                                         (*candidates, NO_UPDATE), OPTION_PREFIX))


def option_scores(lm: LanguageModel, instruction: str, observation: str, steps: Sequence[StepLike], index: int,
                  candidates: Sequence[str]) -> ScoredDecision:
    """The options ``candidates + [NO UPDATE]`` after the review prompt of transition ``index``, scored
    (:class:`agent_shell.decision_scorer.DecisionScorer`; phi = the LM's hidden states)."""
    return DecisionScorer(lm).score(option_request(instruction, observation, steps, index, candidates))


class Calibrator:
    """A fitted calibrator (a :class:`cb_core.Concept` with calibrator metadata)."""

    def __init__(self, concept: Concept):
        meta = concept.metadata
        if meta.get("task_type") != KIND:
            raise ValueError(f"not a calibrator file: task_type is {meta.get('task_type')!r}, expected {KIND!r}")
        self.concept = concept
        self.k = int(meta.get("k", 4))
        self.temperature = float(meta.get("temperature", 0.8))
        self.review_tokens = int(meta.get("review_tokens", 48))

    @property
    def metadata(self) -> dict:
        return self.concept.metadata

    @property
    def fingerprint(self) -> str:
        """Hash of alpha and the metadata (part of cache keys of calibrated reviews)."""
        h = hashlib.sha256(np.ascontiguousarray(self.concept.alpha).tobytes())
        h.update(json.dumps(self.metadata, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibrator:
        """Read a calibrator file (FileNotFoundError; ValueError when it is no calibrator)."""
        import cb_core

        return cls(cb_core.Concept.load(path))

    def save(self, path: str | os.PathLike) -> None:
        from cb_io.storage import write_bytes_atomic

        write_bytes_atomic(path, self.concept.to_bytes())

    def check(self, lm: LanguageModel) -> None:
        """Raise ValueError when ``lm`` (backbone, dtype) or this code's review prompt differ
        from what the calibrator was fitted with, naming the field."""
        meta = self.metadata
        if meta.get("backbone") != lm.name:
            raise ValueError(f"calibrator was fitted with backbone {meta.get('backbone')!r}, but acting uses {lm.name!r}")
        fitted = meta.get("features") if isinstance(meta.get("features"), dict) else {}
        for key, value in calibrator_feature_spec(lm).items():
            if fitted.get(key) != value:
                raise ValueError(f"calibrator was fitted with {key}={fitted.get(key)!r}, but acting uses {value!r}")

    def log_probs(self, scored: ScoredDecision) -> np.ndarray:
        """log P over the options (candidates + NO UPDATE) [M] float32."""
        return scored.log_probs(self.concept)

    def choose(self, lm: LanguageModel, instruction: str, observation: str, steps: Sequence[StepLike], index: int,
               candidates: Sequence[str]) -> tuple[int, np.ndarray]:
        """(index of the chosen option, log P over the options); ``len(candidates)`` = NO UPDATE.
        With no candidate, NO UPDATE is chosen without scoring."""
        if not candidates:
            return 0, np.zeros(1, np.float32)
        logp = self.log_probs(option_scores(lm, instruction, observation, steps, index, candidates))
        return int(np.argmax(logp)), logp

    def review(self, lm: LanguageModel, instruction: str, observation: str, steps: Sequence[StepLike], index: int,
               next_candidates: Sequence[str] = (), seed: int = 0) -> Review:
        """The calibrated review of transition ``index``: :attr:`k` sampled review replies parsed
        into distinct valid candidates (as in labelling), then the calibrator's choice among
        them and NO UPDATE. ``reply`` holds the sampled replies joined by `` | ``;
        ``options`` the candidates; ``experience`` the chosen one or None."""
        replies = lm.generate(review_prompt(instruction, observation, steps, index), max_new_tokens=self.review_tokens,
                              stop=("\n",), temperature=self.temperature, n=self.k, seed=seed + index)
        shown = [observation] + [s.observation for s in steps[:index + 1]]
        candidates: list[str] = []
        for reply in replies:
            experience, _ = parse_review(reply, next_candidates, shown)
            if experience is not None and experience.lower() not in {c.lower() for c in candidates}:
                candidates.append(experience)
        chosen, _ = self.choose(lm, instruction, observation, steps, index, candidates)
        experience = candidates[chosen] if chosen < len(candidates) else None
        return Review(index, " | ".join(replies), experience, "", tuple(candidates))


# ---------------------------------------------------------------------------------------------
# fitting and evaluation


def decisive(records: Sequence[dict]) -> list[dict]:
    """Records with at least one candidate (a choice among >= 2 options)."""
    return [r for r in records if len(r["options"]) >= 2]


def record_features(lm: LanguageModel, record: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hidden [M, d], log_q [M], n_tokens [M]) of a label record's options."""
    s = option_scores(lm, record["instruction"], record["observation"], record_steps(record), record["i"],
                      record["options"][:-1]).scores
    return np.asarray(s.hidden, np.float32), np.asarray(s.log_q, np.float32), np.asarray(s.n_tokens, np.int32)


def split_tasks(records: Sequence[dict], heldout_every: int = 3) -> tuple[list[str], list[str]]:
    """(fitting task ids, held-out task ids): the records' tasks in sorted order, every
    ``heldout_every``-th one held out (deterministic; task-disjoint). ValueError below 2."""
    if heldout_every < 2:
        raise ValueError(f"heldout_every must be >= 2, got {heldout_every}")
    tasks = sorted({r["task_id"] for r in records})
    held = [t for j, t in enumerate(tasks) if j % heldout_every == heldout_every - 1]
    return [t for t in tasks if t not in held], held


def fit_calibrator(lm: LanguageModel, records: Sequence[dict], features: Sequence[tuple], label_field: str = "label",
                   lam: float = 1.0, gamma: float = 0.8, extra: dict | None = None) -> Calibrator:
    """Fit alpha on ``records`` (decisive ones, with their ``features``) to ``label_field``.

    Raises ValueError for an unknown label field or when no record is decisive.
    """
    import cb_core

    if label_field not in LABEL_FIELDS:
        raise ValueError(f"unknown label field {label_field!r}; known: {list(LABEL_FIELDS)}")
    if not records:
        raise ValueError("no transition with a candidate experience to fit the calibrator on")
    missing = [r["item"] for r in records if label_field not in r]
    if missing:
        raise ValueError(f"label record {missing[0]!r} has no {label_field!r} (labelled without content screening?)")
    hidden, log_q, n_tokens = (list(x) for x in zip(*features))
    result = cb_core.fit(cb_core.decisions_from_lists(hidden, log_q, n_tokens, [r[label_field] for r in records]),
                         lam=lam, gamma=gamma)
    concept = cb_core.Concept.from_fit(
        result, backbone=lm.name, features=calibrator_feature_spec(lm), task_type=KIND,
        trajectories=sorted({r["task_id"] for r in records}),
        extra={"label_field": label_field, "n_decisions": len(records), **(extra or {})})
    return Calibrator(concept)


def predictions(calibrator: Calibrator | None, features: Sequence[tuple], gamma: float = 0.8) -> list[int]:
    """Argmax option per record (``calibrator`` None: the prior alone, alpha = 0), all records in one
    batched call (:func:`agent_shell.decision_scorer.choices`)."""
    import cb_core

    if not features:
        return []
    hidden, log_q, n_tokens = (list(x) for x in zip(*features))
    decisions = cb_core.decisions_from_lists(hidden, log_q, n_tokens, [0] * len(features))
    concept = calibrator.concept if calibrator is not None else cb_core.Concept.prior_only(decisions.hidden_size, gamma)
    return [int(c) for c in choices(concept, decisions)]


def tied_labels(record: dict, label_field: str) -> frozenset[int]:
    """The options as good as the record's ``label_field`` by the label rule itself: for an effect
    label that keeps a candidate, every retained candidate with the same sort key (improvements
    minus degradations, then improvements; :func:`agent_shell.studies.labels.transition_label`
    breaks that tie by taking the earliest); otherwise (NO UPDATE, content-screening labels, a
    record without per-candidate counts) the label alone."""
    y = record[label_field]
    candidates = record.get("candidates") or []
    if label_field != "label" or y >= len(candidates):
        return frozenset({y})
    best = effect_key(candidates[y]["improvements"], candidates[y]["degradations"])
    return frozenset(j for j, c in enumerate(candidates)
                     if c["retained"] and effect_key(c["improvements"], c["degradations"]) == best)


def accuracy(pred: Sequence[int], records: Sequence[dict], label_field: str) -> dict[str, Any]:
    """Top-1, top-1 among tied labels (``top1_tied``: the prediction is any option as good as the
    label by the label rule, :func:`tied_labels`), WHEN (update vs NO UPDATE) and WHAT (the same
    candidate, among records whose label updates and whose prediction updates) accuracies against
    ``label_field``, with 95% Wilson intervals; records without that field are left out."""
    from agent_shell.statistics import wilson_interval

    used = [(p, r) for p, r in zip(pred, records) if label_field in r]
    pairs = [(p, r[label_field], len(r["options"]) - 1) for p, r in used]
    top1 = sum(p == y for p, y, _ in pairs)
    tied = sum(p in tied_labels(r, label_field) for p, r in used)
    when = sum((p == none) == (y == none) for p, y, none in pairs)
    what_pairs = [(p, y) for p, y, none in pairs if y != none and p != none]
    what = sum(p == y for p, y in what_pairs)

    def cell(k: int, n: int) -> dict:
        lo, hi = wilson_interval(k, n)
        return {"k": k, "n": n, "rate": round(k / n, 4) if n else None, "ci95": [round(lo, 4), round(hi, 4)]}

    return {"top1": cell(top1, len(pairs)), "top1_tied": cell(tied, len(pairs)), "when": cell(when, len(pairs)),
            "what": cell(what, len(what_pairs))}


def baseline_predictions(records: Sequence[dict]) -> dict[str, list[int]]:
    """Fixed rules on the same options: always NO UPDATE, always the first candidate, and the
    content-screening label (when recorded) used as a prediction of the effect label."""
    out = {"always NO UPDATE": [len(r["options"]) - 1 for r in records],
           "always first candidate": [0 for _ in records]}
    if all("content_label" in r for r in records):
        out["content screening label"] = [r["content_label"] for r in records]
    return out


__all__ = ["Calibrator", "KIND", "LABEL_FIELDS", "OPTION_PREFIX", "accuracy", "baseline_predictions",
           "calibrator_feature_spec", "decisive", "effect_key", "fit_calibrator", "option_request", "option_scores",
           "predictions", "record_features", "record_steps", "split_tasks", "tied_labels"]
