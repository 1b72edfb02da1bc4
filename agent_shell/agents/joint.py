"""The joint actor (action calibration, Sec. 6, step 5): calibrate and act in one reply.

Each step the LM writes ONE greedy reply of two lines under the ReAct prompt (header extended
with :data:`JOINT_FORMAT`; text layout only), continuing the prompt's final ``Experience:``, and
generation ends with the second line (see :meth:`JointMixin.joint_reply`)::

    <an experience about the immediately preceding transition, or NO UPDATE>
    > <the next action, or think: ...>

The calibration block (first line) is read with the Experience review's rules
(:func:`agent_shell.experience.parse_review`): a valid experience is kept beside the preceding
environment transition (shown as ``Experience: ...`` from then on, as under the "experience"
rendering), ``NO UPDATE`` or an invalid statement keeps nothing (recorded as a review with its
reason). At the first step, or after a think step, there is no preceding transition and the block
is recorded nowhere, but it is still required.

The reply is parsed strictly (:func:`parse_joint_reply`): an empty block, a missing second line,
or a second line that does not start with ``>`` is a malformed reply: a format error counted in
``AgentLog.format_errors`` with its reason, no experience kept, and the step falls back as the
agent's base does (joint-react executes ``look``; joint-cb-agent chooses among the candidates).

* ``joint-react``: the action line is executed verbatim (as ReAct).
* ``joint-cb-agent``: the action line routes (a thought is a think step); an environment step
  takes CB-Agent's argmax over the candidate set (Eq. 3), never the written text.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agent_shell import context as ctx
from agent_shell.agents.cb_agent import CBAgent
from agent_shell.agents.config import AgentConfig
from agent_shell.agents.react import ReActAgent
from agent_shell.agents.step import Decision, View
from agent_shell.candidates import FALLBACK_ACTION, read_reply
from agent_shell.experience import NO_UPDATE, Review, parse_review
from agent_shell.history import EXPERIENCE_LABEL
from agent_shell.lm.protocol import Context, LanguageModel

if TYPE_CHECKING:
    from cb_core import Concept

#: How the header asks for the two-line reply.
JOINT_FORMAT = (f"Reply in two lines: first '{EXPERIENCE_LABEL} ' followed by one short general implication of "
                f"the latest observation (not a plan), or {NO_UPDATE}; then '{ctx.ACTION_MARK} ' followed by the "
                "next action.")


class JointFormatError(ValueError):
    """A joint reply that breaks the two-line format (``reason`` says how)."""

    def __init__(self, reply: str, reason: str):
        super().__init__(f"malformed joint reply ({reason}): {reply!r}")
        self.reply, self.reason = reply, reason


def parse_joint_reply(reply: str) -> tuple[str, str]:
    """(calibration block, action line without its ``>``) of a joint reply (the text after the
    prompt's ``Experience:``). Raises :class:`JointFormatError` for an empty block, no second
    line, or a second line that is not an action line (``> ...``)."""
    lines = reply.rstrip("\n").split("\n")
    block = lines[0].strip()
    if not block:
        raise JointFormatError(reply, "empty calibration block")
    rest = [line for line in lines[1:] if line.strip()]
    if not rest:
        raise JointFormatError(reply, "no action line after the calibration block")
    action_line = rest[0].strip()
    if not action_line.startswith(ctx.ACTION_MARK):
        raise JointFormatError(reply, f"second line does not start with {ctx.ACTION_MARK!r}")
    return block, action_line


def joint_config(config: AgentConfig) -> AgentConfig:
    """The joint actor's config derived from ``config``: text layout only, and the history shows
    the kept experiences, so rendering "raw" becomes "experience" (and "experience" stays).
    Applied to the config a joint actor is given, before its construction.

    Raises:
        ValueError: the chat layout, or a rendering other than "raw" / "experience".
    """
    if config.layout != "text":
        raise ValueError(f"the joint actor supports --layout text only, got {config.layout!r}")
    if config.rendering not in ("raw", "experience"):
        raise ValueError(f"the joint actor shows its own experiences (history raw or experience), got "
                         f"{config.rendering!r}")
    return replace(config, rendering="experience")


def preceding_transition(view: View) -> int | None:
    """Index of the environment transition the block reviews (the latest step), or None."""
    if view.steps and view.steps[-1].kind == "env":
        return len(view.steps) - 1
    return None


class JointMixin:
    """The joint step: one generation = calibration block + action line (see the module doc)."""

    separate_review = False  # the reply's calibration block is the review

    def joint_prompt(self, view: View, context: Context) -> str:
        """The ReAct prompt with :data:`JOINT_FORMAT` in the header, ending ``Experience:``."""
        prompt = ctx.react_prompt(self.config.header + " " + JOINT_FORMAT, self.task_demos(view), context,
                                  self.config.task_header)
        return prompt.removesuffix(ctx.ACTION_MARK) + EXPERIENCE_LABEL

    def joint_reply(self, view: View, context: Context) -> tuple[str, str | None, str | None, Review | None]:
        """(reply, action line or None, format error or None, review or None).

        The reply is greedy and read line by line: the calibration block up to its newline (at
        most ``review_tokens``), then, continuing the same text, the action line up to its newline
        (at most ``reply_tokens``). Nothing after the action line is generated: a small backbone
        otherwise writes on (observations, more actions) to the whole budget. A block that ended
        without its newline (the budget, or an end of sequence the protocol does not report) is
        continued on a new line all the same. A backend that returns text past the first newline
        has its reply parsed as it is.
        """
        prompt = self.joint_prompt(view, context)
        block = self.lm.generate(prompt, max_new_tokens=self.config.review_tokens, stop=("\n",),
                                 temperature=0.0, n=1, seed=self.config.seed)[0]
        if "\n" in block:
            reply = block
        else:
            line = self.lm.generate(prompt + block + "\n", max_new_tokens=self.config.reply_tokens, stop=("\n",),
                                    temperature=0.0, n=1, seed=self.config.seed)[0]
            reply = block + "\n" + line
        try:
            block, action_line = parse_joint_reply(reply)
        except JointFormatError as err:
            return reply, None, err.reason, None
        index = preceding_transition(view)
        review = None
        if index is not None:
            shown = [view.start.observation] + [s.observation for s in view.steps]
            experience, invalid = parse_review(block, view.candidates, shown)
            review = Review(index, block, experience, invalid)
        return reply, action_line, None, review


class JointReActAgent(JointMixin, ReActAgent):
    """``joint-react``: the calibration block, then ReAct's own action, in one reply."""

    name = "joint-react"

    def __init__(self, lm: LanguageModel, demos: Mapping[str, Sequence[str]], *, config: AgentConfig = AgentConfig(),
                 **kwargs: Any):
        super().__init__(lm, demos, config=joint_config(config), **kwargs)

    def next_action(self, view: View) -> Decision:
        t0 = time.perf_counter()
        reply, action_line, error, review = self.joint_reply(view, self.scoring_context(view))
        seconds = {"route": time.perf_counter() - t0}
        if error is not None:
            return Decision("env", FALLBACK_ACTION, reply, error, seconds=seconds)
        kind, text, bad = read_reply(action_line)
        if kind == "think":
            return Decision("think", f"{ctx.THINK_PREFIX} {text}", reply, seconds=seconds, review=review)
        return Decision("env", text if kind == "action" else FALLBACK_ACTION, reply, bad, seconds=seconds,
                        review=review)


class JointCBAgent(JointMixin, CBAgent):
    """``joint-cb-agent``: the calibration block and a routing line in one reply; environment
    steps take the concept-guided argmax over the candidate set."""

    name = "joint-cb-agent"
    prior_only_name = "joint-prior-only"

    def __init__(self, lm: LanguageModel, demos: Mapping[str, Sequence[str]], *,
                 concepts: Mapping[str, Concept] | None, config: AgentConfig = AgentConfig(), **kwargs: Any):
        super().__init__(lm, demos, concepts=concepts, config=joint_config(config), **kwargs)

    def next_action(self, view: View) -> Decision:
        t0 = time.perf_counter()
        context = self.scoring_context(view)
        reply, action_line, error, review = self.joint_reply(view, context)
        if action_line is not None:
            kind, text, error = read_reply(action_line)
            if kind == "think":
                return Decision("think", f"{ctx.THINK_PREFIX} {text}", reply,
                                seconds={"route": time.perf_counter() - t0}, review=review)
        t1 = time.perf_counter()
        decision = self.choose(view.start.task_type, context, self.candidate_set(view, context), view)
        return replace(decision, reply=reply, format_error=error, review=review,
                       seconds={"route": t1 - t0, "choose": time.perf_counter() - t1})


__all__ = ["JOINT_FORMAT", "JointCBAgent", "JointFormatError", "JointReActAgent", "joint_config", "parse_joint_reply",
           "preceding_transition"]
