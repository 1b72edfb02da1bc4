"""Candidate sets and the parsing of LM replies into transcript lines (seed Sec. 3.3).

* Fixed action space: the environment's candidates without the observation-only commands
  ``look`` and ``inventory`` (and ALFWorld's meta command ``help``), with ``look`` as the fallback
  when nothing is left. Concept fitting filters expert candidate sets with the very same
  function, so fitting and acting score identical sets.
* LM replies: a reply is read up to its first newline; leading ``>`` marks are dropped. A reply
  that starts with ``think:`` is a thought; any other reply is an action string. A reply with no
  letters (empty, ``>``, ``...``) or a ``think:`` with no thought is malformed
  (:class:`FormatError`); each agent documents what it does with one.

Imports nothing from the LM, the environments or cb_core.
"""

from __future__ import annotations

import re
from typing import Iterable, Literal

from agent_shell.context import ACTION_MARK, THINK_PREFIX

#: Commands removed from environment candidate sets (compared case-insensitively, stripped).
EXCLUDED_ACTIONS: frozenset[str] = frozenset({"look", "inventory", "help"})
#: The action taken when a candidate set is empty after filtering, or a reply is unusable.
FALLBACK_ACTION = "look"

_LETTER = re.compile(r"[A-Za-z]")


class FormatError(ValueError):
    """A malformed LM reply: empty, no letters, or a ``think:`` with no thought.

    Attributes:
        reply: the raw reply text.
        reason: a short description ("empty reply", "no action", "empty thought").
    """

    def __init__(self, reply: str, reason: str):
        super().__init__(f"malformed LM reply ({reason}): {reply!r}")
        self.reply = reply
        self.reason = reason


def is_excluded(action: str) -> bool:
    """True for ``look`` / ``inventory`` / ``help`` (any case, surrounding spaces ignored)."""
    return action.strip().lower() in EXCLUDED_ACTIONS


def drop_excluded(candidates: Iterable[str]) -> list[str]:
    """The candidates without the excluded commands and blanks, order kept (may be empty).

    This is the candidate filter of concept fitting: an expert step whose action it removes
    (ALFWorld's expert ``look``) is no fitting target.
    """
    return [c for c in candidates if c.strip() and not is_excluded(c)]


def fixed_action_space(candidates: Iterable[str]) -> list[str]:
    """The acting candidate set: :func:`drop_excluded`, or ``[FALLBACK_ACTION]`` when that is empty
    (seed Sec. 3.3)."""
    return drop_excluded(candidates) or [FALLBACK_ACTION]


def parse_reply(reply: str) -> tuple[Literal["think", "action"], str]:
    """Split an LM reply into ("think", thought) or ("action", action string).

    The reply is cut at its first newline, stripped, leading ``>`` marks removed and inner
    whitespace collapsed. Raises :class:`FormatError` for an empty reply, a reply without any
    letter ("no action"), or ``think:`` without a thought.
    """
    line = reply.split("\n", 1)[0].strip().lstrip(ACTION_MARK).strip()
    line = " ".join(line.split())
    if not line:
        raise FormatError(reply, "empty reply")
    if line.lower().startswith(THINK_PREFIX):
        thought = line[len(THINK_PREFIX):].strip()
        if not _LETTER.search(thought):
            raise FormatError(reply, "empty thought")
        return "think", thought
    if not _LETTER.search(line):
        raise FormatError(reply, "no action")
    return "action", line


def read_reply(reply: str) -> tuple[Literal["think", "action", "malformed"], str, str | None]:
    """:func:`parse_reply` without raising: (kind, text, None), or ("malformed", "", reason)."""
    try:
        kind, text = parse_reply(reply)
    except FormatError as err:
        return "malformed", "", err.reason
    return kind, text, None


def parse_actions(replies: Iterable[str]) -> list[str]:
    """Open action space: the action strings among sampled replies, duplicates kept, order kept.

    Thoughts and malformed replies are dropped; the caller falls back when none remain.
    """
    return [text for kind, text, _ in map(read_reply, replies) if kind == "action"]
