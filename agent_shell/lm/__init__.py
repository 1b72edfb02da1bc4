"""Language-model backends behind :class:`agent_shell.lm.protocol.LanguageModel`.

``load_language_model()`` gives the offline default (SmolLM2-135M-Instruct); the HuggingFace
backend lives in :mod:`agent_shell.lm.hf` (wiring :mod:`~agent_shell.lm.formatting`,
:mod:`~agent_shell.lm.tokenization`, :mod:`~agent_shell.lm.kv_cache`, :mod:`~agent_shell.lm.torch_kv`,
:mod:`~agent_shell.lm.scoring` and :mod:`~agent_shell.lm.decoding`) and is imported only when a model is loaded; the dtype rule
is :mod:`agent_shell.lm.dtypes`. Importing this package imports neither torch nor transformers.
"""

from agent_shell.lm.factory import load_language_model
from agent_shell.lm.protocol import CandidateScores, Context, DecisionHead, LanguageModel

__all__ = ["CandidateScores", "Context", "DecisionHead", "LanguageModel", "load_language_model"]
