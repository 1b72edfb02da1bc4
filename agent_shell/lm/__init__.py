"""Language-model backends behind :class:`agent_shell.lm.protocol.LanguageModel`."""

from agent_shell.lm.protocol import DEFAULT_ACTION_PREFIX, CandidateScores, LanguageModel

__all__ = ["DEFAULT_ACTION_PREFIX", "CandidateScores", "LanguageModel"]
