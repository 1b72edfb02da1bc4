"""Concept fitting from expert trajectories (seed Sec. 3.2, Eqs. (5)-(6); App. B).

For every environment step of a *won* expert trajectory, the decision's context is the
scoring context the acting agent builds (:func:`agent_shell.decision_scorer.decision_context`:
task + history with thoughts, no demonstrations, the run's seed) and its candidate set the saved environment set filtered exactly as the
acting agent filters it (:func:`agent_shell.candidates.drop_excluded`). The evaluated backbone
recomputes log Q, token counts and hidden states for these (:meth:`LanguageModel.score`); one
concept per task type is then fitted with :func:`cb_core.fit`.

Expert steps whose action the filter removes (ALFWorld's handcoded expert issues ``look``
often), and gold actions a collector had to append to an incomplete engine set (ScienceWorld;
the acting agent can never choose them), stay in later contexts' histories but are no fitting
target; they are counted per task type and action (:attr:`TypeFeatures.skipped_actions`).

What the concept sees of each candidate is a :class:`agent_shell.features.FeatureSet` (default:
the seed's ``lm-hidden``); its blocks, side by side, take the place of the hidden states in the
decisions handed to cb_core, and its description is recorded in every concept
(``metadata["features"]["extractors"]``) and checked when acting.

Every decision is scored by :class:`agent_shell.decision_scorer.DecisionScorer`, as the acting
agent scores its own. The LM's scores (log q, token counts, last-layer hidden states) are cached
per trajectory under ``<cache>/features/<key>.npz``, the key hashing the backbone name, its dtype, the rendering, the
layout, the action prefix and every decision's context, candidates and expert index, so a refit (new
lam, gamma) costs no LM time and any change of the text invalidates the cache. Every other block
is cached per trajectory and extractor under ``<cache>/features/blocks/``
(:mod:`agent_shell.features.cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from agent_shell.candidates import drop_excluded
from agent_shell.context import action_prefix
from agent_shell.decision_scorer import DecisionScorer, decision_context
from agent_shell.expert_decisions import EXPERT_LABEL, decision_examples
from agent_shell.feature_settings import FeatureSettings
from agent_shell.history import REVIEWED, SEEDED_RENDERINGS
from agent_shell.lm.formatting import PLAIN
from agent_shell.features import DecisionInput, check_extractors, recorded_extractors
from agent_shell.lm.protocol import CandidateScores, Context, LanguageModel, backbone_dtype
from cb_io.records import Trajectory
from cb_io.storage import atomic_folder, atomic_path, write_bytes_atomic

if TYPE_CHECKING:
    from cb_core import Concept

#: One fitting decision as text: (scoring context, candidate set, expert index).
DecisionText = tuple[Context, list[str], int]

#: Bumped when the cached feature layout or the context construction changes.
FEATURE_VERSION = 2


@dataclass
class TypeFeatures:
    """Decisions of one task type, with the bookkeeping the report needs.

    Attributes:
        task_type: the type.
        phi, log_q, n_tokens, expert: per-decision lists ([M_i, k] float32 features phi: the
            feature set's blocks side by side, the LM's hidden states for the default
            ``lm-hidden``; [M_i] float32, [M_i] int, int) ready for
            :func:`cb_core.decisions_from_lists`.
        task_ids: trajectories used (won only), in order.
        decision_task_ids: per decision, the trajectory it comes from (the folds of ``lam="auto"``
            never split one).
        n_lost: expert trajectories left out because they were not won.
        n_env_steps: environment steps of the used trajectories.
        skipped_actions: expert actions that were no fitting target (filtered out), counted.
        lm_seconds: time spent on features in this call, LM scoring and other blocks (0 when all
            came from the cache).
        max_candidates: the cap on each decision's candidate set (0: none;
            :attr:`FeatureSettings.max_candidates`).
    """

    task_type: str
    phi: list[np.ndarray] = field(default_factory=list)
    log_q: list[np.ndarray] = field(default_factory=list)
    n_tokens: list[np.ndarray] = field(default_factory=list)
    expert: list[int] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    decision_task_ids: list[str] = field(default_factory=list)
    n_lost: int = 0
    n_env_steps: int = 0
    skipped_actions: Counter = field(default_factory=Counter)
    lm_seconds: float = 0.0
    max_candidates: int = 0

    @property
    def n_decisions(self) -> int:
        return len(self.expert)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped_actions.values())

    def decisions(self):
        """The decisions as a :class:`cb_core.LabelledDecisions` (raises ValueError when there are none)."""
        import cb_core

        if not self.expert:
            raise ValueError(f"task type {self.task_type!r} has no decisions to fit "
                             f"({len(self.task_ids)} won trajectories, {self.n_lost} lost)")
        return cb_core.decisions_from_lists(self.phi, self.log_q, self.n_tokens, self.expert)


def decision_inputs(trajectory: Trajectory, settings: FeatureSettings,
                    experiences: dict[int, str] | None = None,
                    relabelled: bool = False) -> tuple[list[tuple[DecisionInput, int]], Counter]:
    """(decision as the feature extractors see it, expert index) per fitting decision, and the
    skipped expert actions; ``settings.max_candidates`` (0: all) caps each candidate set, the
    expert's action kept (:func:`agent_shell.expert_decisions.capped_candidates`).

    Contexts are :func:`agent_shell.decision_scorer.decision_context` under the settings'
    rendering, layout and seed (the shuffle renderings read it), as the acting agent builds them
    (``experiences``: the expert trajectory's reviewed experiences, rendering "experience").

    ``relabelled``: an agent's episode whose steps carry the expert's label
    (:func:`agent_shell.expert_decisions.decision_examples`): the labels are the targets, and only
    labelled steps the filter removed count as skipped (keyed by the label).

    Raises ValueError (from :func:`agent_shell.expert_decisions.decision_examples`) for an expert
    action outside its saved candidate set.
    """
    examples, _ = decision_examples(trajectory, candidate_filter=drop_excluded, skip_expert_appended=True,
                                    max_candidates=settings.max_candidates, relabelled=relabelled)
    kept = {e.step_index for e in examples}
    target = (lambda s: s.info.get(EXPERT_LABEL)) if relabelled else (lambda s: s.action)
    skipped = Counter(target(s) for i, s in enumerate(trajectory.steps)
                      if s.kind == "env" and i not in kept and target(s) is not None)
    out = [(DecisionInput(decision_context(e.instruction, e.observation, e.history, rendering=settings.rendering,
                                           layout=settings.layout, seed=settings.seed, experiences=experiences),
                          e.instruction, e.observation, e.history, e.candidates, action_prefix(settings.layout)),
            e.expert_index) for e in examples]
    return out, skipped


def decision_texts(trajectory: Trajectory, settings: FeatureSettings,
                   experiences: dict[int, str] | None = None) -> tuple[list[DecisionText], Counter]:
    """(context, candidates, expert index) per fitting decision, and the skipped expert actions
    (:func:`decision_inputs` without the rest of the decision)."""
    inputs, skipped = decision_inputs(trajectory, settings, experiences)
    return [(d.context, list(d.candidates), e) for d, e in inputs], skipped


def feature_key(lm: LanguageModel, settings: FeatureSettings, texts: Sequence[DecisionText]) -> str:
    """Content hash of everything the LM's scores of one trajectory depend on (the texts hold the
    contexts and candidate sets the settings built)."""
    payload = json.dumps([FEATURE_VERSION, lm.name, PLAIN, backbone_dtype(lm), settings.rendering, settings.layout,
                          action_prefix(settings.layout), list(texts)], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def trajectory_scores(scorer: DecisionScorer, inputs: Sequence[tuple[DecisionInput, int]], settings: FeatureSettings,
                      cache_dir: str | os.PathLike | None) -> tuple[list[CandidateScores], float]:
    """The LM's :class:`CandidateScores` of each fitting decision of one trajectory (``inputs``: from
    :func:`decision_inputs`), and LM seconds spent.

    Read from ``cache_dir/features/<key>.npz`` when present (log q, token counts, hidden states);
    computed otherwise (one pass per decision, with the inner layers the scorer's features read)
    and saved.
    """
    import time

    import cb_core

    lm = scorer.lm
    texts = [(d.context, list(d.candidates), e) for d, e in inputs]
    path = None
    if cache_dir is not None and texts:
        path = Path(cache_dir) / "features" / f"{feature_key(lm, settings, texts)}.npz"
        if path.exists():
            dec = cb_core.load_decisions(path)
            off = np.asarray(dec.offsets)
            return ([CandidateScores(np.asarray(dec.log_q[a:b]), np.asarray(dec.n_tokens[a:b]),
                                     np.asarray(dec.hidden[a:b])) for a, b in zip(off[:-1], off[1:])], 0.0)
    start = time.perf_counter()
    scores = []
    for d, _ in inputs:
        s = scorer.lm_scores(scorer.request(d))
        scores.append(CandidateScores(np.asarray(s.log_q, np.float32), np.asarray(s.n_tokens),
                                      np.asarray(s.hidden, np.float32), s.layers))
    seconds = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        decisions = cb_core.decisions_from_lists([s.hidden for s in scores], [s.log_q for s in scores],
                                                 [s.n_tokens for s in scores], [e for _, _, e in texts])
        with atomic_path(path, suffix=".npz") as tmp, open(tmp, "wb") as f:
            cb_core.write_decisions(f, decisions, metadata={"backbone": lm.name, "formatting": PLAIN,
                                                            "rendering": settings.rendering,
                                                            "layout": settings.layout})
    return scores, seconds


def features_cached(lm: LanguageModel, trajectory: Trajectory, settings: FeatureSettings,
                    cache_dir: str | os.PathLike) -> bool:
    """Whether :func:`collect_features` would read ``trajectory``'s LM scores from ``cache_dir``
    without LM time (a lost trajectory has none to compute: True). The reviewed renderings
    ("experience", "calibrator") depend on reviews of the trajectory and raise ValueError."""
    if settings.rendering in REVIEWED:
        raise ValueError(f"features_cached cannot tell for rendering {settings.rendering!r} (it needs reviews)")
    if not trajectory.won:
        return True
    texts, _ = decision_texts(trajectory, settings)
    return not texts or (Path(cache_dir) / "features" / f"{feature_key(lm, settings, texts)}.npz").exists()


def collect_features(lm: LanguageModel, trajectories: Iterable[Trajectory], settings: FeatureSettings,
                     cache_dir: str | os.PathLike | None = None,
                     on_trajectory: Callable[[Trajectory], None] | None = None,
                     reviewer: LanguageModel | None = None, relabelled: bool = False) -> dict[str, TypeFeatures]:
    """Features of every won trajectory, grouped by task type (lost ones are only counted).

    ``settings``: everything the features depend on besides the backbone and the text, built once
    from the run's settings (:func:`agent_shell.configure.feature_settings`): the rendering, layout and
    seed of the contexts (as acting builds them), the feature set (its blocks are computed, or
    read from the cache, after the LM's scores), the cap on each candidate set (the expert's
    action kept; the cached scores' key holds the candidates, so capped and uncapped features
    never mix) and the calibrator.

    Rendering "experience": each trajectory's transitions are first reviewed by ``reviewer``
    (default ``lm``; :func:`agent_shell.experience.review_trajectory`, cached), and the kept
    experiences enter its contexts as they would while acting; rendering "calibrator": the
    same with the settings' calibrator choosing the experiences.

    ``relabelled``: the trajectories are agent episodes the expert labelled, won or lost
    (:func:`decision_inputs`): every labelled step is a decision whose target is the label.
    """
    scorer = DecisionScorer(lm, settings.feature_set)
    by_type: dict[str, TypeFeatures] = {}
    for traj in trajectories:
        tf = by_type.setdefault(traj.task_type, TypeFeatures(traj.task_type, max_candidates=settings.max_candidates))
        if not traj.won and not relabelled:
            tf.n_lost += 1
            continue
        experiences = None
        if settings.rendering in REVIEWED:
            from agent_shell.experience import review_trajectory

            experiences = review_trajectory(reviewer if reviewer is not None else lm, traj, cache_dir,
                                            settings.calibrator)
        inputs, skipped = decision_inputs(traj, settings, experiences, relabelled)
        scores, seconds = trajectory_scores(scorer, inputs, settings, cache_dir)
        scored, block_seconds = scorer.score_many([scorer.request(d) for d, _ in inputs], scores, cache_dir)
        if not scorer.features.is_default:
            seconds += block_seconds
        for s, (_, e) in zip(scored, inputs):
            tf.phi.append(s.phi)
            tf.log_q.append(s.scores.log_q)
            tf.n_tokens.append(s.scores.n_tokens)
            tf.expert.append(e)
            tf.decision_task_ids.append(traj.task_id)
        tf.task_ids.append(traj.task_id)
        tf.n_env_steps += traj.n_env_steps
        tf.skipped_actions.update(skipped)
        tf.lm_seconds += seconds
        if on_trajectory is not None:
            on_trajectory(traj)
    return by_type


def fit_devices(lm: LanguageModel) -> list | None:
    """Where the concepts of ``lm``'s features are fitted: this host's devices of a JAX backbone
    laid out over several (:class:`agent_shell.lm.jax_mesh.Placement`), so the fits spread over the
    backbone's mesh (:func:`cb_core.fit_many`'s ``devices``); None (JAX's default device) otherwise."""
    placement = getattr(lm, "placement", None)
    local = placement.local_devices() if placement is not None else []
    return local if len(local) > 1 else None


def strength_curves(features: Mapping[str, TypeFeatures], gamma: float = 0.8, eps: float = 1e-6,
                    devices: list | None = None) -> dict:
    """Task type -> :class:`cb_core.StrengthCurve`: each type's L2 strength chosen by cross-validation
    over its trajectories (:func:`cb_core.select_strengths` with :data:`cb_core.strength.DEFAULT_GRID`,
    :data:`~cb_core.strength.DEFAULT_FOLDS` folds and the default rule: lam = 1 unless a strength beats
    it on held-out top-1 by more than :data:`~cb_core.strength.DEFAULT_Z` paired standard errors with a
    held-out log-likelihood no lower),
    every type x fold x strength in one batched fit. Types without decisions are left out.

    ``devices``: where the fits run (:func:`fit_devices`; None: JAX's default device).

    Raises:
        ValueError: a type with fewer than 2 won trajectories (naming it), or decisions that carry no
            trajectory labels.
    """
    import cb_core

    typed = {t: tf for t, tf in sorted(features.items()) if tf.n_decisions}
    for t, tf in typed.items():
        if len(tf.decision_task_ids) != tf.n_decisions:
            raise ValueError(f"--lam auto: the decisions of task type {t!r} carry no trajectory labels")
        n = len(set(tf.decision_task_ids))
        if n < 2:
            raise ValueError(f"--lam auto: task type {t!r} has {n} won trajectory; cross-validation needs 2 "
                             "(raise --demos-per-type, or pass a number to --lam)")
    if not typed:
        return {}
    curves = cb_core.select_strengths([tf.decisions() for tf in typed.values()],
                                      [tf.decision_task_ids for tf in typed.values()], gamma=gamma, eps=eps,
                                      devices=devices)
    return dict(zip(typed, curves))


def fit_concepts(features: dict[str, TypeFeatures], lm: LanguageModel, settings: FeatureSettings,
                 lam: float | str = 1.0, gamma: float = 0.8, eps: float = 1e-6, env_name: str = "",
                 warm: Mapping[str, Concept] | None = None) -> dict[str, Concept]:
    """One :class:`cb_core.Concept` per task type with decisions (seed Eq. (6)).

    The metadata records everything acting must match (backbone, ``features`` =
    :func:`concept_feature_spec`, with the feature set's description, gamma, eps; the rendering
    also at top level) and the fit summary and data counts (decisions, skipped expert steps by
    action). ``features`` must have been collected with the same ``settings``. Types without any
    decision are left out. ``lam``: the strength, or ``"auto"``: each type's chosen by
    :func:`strength_curves`, its whole curve in the metadata (``strength``). ``warm``: task type ->
    a concept whose alpha starts that type's fit (:func:`cb_core.fit`'s ``init``; the same optimum,
    reached from nearer; its fit summary records ``warm_start``); a type without one, or with
    another hidden size, starts at 0. The fits run on the backbone's devices (:func:`fit_devices`).

    Raises:
        ValueError: as :func:`strength_curves` under ``lam="auto"``.
    """
    import cb_core

    devices = fit_devices(lm)
    curves = strength_curves(features, gamma, eps, devices) if lam == "auto" else {}
    concepts = {}
    for task_type, tf in sorted(features.items()):
        if not tf.n_decisions:
            continue
        decisions = tf.decisions()
        start = (warm or {}).get(task_type)
        init = start.alpha if start is not None and start.hidden_size == decisions.hidden_size else None
        curve = curves.get(task_type)
        result = cb_core.fit(decisions, lam=curve.chosen if curve else lam, gamma=gamma, eps=eps, init=init,
                             devices=devices)
        concepts[task_type] = cb_core.Concept.from_fit(
            result, backbone=lm.name, task_type=task_type, trajectories=tf.task_ids,
            features=concept_feature_spec(lm, settings),
            extra={"env": env_name, "rendering": settings.rendering, "layout": settings.layout,
                   "n_decisions": tf.n_decisions,
                   "n_lost_trajectories": tf.n_lost, "n_expert_env_steps": tf.n_env_steps,
                   "n_skipped_expert_steps": tf.n_skipped, "skipped_actions": dict(tf.skipped_actions),
                   **({"strength": curve.to_dict()} if curve else {})})
    return concepts


def concept_feature_spec(lm: LanguageModel, settings: FeatureSettings) -> dict[str, Any]:
    """How a concept's features and contexts were built; acting must use the same (the concept's
    ``metadata["features"]``, :func:`check_concept_matches`).

    ``extractors``: the feature set's description (:meth:`FeatureSet.describe`). The seed is
    recorded under the renderings that read it, the calibrator's fingerprint under rendering
    "calibrator" (:class:`FeatureSettings` drops them elsewhere); the cap on the fitting
    decisions' candidate sets is no acting setting (acting scores every candidate).
    """
    spec = {"formatting": PLAIN, "dtype": backbone_dtype(lm), "rendering": settings.rendering,
            "layout": settings.layout, "action_prefix": action_prefix(settings.layout),
            "context": "task + history, no demonstrations", "candidate_filter": "drop look/inventory/help",
            "extractors": settings.feature_set.describe(lm)}
    if settings.rendering in SEEDED_RENDERINGS:
        spec["seed"] = settings.seed
    if settings.calibrator is not None:
        spec["calibrator"] = settings.calibrator.fingerprint
    return spec


def strength_key(lam: float | str) -> float | dict:
    """How the strength is set, for a cache key: the number, or under ``"auto"`` the rule, its criterion,
    guard and tie-break, the default a flat curve keeps, the grid and the folds that choose it."""
    if lam != "auto":
        return lam
    from cb_core.strength import (DEFAULT_CRITERION, DEFAULT_FOLDS, DEFAULT_GRID, DEFAULT_GUARD, DEFAULT_RULE,
                                  DEFAULT_STRENGTH, DEFAULT_Z)

    return {"lam": "auto", "rule": DEFAULT_RULE, "criterion": DEFAULT_CRITERION, "default": DEFAULT_STRENGTH,
            "z": DEFAULT_Z, "guard": DEFAULT_GUARD, "ties": "nearest the default", "grid": list(DEFAULT_GRID),
            "folds": DEFAULT_FOLDS}


def concepts_dir_key(features: dict[str, TypeFeatures], lm: LanguageModel, settings: FeatureSettings,
                     lam: float | str, gamma: float, eps: float) -> str:
    """Hash naming a cached set of concepts: the backbone, every feature setting
    (:meth:`FeatureSettings.describe`, all its fields), the fit settings (under ``lam="auto"``, the
    rule, grid and folds: :func:`strength_key`) and the data."""
    parts = [FEATURE_VERSION, lm.name, PLAIN, backbone_dtype(lm), settings.describe(lm), strength_key(lam), gamma, eps,
             {t: f.task_ids for t, f in sorted(features.items())}]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def save_concepts(concepts: dict[str, Concept], directory: str | os.PathLike) -> None:
    """Write ``<directory>/<task_type>.safetensors`` for each concept (:meth:`cb_core.Concept.to_bytes`,
    atomically)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for task_type, concept in concepts.items():
        write_bytes_atomic(directory / f"{task_type}.safetensors", concept.to_bytes())


def copy_concepts(source: str | os.PathLike, directory: str | os.PathLike) -> list[Path]:
    """Copy the concept files of ``source`` (``*.safetensors``) into ``directory``, each atomically
    (:func:`cb_io.storage.write_bytes_atomic`): a copy killed part-way leaves every file whole or
    absent, never a torn concept under its name. Returns the copies."""
    directory = Path(directory)
    copies = []
    for f in sorted(Path(source).glob("*.safetensors")):
        write_bytes_atomic(directory / f.name, f.read_bytes())
        copies.append(directory / f.name)
    return copies


def load_concepts(directory: str | os.PathLike) -> dict[str, Concept]:
    """Inverse of :func:`save_concepts`: task type -> concept (raises FileNotFoundError if none)."""
    import cb_core

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no concept files (*.safetensors) in {directory}")
    return {f.stem: cb_core.Concept.load(f) for f in files}


def check_concept_matches(concept: Concept, lm: LanguageModel, settings: FeatureSettings) -> None:
    """Raise ValueError when a concept was fitted with another backbone, formatting, rendering,
    layout, seed (under a shuffle rendering), calibrator or feature set than ``settings`` give
    (a concept file without an extractor list was fitted with ``lm-hidden``)."""
    meta = concept.metadata
    fitted = {"backbone": meta.get("backbone"), **(meta.get("features") if isinstance(meta.get("features"), dict) else {})}
    acting = {"backbone": lm.name, **concept_feature_spec(lm, settings)}
    extractors = acting.pop("extractors")
    for key, value in acting.items():
        if fitted.get(key) != value:
            raise ValueError(f"concept for {meta.get('task_type')!r} was fitted with {key}="
                             f"{fitted.get(key)!r}, but acting uses {value!r} (act with the settings it was "
                             "fitted with)")
    check_extractors(recorded_extractors(meta.get("features"), concept.hidden_size), extractors,
                     where=f"concept for {meta.get('task_type')!r}")


def skipped_summary(features: dict[str, TypeFeatures]) -> str:
    """One line: how many expert steps were no fitting target, and which actions."""
    total = sum(f.n_env_steps for f in features.values())
    skipped: Counter = Counter()
    for f in features.values():
        skipped.update(f.skipped_actions)
    n = sum(skipped.values())
    top = ", ".join(f"{a} x{c}" for a, c in skipped.most_common(5))
    share = f"{100 * n / total:.1f}%" if total else "n/a"
    return f"{n} of {total} expert steps ({share}) were no fitting target" + (f" ({top})" if top else "")


def cached_concepts(features: dict[str, TypeFeatures], lm: LanguageModel, settings: FeatureSettings,
                    lam: float | str = 1.0, gamma: float = 0.8, eps: float = 1e-6, env_name: str = "",
                    cache_dir: str | os.PathLike | None = None) -> tuple[dict[str, Concept], Path | None]:
    """:func:`fit_concepts`, read from / written to ``<cache_dir>/concepts/<key>/`` when given; a
    cached folder holding a damaged concept file (:meth:`cb_core.Concept.load`) is refitted and
    replaced, with a warning.

    Returns (concepts, the folder they are stored in or None).
    """
    if cache_dir is None:
        return fit_concepts(features, lm, settings, lam, gamma, eps, env_name), None
    folder = Path(cache_dir) / "concepts" / concepts_dir_key(features, lm, settings, lam, gamma, eps)
    if any(folder.glob("*.safetensors")):
        try:
            return load_concepts(folder), folder
        except ValueError as err:  # a damaged cache entry is refitted, never trusted
            warnings.warn(f"cached concepts in {folder} are damaged and are refitted: {err}", stacklevel=2)
    concepts = fit_concepts(features, lm, settings, lam, gamma, eps, env_name)
    with atomic_folder(folder) as staging:  # the folder appears complete or not at all
        save_concepts(concepts, staging)
    return concepts, folder
