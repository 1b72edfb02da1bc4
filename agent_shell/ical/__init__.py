"""ICAL: In-Context Abstraction Learning for text games (Sarch et al. 2024, text version).

From noisy trajectories (agent runs, corrupted expert trajectories: :mod:`.noisy`) the backbone
writes optimized trajectories with language abstractions (:mod:`.program`), which are executed in
the real game (:mod:`.execution`) and revised on feedback until they win (:mod:`.learn`); winners
enter a memory of examples with an embedding index, retrieved by a weighted instruction /
textual-state cosine (:mod:`.memory`) and shown to the agents as demonstrations (:mod:`.acting`).

Imports no game engine and no LM backend at import time.
"""

from agent_shell.ical.execution import EnvFeedback, HumanFeedback, execute
from agent_shell.ical.learn import LearnConfig, Outcome, learn_example
from agent_shell.ical.memory import Example, Lambdas, Memory, retrieval_scores, top_k
from agent_shell.ical.program import KINDS, REASONS, Annotation, Parsed, Program, parse_program

__all__ = ["KINDS", "REASONS", "Annotation", "EnvFeedback", "Example", "HumanFeedback", "Lambdas", "LearnConfig",
           "Memory", "Outcome", "Parsed", "Program", "execute", "learn_example", "parse_program", "retrieval_scores",
           "top_k"]
