"""Formatting: the text a backend conditions on, from a context or a prompt.

A context is one text or a list of chat messages (:data:`agent_shell.lm.protocol.Context`). The
backend takes a text as it is, and lays a message list out with the tokenizer's chat template and
the assistant turn opened, so that a candidate or a reply is the next assistant message's
content. Which of the two a caller builds is the caller's *layout* (:mod:`agent_shell.context`:
``"text"`` or ``"chat"``); the backend has no setting of its own for it.

Only the chat template's own control tokens are special: a :class:`Rendered` text names their
character spans (``markers``), and :mod:`~agent_shell.lm.tokenization` reads every other
character, message contents (game text, memories, the LM's own earlier replies) and candidates
alike, as ordinary text, so an observation holding ``<|im_end|>`` cannot open a new turn. A text
context has no markers at all; the tokenizer adds its own special tokens (a BOS) to it.

Must not import the agents or the environments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

from agent_shell.lm.protocol import Context

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: How a text context reaches the tokenizer: as it is. Recorded as ``formatting`` in concept
#: metadata and in feature and review cache keys, as it was when a backend could also wrap a text
#: in its chat template (the layout alone decides that now), so older concepts and caches stay valid.
PLAIN = "plain"
ROLES = ("system", "user", "assistant")
#: What stands in for message ``i``'s content when the template's own text is located
#: (private-use code points: no game text or template holds them).
STAND_IN = "\ue000{}\ue001"
_STAND_INS = re.compile("\ue000\\d+\ue001")


class Rendered(NamedTuple):
    """A rendered conditioning text and where its control tokens are.

    Attributes:
        text: the rendered text.
        markers: None for a plain text (the tokenizer adds its special tokens, none is read from
            the text); for a templated text the ``(start, end)`` character spans, in order, of the
            template's own special tokens, the only special tokens it holds.
    """

    text: str
    markers: tuple[tuple[int, int], ...] | None = None


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[int, str]:
    """The tokenizer's special added tokens (``<|im_start|>``, ``<|im_end|>``, ...): id -> text.
    These are the only tokens a text can yield as control tokens."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {})
    return {i: t.content for i, t in decoder.items() if t.special}


def special_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The texts of :func:`special_tokens`, longest first."""
    return tuple(sorted(set(special_tokens(tokenizer).values()), key=len, reverse=True))


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

    def rendered(self, context: Context, action_prefix: str = "") -> Rendered:
        """:meth:`render` with the spans of the template's own special tokens (none for a text).

        Raises:
            ValueError: what :meth:`template` raises, or a template that does not copy each
                message's content (or its stripped content) verbatim between its own text.
        """
        if isinstance(context, str):
            return Rendered(context + action_prefix)
        text = self.template(context)
        return Rendered(text + action_prefix, self._markers(list(context), text))

    def _markers(self, messages: list[Mapping[str, str]], text: str) -> tuple[tuple[int, int], ...]:
        """The spans in ``text`` (the template of ``messages``) of the special tokens the template
        writes itself: those in its text around the contents, found by rendering stand-ins."""
        shape = self.template([{**m, "content": STAND_IN.format(i)} for i, m in enumerate(messages)])
        own = _STAND_INS.split(shape)
        order = [int(m[1:-1]) for m in _STAND_INS.findall(shape)]
        for strip in (False, True):
            contents = [messages[i]["content"].strip() if strip else messages[i]["content"] for i in order]
            if "".join(p + c for p, c in zip(own, contents + [""])) == text:
                break
        else:
            raise ValueError(f"the chat template of {self.name!r} does not copy message contents verbatim: "
                             f"cannot tell its own control tokens from the messages' text")
        specials = special_strings(self.tokenizer)
        if not specials:
            return ()
        pattern = re.compile("|".join(map(re.escape, specials)))
        spans, at = [], 0
        for part, content in zip(own, contents + [""]):
            spans.extend((at + m.start(), at + m.end()) for m in pattern.finditer(part))
            at += len(part) + len(content)
        return tuple(spans)

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


__all__ = ["PLAIN", "Formatter", "Rendered", "special_strings", "special_tokens"]
