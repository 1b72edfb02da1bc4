"""Formatting: the text a backend conditions on, from a context or a prompt.

A context is one text or a list of chat messages (:data:`agent_shell.lm.protocol.Context`). The
backend takes a text as it is, and lays a message list out with the tokenizer's chat template and
the assistant turn opened, so that a candidate or a reply is the next assistant message's
content. Which of the two a caller builds is the caller's *layout* (:mod:`agent_shell.context`:
``"text"`` or ``"chat"``); the backend has no setting of its own for it. A templated text
carries its own special tokens, so it is tokenized without adding them again.

Must not import the agents or the environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from agent_shell.lm.protocol import Context

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: How a text context reaches the tokenizer: as it is. Recorded as ``formatting`` in concept
#: metadata and in feature and review cache keys, as it was when a backend could also wrap a text
#: in its chat template (the layout alone decides that now), so older concepts and caches stay valid.
PLAIN = "plain"
ROLES = ("system", "user", "assistant")


def templated(context: Context) -> bool:
    """Whether ``context`` goes through the chat template (then it brings its own special tokens)."""
    return not isinstance(context, str)


@dataclass(frozen=True)
class Formatter:
    """Renders contexts and prompts for one tokenizer.

    Args:
        tokenizer: a HuggingFace tokenizer (``apply_chat_template``, ``chat_template``).
        name: the backbone's name, for error messages.
    """

    tokenizer: PreTrainedTokenizerBase
    name: str

    def render(self, context: Context, action_prefix: str) -> str:
        """The text every candidate is appended to: the conditioning of log Q(a | x)."""
        return self.render_prompt(context) + action_prefix

    def render_prompt(self, prompt: Context) -> str:
        """The text generation continues: a text as it is, a message list through the template."""
        return prompt if isinstance(prompt, str) else self.template(prompt)

    def template(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The chat template of ``messages`` with a generation prompt.

        Raises:
            ValueError: no chat template, an empty list, or a message that is not a dict with
                role system/user/assistant and str content (naming its index).
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"model {self.name!r} has no chat template: use the text layout")
        messages = list(messages)
        if not messages:
            raise ValueError("empty message list: nothing to condition on")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} is {m!r}: need a dict with role system/user/assistant and str content")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


__all__ = ["PLAIN", "Formatter", "templated"]
