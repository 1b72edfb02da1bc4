"""Concepts as a function of their data: the seed's concept t-SNE and the concept data-size table.

Both start from the cached features of won expert trajectories (one
:class:`agent_shell.concepts.TypeFeatures` per trajectory, so the LM runs only on the first
extraction) and refit concepts (:func:`cb_core.fit`, seed Eq. (6)) on subsets of them:

* :func:`sample_subsets` + :func:`sampled_concepts`: for each task type, repeatedly draw
  ``size`` of the type's trajectories without replacement and fit one concept per draw (the
  seed's figure: concepts of one type should lie together). :func:`embed_concepts` maps the
  concept vectors to 2-D with scikit-learn's t-SNE; :func:`silhouette` scores how well the types
  separate in the concept space itself (cosine distance), a number beside the picture;
  :func:`tsne_figure` draws one colour per type.
* :func:`data_size_rows`: top-1 accuracy on fixed held-out decisions
  (:func:`agent_shell.decision_scorer.decision_accuracy`) of concepts fitted on the first
  k trajectories of each type, for several k.

Imports no environment or LM code; callers pass features.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from agent_shell.concepts import TypeFeatures
from agent_shell.charts import save_figure


def merge_features(parts: Sequence[TypeFeatures]) -> TypeFeatures:
    """One :class:`TypeFeatures` holding the decisions of ``parts`` (all of one task type), in order.

    Raises ValueError for no parts or parts of different task types.
    """
    if not parts:
        raise ValueError("merge_features needs at least one part")
    types = {p.task_type for p in parts}
    if len(types) != 1:
        raise ValueError(f"merge_features: parts of several task types {sorted(types)}")
    caps = {p.max_candidates for p in parts}
    if len(caps) != 1:
        raise ValueError(f"merge_features: parts fitted on candidate sets capped differently {sorted(caps)}")
    merged = TypeFeatures(parts[0].task_type, max_candidates=parts[0].max_candidates)
    for p in parts:
        merged.phi.extend(p.phi)
        merged.log_q.extend(p.log_q)
        merged.n_tokens.extend(p.n_tokens)
        merged.expert.extend(p.expert)
        merged.task_ids.extend(p.task_ids)
        merged.decision_task_ids.extend(p.decision_task_ids)
        merged.n_lost += p.n_lost
        merged.n_env_steps += p.n_env_steps
        merged.skipped_actions.update(p.skipped_actions)
        merged.lm_seconds += p.lm_seconds
    return merged


def sample_subsets(pool: int, size: int, n_samples: int, seed: int = 0) -> list[tuple[int, ...]]:
    """``n_samples`` distinct sorted index subsets of ``range(pool)``, each of ``size`` elements.

    Drawn uniformly without replacement with ``numpy.random.default_rng(seed)``; when fewer than
    ``n_samples`` distinct subsets exist (``comb(pool, size)``), all of them are returned.

    Raises ValueError unless 1 <= size <= pool and n_samples >= 1.
    """
    if not 1 <= size <= pool:
        raise ValueError(f"sample size {size} must be between 1 and the pool size {pool}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    total = math.comb(pool, size)
    if total <= n_samples:
        from itertools import combinations

        return list(combinations(range(pool), size))
    rng = np.random.default_rng(seed)
    seen: dict[tuple[int, ...], None] = {}
    while len(seen) < n_samples:
        seen.setdefault(tuple(sorted(int(i) for i in rng.choice(pool, size, replace=False))), None)
    return list(seen)


@dataclass
class SampledConcept:
    """One concept fitted on one sample of a type's trajectories.

    Attributes:
        task_type: the type.
        task_ids: the sampled trajectories.
        alpha: [d + 1] float32 concept vector (last entry: bias weight).
        n_decisions: fitting decisions.
        converged: the fit's convergence flag.
    """

    task_type: str
    task_ids: list[str]
    alpha: np.ndarray
    n_decisions: int
    converged: bool


def sampled_concepts(per_trajectory: dict[str, list[TypeFeatures]], size: int, n_samples: int, lam: float = 1.0,
                     gamma: float = 0.8, eps: float = 1e-6, seed: int = 0,
                     on_fit=None) -> tuple[list[SampledConcept], dict[str, str]]:
    """Concepts of ``n_samples`` random ``size``-subsets of each type's trajectories (seed Eq. (6)).

    Args:
        per_trajectory: task type -> one TypeFeatures per won trajectory (the pool).
        size, n_samples, seed: as :func:`sample_subsets` (seeded per type: ``seed + type index``).
        lam, gamma, eps: the fit's settings.
        on_fit: called with each :class:`SampledConcept` as it is fitted.

    Returns (the concepts, task type -> why it was left out, for types whose pool is smaller than
    ``size``).
    """
    import cb_core

    concepts, skipped = [], {}
    for i, (task_type, pool) in enumerate(sorted(per_trajectory.items())):
        if len(pool) < size:
            skipped[task_type] = f"{len(pool)} won trajectories < sample size {size}"
            continue
        for subset in sample_subsets(len(pool), size, n_samples, seed + i):
            tf = merge_features([pool[j] for j in subset])
            result = cb_core.fit(tf.decisions(), lam=lam, gamma=gamma, eps=eps)
            sc = SampledConcept(task_type, tf.task_ids, np.asarray(result.alpha, np.float32), tf.n_decisions,
                                bool(result.converged))
            concepts.append(sc)
            if on_fit is not None:
                on_fit(sc)
    return concepts, skipped


def embed_concepts(alphas: np.ndarray, seed: int = 0, perplexity: float = 30.0) -> np.ndarray:
    """[n, 2] t-SNE embedding (scikit-learn, PCA initialisation) of concept vectors ``alphas`` [n, d + 1].

    The perplexity is capped at ``(n - 1) / 3`` so that small sets embed too. Raises ValueError
    for fewer than 3 concepts.
    """
    from sklearn.manifold import TSNE

    alphas = np.asarray(alphas, np.float64)
    n = alphas.shape[0]
    if n < 3:
        raise ValueError(f"t-SNE needs at least 3 concepts, got {n}")
    perplexity = min(perplexity, max(1.0, (n - 1) / 3))
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(alphas)


def silhouette(alphas: np.ndarray, labels: Sequence[str]) -> float | None:
    """Mean silhouette of the concept vectors grouped by task type, cosine distance (scikit-learn);
    1 = tight, separate types, 0 = overlapping, < 0 = mixed. None with fewer than two types."""
    from sklearn.metrics import silhouette_score

    if len(set(labels)) < 2 or len(labels) <= len(set(labels)):
        return None
    return float(silhouette_score(np.asarray(alphas, np.float64), list(labels), metric="cosine"))


def tsne_figure(points: np.ndarray, labels: Sequence[str], path: str | Path, title: str, caption: str = "") -> Path:
    """Scatter ``points`` [n, 2] with one colour (and legend entry) per label; PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 6))
    cmap = plt.get_cmap("tab10")
    for i, label in enumerate(sorted(set(labels))):
        mask = np.array([lab == label for lab in labels])
        ax.scatter(points[mask, 0], points[mask, 1], s=28, color=cmap(i % 10), label=f"{label} ({mask.sum()})",
                   alpha=0.85, edgecolors="none")
    ax.set_title(textwrap.fill(title, 90), fontsize=9)
    ax.set_xlabel("t-SNE 1")
    ax.set_ylabel("t-SNE 2")
    ax.legend(fontsize=8, loc="best", frameon=True)
    caption = textwrap.fill(caption, 150)
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=6.5, ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.02 + 0.025 * (caption.count("\n") + 1) if caption else 0, 1, 1))
    return save_figure(fig, path, dpi=130)


@dataclass
class DataSizeRow:
    """Held-out top-1 accuracy of concepts fitted on ``size`` trajectories per type.

    Attributes:
        size: trajectories per type asked for.
        used: task type -> trajectories actually used (fewer when the type has fewer won ones).
        rows: :func:`agent_shell.decision_scorer.decision_accuracy` rows (per type, then ``all``).
    """

    size: int
    used: dict[str, int] = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)


def data_size_rows(per_trajectory: dict[str, list[TypeFeatures]], heldout: dict[str, TypeFeatures],
                   sizes: Sequence[int], lam: float = 1.0, gamma: float = 0.8, eps: float = 1e-6) -> list[DataSizeRow]:
    """For each k in ``sizes``: concepts fitted on the first k trajectories of each type's pool
    (all of them when the pool is smaller), evaluated on the same ``heldout`` decisions."""
    import cb_core

    from agent_shell.decision_scorer import decision_accuracy

    out = []
    for size in sizes:
        concepts, used = {}, {}
        for task_type, pool in sorted(per_trajectory.items()):
            if not pool:
                continue
            tf = merge_features(pool[:size])
            used[task_type] = len(pool[:size])
            if tf.n_decisions:
                result = cb_core.fit(tf.decisions(), lam=lam, gamma=gamma, eps=eps)
                concepts[task_type] = cb_core.Concept(np.asarray(result.alpha), gamma, eps, {"task_type": task_type})
        out.append(DataSizeRow(size, used, decision_accuracy(heldout, concepts, gamma)))
    return out


def data_size_cells(sizes: Sequence[Mapping], task_types: Sequence[str]) -> list[list[str]]:
    """The data-size table's rows as text, one per size: k, then per task type the held-out accuracy
    of its concept (95% Wilson interval; ``(n=U)`` when only U < k trajectories were used, ``-``
    without a concept), then all decisions' accuracy with alpha = 0 and with the concepts.

    ``sizes``: :class:`DataSizeRow` fields as a mapping each (``k``, ``used``, ``rows``), as
    ``cb-agent concept-data-size --out`` writes them."""
    from agent_shell.decision_scorer import accuracy_cell

    out = []
    for size in sizes:
        by_type = {r["task_type"]: r for r in size["rows"]}
        cells = []
        for t in task_types:
            cell = accuracy_cell(by_type[t], "concept") if t in by_type else "-"
            if size["used"].get(t, 0) < size["k"]:
                cell += f" (n={size['used'].get(t, 0)})"
            cells.append(cell)
        total = by_type["all"]
        out.append([str(size["k"]), *cells, accuracy_cell(total, "prior"), accuracy_cell(total, "concept")])
    return out


def data_size_markdown(table: Mapping) -> str:
    """The Markdown table of a ``cb-agent concept-data-size --out`` JSON (:func:`data_size_cells`);
    the task types are its ``task_types``, or (files written before that field) those of its
    ``used`` counts and accuracy rows."""
    types = table.get("task_types") or sorted({t for s in table["sizes"] for t in s["used"]}
                                              | {r["task_type"] for s in table["sizes"] for r in s["rows"]} - {"all"})
    lines = ["| k | " + " | ".join(types) + " | all: alpha = 0 | all: concept |", "|---" * (len(types) + 3) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in data_size_cells(table["sizes"], types)]
    return "\n".join(lines) + "\n"


__all__ = ["DataSizeRow", "SampledConcept", "data_size_cells", "data_size_markdown", "data_size_rows", "embed_concepts",
           "merge_features", "sample_subsets", "sampled_concepts", "silhouette", "tsne_figure"]
