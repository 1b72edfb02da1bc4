"""Every run setting that changes a decision's features, as one value: :class:`FeatureSettings`.

The concept's data (:func:`agent_shell.concepts.collect_features`), its cache key
(:func:`agent_shell.concepts.concepts_dir_key`), the check of a concept against the acting run
(:func:`agent_shell.concepts.check_concept_matches`) and every command that computes features read
this one object, derived once per set-up from the run's settings
(:func:`agent_shell.configure.feature_settings`, :attr:`agent_shell.pipeline.Setup.feature_settings`),
instead of copies of its fields passed by hand. Its :meth:`~FeatureSettings.describe` walks the
dataclass's fields, so a field added here is part of every key and check without another edit.

Settings that cannot change a feature are normalised away when the object is made, so two runs
that build the same features share one value: the seed is kept only under the renderings that
read it (:data:`agent_shell.history.SEEDED_RENDERINGS`), the calibrator only under rendering
``calibrator``.

Imports no LM, no game engine and not cb_core.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent_shell.context import check_layout, check_rendering
from agent_shell.features import FeatureSet
from agent_shell.history import SEEDED_RENDERINGS

if TYPE_CHECKING:
    from agent_shell.calibration.calibrator import Calibrator
    from agent_shell.lm.protocol import LanguageModel


@dataclass(frozen=True)
class FeatureSettings:
    """What a decision's features depend on besides the backbone and the trajectory's text.

    Attributes:
        rendering: history rendering of every decision's context (:data:`agent_shell.history.RENDERINGS`).
        layout: context layout (``"text"`` or ``"chat"``).
        seed: the run's seed; kept only under a rendering that reads it (``shuffle-all``,
            ``shuffle-old``), 0 otherwise.
        feature_set: what the concept sees of each candidate (default the seed's ``lm-hidden``).
        max_candidates: cap on each expert decision's candidate set (0: the whole set; the
            expert's action and a seeded sample of the others, :func:`agent_shell.expert_decisions.capped_candidates`).
        calibrator: rendering ``"calibrator"``: the fitted calibrator that writes the
            experiences (required there, dropped under every other rendering).

    Raises:
        ValueError: an unknown rendering or layout, a cap of 1 or below 0, or rendering
            ``"calibrator"`` without a calibrator (one line naming the setting).
    """

    rendering: str = "raw"
    layout: str = "text"
    seed: int = 0
    feature_set: FeatureSet = field(default_factory=FeatureSet.from_spec)
    max_candidates: int = 0
    calibrator: Calibrator | None = None

    def __post_init__(self) -> None:
        check_rendering(self.rendering)
        check_layout(self.layout)
        if self.max_candidates == 1 or self.max_candidates < 0:
            raise ValueError(f"max_candidates={self.max_candidates} must be 0 (no cap) or >= 2")
        if self.rendering not in SEEDED_RENDERINGS:
            object.__setattr__(self, "seed", 0)
        if self.rendering == "calibrator":
            if self.calibrator is None:
                raise ValueError("rendering 'calibrator' needs a fitted calibrator to write the experiences")
        else:
            object.__setattr__(self, "calibrator", None)

    def describe(self, lm: LanguageModel) -> dict[str, Any]:
        """Every field as JSON-ready data for backbone ``lm``, in declaration order: the feature
        set as :meth:`FeatureSet.describe`, the calibrator as its fingerprint (None without one)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, FeatureSet):
                value = value.describe(lm)
            elif f.name == "calibrator":
                value = None if value is None else value.fingerprint
            out[f.name] = value
        return out


__all__ = ["FeatureSettings"]
