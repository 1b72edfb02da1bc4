"""Complete example feature extractors: what a third-party package ships to plug a block into
the concept's features (``docs/plugins.md``). Not registered: a package registers its own under
the entry-point group ``cb_agent.feature_extractors``::

    [project.entry-points."cb_agent.feature_extractors"]
    word-count = "my_package.features:WordCount"

An extractor is a class with ``name`` (the spec that selects it), ``metadata`` (JSON: everything a
block of another construction would differ by), an optional ``version`` (change it whenever
``extract`` changes: cached blocks are keyed by name, width, metadata and version, not by code),
``size(lm)`` and ``extract(decision, lm, scores) -> float32 [M, k]``; its constructor takes the
spec's argument (``word-count:3`` gives ``"3"``, ``word-count`` None) and raises ValueError for a
bad one. ``decision`` is an :class:`agent_shell.features.DecisionInput` (``context``,
``instruction``, ``observation``, ``history``, ``candidates``); ``scores`` the LM's scores of the
decision (``.log_q`` [M], ``.n_tokens`` [M], ``.hidden`` [M, d]); ``lm`` the backbone
(``lm.hidden_size`` is d).
"""

from __future__ import annotations

import numpy as np


class WordCount:
    """One column: the candidate's number of words (``word-count``), or of words longer than N
    letters (``word-count:N``)."""

    version = 1

    def __init__(self, arg: str | None = None):
        if arg is not None and not arg.isdigit():
            raise ValueError(f"word-count:N takes a whole number of letters N, got {arg!r}")
        self.min_len = int(arg) if arg else 0
        self.name = "word-count" + (f":{arg}" if arg else "")
        self.metadata = {"columns": ["n_words"], "min_len": self.min_len}

    def size(self, lm) -> int:
        return 1

    def extract(self, decision, lm, scores) -> np.ndarray:
        return np.array([[sum(len(w) > self.min_len for w in c.split())] for c in decision.candidates], np.float32)


class TokenLogProb:
    """Two columns from the LM's own scores: the candidate's mean log-probability per action token
    (``scores.log_q / scores.n_tokens``, nats) and its token count (``token-log-prob``)."""

    version = 1
    name = "token-log-prob"
    metadata = {"columns": ["mean_token_log_prob", "n_tokens"]}

    def __init__(self, arg: str | None = None):
        if arg is not None:
            raise ValueError(f"token-log-prob takes no argument, got {arg!r}")

    def size(self, lm) -> int:
        return 2

    def extract(self, decision, lm, scores) -> np.ndarray:
        n = np.asarray(scores.n_tokens, np.float32)
        return np.stack([np.asarray(scores.log_q, np.float32) / n, n], axis=1)


__all__ = ["TokenLogProb", "WordCount"]
