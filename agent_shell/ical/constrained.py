"""ICAL programs written under constraints: a grammar for the lines, the game's admissible
commands for the actions.

A small backbone rarely writes a whole program in the form :func:`agent_shell.ical.program.parse_program`
reads (SmolLM2-135M: 0 of 30 free outputs parsed, docs/results.md "ICAL"). Constrained decoding keeps the
LM as the author of every choice and every word while the decoder supplies the form:

* **Lines by grammar.** ``Abstractions:`` gets one ``causal:`` and one ``state:`` line (their
  text generated up to the line's end); then ``Program:``, where each new line is one of the
  options the grammar allows there, chosen by the LM's length-normalised log-probability of the
  option's text (the prior of Eq. 3, log q / L ** gamma)::

      after Program:        subgoal: | > action
      after a subgoal line  > action
      after an action       effect: | subgoal: | > action | End
      after an effect line  subgoal: | > action | End

  A chosen annotation's text is generated freely up to the end of its line (an empty one is
  dropped), either continuing the program text (inline) or as the answer to a short chat
  request about the task (:class:`ChatNotes`).
* **Actions from the admissible commands.** A scratch game follows the program as it is
  written, so each ``> action`` option is a command the game accepts in the state the written
  actions lead to: a repeated pickup, a wrong object number or an action of another state cannot
  be written at all (the corrections ICAL asks for that the candidate sets decide). Which of the
  admissible commands, and in which order, is the LM's choice, read from the noisy record in its
  prompt.
* **Anchored to the record** (``record`` given, ``decoding="anchored"``): the action options
  come from the record's next ``window`` actions (:func:`anchored_options`): the LM keeps the
  next one or skips a detour; where the next one is not admissible (a repeat, a wrong object),
  it chooses among the admissible commands of the same verb and the later record actions; where
  nothing of the record fits, among every admissible command (a missing step); past the
  record's end, every admissible command. A small backbone cannot pick the right command out of
  30-50 by itself (prior-only wins no ALFWorld game here), but it can tell a detour from the
  next step; the anchor is a decoding constraint, and what the program does is still checked by
  executing it.
* **No undo loops.** One command is written at most ``max_uses`` times (default 2).
* **The LM watches the game.** The LM reads the program so far with the scratch game's answer
  under each action, as in the noisy record (the program itself has no observations), so what
  it writes next can follow what the game showed.
* **Where it stops.** ``End`` when the LM chooses it, when the scratch game reports the goal, or
  after ``max_actions`` actions.

The output is ordinary program text: the strict parser reads it, the execution of the
refinement phase runs it in a fresh game, and its rounds are recorded like free outputs.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from agent_shell.ical.program import ABSTRACTIONS_HEADER, END_MARK, PROGRAM_HEADER

if TYPE_CHECKING:
    from agent_shell.lm.protocol import LanguageModel
    from envs.protocol import Environment

#: Line options after each kind of line (``program``: right after ``Program:``).
GRAMMAR = {
    "program": ("subgoal", "act"),
    "subgoal": ("act",),
    "act": ("effect", "subgoal", "act", "end"),
    "effect": ("subgoal", "act", "end"),
}
#: The text that starts each option's line (an action option is ``> `` + the command).
OPENERS = {"subgoal": "subgoal:", "effect": "effect:", "end": END_MARK}


def choose(lm: LanguageModel, text: str, options: Sequence[str], gamma: float) -> int:
    """Index of the option the LM prefers as the next line of ``text``: the argmax of
    log q(option | text) / n_tokens ** gamma (ties: the first).

    Raises:
        ValueError: no options (from the backend's candidate check).
    """
    scores = lm.score(text, list(options), "")
    return int(np.argmax(np.asarray(scores.log_q, np.float64) / np.asarray(scores.n_tokens, np.float64) ** gamma))


def line_text(lm: LanguageModel, text: str, max_tokens: int, seed: int = 0) -> str:
    """The LM's greedy continuation of ``text`` up to the end of the line (stripped)."""
    reply = lm.generate(text, max_new_tokens=max_tokens, stop=("\n",), temperature=0.0, n=1, seed=seed)[0]
    return " ".join(reply.split())


#: The question a chat note asks per annotation kind (``notes="chat"``).
NOTE_QUESTIONS = {
    "causal": "State in one short sentence the principle that solves this task (cause and effect).",
    "state": "List only the objects and places that matter for this task, separated by commas.",
    "subgoal": "In a few words, what should be done next?",
    "effect": "In a few words, what did the last action change?",
}


class ChatNotes:
    """Annotations written as answers to short chat requests (the backbone's chat template)
    instead of continuing the long abstraction prompt, where a small backbone copies the
    record's numbered object lists ("1, 2, 3, ...") into its notes.

    Each request holds the instruction and, per kind: the record's actions (``causal``,
    ``state``), the actions written so far (``subgoal``), or the last action and the game's
    answer (``effect``); then the kind's question (:data:`NOTE_QUESTIONS`). The reply's first
    non-empty line is the note. Runs on ``lm.fork()``, so the abstraction prompt's KV cache is kept.
    """

    def __init__(self, lm: LanguageModel, instruction: str, record: Sequence[str], max_tokens: int = 32, seed: int = 0):
        self.lm = lm.fork()
        self.instruction = instruction.strip()
        self.record = list(record)
        self.max_tokens = max_tokens
        self.seed = seed

    def request(self, kind: str, written: Sequence[str], observation: str | None) -> str:
        """The user message for one note."""
        if kind in ("causal", "state"):
            facts = "Actions of an attempt:\n" + "\n".join(self.record)
        elif kind == "subgoal":
            facts = "Done so far: " + ("; ".join(written) if written else "nothing") + "."
        else:
            facts = f"Last action: {written[-1] if written else 'none'}\nThe game answered: {observation or ''}"
        return f"{self.instruction}\n{facts}\n{NOTE_QUESTIONS[kind]}"

    def __call__(self, kind: str, written: Sequence[str], observation: str | None) -> str:
        messages = [{"role": "user", "content": self.request(kind, written, observation)}]
        reply = self.lm.generate(messages, max_new_tokens=self.max_tokens, stop=("\n\n",), temperature=0.0, n=1,
                                 seed=self.seed)[0]
        return next((" ".join(line.split()) for line in reply.splitlines() if line.strip()), "")


def anchored_options(ahead: Sequence[str], admissible: Sequence[str]) -> list[str]:
    """The action options of anchored decoding, given the record's next actions ``ahead`` and
    the commands ``admissible`` now.

    * The next record action admissible: it and the admissible ones after it (keep or skip a
      detour).
    * Not admissible (a repeat, a wrong object): the admissible commands of the same verb (the
      same object fixed: ``use statue 1`` -> ``use desklamp 1``) and the admissible record
      actions after it.
    * None of those: every admissible command (a missing step to put in).
    """
    ahead_ok = [a for a in dict.fromkeys(ahead) if a in admissible]
    if ahead and ahead[0] in admissible:
        return ahead_ok
    verb = ahead[0].split(" ", 1)[0] if ahead else ""
    options = [c for c in admissible if c.split(" ", 1)[0] == verb and c not in ahead_ok] + ahead_ok
    return options or list(admissible)


def constrained_program(lm: LanguageModel, env: Environment, task_id: str, prompt: str, *, max_actions: int,
                        max_uses: int = 2, record: Sequence[str] | None = None, window: int = 3, gamma: float = 0.8,
                        line_tokens: int = 32, seed: int = 0,
                        notes: Callable[[str, list[str], str | None], str] | None = None) -> tuple[str, set[str]]:
    """Write one program for ``task_id`` under the grammar and the admissible commands.

    Args:
        lm: the backbone (``score`` and ``generate``).
        env: the environment adapter; a scratch game of ``task_id`` is played in it.
        prompt: the abstraction or revision prompt, ending with ``Abstractions:\\n``.
        max_actions: actions at most (then ``End``).
        max_uses: times one command may be written at most (a program that undoes and redoes an
            action, e.g. take / put back, is a detour ICAL removes; twice leaves room for tasks
            that revisit a place).
        record: the noisy record's environment actions, to anchor the action options to (None:
            every admissible command is an option at every action line).
        window: record actions offered ahead when anchored.
        gamma: length-normalisation exponent of the option scores.
        line_tokens: token cap of each annotation's text.
        notes: who writes an annotation's text: None continues the program text after
            ``<kind>: `` (inline), or a callable ``(kind, actions written, last observation) ->
            text`` such as :class:`ChatNotes`.

    Returns:
        (the program text from ``Abstractions:`` to ``End``, the form :func:`parse_program` reads;
        the admissible commands of every state the scratch game passed through, so the parser's
        candidate-set check accepts what was admissible where it was written).

    Raises:
        ValueError: ``prompt`` does not end with the ``Abstractions:`` line, or max_actions,
            max_uses or window < 1.
    """
    from envs.episode import Episode

    if not prompt.endswith(ABSTRACTIONS_HEADER + "\n"):
        raise ValueError("a constrained program continues a prompt that ends with 'Abstractions:' and a newline")
    if max_actions < 1 or max_uses < 1 or window < 1:
        raise ValueError(f"max_actions, max_uses and window must be >= 1, got {max_actions}, {max_uses}, {window}")
    lines: list[str] = []  # the program
    seen: list[str] = []  # what the LM reads: the program with the scratch game's observations
    admissible: set[str] = set()
    actions: list[str] = []  # the commands written, in order
    uses: Counter = Counter()

    def so_far() -> str:
        return prompt + "".join(line + "\n" for line in seen)

    def write(line: str, observation: str | None = None) -> None:
        lines.append(line)
        seen.append(line)
        if observation is not None:
            seen.append(" ".join(observation.split()))

    last_observation: str | None = None

    def annotate(kind: str) -> bool:
        if notes is None:
            said = line_text(lm, so_far() + f"{kind}: ", line_tokens, seed)
        else:
            said = " ".join(str(notes(kind, list(actions), last_observation)).split())
        if said:
            write(f"{kind}: {said}")
        return bool(said)

    for kind in ("causal", "state"):
        annotate(kind)
    write(PROGRAM_HEADER)
    episode = Episode(env, task_id, max_steps=max_actions)
    state, empty = "program", set()  # empty: note kinds just written empty
    at = 0  # the record's next action (anchored decoding)
    while not (episode.won or episode.done or len(actions) >= max_actions):
        kinds = [k for k in GRAMMAR[state] if k not in empty]
        options = [OPENERS[k] for k in kinds if k != "act"]
        if "act" in kinds:
            commands = episode.candidates()
            admissible.update(commands)
            allowed = [c for c in commands if uses[c] < max_uses]
            if record is not None:
                while at < len(record) and actions and record[at] == actions[-1] and record[at] not in allowed:
                    at += 1  # a repeat of the action just written that the game would refuse
                if at < len(record):
                    allowed = anchored_options(record[at:at + window], allowed)
            options += [f"> {c}" for c in allowed]
        if not options:
            break
        opener = options[choose(lm, so_far(), options, gamma)]
        if opener == END_MARK:
            break
        if opener.startswith("> "):
            command = opener[2:]
            last_observation = episode.act(command).observation
            write(opener, last_observation)
            actions.append(command)
            uses[command] += 1
            if record is not None and command in record[at:at + window]:
                at += record[at:at + window].index(command) + 1
            state, empty = "act", set()
        else:
            kind = opener[:-1]
            if annotate(kind):
                state, empty = kind, set()
            else:  # nothing written: the same line options, without this kind
                empty.add(kind)
    lines.append(END_MARK)
    return ABSTRACTIONS_HEADER + "\n" + "\n".join(lines), admissible


__all__ = ["ChatNotes", "GRAMMAR", "NOTE_QUESTIONS", "OPENERS", "anchored_options", "choose", "constrained_program", "line_text"]
