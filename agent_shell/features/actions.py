"""Action strings split into verb, object and receptacle, for the text-level feature blocks.

The three benchmarks' commands share one shape: a verb (one word, or a two-word verb such as
``go to``, ``pick up``, ``focus on``), an object, and optionally a preposition and a second
argument (the receptacle or tool): ``take mug 2 from countertop 1``, ``move mug 2 to
coffeemachine 1``, ``heat egg 1 with microwave 1``, ``go to cabinet 3``, ``insert apple into
fridge``. Entity numbers (``mug 2``) are part of the object; :func:`head_words` drops them to
compare with the instruction, which names object classes (``a clean mug``).

Pure functions of strings; imports nothing of this project.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Two-word verbs, matched before the one-word rule.
TWO_WORD_VERBS = frozenset({"go to", "pick up", "put down", "focus on", "look at", "look around", "turn on",
                            "turn off", "wait for", "connect to", "dunk in", "pour into"})
#: Words that end the object and begin the second argument.
PREPOSITIONS = frozenset({"from", "to", "into", "in", "on", "onto", "in/on", "with", "at", "under", "inside"})
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class ActionParts:
    """``verb`` (lowercase), ``obj`` (the first argument, "" for none) and ``receptacle`` (the
    argument after the first preposition, "" for none), each with single spaces."""

    verb: str
    obj: str
    receptacle: str


def split_action(action: str) -> ActionParts:
    """Split a command into :class:`ActionParts` (lowercased; never raises).

    >>> split_action("take mug 2 from countertop 1")
    ActionParts(verb='take', obj='mug 2', receptacle='countertop 1')
    >>> split_action("go to cabinet 3")
    ActionParts(verb='go to', obj='cabinet 3', receptacle='')
    """
    words = action.lower().split()
    if not words:
        return ActionParts("", "", "")
    n_verb = 2 if len(words) >= 2 and " ".join(words[:2]) in TWO_WORD_VERBS else 1
    verb, rest = " ".join(words[:n_verb]), words[n_verb:]
    for i, w in enumerate(rest):
        if i > 0 and w in PREPOSITIONS:
            return ActionParts(verb, " ".join(rest[:i]), " ".join(rest[i + 1:]))
    return ActionParts(verb, " ".join(rest), "")


def head_words(text: str) -> frozenset[str]:
    """The alphabetic words of ``text``, lowercased, numbers and punctuation dropped."""
    return frozenset(_WORD.findall(text.lower()))


def _singular(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def names_in(argument: str, text_words: frozenset[str]) -> bool:
    """Whether every word of ``argument`` (numbers dropped) occurs in ``text_words`` (a plural
    ``s`` ignored on both sides); False for an argument without words."""
    words = head_words(argument)
    if not words:
        return False
    vocab = {_singular(w) for w in text_words}
    return all(_singular(w) in vocab for w in words)


__all__ = ["ActionParts", "PREPOSITIONS", "TWO_WORD_VERBS", "head_words", "names_in", "split_action"]
