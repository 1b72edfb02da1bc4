"""A selection of feature extractors and the concatenated feature matrix the concept reads.

``FeatureSet.from_spec("lm-hidden,novelty").extract(decision, lm, scores)`` returns the blocks
side by side, float32 [M, k] with k = sum of the block widths, in selection order. That matrix
takes the place of the hidden states everywhere in cb_core (``LabelledDecisions.hidden``,
:func:`cb_core.candidate_log_probs`), which standardises each column across the candidate set
and appends the bias coordinate, so a concept fitted on it has d = k (alpha [k + 1]).

``describe(lm)`` is what a concept records (``metadata["features"]["extractors"]``): per block
its name, width and metadata; acting refuses a concept whose description differs
(:func:`check_extractors`). A concept file without the field was fitted with the seed's
``lm-hidden`` alone (:func:`recorded_extractors`).

Must not import the agents, the environments or cb_core.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import numpy as np

from agent_shell.features.protocol import DecisionInput, FeatureExtractor, check_block
from agent_shell.features.registry import DEFAULT_FEATURES, make_extractor, parse_features

if TYPE_CHECKING:
    from agent_shell.lm.protocol import CandidateScores, LanguageModel


@dataclass(frozen=True)
class FeatureSet:
    """The chosen extractors, in order (at least one, no name twice)."""

    extractors: tuple[FeatureExtractor, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "extractors", tuple(self.extractors))
        if not self.extractors:
            raise ValueError("a FeatureSet needs at least one extractor")
        names = [e.name for e in self.extractors]
        twice = [n for i, n in enumerate(names) if n in names[:i]]
        if twice:
            raise ValueError(f"feature extractor {twice[0]!r} is selected twice")

    @classmethod
    def from_spec(cls, selection: str | Iterable[str] = DEFAULT_FEATURES) -> FeatureSet:
        """Build the extractors a selection names (:func:`~agent_shell.features.registry.parse_features`).

        Raises:
            ValueError: see :func:`parse_features` and :func:`make_extractor`.
        """
        return cls(tuple(make_extractor(s) for s in parse_features(selection)))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.extractors)

    @property
    def spec(self) -> str:
        """The selection as one comma-separated string (what ``--features`` takes)."""
        return ",".join(self.names)

    @property
    def is_default(self) -> bool:
        """True for the seed's features alone (``lm-hidden``)."""
        return self.names == (DEFAULT_FEATURES,)

    def size(self, lm: LanguageModel) -> int:
        """k: the summed block widths for backbone ``lm``."""
        return sum(int(e.size(lm)) for e in self.extractors)

    def describe(self, lm: LanguageModel) -> list[dict[str, Any]]:
        """Per block ``{"name", "size", "metadata"}`` (JSON), recorded in each concept."""
        return [_describe(e, lm) for e in self.extractors]

    def extract(self, decision: DecisionInput, lm: LanguageModel, scores: CandidateScores) -> np.ndarray:
        """float32 [M, k]: the raw blocks side by side (cb_core standardises them per candidate set).

        Raises:
            ValueError: a block of the wrong shape or with non-finite values, naming its extractor.
        """
        m = len(decision.candidates)
        return _side_by_side([check_block(e.name, e.extract(decision, lm, scores), m, int(e.size(lm)))
                              for e in self.extractors])

    def extract_trajectory(self, decisions: Sequence[DecisionInput], lm: LanguageModel,
                           scores: Sequence[CandidateScores],
                           cache_dir: str | os.PathLike | None = None) -> tuple[list[np.ndarray], float]:
        """:meth:`extract` for the decisions of one trajectory, each block read from / written to
        the block cache (:mod:`agent_shell.features.cache`) when ``cache_dir`` is given.

        ``lm-hidden`` is ``scores[i].hidden`` itself (cached with the scores by the caller).
        Returns (one float32 [M_i, k] matrix per decision, seconds spent computing blocks).
        """
        from agent_shell.features.cache import block_key, block_path, cached_blocks
        from agent_shell.features.lm_states import LMHidden

        backbone = [str(getattr(lm, a, "")) for a in ("name", "dtype")]
        start = time.perf_counter()
        columns = []
        for e in self.extractors:
            k = int(e.size(lm))
            if isinstance(e, LMHidden):
                columns.append([check_block(e.name, s.hidden, len(d.candidates), k) for d, s in zip(decisions, scores)])
                continue
            path = block_path(cache_dir, block_key(_describe(e, lm), backbone, decisions)) if decisions else None
            blocks, _ = cached_blocks(path, lambda: [check_block(e.name, e.extract(d, lm, s), len(d.candidates), k)
                                                     for d, s in zip(decisions, scores)])
            columns.append(blocks)
        return [_side_by_side(parts) for parts in zip(*columns)], time.perf_counter() - start


def _side_by_side(blocks: Sequence[np.ndarray]) -> np.ndarray:
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)


def _describe(extractor: FeatureExtractor, lm: LanguageModel) -> dict[str, Any]:
    """name, size, metadata, and the version the extractor declares (when it declares one): what
    a concept records and what keys the extractor's cached blocks."""
    meta = json.loads(json.dumps(dict(extractor.metadata)))  # JSON-normalised, as it reads back from a file
    described = {"name": extractor.name, "size": int(extractor.size(lm)), "metadata": meta}
    version = getattr(extractor, "version", None)
    if version is not None:
        described["version"] = json.loads(json.dumps(version))
    return described


def recorded_extractors(features_meta: object, hidden_size: int) -> list[dict[str, Any]]:
    """The extractor description stored in a concept's ``features`` metadata; for a concept file
    from before feature extractors (no ``extractors`` field) the seed's ``lm-hidden`` of width
    ``hidden_size``."""
    if isinstance(features_meta, Mapping) and "extractors" in features_meta:
        return list(features_meta["extractors"])
    from agent_shell.features.lm_states import LMHidden

    return [{"name": LMHidden.name, "size": int(hidden_size), "metadata": dict(LMHidden().metadata)}]


def check_extractors(recorded: list[dict[str, Any]], acting: list[dict[str, Any]], where: str = "concept") -> None:
    """Raise ValueError naming the first difference between a recorded and the acting description."""
    names_rec, names_act = [r.get("name") for r in recorded], [a["name"] for a in acting]
    if names_rec != names_act:
        raise ValueError(f"{where} was fitted with features {','.join(map(str, names_rec))!r}, but acting uses "
                         f"{','.join(names_act)!r} (select them with --features)")
    for rec, act in zip(recorded, acting):
        for key in ("size", "metadata"):
            if rec.get(key) != act[key]:
                raise ValueError(f"{where}: feature extractor {act['name']!r} was fitted with {key}="
                                 f"{rec.get(key)!r}, but acting has {act[key]!r}")


__all__ = ["FeatureSet", "check_extractors", "recorded_extractors"]
