"""ICAL's structured output: an optimized trajectory with its language abstractions ("programs of
thought"), how it is written, and the strict parser of what the LM wrote.

The LM writes (and every stored example is shown in) this text form::

    Abstractions:
    causal: To clean something, take it to a sinkbasin and clean it there.
    state: mug, sinkbasin 1, coffeemachine 1
    Program:
    subgoal: find a mug
    > go to countertop 1
    > take mug 1 from countertop 1
    effect: I hold mug 1.
    ...
    End

Annotation kinds (ICAL Sec. 3, the four kinds of abstraction): ``causal`` - task and causal
abstractions (principles, cause and effect); ``effect`` - state changes (predicted effects of an
action); ``subgoal`` - task decomposition (a step and its short summary); ``state`` - state
abstraction (only the relevant objects and receptacles, and others worth checking). The
``Abstractions:`` section holds task-level annotations, the ``Program:`` section the actions
(``> action``) interleaved with step-level annotations; an annotation's ``at`` is the number of
actions written before it. ``End`` closes the program; anything after it is ignored.

:func:`parse_program` is strict: any defect rejects the whole output and every defect is listed
with a short reason (:data:`REASONS`), so a caller can count why outputs were rejected. Actions
must be in ``allowed`` (the environment's candidate sets seen for the task), compared after
collapsing whitespace and case; the candidate's own spelling is kept.

Pure functions; imports nothing of the LM, the environments or cb_core.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

#: Annotation kinds, in the order the source lists them.
KINDS = ("causal", "effect", "subgoal", "state")
#: How an annotation reads as a thought in a ReAct transcript (``think: <label> <text>``).
THOUGHT_LABELS = {"causal": "Principle:", "effect": "Effect:", "subgoal": "Subgoal:", "state": "Relevant:"}
ABSTRACTIONS_HEADER = "Abstractions:"
PROGRAM_HEADER = "Program:"
END_MARK = "End"

#: Every reason :func:`parse_program` can give, for counting.
REASONS = (
    "empty output",
    "missing section Abstractions",
    "missing section Program",
    "no abstraction",
    "no actions",
    "unreadable line",
    "unknown annotation kind",
    "empty annotation",
    "action outside the candidate sets",
)

_ANNOTATION = re.compile(r"^[-*]?\s*([A-Za-z][A-Za-z _-]*?)\s*:\s*(.*)$")


@dataclass(frozen=True)
class Annotation:
    """One abstraction: its kind (:data:`KINDS`), its text, and where it stands.

    ``at`` is None for a task-level annotation (section Abstractions), else the number of
    program actions before it (0 = before the first action).
    """

    kind: str
    text: str
    at: int | None = None

    def thought(self) -> str:
        """The annotation as a think step's text (``think: Subgoal: find a mug``)."""
        return f"think: {THOUGHT_LABELS[self.kind]} {self.text}"


@dataclass(frozen=True)
class Program:
    """A parsed ICAL output: task-level abstractions, then actions with step-level annotations.

    Attributes:
        abstractions: task-level annotations (``at`` None).
        actions: the optimized action sequence, in the candidate sets' own spelling.
        notes: step-level annotations (``at`` = actions before them).
    """

    abstractions: tuple[Annotation, ...]
    actions: tuple[str, ...]
    notes: tuple[Annotation, ...] = ()

    def items(self) -> list[tuple[str, str]]:
        """The program in transcript order as ("think" | "act", text) pairs: task-level
        abstractions first, then each action preceded by the notes standing before it."""
        out = [("think", a.thought()) for a in self.abstractions]
        for i in range(len(self.actions) + 1):
            out.extend(("think", n.thought()) for n in self.notes if n.at == i)
            if i < len(self.actions):
                out.append(("act", self.actions[i]))
        return out

    def text(self) -> str:
        """The program in the written form :func:`parse_program` reads (``End`` included)."""
        lines = [ABSTRACTIONS_HEADER] + [f"{a.kind}: {a.text}" for a in self.abstractions] + [PROGRAM_HEADER]
        for i in range(len(self.actions) + 1):
            lines.extend(f"{n.kind}: {n.text}" for n in self.notes if n.at == i)
            if i < len(self.actions):
                lines.append(f"> {self.actions[i]}")
        return "\n".join(lines + [END_MARK])

    def to_record(self) -> dict:
        return {"abstractions": [{"kind": a.kind, "text": a.text} for a in self.abstractions],
                "actions": list(self.actions),
                "notes": [{"kind": n.kind, "text": n.text, "at": n.at} for n in self.notes]}

    @classmethod
    def from_record(cls, record: dict) -> "Program":
        """Inverse of :meth:`to_record`; raises ValueError naming a missing field or bad kind."""
        try:
            abstractions = tuple(Annotation(_kind(a["kind"]), str(a["text"])) for a in record["abstractions"])
            notes = tuple(Annotation(_kind(n["kind"]), str(n["text"]), int(n["at"])) for n in record["notes"])
            actions = tuple(str(a) for a in record["actions"])
        except KeyError as err:
            raise ValueError(f"program record lacks field {err.args[0]!r}") from None
        except TypeError as err:
            raise ValueError(f"malformed program record: {err}") from None
        return cls(abstractions, actions, notes)


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown annotation kind {kind!r}; known: {list(KINDS)}")
    return kind


@dataclass(frozen=True)
class Issue:
    """One defect of an output: its reason (:data:`REASONS`), 1-based line number (0: the whole
    output) and the offending text."""

    reason: str
    line: int = 0
    text: str = ""

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.reason}" + (f" ({self.text!r})" if self.text else "")


@dataclass(frozen=True)
class Parsed:
    """What :func:`parse_program` found: the program when there was no defect, and every defect."""

    program: Program | None
    issues: tuple[Issue, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.program is not None

    @property
    def reasons(self) -> list[str]:
        """The distinct reasons, in order of first appearance (for counting rejections)."""
        return list(dict.fromkeys(i.reason for i in self.issues))


def normalize_action(text: str) -> str:
    """An action as compared: leading ``>`` marks dropped, whitespace collapsed, lower case."""
    return " ".join(text.strip().lstrip(">").split()).lower()


def parse_program(text: str, allowed: Iterable[str] | None = None) -> Parsed:
    """Parse an ICAL output strictly.

    Args:
        text: the LM's output in the form of this module's docstring (a leading ``Task:`` line
            and blank lines are ignored; parsing stops at ``End``).
        allowed: the candidate actions the program may use (the union of the environment's
            candidate sets seen for the task); None accepts every action.

    Returns:
        :class:`Parsed`: ``program`` is None when any defect was found; ``issues`` lists every
        defect (reason, line, text). Never raises on bad LM text.
    """
    canonical = None if allowed is None else {normalize_action(a): a for a in allowed}
    issues: list[Issue] = []
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        return Parsed(None, (Issue("empty output"),))
    section: str | None = None
    seen: set[str] = set()
    abstractions: list[Annotation] = []
    actions: list[str] = []
    notes: list[Annotation] = []
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.rstrip(".").lower() == END_MARK.lower():
            break
        header = line.lower().rstrip(":")
        if header in ("abstractions", "program") and line.endswith(":"):
            section = header
            seen.add(header)
            continue
        if section is None:
            if line.lower().startswith("task:"):
                continue
            issues.append(Issue("unreadable line", number, line))
            continue
        if line.startswith(">"):
            if section != "program":
                issues.append(Issue("unreadable line", number, line))
                continue
            action = " ".join(line.lstrip(">").split())
            if not action:
                issues.append(Issue("unreadable line", number, line))
            elif canonical is not None and normalize_action(action) not in canonical:
                issues.append(Issue("action outside the candidate sets", number, action))
            else:
                actions.append(action if canonical is None else canonical[normalize_action(action)])
            continue
        match = _ANNOTATION.match(line)
        if match is None:
            issues.append(Issue("unreadable line", number, line))
            continue
        kind, body = match.group(1).strip().lower(), " ".join(match.group(2).split())
        if kind not in KINDS:
            issues.append(Issue("unknown annotation kind", number, kind))
            continue
        if not body:
            issues.append(Issue("empty annotation", number, kind))
            continue
        if section == "abstractions":
            abstractions.append(Annotation(kind, body))
        else:
            notes.append(Annotation(kind, body, len(actions)))
    if "abstractions" not in seen:
        issues.append(Issue("missing section Abstractions"))
    elif not abstractions:
        issues.append(Issue("no abstraction"))
    if "program" not in seen:
        issues.append(Issue("missing section Program"))
    elif not actions:
        issues.append(Issue("no actions"))
    if issues:
        return Parsed(None, tuple(issues))
    return Parsed(Program(tuple(abstractions), tuple(actions), tuple(notes)), ())


__all__ = ["ABSTRACTIONS_HEADER", "END_MARK", "KINDS", "PROGRAM_HEADER", "REASONS", "THOUGHT_LABELS", "Annotation",
           "Issue", "Parsed", "Program", "normalize_action", "parse_program"]
