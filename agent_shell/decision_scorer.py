"""One decision scorer: a candidate set scored by the LM and, given a concept, by the concept (seed Eq. 3).

Acting (:class:`agent_shell.agents.cb_agent.CBAgent`), fitting (:mod:`agent_shell.concepts`),
evaluation (:func:`decision_accuracy`) and the calibrator
(:mod:`agent_shell.calibration.calibrator`) all score a decision here:

* :func:`decision_context` builds the scoring context x of a decision, for acting and fitting
  alike (the run's seed is required: the shuffle renderings read it);
* a :class:`DecisionRequest` is one decision as the feature extractors see it
  (:class:`agent_shell.features.DecisionInput`) plus the inner LM layers its features want;
* :meth:`DecisionScorer.decide` takes one request's decision under a concept (acting): the
  concept's decision head handed to the backend (:func:`agent_shell.lm.decision.decide`) when the
  features are its hidden states (the pass and the decision on its device, one fetch after the
  argmax), else from the scored features on the host through the same head;
* :meth:`DecisionScorer.score` scores one request, :meth:`DecisionScorer.score_many` a
  list of them (fitting; the shape of lm-evaluation-harness's ``loglikelihood(requests)``). The LM
  runs once per request: the ``lm-layer:K`` states come from the same forward pass as log q and
  the last-layer hidden states when the backend can capture them
  (:meth:`agent_shell.lm.hf.HFLanguageModel.score_with_layers`);
* a :class:`ScoredDecision` holds per candidate the LM's scores and the feature matrix phi's input
  (the raw blocks side by side, float32 [M, k]) and gives log P, the prior term (log Qbar after
  length normalisation) and the concept term alpha . phi (float32 [M]) from one cb_core kernel
  (:meth:`ScoredDecision.terms`: one validation, one padding, one compiled call);
* :func:`batch_log_probs` is log P over many decisions in one cb_core call (evaluation), and
  :func:`batch_terms` all three terms, in one cb_core call too.

cb_core (JAX) is imported only when something is computed under a concept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from agent_shell import context as ctx
from agent_shell.features import DecisionInput, FeatureSet
from agent_shell.features.lm_states import LMLayer
from agent_shell.history import StepLike
from agent_shell.lm.protocol import CandidateScores, Context, Decided, DeviceScores, LanguageModel

if TYPE_CHECKING:
    from cb_core import Concept, LabelledDecisions
    from cb_core.model import Terms

#: An inner LM layer wanted from the candidates' pass: (layer, pool), as ``lm-layer:K[:pool]`` names it.
LayerSpec = tuple[int, str]


def decision_context(instruction: str, observation: str, history: Sequence[StepLike], *, rendering: str, layout: str,
                     seed: int, memory: Sequence[str] = (), experiences: Mapping[int, str] | None = None,
                     reference: ctx.Reference | None = None) -> Context:
    """The scoring context x of one decision (:func:`agent_shell.context.scoring_context`): the one
    construction acting and fitting share, so a concept is fitted on the text the agent reads.

    ``seed`` has no default: the shuffle renderings (``shuffle-all``, ``shuffle-old``) order the
    history by it. Raises ValueError for an unknown rendering or layout, or an empty task.
    """
    return ctx.scoring_context(instruction, observation, history, rendering, memory, layout=layout,
                               experiences=experiences, seed=seed, reference=reference)


@dataclass(frozen=True)
class DecisionRequest:
    """One decision to score.

    Attributes:
        decision: the context, the task, the executed history and the candidate set (M >= 1).
        layers: the inner layers whose states at the candidates' action tokens the features read
            (``lm-layer:K[:pool]``), taken from the same forward pass as the scores when the
            backend can.
    """

    decision: DecisionInput
    layers: tuple[LayerSpec, ...] = ()


@dataclass(frozen=True)
class ScoredDecision:
    """A scored candidate set.

    Attributes:
        candidates: the candidate set A (M strings), in scoring order.
        scores: the LM's :class:`CandidateScores` (log_q [M] float32, n_tokens [M] int32, hidden
            [M, d] float32; ``layers``: the requested inner-layer states).
        phi: float32 [M, k], what the concept reads in the place of the hidden states (the raw
            feature blocks side by side; cb_core standardises each column over A and appends the
            bias coordinate). ``scores.hidden`` itself for ``lm-hidden``.
    """

    candidates: tuple[str, ...]
    scores: CandidateScores
    phi: np.ndarray

    def terms(self, concept: Concept) -> Terms:
        """The terms of Eq. 3 under ``concept`` (it carries gamma and eps), each float32 [M]:
        ``log_p`` = log-softmax over A of (prior + concept term), ``prior`` = log Qbar(a | x) =
        log q / n_tokens ** gamma log-normalised over A, ``concept_term`` = alpha . phi(x, a; A)
        (phi standardised over A with the concept's eps, bias coordinate included); one kernel
        (:meth:`cb_core.Concept.terms`), whose ``log_p`` is the one the agent acts on.

        Raises:
            ValueError: phi's width differs from the concept's d, or non-finite scores.
        """
        return concept.terms(self.phi, self.scores.log_q, self.scores.n_tokens)

    def log_probs(self, concept: Concept) -> np.ndarray:
        """log P(a | x) under ``concept`` (Eq. 3), float32 [M]: the ``log_p`` of :meth:`terms`."""
        return self.terms(concept).log_p


class DecisionScorer:
    """Scores decisions with one backbone and one feature set.

    Args:
        lm: the backbone that scores the candidates (log q, token counts, hidden states).
        features: what a concept sees (default the seed's ``lm-hidden``).
    """

    def __init__(self, lm: LanguageModel, features: FeatureSet | None = None):
        self.lm = lm
        self.features = features if features is not None else FeatureSet.from_spec()
        #: phi is the LM's hidden states (``lm-hidden``): no extractor runs, and a decision is
        #: taken where they lie (:meth:`decide`)
        self.reads_hidden_only: bool = self.features.is_default
        self.layers: tuple[LayerSpec, ...] = tuple((e.layer, e.pool) for e in self.features.extractors
                                                   if isinstance(e, LMLayer))

    def request(self, decision: DecisionInput) -> DecisionRequest:
        """The request for ``decision`` with the layers this scorer's features read."""
        return DecisionRequest(decision, self.layers)

    def lm_scores(self, request: DecisionRequest) -> CandidateScores:
        """One LM pass over the request's candidates: :meth:`LanguageModel.score`, with the requested
        layers' states in ``layers`` when the backend has ``score_with_layers`` (otherwise an
        ``lm-layer`` block asks the backend for them itself).

        Raises:
            ValueError: what the backend's ``score`` raises (empty candidates, a full window, ...).
        """
        d = request.decision
        with_layers = getattr(self.lm, "score_with_layers", None)
        if request.layers and callable(with_layers):
            return with_layers(d.context, d.candidates, d.action_prefix, request.layers)
        return self.lm.score(d.context, d.candidates, d.action_prefix)

    def score(self, request: DecisionRequest, scores: CandidateScores | None = None) -> ScoredDecision:
        """One decision scored (acting). ``scores``: the LM's scores when already known (none: one
        pass of :meth:`lm_scores`).

        Raises:
            ValueError: see :meth:`lm_scores`; a feature block of the wrong shape or non-finite.
        """
        scores = self.lm_scores(request) if scores is None else scores
        if self.reads_hidden_only:
            phi = np.asarray(scores.hidden, np.float32)
        else:
            phi = self.features.extract(request.decision, self.lm, scores)
        return ScoredDecision(request.decision.candidates, scores, phi)

    def decide(self, request: DecisionRequest, concept: Concept) -> Decided:
        """The request's decision under ``concept`` (Eq. 3, Eq. 7: the terms and their argmax).

        With phi = the LM's hidden states and no inner layers asked for, the concept's decision
        head goes to the backend (:func:`agent_shell.lm.decision.decide`: on its device when it
        has one, one fetch); otherwise the request is scored on the host (:meth:`score`) and its
        features decided on by the same head (:func:`agent_shell.lm.decision.decide_scores`).

        Raises:
            ValueError: what :meth:`score` raises; features whose width differs from the concept's
                d; non-finite scores (naming the candidate).
        """
        from agent_shell.lm.decision import decide, decide_scores

        d = request.decision
        if self.reads_hidden_only and not request.layers:
            return decide(self.lm, d.context, d.candidates, d.action_prefix, concept.decision_head)
        scored = self.score(request)
        return decide_scores(concept.decision_head, DeviceScores.from_host(scored.scores, scored.phi))

    def score_many(self, requests: Sequence[DecisionRequest], scores: Sequence[CandidateScores] | None = None,
                   cache_dir=None) -> tuple[list[ScoredDecision], float]:
        """Many decisions scored (fitting, evaluation), each feature block read from / written to the
        block cache under ``cache_dir`` for the decisions together
        (:meth:`FeatureSet.extract_trajectory`). ``scores``: the LM's scores when already known
        (e.g. from the features cache), else one pass per request. Returns (the scored decisions in
        request order, seconds spent in the LM and the extractors)."""
        start = time.perf_counter()
        scores = [self.lm_scores(r) for r in requests] if scores is None else list(scores)
        if self.reads_hidden_only:
            phi = [np.asarray(s.hidden, np.float32) for s in scores]
        else:
            phi, _ = self.features.extract_trajectory([r.decision for r in requests], self.lm, scores, cache_dir)
        out = [ScoredDecision(r.decision.candidates, s, x) for r, s, x in zip(requests, scores, phi)]
        return out, time.perf_counter() - start


def _check_width(concept: Concept, width: int) -> None:
    if width != concept.hidden_size:
        raise ValueError(f"features of width {width} differ from the concept's d = {concept.hidden_size}")


def batch_log_probs(concept: Concept, decisions: LabelledDecisions) -> list[np.ndarray]:
    """log P(a | x) under ``concept`` (its alpha, gamma, eps) for every decision of a ragged set in one
    cb_core call (:func:`cb_core.log_probs`): one float32 [M_i] array per decision, in order.

    Raises:
        ValueError: the decisions' feature width differs from the concept's d.
    """
    import cb_core

    _check_width(concept, decisions.hidden_size)
    flat = np.asarray(cb_core.log_probs(concept.alpha, decisions, concept.gamma, concept.eps), np.float32)
    off = np.asarray(decisions.offsets)
    return [flat[a:b] for a, b in zip(off[:-1], off[1:])]


def batch_terms(concept: Concept, decisions: LabelledDecisions) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(the prior term log Qbar, the concept term alpha . phi, log P) under ``concept`` for every
    decision of a ragged set, each float32 [M_i], in order: what :class:`ScoredDecision` gives for
    one decision, in one batched cb_core call (evaluation's per-decision record).

    Raises:
        ValueError: the decisions' feature width differs from the concept's d.
    """
    import cb_core

    _check_width(concept, decisions.hidden_size)
    log_p, prior, term = (np.asarray(x, np.float32)
                          for x in cb_core.terms(concept.alpha, decisions, concept.gamma, concept.eps))
    off = np.asarray(decisions.offsets)
    return [(prior[a:b], term[a:b], log_p[a:b]) for a, b in zip(off[:-1], off[1:])]


def choices(concept: Concept, decisions: LabelledDecisions) -> np.ndarray:
    """int [N]: the argmax of log P per decision (Eq. 7; the lowest index among exact ties)."""
    return np.array([int(np.argmax(lp)) for lp in batch_log_probs(concept, decisions)], dtype=np.int64)


def decision_accuracy(features: Mapping, concepts: Mapping[str, Concept], gamma: float = 0.8) -> list[dict]:
    """Top-1 accuracy on expert decisions (teacher forcing), per task type then ``all``.

    ``features``: task type -> :class:`agent_shell.concepts.TypeFeatures`; ``concepts``: task type ->
    concept. Each row: ``task_type``, ``decisions``, ``mean_candidates``, and for ``prior`` (alpha = 0
    with ``gamma``) and ``concept`` (the type's concept with its own gamma and eps): ``acc_*`` (None
    without a concept), the hit counts ``hits_*`` and the 95% Wilson intervals ``ci_*`` = [low, high].
    One batched cb_core call per task type and model. A type without a concept counts as misses in
    ``all``.
    """
    import cb_core

    from agent_shell.statistics import wilson_interval

    def with_intervals(row: dict, hits: dict, has_concept: bool) -> dict:
        n = row["decisions"]
        for name in ("prior", "concept"):
            known = name == "prior" or has_concept
            row[f"acc_{name}"] = hits[name] / n if known else None
            row[f"hits_{name}"] = int(hits[name]) if known else None
            row[f"ci_{name}"] = list(wilson_interval(int(hits[name]), n)) if known else None
        return row

    rows, totals = [], {"n": 0, "prior": 0, "concept": 0, "sizes": 0}
    for task_type, tf in sorted(features.items()):
        if not tf.n_decisions:
            continue
        decisions = tf.decisions()
        expert = np.asarray(tf.expert)
        concept = concepts.get(task_type)
        prior = cb_core.Concept.prior_only(decisions.hidden_size, gamma)
        hits = {"prior": int(np.sum(choices(prior, decisions) == expert)),
                "concept": 0 if concept is None else int(np.sum(choices(concept, decisions) == expert))}
        n = tf.n_decisions
        sizes = float(np.mean([len(x) for x in tf.log_q]))
        rows.append(with_intervals({"task_type": task_type, "decisions": n, "mean_candidates": sizes}, hits,
                                   concept is not None))
        totals["n"] += n
        totals["prior"] += hits["prior"]
        totals["concept"] += hits["concept"]
        totals["sizes"] += sizes * n
    if totals["n"]:
        rows.append(with_intervals({"task_type": "all", "decisions": totals["n"],
                                    "mean_candidates": totals["sizes"] / totals["n"]}, totals, True))
    return rows


def accuracy_cell(row: dict, name: str) -> str:
    """``"45.0% [30.1, 60.9]"``: a :func:`decision_accuracy` row's accuracy ``name`` (prior or concept)
    and its 95% Wilson interval, ``-`` without a concept."""
    if row[f"acc_{name}"] is None:
        return "-"
    low, high = row[f"ci_{name}"]
    return f"{100 * row[f'acc_{name}']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


__all__ = ["DecisionRequest", "DecisionScorer", "LayerSpec", "ScoredDecision", "accuracy_cell", "batch_log_probs",
           "batch_terms", "choices", "decision_accuracy", "decision_context"]
