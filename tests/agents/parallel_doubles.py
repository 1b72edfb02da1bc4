"""Players for the parallel-runner tests, built inside Ray workers (importable, picklable).

``make_players(kill_on=..., raise_on=..., marker_dir=...)`` gives a :class:`ScriptedEnv` and the
agents of :data:`AGENTS` over a stateless looping LM (its reply depends only on the prompt, so
an episode's record does not depend on which episodes the worker played before). ``kill_on``:
tasks whose first ``kills`` resets SIGKILL the worker process (counted in files under
``marker_dir``, shared by all workers); ``raise_on``: tasks whose every reset raises (an engine
fault); ``fail_on``: tasks whose every LM call raises (an exception that is no engine fault);
``hang_on``: tasks whose second engine step never returns (an engine that hangs).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import build_agent

AGENTS = ("react", "prior-only")
DEMOS = {"fetch": ["d"], "open": ["d"]}
LOOP = [" think: plan", " go to desk 1", " open box 1", " take key 1 from desk 1", " go to hall 1"] * 4


def loop_reply(prompt, temperature, n):
    return [LOOP[prompt.split("Here is the task.")[-1].count("\n> ") % len(LOOP)]] * n


class FaultyEnv(ScriptedEnv):
    def __init__(self, kill_on=(), kills=1, raise_on=(), marker_dir=None, hang_on=()):
        super().__init__()
        self.kill_on, self.kills, self.raise_on, self.hang_on = set(kill_on), kills, set(raise_on), set(hang_on)
        self.marker_dir = Path(marker_dir) if marker_dir else None

    def reset(self, task_id):
        if task_id in self.raise_on:
            raise RuntimeError(f"engine crashed on {task_id}")
        if task_id in self.kill_on:
            marker = self.marker_dir / task_id.replace("/", "_")
            with open(marker, "a") as f:
                f.write("x")
            if marker.stat().st_size <= self.kills:
                os.kill(os.getpid(), signal.SIGKILL)
        self.steps_played = 0
        return super().reset(task_id)

    def step(self, action):
        self.steps_played += 1
        if self._task in self.hang_on and self.steps_played > 1:
            threading.Event().wait()  # never set: blocks until interrupted
        return super().step(action)


def make_players(kill_on=(), kills=1, raise_on=(), marker_dir=None, fail_on=(), hang_on=()):
    env = FaultyEnv(kill_on, kills, raise_on, marker_dir, hang_on)

    def reply(prompt, temperature, n):
        task = next((t for t in fail_on if f"solve {t}." in prompt), None)
        if task is not None:
            raise RuntimeError(f"the LM failed on {task}")
        return loop_reply(prompt, temperature, n)

    return env, {name: build_agent(name, FakeLM(reply), DEMOS) for name in AGENTS}
