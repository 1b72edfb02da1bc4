"""Text contexts of the agents: the task, the interaction history, demonstrations, prompts.

Every agent context is built here from small pure functions of plain data (strings and steps
with ``kind`` / ``action`` / ``observation`` attributes, e.g. :class:`envs.trajectory.Step`),
so that concept fitting and acting see byte-identical text (seed App. B: one formatting for
fitting and acting; the rendering's name is recorded in every concept's metadata).

Layout (the published ReAct transcript format, seed Sec. 3.3)::

    <initial observation>
    <instruction>
    > <action 1>
    <observation 1>
    > think: <thought>
    OK.
    ...

The scoring context ends with the latest observation; the LM backend appends
``"\\n> " + candidate`` (:data:`agent_shell.lm.protocol.DEFAULT_ACTION_PREFIX`), so a scored
candidate reads exactly like the next line of the transcript.

A *rendering* turns the history into text. Only ``"raw"`` (the ordinary alternating action /
observation history) exists now; :data:`RENDERINGS` is the single place where others plug in.

This module imports nothing from the LM, the environments or cb_core.
"""

from __future__ import annotations

from typing import Callable, Iterable, Protocol, Sequence

#: Feedback of a think step (seed Sec. 2.3); it never reaches the environment.
THINK_FEEDBACK = "OK."
#: Prefix that marks a think step in the transcript and in an LM reply.
THINK_PREFIX = "think:"


class StepLike(Protocol):
    """What a rendering reads from a step (duck-typed; :class:`envs.trajectory.Step` fits)."""

    kind: str  # "think" or "env"
    action: str
    observation: str


def action_line(step: StepLike) -> str:
    """The transcript text of a step's action: ``think: ...`` for a think step, else the action.

    Think steps may store their text with or without the ``think:`` prefix; both render the same.
    """
    action = step.action.strip()
    if step.kind == "think" and not action.lower().startswith(THINK_PREFIX):
        action = f"{THINK_PREFIX} {action}"
    return action


def render_raw(steps: Sequence[StepLike]) -> list[str]:
    """Raw rendering: one ``"> action\\nobservation"`` block per step, in order."""
    return [f"> {action_line(s)}\n{s.observation.strip()}" for s in steps]


#: name -> function(steps) -> list of per-step text blocks joined by newlines.
RENDERINGS: dict[str, Callable[[Sequence[StepLike]], list[str]]] = {"raw": render_raw}


def check_rendering(rendering: str) -> str:
    """Return ``rendering`` if known; raise ValueError naming it and the known ones otherwise."""
    if rendering not in RENDERINGS:
        raise ValueError(f"unknown history rendering {rendering!r}; known: {sorted(RENDERINGS)}")
    return rendering


def render_task(instruction: str, observation: str) -> str:
    """The task block: initial observation o0, then the instruction (ReAct's ALFWorld layout)."""
    parts = [p.strip() for p in (observation, instruction) if p and p.strip()]
    if not parts:
        raise ValueError("render_task: both the instruction and the initial observation are empty")
    return "\n".join(parts)


def render_history(steps: Sequence[StepLike], rendering: str = "raw") -> str:
    """The interaction history (thoughts included) as text; "" for no steps."""
    return "\n".join(RENDERINGS[check_rendering(rendering)](steps))


def render_memory(reflections: Sequence[str]) -> str:
    """Reflexion's memory block (reflections of earlier failed trials); "" when there are none."""
    if not reflections:
        return ""
    lines = [f"Trial {i}: {r.strip()}" for i, r in enumerate(reflections, start=1)]
    return "Your memory for the task below:\n" + "\n".join(lines)


def scoring_context(
    instruction: str,
    observation: str,
    steps: Sequence[StepLike],
    rendering: str = "raw",
    memory: Sequence[str] = (),
) -> str:
    """CB-Agent's scoring context x: [memory] + task + history, no demonstrations.

    Used verbatim both for fitting (expert contexts) and for acting. It ends with the latest
    observation, without a trailing newline; candidates are appended by the LM backend.
    """
    blocks = [render_memory(memory), render_task(instruction, observation),
              render_history(steps, rendering)]
    return "\n".join(b for b in blocks if b)


def render_demo(instruction: str, observation: str, steps: Sequence[StepLike],
                rendering: str = "raw") -> str:
    """One demonstration: a whole expert transcript, rendered like the agent's own history."""
    return scoring_context(instruction, observation, steps, rendering)


def react_prompt(
    header: str,
    demos: Iterable[str],
    context: str,
    task_header: str = "Here is the task.",
) -> str:
    """The ReAct routing prompt (seed Sec. 3.3): header, demonstrations, then the task so far.

    Ends with ``"\\n>"`` so the LM's reply is the next transcript line (an action or
    ``think: ...``), read up to the first newline.
    """
    demos = [d.strip() for d in demos]
    parts = [header.strip().format(n_demos=len(demos))] + demos + [task_header.strip(), context]
    return "\n\n".join(parts[:-1]) + "\n" + parts[-1] + "\n>"

