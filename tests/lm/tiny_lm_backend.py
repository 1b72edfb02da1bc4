"""Example third-party LM backend (the documented plug-in seam; no torch, no model files).

A package registers its factory in its ``pyproject.toml``::

    [project.entry-points."cb_agent.lm_backends"]
    tiny = "tiny_lm_backend:load"

and ``cb-agent run --model tiny:ARG`` (or ``load_language_model("tiny:ARG")``) selects it. The
factory gets the text after ``tiny:`` plus ``dtype``, ``device`` and any extra keyword arguments,
and returns an object of the :class:`agent_shell.lm.protocol.LanguageModel` protocol, implemented
structurally (no base class; its decisions are the host decision on its scores,
:func:`agent_shell.lm.decision.decide`). This one
scores a candidate by its letters: log q = -(number of characters) / scale nats, hidden = the
counts of a..h, and always replies ``reply``.
"""

from __future__ import annotations

import numpy as np

from agent_shell.lm.protocol import CandidateScores


class TinyLM:
    hidden_size = 8

    def __init__(self, scale: float, reply: str = " look"):
        self.name = f"tiny:{scale:g}"
        self.scale = scale
        self.reply = reply

    def score(self, context, candidates, action_prefix):
        if not candidates or any(not c for c in candidates):
            raise ValueError("empty candidate list or candidate")
        log_q = np.array([-len(c) / self.scale for c in candidates], np.float32)
        n_tokens = np.array([len(c.split()) for c in candidates], np.int32)
        hidden = np.array([[c.count(ch) for ch in "abcdefgh"] for c in candidates], np.float32)
        return CandidateScores(log_q, n_tokens, hidden)

    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        return [self.reply] * n

    def fork(self):
        return self


def load(arg, *, dtype="auto", device=None, **kwargs):
    """The factory: ``tiny:SCALE`` (default scale 1)."""
    return TinyLM(float(arg) if arg else 1.0, **kwargs)
