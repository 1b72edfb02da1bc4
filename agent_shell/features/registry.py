"""Feature extractors by name: the built-ins and third-party ones from an entry-point group.

A spec names one extractor, optionally with an argument after the first colon:
``lm-hidden``, ``lm-layer:6``, ``lm-layer:-2:mean``, ``goal-similarity``, ``novelty``. A feature
selection is a comma-separated list of specs (``--features lm-hidden,goal-similarity,novelty``).

Third-party extractors register a *factory* under the entry-point group
:data:`ENTRY_POINT_GROUP`; the factory is called with the spec's argument (a string, or None
when there is none) and returns an object of the :class:`~agent_shell.features.protocol.FeatureExtractor`
protocol whose ``name`` is the full spec. In a package's ``pyproject.toml``::

    [project.entry-points."cb_agent.feature_extractors"]
    word-count = "my_package.features:WordCount"

(:mod:`agent_shell.features.examples` is a complete example extractor; ``cb-agent features``
lists the available ones.) Built-in names cannot be overridden.

Must not import the agents, the environments or cb_core.
"""

from __future__ import annotations

import inspect
from typing import Callable, Iterable

from agent_shell.features.goal import GoalSimilarity
from agent_shell.features.lm_states import LMHidden, LMLayer
from agent_shell.features.novelty import Novelty
from agent_shell.features.protocol import FeatureExtractor
from agent_shell.plugins import load_registered, registered

#: The entry-point group third-party extractors register under.
ENTRY_POINT_GROUP = "cb_agent.feature_extractors"
#: Built-in extractor names -> factories ``(arg: str | None) -> FeatureExtractor``.
BUILTIN: dict[str, Callable[[str | None], FeatureExtractor]] = {
    "lm-hidden": LMHidden,
    "lm-layer": LMLayer,
    "goal-similarity": GoalSimilarity,
    "novelty": Novelty,
}
#: The seed's features (and what a concept file without an extractor list was fitted with).
DEFAULT_FEATURES = "lm-hidden"


def available_extractors() -> dict[str, str]:
    """Extractor name -> where it comes from (``"built-in"`` or the entry point's target)."""
    return {**{n: "built-in" for n in BUILTIN}, **{n: ep.value for n, ep in sorted(registered(ENTRY_POINT_GROUP, BUILTIN).items())}}


def parse_features(selection: str | Iterable[str]) -> tuple[str, ...]:
    """The specs of a selection (``"lm-hidden, novelty"`` or a list of specs), stripped, in order.

    Raises:
        ValueError: an empty selection, an empty spec, or a spec given twice.
    """
    parts = selection.split(",") if isinstance(selection, str) else [p for s in selection for p in s.split(",")]
    specs = tuple(p.strip() for p in parts)
    if not specs or specs == ("",):
        raise ValueError("empty feature selection: name at least one extractor, e.g. lm-hidden")
    if any(not s for s in specs):
        raise ValueError(f"feature selection {','.join(specs)!r} has an empty entry")
    seen = [s for i, s in enumerate(specs) if s in specs[:i]]
    if seen:
        raise ValueError(f"feature extractor {seen[0]!r} is selected twice")
    return specs


#: The members every extractor has (:class:`FeatureExtractor`).
_MEMBERS = ("name", "metadata", "size", "extract")


def _is_extractor(obj: object) -> bool:
    """``isinstance(obj, FeatureExtractor)`` without evaluating its properties: ``metadata`` may load
    a model (goal-similarity's embedder), and a spec is checked before anything heavy loads."""
    return all(_has_static(obj, m) for m in _MEMBERS) and callable(getattr(obj, "size")) \
        and callable(getattr(obj, "extract"))


def _has_static(obj: object, member: str) -> bool:
    try:
        inspect.getattr_static(obj, member)
    except AttributeError:
        return False
    return True


def make_extractor(spec: str) -> FeatureExtractor:
    """The extractor a spec names (its factory called with the spec's argument).

    Raises:
        ValueError: an unknown name (listing the known ones), a plug-in that fails to import, a bad
            argument (from the factory; a plug-in's error of any type, named with the extractor),
            or a factory whose result is no FeatureExtractor or is named other than ``spec``.
    """
    base, _, arg = spec.strip().partition(":")
    factory = BUILTIN.get(base) or load_registered(ENTRY_POINT_GROUP, base, BUILTIN, what="feature extractor")
    if not callable(factory):
        raise ValueError(f"feature extractor {spec!r}: its entry point gives a {type(factory).__name__}, not a "
                         "factory")
    try:
        extractor = factory(arg or None)
    except Exception as err:  # noqa: BLE001 - a plug-in's own error, however it words it
        if base in BUILTIN:  # the built-ins' errors name them already
            raise
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"feature extractor {spec.strip()!r} ({available_extractors()[base]}) refused its "
                         f"argument {arg or None!r}: {type(err).__name__}: {first}") from err
    if not _is_extractor(extractor):
        raise ValueError(f"feature extractor {spec!r}: its factory returned a {type(extractor).__name__}, which "
                         f"lacks name / metadata / size / extract")
    if extractor.name != spec.strip() and base not in BUILTIN:
        raise ValueError(f"feature extractor {spec!r} calls itself {extractor.name!r}; a third-party extractor's "
                         f"name must be the spec that selects it")
    return extractor


__all__ = ["BUILTIN", "DEFAULT_FEATURES", "ENTRY_POINT_GROUP", "available_extractors", "make_extractor",
           "parse_features"]
