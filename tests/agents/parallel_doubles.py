"""Players for the parallel-runner tests, built inside Ray workers (importable, picklable).

``make_players(kill_on=..., raise_on=..., marker_dir=...)`` gives a :class:`ScriptedEnv` and the
agents of :data:`AGENTS` over a stateless looping LM (its reply depends only on the prompt, so
an episode's record does not depend on which episodes the worker played before). ``kill_on``:
tasks whose first ``kills`` resets SIGKILL the worker process (counted in files under
``marker_dir``, shared by all workers); ``raise_on``: tasks whose every reset raises (an engine
fault); ``fail_on``: tasks whose every LM call raises (an exception that is no engine fault);
``broken_on``: tasks whose every LM call meets a fault of the backbone itself
(:class:`agent_shell.lm.protocol.BackboneFault`); ``oom_on``: tasks whose every LM call runs out of
memory, raising ``oom_kind``'s own error (:data:`OUT_OF_MEMORY`) through the backends' rule
(:func:`agent_shell.lm.faults.pass_fault`); ``hang_on``: tasks whose second engine step never
returns (an engine that hangs).
"""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path

from agent_doubles import FakeLM, HangingEnv, ScriptedEnv
from agent_shell.agents import build_agent
from agent_shell.pipeline import build_players as BUILD_PLAYERS  # the original, before any test replaces it

AGENTS = ("react", "prior-only")
DEMOS = {"fetch": ["d"], "open": ["d"]}
LOOP = [" think: plan", " go to desk 1", " open box 1", " take key 1 from desk 1", " go to hall 1"] * 4


def loop_reply(prompt, temperature, n):
    return [LOOP[prompt.split("Here is the task.")[-1].count("\n> ") % len(LOOP)]] * n


class FaultyEnv(HangingEnv):
    def __init__(self, kill_on=(), kills=1, raise_on=(), marker_dir=None, hang_on=()):
        super().__init__(hang_on=hang_on, after=1)
        self.kill_on, self.kills, self.raise_on = set(kill_on), kills, set(raise_on)
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
        return super().reset(task_id)


#: Each library's out-of-memory error as it raises it: (its type, its message); the type is built
#: by :func:`library_oom`.
OUT_OF_MEMORY = {
    "torch-cpu": ("RuntimeError", "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                  "memory: you tried to allocate 100000000000000 bytes. Error code 12 (Cannot allocate memory)"),
    "torch-cuda": ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                   "capacity of 79.15 GiB of which 1.02 GiB is free."),
    "jax": ("jax.errors.JaxRuntimeError", "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 "
            "bytes."),
}
#: The bytes each message of :data:`OUT_OF_MEMORY` asks for.
ASKED = {"torch-cpu": 100_000_000_000_000, "torch-cuda": 2 * 2**30, "jax": 17_179_869_184}


def library_oom(kind: str) -> BaseException:
    """The library's own out-of-memory exception of :data:`OUT_OF_MEMORY` ``kind``."""
    _, message = OUT_OF_MEMORY[kind]
    if kind == "torch-cuda":
        import torch

        return torch.OutOfMemoryError(message)
    if kind == "jax":
        import jax

        return jax.errors.JaxRuntimeError(message)
    return RuntimeError(message)


def faulty_lm(fail_on=(), broken_on=(), oom_on=(), oom_kind="torch-cpu") -> FakeLM:
    """The looping LM, with the faults :func:`make_players` describes."""
    def reply(prompt, temperature, n):
        from agent_shell.lm.faults import pass_fault
        from agent_shell.lm.protocol import BackboneFault

        if any(f"solve {t}." in prompt for t in oom_on):  # the context's length in characters stands for tokens
            raise pass_fault(library_oom(oom_kind), "the double's pass", len(prompt))
        task = next((t for t in fail_on if f"solve {t}." in prompt), None)
        if task is not None:
            raise RuntimeError(f"the LM failed on {task}")
        if any(f"solve {t}." in prompt for t in broken_on):
            raise BackboneFault.of(TypeError("cannot reshape array"), "the JAX decoder's stream pass")
        return loop_reply(prompt, temperature, n)

    return FakeLM(reply)


def make_players(kill_on=(), kills=1, raise_on=(), marker_dir=None, fail_on=(), hang_on=(), broken_on=(),
                 oom_on=(), oom_kind="torch-cpu"):
    env = FaultyEnv(kill_on, kills, raise_on, marker_dir, hang_on)
    lm = faulty_lm(fail_on, broken_on, oom_on, oom_kind)
    return env, {name: build_agent(name, lm, DEMOS) for name in AGENTS}


def players_built_together(workers: int, marker_dir: str, timeout_s: float = 120.0):
    """:func:`make_players`, once ``workers`` workers have begun building theirs: each marks its
    start with a file under ``marker_dir`` and waits for the others' marks (RuntimeError after
    ``timeout_s``). Workers that build one after another never get past the first."""
    import time

    Path(marker_dir, f"building-{os.getpid()}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(Path(marker_dir).glob("building-*"))) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the other workers did not begin building their players within {timeout_s:g} s")
        time.sleep(0.05)
    return make_players()


# ------------------------------------------------------------------------------------------------
# `cb-agent run --workers N` with doubles: the CLI's own path, on ScriptedEnv and the looping LM


def install_doubles() -> None:
    """In this process: every environment the pipeline makes is a :class:`ScriptedEnv`, every
    backbone it loads the looping FakeLM (what the driver's and each worker's set-up call)."""
    import agent_shell.lm
    import envs

    envs.make_env = lambda name, **kw: ScriptedEnv()
    agent_shell.lm.load_language_model = lambda name=None, dtype="float32", **kw: FakeLM(loop_reply)


def players_after(install, config, task_types, server=None):
    """:func:`agent_shell.pipeline.build_players` in a Ray worker, with the doubles of ``install``
    installed first (a worker is a fresh process: the driver's doubles do not reach it)."""
    install()
    return BUILD_PLAYERS(config, task_types, server)


def use_doubles_in_run_command(install=None) -> None:
    """This process's ``cb-agent run`` (and ``improve``) plays on the doubles of ``install`` (default
    :func:`install_doubles`), also on its Ray workers (:func:`agent_shell.parallel.play_on_ray` hands
    them ``agent_shell.pipeline.build_players``)."""
    import agent_shell.pipeline

    install = install or install_doubles
    install()
    agent_shell.pipeline.build_players = functools.partial(players_after, install)


def install_improve_doubles() -> None:
    """In this process: the relabelling doubles of ``test_improve`` (its :class:`LabellingEnv` over
    its GAMES, whose expert answers from any state, and a FakeLM preferring the desk's actions)."""
    import agent_shell.lm
    import envs
    from test_improve import GAMES, LabellingEnv

    envs.make_env = lambda name, **kw: LabellingEnv(GAMES)
    agent_shell.lm.load_language_model = lambda name=None, dtype="float32", **kw: FakeLM((" go",), prefer="desk")


def killed_driver(stop_after: int, argv: list[str]) -> None:
    """``cb-agent run ARGV`` on the doubles whose process SIGKILLs itself right after storing its
    ``stop_after``-th record (a driver killed mid-run, at a known point)."""
    import agent_shell.scheduler
    from agent_shell.cli import main

    use_doubles_in_run_command()
    store, stored = agent_shell.scheduler.store_record, []

    def store_then_die(*args, **kwargs):
        store(*args, **kwargs)
        stored.append(args[1])
        if len(stored) == stop_after:
            os.kill(os.getpid(), signal.SIGKILL)

    agent_shell.scheduler.store_record = store_then_die
    main(argv)


if __name__ == "__main__":  # python parallel_doubles.py STOP_AFTER RUN-ARGS...: killed_driver
    import sys

    killed_driver(int(sys.argv[1]), sys.argv[2:])
