"""Text contexts of the agents: the task, the interaction history, demonstrations, prompts.

Every agent context is built here from small pure functions of plain data (strings and steps
with ``kind`` / ``action`` / ``observation`` attributes, e.g. :class:`cb_io.records.Step`),
so that concept fitting and acting see byte-identical text (seed App. B: one formatting for
fitting and acting; the rendering and layout are recorded in every concept's metadata).

How the history is shown is a *rendering* (:mod:`agent_shell.history`: raw, causal, check,
experience and the interventions). How it is laid out is a *layout*:

``"text"`` - one text prompt, the published ReAct transcript format (seed Sec. 3.3)::

    <initial observation>
    <instruction>
    > <action 1>
    <observation 1>
    > think: <thought>
    OK.
    ...

  The scoring context ends with the latest observation (or the Check reminder); the LM backend
  appends ``"\\n> " + candidate`` (:data:`ACTION_PREFIX` ``["text"]``), so a scored candidate
  reads exactly like the next line of the transcript.

``"chat"`` - a list of ``{"role", "content"}`` messages: the task as the first user message,
then each action as an assistant message and its observation as the next user message. The
backend applies its chat template with a generation prompt, and a candidate is the content of
the next assistant message (action prefix ``""``).

A *reference* (reference-history recovery) is a recorded stretch of steps shown at a position
of the history and marked as not executed in the current environment.

This module imports nothing from the LM (its :data:`~agent_shell.lm.protocol.Context` type only for
annotations), cb_core or the games; of the records (:mod:`cb_io.records`) only the think-step convention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from agent_shell.history import (CHECK_REMINDER, EXPERIENCE_LABEL, INTERVENTIONS, RENDERINGS, REVIEWED, HistoryView,
                                 StepLike,
                                 action_line, check_rendering, demo_rendering, render)
from cb_io.records import THINK_FEEDBACK, THINK_PREFIX

if TYPE_CHECKING:
    from agent_shell.lm.protocol import Context


#: The transcript's mark of an action line (``> go to desk 1``); a routing prompt ends with it, and
#: a reply's leading marks are no part of the reply (:func:`agent_shell.candidates.parse_reply`).
ACTION_MARK = ">"
#: Layout name -> the prefix between a context and a scored candidate: the text layout scores a
#: candidate as the transcript's next action line, the chat layout as the next assistant message.
ACTION_PREFIX: dict[str, str] = {"text": f"\n{ACTION_MARK} ", "chat": ""}
LAYOUTS = tuple(ACTION_PREFIX)


def check_layout(layout: str) -> str:
    """Return ``layout`` if known; raise ValueError naming it otherwise."""
    if layout not in ACTION_PREFIX:
        raise ValueError(f"unknown layout {layout!r}; known: {list(LAYOUTS)}")
    return layout


def action_prefix(layout: str) -> str:
    """What the backend puts between a context of ``layout`` and a candidate action."""
    return ACTION_PREFIX[check_layout(layout)]


@dataclass(frozen=True)
class Reference:
    """A recorded stretch of steps shown at history position ``at``, marked as not executed.

    Attributes:
        at: the number of executed steps before the block (the block precedes step ``at``).
        steps: the recorded steps shown (rendered with the context's rendering, no experiences).
    """

    at: int
    steps: tuple

    def header(self) -> str:
        return (f"[Reference: {len(self.steps)} recorded steps follow. They were NOT executed in the "
                f"current environment, which is in the state after the {self.at} step(s) above.]")

    footer = "[End of reference. Actions below are executed.]"


def _entry_text(action: str | None, observation: str) -> str:
    return observation if action is None else f"{ACTION_MARK} {action}\n{observation}"


def _text_lines(pieces: Sequence[tuple[str, str | None, str]]) -> list[str]:
    """The text layout of :func:`_segments`' pieces: notes as they are, entries as transcript lines."""
    return [text if kind == "note" else _entry_text(action, text) for kind, action, text in pieces]


def _hidden_note(n: int) -> str:
    return f"({n} earlier steps are not shown.)"


def _segments(steps: Sequence[StepLike], rendering: str, experiences: Mapping[int, str] | None, seed: int,
              reference: Reference | None) -> tuple[HistoryView, list[tuple[str, str | None, str]]]:
    """The history as ordered (kind, action, text) pieces: kind "entry" or "note"."""
    view = render(steps, rendering, experiences, seed)
    pieces: list[tuple[str, str | None, str]] = []
    if view.hidden_before:
        pieces.append(("note", None, _hidden_note(view.hidden_before)))
    ref_done = reference is None
    for e in view.entries:
        if not ref_done and e.step >= reference.at:
            pieces.extend(_reference_pieces(reference, rendering, seed))
            ref_done = True
        obs = e.observation if not e.experience else f"{e.observation}\n{EXPERIENCE_LABEL} {e.experience.strip()}"
        pieces.append(("entry", e.action, obs))
    if not ref_done:
        pieces.extend(_reference_pieces(reference, rendering, seed))
    if view.reminder:
        pieces.append(("note", None, view.reminder))
    return view, pieces


def _reference_pieces(reference: Reference, rendering: str, seed: int) -> list[tuple[str, str | None, str]]:
    body = render(reference.steps, "raw" if rendering in REVIEWED else rendering, None, seed)
    text = "\n".join([reference.header()] + [_entry_text(e.action, e.observation) for e in body.entries]
                     + [Reference.footer])
    return [("note", None, text)]


def render_history(steps: Sequence[StepLike], rendering: str = "raw", experiences: Mapping[int, str] | None = None,
                   seed: int = 0, reference: Reference | None = None) -> str:
    """The interaction history (thoughts included) as text in the text layout; "" for none."""
    _, pieces = _segments(steps, rendering, experiences, seed, reference)
    return "\n".join(_text_lines(pieces))


def render_memory(reflections: Sequence[str]) -> str:
    """Reflexion's memory block (reflections of earlier failed trials); "" when there are none."""
    if not reflections:
        return ""
    lines = [f"Trial {i}: {r.strip()}" for i, r in enumerate(reflections, start=1)]
    return "Your memory for the task below:\n" + "\n".join(lines)


def render_task(instruction: str, observation: str) -> str:
    """The task block: initial observation o0, then the instruction (ReAct's ALFWorld layout)."""
    parts = [p.strip() for p in (observation, instruction) if p and p.strip()]
    if not parts:
        raise ValueError("render_task: both the instruction and the initial observation are empty")
    return "\n".join(parts)


def _merge(messages: list[dict]) -> list[dict]:
    out: list[dict] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"]:
            out[-1] = {"role": m["role"], "content": out[-1]["content"] + "\n" + m["content"]}
        else:
            out.append(dict(m))
    return out


def scoring_context(
    instruction: str,
    observation: str,
    steps: Sequence[StepLike],
    rendering: str = "raw",
    memory: Sequence[str] = (),
    *,
    layout: str = "text",
    experiences: Mapping[int, str] | None = None,
    seed: int = 0,
    reference: Reference | None = None,
) -> Context:
    """CB-Agent's scoring context x: [memory] + task + rendered history, no demonstrations.

    Used verbatim both for fitting (expert contexts) and for acting. Text layout: a string that
    ends with the latest observation (or the Check reminder), without a trailing newline; chat
    layout: a list of messages ending with a user message. Candidates are appended by the LM
    backend after :func:`action_prefix` ``(layout)``.

    Raises:
        ValueError: unknown rendering or layout, or an empty task.
    """
    check_layout(layout)
    head = "\n".join(b for b in (render_memory(memory), render_task(instruction, observation)) if b)
    _, pieces = _segments(steps, rendering, experiences, seed, reference)
    if layout == "text":
        return "\n".join([head] + _text_lines(pieces))
    messages = [{"role": "user", "content": head}]
    for kind, action, text in pieces:
        if kind == "entry" and action is not None:
            messages.append({"role": "assistant", "content": action})
        messages.append({"role": "user", "content": text})
    return _merge(messages)


def render_demo(instruction: str, observation: str, steps: Sequence[StepLike], rendering: str = "raw",
                experiences: Mapping[int, str] | None = None) -> str:
    """One demonstration: a whole expert transcript as text, rendered like the agent's history.

    Interventions (:data:`agent_shell.history.INTERVENTIONS`) apply to the agent's own history
    only; their demonstrations are raw (:func:`agent_shell.history.demo_rendering`). The Check
    reminder belongs before the agent's next action, so it is not part of a demonstration.
    """
    rendering = demo_rendering(rendering)
    text = scoring_context(instruction, observation, steps, rendering, experiences=experiences)
    if rendering == "check" and steps:
        text = text.removesuffix("\n" + CHECK_REMINDER)
    return text


def react_prompt(
    header: str,
    demos: Iterable[str],
    context: Context,
    task_header: str = "Here is the task.",
) -> Context:
    """The ReAct routing prompt (seed Sec. 3.3): header, demonstrations, then the task so far.

    Text layout: ends with ``"\\n>"`` so the LM's reply is the next transcript line (an action
    or ``think: ...``), read up to the first newline. Chat layout (``context`` is a message
    list): header, demonstrations and task header open the first user message; the reply is the
    next assistant message.
    """
    head = _head_text(header, demos, task_header)
    if isinstance(context, str):
        return head + context + "\n" + ACTION_MARK
    if not context or context[0].get("role") != "user":
        raise ValueError("a chat context must start with a user message")
    first = {"role": "user", "content": head + context[0]["content"]}
    return [first] + [dict(m) for m in context[1:]]


def _head_text(header: str, demos: Iterable[str], task_header: str) -> str:
    demos = [d.strip() for d in demos]
    parts = [header.strip().format(n_demos=len(demos))] + demos + [task_header.strip()]
    return "\n\n".join(parts) + "\n"


def react_head(header: str, demos: Iterable[str], task_header: str = "Here is the task.",
               layout: str = "text") -> Context:
    """The fixed head of every ReAct routing prompt of one task type (header, demonstrations, task
    header): what :func:`react_prompt` puts before the task, for an LM backend to encode once
    and reuse across episodes (:meth:`agent_shell.lm.tokenized.TokenizedBackend.pin_prefix`). Chat
    layout: the first user message holding only the head."""
    text = _head_text(header, demos, task_header)
    return text if check_layout(layout) == "text" else [{"role": "user", "content": text}]


def context_text(context: Context) -> str:
    """A context as plain text (chat messages joined with role tags), for reflection prompts."""
    if isinstance(context, str):
        return context
    return "\n".join(m["content"] if m["role"] == "user" else f"{ACTION_MARK} {m['content']}" for m in context)


__all__ = ["ACTION_MARK", "ACTION_PREFIX", "CHECK_REMINDER", "INTERVENTIONS", "LAYOUTS", "RENDERINGS",
           "Reference", "THINK_FEEDBACK", "THINK_PREFIX", "action_line", "action_prefix", "check_layout",
           "check_rendering", "context_text", "react_head", "react_prompt", "render_demo", "render_history",
           "render_memory", "render_task", "scoring_context"]
