"""The agents' configuration: everything an agent's behaviour depends on besides the LM, the
demonstrations and the concepts. Validated once, when it is made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_shell import context as ctx
from agent_shell.run_config import ACTION_SPACES

#: ReAct headers per environment name; ``{n_demos}`` is filled in.
HEADERS: dict[str, str] = {
    "alfworld": "Interact with a household to solve a task. Here are {n_demos} examples.",
    "textworld": "Interact with a text game to solve a task. Here are {n_demos} examples.",
    "scienceworld": "Interact with a science simulator to solve a task. Here are {n_demos} examples.",
}


@dataclass(frozen=True)
class AgentConfig:
    """Everything an agent's behaviour depends on besides the LM, demos and concepts.

    Attributes:
        header: ReAct prompt header; ``{n_demos}`` is replaced by the number of demonstrations.
        task_header: line between the demonstrations and the current task.
        reply_tokens: max new tokens of a routing reply (a transcript line).
        rendering: history rendering name (:data:`agent_shell.history.RENDERINGS`); the same
            rendering serves the routing prompt, the scoring context and the reflection prompt.
        layout: "text" (one prompt) or "chat" (user / assistant messages), see
            :mod:`agent_shell.context`.
        review_tokens: max new tokens of an experience review (rendering "experience").
        action_space: CB-Agent only: "fixed" (environment candidates) or "open" (sampled).
        n_samples: open action space: replies sampled per decision (seed: 20, duplicates kept).
        sample_temperature: open action space: sampling temperature (seed: 0.7).
        gamma, eps: prior length-normalisation exponent and feature standardisation epsilon,
            used for prior-only scoring; a concept's own fit settings take precedence.
        reflection_instruction, reflection_tokens: Reflexion's reflection prompt and length.
        seed: base seed of sampled generations (step index is added).
    """

    header: str = HEADERS["alfworld"]
    task_header: str = "Here is the task."
    reply_tokens: int = 48
    rendering: str = "raw"
    layout: str = "text"
    review_tokens: int = 48
    action_space: str = "fixed"
    n_samples: int = 20
    sample_temperature: float = 0.7
    gamma: float = 0.8
    eps: float = 1e-6
    reflection_instruction: str = (
        "You did not complete the task above. In two or three sentences, say what went wrong "
        "and give a new, concise, high-level plan that avoids it."
    )
    reflection_tokens: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        ctx.check_rendering(self.rendering)
        ctx.check_layout(self.layout)
        if self.action_space not in ACTION_SPACES:
            raise ValueError(f"action_space={self.action_space!r} is not one of {list(ACTION_SPACES)}")
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {self.n_samples}")

    @classmethod
    def for_env(cls, env_name: str, **overrides: Any) -> "AgentConfig":
        """The default config with the ReAct header of ``env_name`` (:func:`header_of`)."""
        return cls(header=header_of(env_name), **overrides)


def header_of(env_name: str) -> str:
    """The ReAct header of ``env_name`` (:data:`HEADERS`; a generic one for another environment)."""
    return HEADERS.get(env_name, "Interact with an environment to solve a task. Here are {n_demos} examples.")


__all__ = ["ACTION_SPACES", "HEADERS", "AgentConfig", "header_of"]
