"""Language-model backends behind :class:`agent_shell.lm.protocol.LanguageModel`.

``load_language_model()`` gives the offline default (SmolLM2-135M-Instruct); the HuggingFace
backend lives in :mod:`agent_shell.lm.hf` and is imported only when a model is loaded.
"""

from agent_shell.lm.factory import load_language_model
from agent_shell.lm.protocol import DEFAULT_ACTION_PREFIX, CandidateScores, LanguageModel

__all__ = ["DEFAULT_ACTION_PREFIX", "CandidateScores", "LanguageModel", "load_language_model"]
