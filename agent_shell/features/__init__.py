"""Feature extractors: what CB-Agent's concept sees of each candidate (beside the LM's prior).

* :mod:`~agent_shell.features.protocol` - :class:`DecisionInput` and the :class:`FeatureExtractor`
  protocol (a raw [M, k] block per decision);
* :mod:`~agent_shell.features.feature_set` - :class:`FeatureSet`: the chosen blocks side by side,
  described in concept metadata and checked when acting;
* :mod:`~agent_shell.features.registry` - selection by name (``--features lm-hidden,novelty``),
  built-ins and the entry-point group for third-party extractors;
* built-ins: ``lm-hidden`` and ``lm-layer:K[:mean]`` (:mod:`~agent_shell.features.lm_states`),
  ``goal-similarity`` (:mod:`~agent_shell.features.goal`), ``novelty``
  (:mod:`~agent_shell.features.novelty`).

Must not import the agents, the environments or cb_core.
"""

from agent_shell.features.feature_set import FeatureSet, check_extractors, recorded_extractors
from agent_shell.features.protocol import DecisionInput, FeatureExtractor
from agent_shell.features.registry import (BUILTIN, DEFAULT_FEATURES, ENTRY_POINT_GROUP, available_extractors,
                                           make_extractor, parse_features)

__all__ = ["BUILTIN", "DEFAULT_FEATURES", "DecisionInput", "ENTRY_POINT_GROUP", "FeatureExtractor", "FeatureSet",
           "available_extractors", "check_extractors", "make_extractor", "parse_features", "recorded_extractors"]
