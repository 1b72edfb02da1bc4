"""How each engine words "nothing happened", and what of its feedback is bookkeeping, not state.

Part of the records' vocabulary (:mod:`cb_io.records`): the games (:mod:`envs`) answer with this
wording and the agents' features (:mod:`agent_shell.features.novelty`) read it from trajectory
records without importing the games. One :class:`EngineFeedback` per benchmark in
:data:`ENGINE_FEEDBACK`:

* ``alfworld``: an action the engine cannot execute answers ``Nothing happens.``; observations
  carry no counters.
* ``textworld``: the Inform 7 parser's refusals (``I didn't understand that sentence.``, which
  the adapter also gives to a chained input, ``That's not a verb I recognise.``, ...); every
  feedback ends with the game's status line after the prompt, ``>  -= Kitchen =-0/21`` (room,
  score / moves), whose move counter changes on every step, so it is cut before comparing.
* ``scienceworld``: ``No known action matches that input.``, ``It's not clear how to get there
  from here.``, ``Its not clear how to go to/through ...``, ``The door is already open.``,
  ``The kitchen is not something that can be activated.``, ``The sink is not openable.``;
  observations carry no counters.

:func:`is_nothing` and :func:`normalise` apply one engine's rule, or, for ``env=None`` (a decision
that does not say its engine), every engine's: the wordings are disjoint (no engine answers
another's refusal), and TextWorld's status line occurs in no other engine's text.

Imports the standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFeedback:
    """One engine's wording.

    Attributes:
        nothing: regular expressions (full match, after stripping blanks) of a feedback that says
            the action changed nothing (refused, not understood, already so).
        counters: regular expressions of bookkeeping text (move counter, score line) removed from
            an observation before two observations are compared.
    """

    nothing: tuple[str, ...]
    counters: tuple[str, ...] = ()


#: ALFWorld's answer to an action it cannot execute.
ALFWORLD_NOTHING = "Nothing happens."
#: The TextWorld parser's answer to an input it cannot read (the adapter's answer to a chained input).
TEXTWORLD_NOT_UNDERSTOOD = "I didn't understand that sentence."

#: Benchmark name (``Trajectory.env``) -> its wording.
ENGINE_FEEDBACK: dict[str, EngineFeedback] = {
    "alfworld": EngineFeedback(nothing=(re.escape(ALFWORLD_NOTHING),)),
    "textworld": EngineFeedback(
        nothing=(re.escape(TEXTWORLD_NOT_UNDERSTOOD), r"That's not a verb I recognise\.",
                 r"You can't see any such thing\.", r"You can't go that way\.", r"Nothing obvious happens\.",
                 r"That's already (?:open|closed|locked|unlocked)\."),
        counters=(r"\s*>[ \t]*-=[^\n]*=-[ \t]*-?\d+/\d+\s*$",)),  # the status line after the final prompt
    "scienceworld": EngineFeedback(
        nothing=(r"No known action matches that input\.", r"It'?s not clear how to .*",
                 r"The .+ is already \w+\.", r"The .+ is not something that can be \w+\.",
                 r"The .+ is not \w+able\.")),
}


def _rules(env: str | None) -> list[EngineFeedback]:
    if env is None:
        return list(ENGINE_FEEDBACK.values())
    if env not in ENGINE_FEEDBACK:
        raise ValueError(f"no feedback rule for environment {env!r}; known: {', '.join(ENGINE_FEEDBACK)}")
    return [ENGINE_FEEDBACK[env]]


def is_nothing(observation: str, env: str | None = None) -> bool:
    """True when ``observation`` (status line and blanks stripped) is ``env``'s "nothing happened".

    Raises:
        ValueError: ``env`` has no rule.
    """
    text = normalise(observation, env)
    return any(re.fullmatch(p, text, re.DOTALL) for rule in _rules(env) for p in rule.nothing)


def normalise(observation: str, env: str | None = None) -> str:
    """``observation`` without ``env``'s bookkeeping (TextWorld's status line) and outer blanks:
    two observations of one state compare equal.

    Raises:
        ValueError: ``env`` has no rule.
    """
    text = observation
    for rule in _rules(env):
        for p in rule.counters:
            text = re.sub(p, "", text)
    return text.strip()


__all__ = ["ALFWORLD_NOTHING", "ENGINE_FEEDBACK", "TEXTWORLD_NOT_UNDERSTOOD", "EngineFeedback", "is_nothing",
           "normalise"]
