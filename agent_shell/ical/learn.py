"""ICAL's two phases for one noisy trajectory: abstraction, then refinement with feedback.

1. **Abstraction** F_abstract(noisy trajectory, I, k examples) -> (optimized trajectory, L): the
   LM reads the noisy record and writes a program (:mod:`agent_shell.ical.program`) with the
   actions corrected and the four kinds of annotation; the prompt shows ``k`` retrieved examples
   from the memory (or, while the memory is empty, one built-in worked example of the format).
2. **Refinement** Xi_update(optimized trajectory, H(a_t, o_t), L, I, examples): the program is
   executed in the real game (:func:`agent_shell.ical.execution.execute`), annotations as think
   steps. Where it fails - an action outside the state's candidate set, an action the engine
   answers with its invalid feedback (ALFWorld ``Nothing happens.``), or a finished program that
   did not reach the goal - feedback H (the failed action, what the game answered, the valid
   actions there, whether the goal was reached) goes back to the LM, which writes the whole
   program again. With a person in the loop (:class:`agent_shell.ical.execution.HumanFeedback`)
   every executed step is shown and a typed line becomes feedback (Enter accepts the step).

:func:`learn_example` runs both phases for up to ``max_rounds`` revisions and records every round;
only a program whose execution wins yields an :class:`agent_shell.ical.memory.Example`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from agent_shell.ical.execution import Execution, Feedback, execute
from agent_shell.ical.memory import Example
from agent_shell.ical.program import ABSTRACTIONS_HEADER, Parsed, parse_program
from cb_io.records import Trajectory

if TYPE_CHECKING:
    from agent_shell.lm.protocol import LanguageModel
    from envs.protocol import Environment

#: How a program is written: free generation, or constrained to a grammar and the admissible commands.
DECODINGS = ("free", "constrained", "anchored")

HEADER = (
    "You turn a noisy record of a task in a text game into a clean example for later use. Remove "
    "detours, repeated and useless actions, and fix wrong objects, so that the actions solve the task. "
    "Explain the solution with annotations of four kinds: causal (a principle of the task, cause and "
    "effect), state (the objects and receptacles that matter), subgoal (the next step, in short) and "
    "effect (what an action changes). Actions start with '> ' and must be game commands. Write:\n"
    "Abstractions:\n<causal and state lines>\nProgram:\n<subgoal, '> action' and effect lines>\nEnd"
)

#: The built-in worked example shown while the memory holds none (written for this project).
BUILTIN_EXAMPLE = """Task: Your task is to: put a hot apple in fridge.
Noisy record:
> go to drawer 2
The drawer 2 is closed.
> go to countertop 1
On the countertop 1, you see a apple 1, and a knife 1.
> take apple 1 from countertop 1
You pick up the apple 1 from the countertop 1.
> take apple 1 from countertop 1
Nothing happens.
> go to microwave 1
The microwave 1 is closed.
> heat apple 1 with microwave 1
You heat the apple 1 using the microwave 1.
> go to fridge 1
The fridge 1 is closed.
> open fridge 1
You open the fridge 1. The fridge 1 is open. In it, you see nothing.
> move apple 1 to fridge 1
You move the apple 1 to the fridge 1.
Clean example:
Abstractions:
causal: To heat something, hold it and use a microwave; then put it where the task says.
state: apple 1, countertop 1, microwave 1, fridge 1
Program:
subgoal: find and take an apple
> go to countertop 1
> take apple 1 from countertop 1
effect: I hold the apple 1.
subgoal: heat the apple
> go to microwave 1
> heat apple 1 with microwave 1
effect: the apple 1 is hot.
subgoal: put the apple in the fridge
> go to fridge 1
> open fridge 1
> move apple 1 to fridge 1
End"""


def render_record(traj: Trajectory, max_steps: int | None = None) -> str:
    """The noisy trajectory as a transcript (initial observation, then ``> action`` / observation)."""
    from agent_shell.context import render_history

    steps = traj.steps if max_steps is None else traj.steps[:max_steps]
    lines = [traj.observation.strip(), render_history(steps)]
    outcome = "The task was completed." if traj.won else "The task was NOT completed."
    return "\n".join(line for line in lines if line) + f"\n({outcome})"


def example_text(example: Example) -> str:
    """A memory example as shown in abstraction prompts (no noisy record: only its clean form)."""
    return f"Task: {example.instruction}\nClean example:\n{example.program.text()}"


def abstraction_prompt(noisy: Trajectory, examples: Sequence[Example] = ()) -> str:
    """F_abstract's prompt: header, examples, the noisy record; ends with ``Abstractions:\\n`` so
    the reply continues the clean example (the caller puts the header back before parsing)."""
    shown = [example_text(e) for e in examples] or [BUILTIN_EXAMPLE]
    return (f"{HEADER}\n\n" + "\n\n".join(shown) + f"\n\nTask: {noisy.instruction}\nNoisy record:\n"
            f"{render_record(noisy)}\nClean example:\n{ABSTRACTIONS_HEADER}\n")


def revision_prompt(noisy: Trajectory, program_text: str, executed: Trajectory | None, feedback: str,
                    examples: Sequence[Example] = ()) -> str:
    """Xi_update's prompt: as :func:`abstraction_prompt`, then the last program, the steps of its
    execution and the feedback H; the reply is the whole corrected program."""
    shown = [example_text(e) for e in examples] or [BUILTIN_EXAMPLE]
    ran = ""
    if executed is not None and executed.steps:
        from agent_shell.context import render_history

        ran = f"It was executed in the game:\n{render_history(executed.steps)}\n"
    return (f"{HEADER}\n\n" + "\n\n".join(shown) + f"\n\nTask: {noisy.instruction}\nNoisy record:\n"
            f"{render_record(noisy)}\nYour last clean example:\n{program_text.strip()}\n{ran}"
            f"Feedback: {feedback.strip()}\nWrite the corrected clean example.\n{ABSTRACTIONS_HEADER}\n")


# ------------------------------------------------------------------------------------------------
# the loop


@dataclass(frozen=True)
class LearnConfig:
    """Settings of :func:`learn_example`.

    Attributes:
        max_rounds: revisions after the first abstraction (0: abstraction only, executed once).
        max_new_tokens: length cap of one program.
        k: retrieved examples shown in each prompt.
        seed: generation seed (greedy decoding ignores it).
        decoding: "free" (the LM writes the whole program; ``max_new_tokens``), "constrained"
            (:mod:`agent_shell.ical.constrained`: lines by grammar, actions from the admissible
            commands of a scratch game) or "anchored" (constrained, and the action options
            anchored to the noisy record's next actions).
        extra_actions: constrained decoding writes at most the noisy record's actions plus
            this many.
        notes: who writes the annotations of constrained decoding: "inline" (the LM continues
            the program text) or "chat" (short chat requests, :class:`agent_shell.ical.constrained.ChatNotes`).
        episode_timeout: wall-clock seconds each game played for an input may take (the replay
            of its record, the scratch game of constrained decoding, each execution), past which
            :class:`cb_io.records.EpisodeTimeout` is raised (:func:`envs.episode.time_limit`); None: no
            limit. Not a setting of the outputs (it changes no program that finishes in time).
    """

    max_rounds: int = 2
    max_new_tokens: int = 400
    k: int = 2
    seed: int = 0
    decoding: str = "free"
    extra_actions: int = 5
    notes: str = "inline"
    episode_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.max_rounds < 0:
            raise ValueError(f"max_rounds must be >= 0, got {self.max_rounds}")
        if self.max_new_tokens < 1 or self.k < 0:
            raise ValueError("max_new_tokens must be >= 1 and k >= 0")
        if self.decoding not in DECODINGS:
            raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}, got {self.decoding!r}")
        if self.notes not in ("inline", "chat"):
            raise ValueError(f"notes must be 'inline' or 'chat', got {self.notes!r}")
        if self.notes == "chat" and self.decoding == "free":
            raise ValueError("notes='chat' writes the notes of constrained decoding: it needs decoding "
                             "'constrained' or 'anchored' (free decoding writes its notes itself)")
        if self.extra_actions < 0:
            raise ValueError(f"extra_actions must be >= 0, got {self.extra_actions}")
        if self.episode_timeout is not None and not self.episode_timeout > 0:
            raise ValueError(f"episode_timeout must be > 0 seconds or None, got {self.episode_timeout}")


@dataclass
class Outcome:
    """What :func:`learn_example` did with one noisy trajectory.

    Attributes:
        noisy_id: the input's id.
        rounds: one dict per round (``round``, ``kind`` abstract/revise, ``output``, ``parse_issues``,
            ``program``, ``executed_steps``, ``won``, ``failure``, ``feedback``, ``seconds``).
        example: the kept example, or None.
        reason: why it was not kept (the last round's parse reasons or failure reason; ``engine:
            time limit`` or ``engine: fault`` when a game of the input ran past its wall-clock
            limit or its engine failed, which ends the input), or None.
        error: with an ``engine:`` reason, ``{"type", "message", "round"}`` (the round it ended).
    """

    noisy_id: str
    task_type: str
    rounds: list[dict] = field(default_factory=list)
    example: Example | None = None
    reason: str | None = None
    error: dict | None = None

    @property
    def abstracted(self) -> bool:
        """The first abstraction parsed."""
        return bool(self.rounds) and self.rounds[0]["program"] is not None

    def to_record(self) -> dict:
        record = {"noisy_id": self.noisy_id, "task_type": self.task_type, "kept": self.example is not None,
                  "n_rounds": len(self.rounds), "reason": self.reason, "rounds": self.rounds,
                  "example_id": None if self.example is None else self.example.example_id}
        return record if self.error is None else {**record, "error": self.error}


def allowed_actions(*trajectories: Trajectory) -> set[str]:
    """The union of the environment's candidate sets seen in ``trajectories`` (env steps)."""
    return {c for t in trajectories for s in t.steps if s.candidates for c in s.candidates}


def final_candidates(env: Environment, noisy: Trajectory, time_limit: float | None = None) -> list[str]:
    """The candidate set after the noisy trajectory's last step (a trajectory stores the sets
    *before* each action only), found by replaying its environment actions in a fresh game
    within ``time_limit`` seconds (:class:`cb_io.records.EpisodeTimeout` past it; None: no limit); []
    when the replay wins."""
    from envs.episode import Episode, time_limit as limit

    actions = [s.action for s in noisy.steps if s.kind == "env"]
    if not actions:
        return []
    with limit(time_limit):
        episode = Episode(env, noisy.task_id, len(actions))
        for action in actions:
            if episode.done:
                break
            episode.act(action)
        return [] if episode.won else list(env.candidates())


def generate_program(lm: LanguageModel, prompt: str, config: LearnConfig) -> str:
    """One program from the LM (greedy), with the section header the prompt ended with put back."""
    reply = lm.generate(prompt, max_new_tokens=config.max_new_tokens, stop=("\nEnd", "\n\n\n"), temperature=0.0,
                        n=1, seed=config.seed)[0]
    return f"{ABSTRACTIONS_HEADER}\n{reply}"


def write_program(lm: LanguageModel, env: Environment, noisy: Trajectory, prompt: str, config: LearnConfig) -> tuple[str, set[str]]:
    """One program for ``noisy``'s task after ``prompt``, as ``config.decoding`` says: free
    (:func:`generate_program`) or constrained (:func:`agent_shell.ical.constrained.constrained_program`,
    at most the record's environment actions + ``config.extra_actions``).

    Returns:
        (the program text, the commands known admissible where the writer met them: none for
        free generation, the scratch game's candidate sets for constrained decoding).
    """
    if config.decoding == "free":
        return generate_program(lm, prompt, config), set()
    from agent_shell.ical.constrained import ChatNotes, constrained_program
    from envs.episode import time_limit

    record = [step.action for step in noisy.steps if step.kind == "env"]
    notes = ChatNotes(lm, noisy.instruction, record, seed=config.seed) if config.notes == "chat" else None
    with time_limit(config.episode_timeout):  # the scratch game, its LM calls included
        return constrained_program(lm, env, noisy.task_id, prompt,
                                   max_actions=max(1, len(record) + config.extra_actions),
                                   record=record if config.decoding == "anchored" else None, seed=config.seed,
                                   notes=notes)


def run_round(outcome: Outcome, kind: str, output: str, parsed: Parsed, env: Environment, noisy: Trajectory,
              feedback: Feedback | None, seconds: float, time_limit: float | None = None) -> Execution | None:
    """Record one round: a parsed program is executed (within ``time_limit`` seconds:
    :class:`cb_io.records.EpisodeTimeout` past it, and nothing recorded); an unparsable one is not."""
    from envs.episode import time_limit as limit

    execution = None
    if parsed.ok:
        with limit(time_limit):
            execution = execute(env, noisy.task_id, parsed.program, feedback)
    outcome.rounds.append({
        "round": len(outcome.rounds), "kind": kind, "output": output,
        "parse_issues": [str(i) for i in parsed.issues], "parse_reasons": parsed.reasons,
        "program": None if parsed.program is None else parsed.program.to_record(),
        "executed_steps": None if execution is None else len(execution.trajectory.steps),
        "won": bool(execution and execution.won), "failure": None if execution is None else execution.failure,
        "feedback": None if execution is None else execution.feedback,
        "trajectory": None if execution is None else execution.trajectory.to_record(),
        "seconds": round(seconds, 3)})
    return execution


def learn_example(lm: LanguageModel, env: Environment, noisy: Trajectory, examples: Sequence[Example] = (),
                  config: LearnConfig = LearnConfig(), feedback: Feedback | None = None,
                  first_output: str | None = None) -> Outcome:
    """Abstraction, then up to ``config.max_rounds`` revisions, for one noisy trajectory.

    Args:
        lm: the backbone (``generate``).
        env: the environment adapter the program is executed in.
        noisy: the noisy trajectory (:mod:`agent_shell.ical.noisy`).
        examples: retrieved examples for the prompts (at most ``config.k`` are shown).
        feedback: :class:`agent_shell.ical.execution.HumanFeedback` for a person in the loop;
            default environment only.
        first_output: an abstraction already written (``cb-agent ical abstract``); the LM is
            then called for revisions only.

    Returns:
        :class:`Outcome` with every round and, when an execution won, the kept example. A game of
        the input that runs past ``config.episode_timeout`` or whose engine fails
        (:class:`cb_io.records.EngineError`) ends the input, not kept: reason ``engine: time limit`` or
        ``engine: fault``, ``error`` naming it, the rounds before it recorded.
    """
    from agent_shell.ical.noisy import noisy_id
    from cb_io.records import EngineError, EpisodeTimeout, one_line

    nid = noisy_id(noisy)
    outcome = Outcome(nid, noisy.task_type)
    shown = list(examples)[:config.k]
    try:
        parsed, execution = _rounds(outcome, lm, env, noisy, shown, config, feedback, first_output)
    except EngineError as err:  # this input ends; the caller goes on with the next
        outcome.reason = f"engine: {'time limit' if isinstance(err, EpisodeTimeout) else 'fault'}"
        outcome.error = {"type": type(err).__name__, "message": one_line(err), "round": len(outcome.rounds)}
        return outcome
    if execution is not None and execution.won:
        outcome.example = Example(example_id=nid, program=parsed.program, trajectory=execution.trajectory,
                                  source={"noisy_id": nid, **noisy.meta.get("noisy_source", {}),
                                          "corruptions": noisy.meta.get("corruptions"), "decoding": config.decoding,
                                          "notes": config.notes},
                                  rounds=len(outcome.rounds) - 1, backbone=str(getattr(lm, "name", "")))
    else:
        last = outcome.rounds[-1]
        outcome.reason = ("parse: " + ", ".join(last["parse_reasons"])) if last["program"] is None \
            else f"execution: {last['failure']['reason']}"
    return outcome


def _rounds(outcome: Outcome, lm: LanguageModel, env: Environment, noisy: Trajectory, shown: Sequence[Example],
            config: LearnConfig, feedback: Feedback | None, first_output: str | None) -> tuple[Parsed, Execution | None]:
    """:func:`learn_example`'s rounds, recorded in ``outcome``; (the last parse, its execution)."""
    allowed = allowed_actions(noisy) | set(final_candidates(env, noisy, config.episode_timeout))
    t = time.perf_counter()
    if first_output is not None:
        output = first_output
    else:
        output, seen = write_program(lm, env, noisy, abstraction_prompt(noisy, shown), config)
        allowed |= seen
    parsed = parse_program(output, allowed)
    execution = run_round(outcome, "abstract", output, parsed, env, noisy, feedback, time.perf_counter() - t,
                          config.episode_timeout)
    for _ in range(config.max_rounds):
        if execution is not None and execution.won:
            break
        t = time.perf_counter()
        if execution is None:
            h = "Your clean example could not be read: " + "; ".join(str(i) for i in parsed.issues[:5])
            executed, program_text = None, output
        else:
            h, executed = execution.feedback, execution.trajectory
            program_text = parsed.program.text()
            allowed |= allowed_actions(executed)
        output, seen = write_program(lm, env, noisy, revision_prompt(noisy, program_text, executed, h, shown), config)
        allowed |= seen
        parsed = parse_program(output, allowed)
        execution = run_round(outcome, "revise", output, parsed, env, noisy, feedback, time.perf_counter() - t,
                              config.episode_timeout)
    return parsed, execution


def abstract_record(lm: LanguageModel, env: Environment, noisy: Trajectory, examples: Sequence[Example], config: LearnConfig
                    ) -> tuple[dict, Parsed]:
    """Phase 1 only (``cb-agent ical abstract``): the LM abstracts ``noisy`` after the prompt with
    ``examples``; the output is parsed strictly against the actions known admissible, not executed.

    Returns:
        (the output line's record: ``noisy_id``, ``task_type``, ``output``, ``parsed``,
        ``parse_issues``, ``parse_reasons``, ``examples``, ``decoding``, ``notes``, ``program``,
        ``backbone``; the parse).

    Raises:
        cb_io.records.EngineError: a game it plays (the record's replay, constrained decoding's scratch
            game) failed or ran past ``config.episode_timeout`` (:class:`cb_io.records.EpisodeTimeout`).
    """
    from agent_shell.ical.noisy import noisy_id

    output, seen = write_program(lm, env, noisy, abstraction_prompt(noisy, examples), config)
    parsed = parse_program(output, allowed_actions(noisy) | set(final_candidates(env, noisy, config.episode_timeout))
                           | seen)
    record = {"noisy_id": noisy_id(noisy), "task_type": noisy.task_type, "output": output, "parsed": parsed.ok,
              "parse_issues": [str(i) for i in parsed.issues], "parse_reasons": parsed.reasons,
              "examples": [e.example_id for e in examples], "decoding": config.decoding, "notes": config.notes,
              "program": None if parsed.program is None else parsed.program.to_record(), "backbone": lm.name}
    return record, parsed


def learn_record(outcome: Outcome, examples: Sequence[Example], config: LearnConfig, lm: LanguageModel) -> dict:
    """The output line of ``cb-agent ical refine`` / ``build-memory`` for one noisy trajectory:
    :meth:`Outcome.to_record` with the examples shown, the decoding, the notes and the backbone
    (None without an LM)."""
    return {**outcome.to_record(), "examples": [e.example_id for e in examples], "decoding": config.decoding,
            "notes": config.notes, "backbone": lm.name if lm is not None else None}


def read_abstractions(path: str | Path) -> dict[str, str]:
    """noisy id -> abstraction output of a ``cb-agent ical abstract`` file (a later line wins).

    Raises:
        ValueError: a line that is torn or not of that command's output (naming file and line).
    """
    from cb_io.storage import iter_jsonl

    firsts: dict[str, str] = {}
    for number, record, err in iter_jsonl(path):
        if err is None and not (isinstance(record, dict) and {"noisy_id", "output"} <= record.keys()):
            err = "not a line of cb-agent ical abstract"
        if err is not None:
            raise ValueError(f"{path}:{number}: {err}")
        firsts[record["noisy_id"]] = record["output"]
    return firsts


__all__ = ["BUILTIN_EXAMPLE", "DECODINGS", "LearnConfig", "Outcome", "abstract_record", "abstraction_prompt",
           "allowed_actions", "learn_example", "learn_record", "read_abstractions", "revision_prompt", "write_program"]
