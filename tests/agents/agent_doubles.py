"""Small deterministic test doubles for the agent tests: a language model and an environment.

* :class:`FakeLM` implements the LanguageModel protocol structurally, with no base class (its
  decisions: the host decision, :func:`agent_shell.lm.decision.decide`). ``score`` derives log q and hidden
  states from a hash of (context, candidate), so equal inputs give equal numbers; ``generate``
  replays a script of replies (or calls a function of the prompt) and records every prompt.
* :class:`ScriptedEnv` implements the Environment protocol: each task is won by playing its
  solution in order; any other action answers ``Nothing happens.``. Every action that reaches
  the engine is recorded in ``engine_actions``. :class:`HangingEnv`: the same game whose engine
  hangs on some tasks (for time limits).
"""

from __future__ import annotations

import hashlib
import json
import threading
from typing import Callable, Sequence

import numpy as np

from agent_shell.lm.protocol import CandidateScores
from cb_io.records import StepResult, TaskStart


def _seed(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:8], "little")


def _text(context) -> str:
    """A context as one string: a text as is, chat messages as JSON (so both layouts score)."""
    return context if isinstance(context, str) else json.dumps(list(context), sort_keys=True)


class FakeLM:
    """Hash-based scores; scripted replies.

    Args:
        replies: a list of replies served in order (the last one repeats), or a function
            ``(prompt, temperature, n) -> list[str]``.
        hidden_size: d.
        prefer: if given, this substring boosts a candidate's log q by 5 nats (steers the prior).
    """

    def __init__(self, replies: Sequence[str] | Callable = ("> go",), hidden_size: int = 8,
                 prefer: str | None = None, name: str = "fake-lm"):
        self.name = name
        self.hidden_size = hidden_size
        self.replies = replies
        self.prefer = prefer
        self.prompts: list[str] = []
        self.score_calls: list[tuple[str, list[str]]] = []
        self._i = 0
        self._last = None

    def fork(self):
        """No KV cache to keep apart: the double is its own view."""
        return self

    def score(self, context, candidates, action_prefix):
        if not candidates or any(not c for c in candidates):
            raise ValueError("empty candidate list or candidate")
        self.score_calls.append((context, list(candidates)))
        log_q, hidden = [], []
        for c in candidates:
            rng = np.random.default_rng(_seed(_text(context)[-300:], c))
            boost = 5.0 if self.prefer and self.prefer in c else 0.0
            log_q.append(-rng.uniform(1.0, 6.0) * len(c.split()) + boost)
            hidden.append(rng.normal(size=self.hidden_size))
        return CandidateScores(np.asarray(log_q, np.float32),
                               np.asarray([len(c.split()) for c in candidates], np.int32),
                               np.asarray(hidden, np.float32))

    def generate(self, prompt, max_new_tokens=64, stop=(), temperature=0.0, n=1, seed=None):
        """Scripted replies; like a greedy LM, a repeated greedy prompt gets the same reply again
        (no script entry consumed), cut to ``max_new_tokens`` words when that is below 8."""
        self.prompts.append(prompt)
        if callable(self.replies):
            out = list(self.replies(prompt, temperature, n))
        elif temperature == 0 and self._last is not None and self._last[0] == prompt:
            out = [self._last[1]] * n
        else:
            out = []
            for _ in range(n):
                out.append(self.replies[min(self._i, len(self.replies) - 1)])
                self._i += 1
            if temperature == 0:
                self._last = (prompt, out[0])
        if max_new_tokens < 8:
            out = [" ".join(r.split(" ")[:max_new_tokens + 1]) for r in out]  # a leading space is no word
        return out


#: task id -> (task type, solution)
TASKS = {
    "a/1": ("fetch", ["go to desk 1", "take key 1 from desk 1"]),
    "a/2": ("fetch", ["go to shelf 1", "take book 2 from shelf 1"]),
    "a/3": ("fetch", ["go to bed 1", "take pillow 1 from bed 1"]),
    "b/1": ("open", ["go to door 1", "open door 1", "go to hall 1"]),
    "b/2": ("open", ["go to box 1", "open box 1", "go to hall 1"]),
}


class ScriptedEnv:
    """A tiny deterministic text game per task (see :data:`TASKS`)."""

    name = "scripted"
    default_max_steps = 10
    expert_name = "scripted-expert"

    def __init__(self, tasks: dict | None = None, expert_looks: bool = False):
        self._tasks = dict(TASKS if tasks is None else tasks)
        self.expert_looks = expert_looks  # expert issues `look` before each move (like ALFWorld's)
        self.engine_actions: list[str] = []
        self.closed = False
        self._task = None
        self._pos = 0
        self._looked = False

    def tasks(self, split):
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}")
        return sorted(self._tasks)

    def task_type_of(self, task_id):
        return self._tasks[task_id][0]

    def reset(self, task_id, expert=False):
        if task_id not in self._tasks:
            raise ValueError(f"unknown task {task_id!r}")
        self._task, self._pos, self._looked = task_id, 0, False
        return TaskStart(task_id, self._tasks[task_id][0], f"Your task is to: solve {task_id}.",
                         "You are in a small room.")

    def _solution(self):
        return self._tasks[self._task][1]

    def step(self, action):
        self.engine_actions.append(action)
        sol = self._solution()
        if action == "look":
            self._looked = True
            return StepResult("You are in a small room.", False, False)
        if self._pos < len(sol) and action == sol[self._pos]:
            self._pos += 1
            self._looked = False
            won = self._pos == len(sol)
            return StepResult(f"You {action}.", won, won, float(won))
        return StepResult("Nothing happens.", False, False)

    def candidates(self):
        sol = self._solution()
        nxt = sol[self._pos] if self._pos < len(sol) else "wait"
        return ["look", "inventory", "help", "go to window 1", nxt, "examine wall 1"]

    def expert_action(self):
        sol = self._solution()
        if self._pos >= len(sol):
            return None
        if self.expert_looks and not self._looked:
            return "look"
        return sol[self._pos]

    def close(self):
        self.closed = True


class SplitEnv(ScriptedEnv):
    """:class:`ScriptedEnv` with train and test games apart (``<type>/<split>/<n>``)."""

    def tasks(self, split):
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}")
        return sorted((t for t in self._tasks if t.split("/")[1] == split), key=lambda t: int(t.split("/")[2]))

    def split_of(self, task_id):
        return task_id.split("/")[1]


class HangingEnv(ScriptedEnv):
    """A :class:`ScriptedEnv` whose engine hangs on the tasks ``hang_on``: the step that plays
    ``action`` (when given), else step number ``after + 1`` of a game (counted from its reset),
    never returns, and only a time limit ends it."""

    def __init__(self, hang_on=(), after: int = 1, action: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.hang_on, self.after, self.action, self.steps_played = set(hang_on), after, action, 0

    def reset(self, task_id, expert=False):
        self.steps_played = 0
        return super().reset(task_id, expert)

    def step(self, action):
        self.steps_played += 1
        hangs = action == self.action if self.action is not None else self.steps_played > self.after
        if self._task in self.hang_on and hangs:
            threading.Event().wait()  # never set: blocks until interrupted
        return super().step(action)


def play_agent(env, agent, task_ids, results_path, max_steps, resume=True, meta=None, keep_errors=False):
    """One agent's episodes on ``task_ids`` in this process (in the given order), appended to
    ``results_path``: the scheduler with the in-process executor. Returns its RunSummary."""
    from agent_shell.scheduler import InProcessExecutor, play_episodes

    return play_episodes(InProcessExecutor(env, {agent.name: agent}), [agent.name], task_ids, results_path,
                         max_steps, resume=resume, meta=meta, keep_errors=keep_errors)[agent.name]
