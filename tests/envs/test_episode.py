"""Episode semantics: think steps, the step budget, recording (a scripted engine, then a real one)."""

from __future__ import annotations

import pytest

from agent_shell.expert_decisions import decision_examples
from cb_io.records import StepResult, TaskStart, is_think
from envs import Episode, EpisodeOver


class ScriptedEnv:
    """A two-action engine that records every call that reaches it."""

    name = "scripted"
    default_max_steps = 4

    def __init__(self):
        self.calls: list[str] = []

    def tasks(self, split):
        return ["t"]

    def reset(self, task_id, expert=False):
        self.calls.append("reset")
        return TaskStart(task_id, "type", "Do it.", "o0")

    def step(self, action):
        self.calls.append(action)
        won = action == "win"
        return StepResult(f"did {action}", done=won, won=won, score=float(won))

    def candidates(self):
        return ["noop", "win"]

    def expert_action(self):
        return "win"

    def close(self):
        pass


def test_think_steps_never_reach_the_engine_but_use_the_budget():
    env = ScriptedEnv()
    ep = Episode(env, "t", max_steps=3)
    r = ep.act("think: first I plan")
    assert r.observation == "OK." and not r.done
    ep.act("  THINK: again")
    assert env.calls == ["reset"]
    assert ep.budget_left == 1
    ep.act("noop")
    assert env.calls == ["reset", "noop"]
    assert ep.done and not ep.won  # budget spent
    with pytest.raises(EpisodeOver):
        ep.act("win")
    assert [s.kind for s in ep.steps] == ["think", "think", "env"]
    assert ep.steps[2].candidates == ["noop", "win"]
    assert ep.steps[0].candidates is None


def test_a_thought_spending_the_last_step_ends_the_episode():
    ep = Episode(ScriptedEnv(), "t", max_steps=1)
    assert ep.act("think: hmm").done
    assert ep.done and not ep.won


def test_won_episode_becomes_a_trajectory():
    env = ScriptedEnv()
    ep = Episode(env, "t")
    assert ep.max_steps == 4  # the adapter's default_max_steps
    ep.act("think: win now")
    r = ep.act("win")
    assert r.won and ep.done and ep.won
    traj = ep.trajectory({"expert": "scripted"})
    assert traj.won and traj.meta == {"max_steps": 4, "expert": "scripted"}
    examples, skipped = decision_examples(traj)
    assert len(examples) == 1 and skipped == 0
    assert examples[0].history[0].observation == "OK."


def test_is_think_and_bad_inputs():
    assert is_think("think: x") and is_think(" Think: x") and not is_think("thinking about it")
    with pytest.raises(ValueError):
        Episode(ScriptedEnv(), "t", max_steps=0)
    with pytest.raises(ValueError):
        Episode(ScriptedEnv(), "t").act("  ")


# -- engine faults, the expert only on request, the split ---------------------------------

class FaultyEnv(ScriptedEnv):
    """Raises like a third-party engine on the action "crash"; knows its tasks' splits."""

    def __init__(self):
        super().__init__()
        self.expert_calls = 0

    def split_of(self, task_id):
        if task_id not in ("t", "u"):
            raise ValueError(f"unknown task {task_id!r}")
        return {"t": "train", "u": "test"}[task_id]

    def step(self, action):
        if action == "crash":
            raise Exception("Timeout\n  at the engine's line 1\n  at line 2")
        return super().step(action)

    def expert_action(self):
        self.expert_calls += 1
        return super().expert_action()


def test_an_engine_fault_is_one_engine_error_and_records_nothing():
    from cb_io.records import EngineError

    ep = Episode(FaultyEnv(), "t", max_steps=4)
    ep.act("noop")
    with pytest.raises(EngineError) as err:
        ep.act("crash")
    assert str(err.value) == "scripted engine failed in step 'crash' at step 2 of 't': Exception: Timeout"
    assert isinstance(err.value.__cause__, Exception) and len(ep.steps) == 1
    with pytest.raises(ValueError, match="unknown task"):  # bad input stays a ValueError
        Episode(FaultyEnv(), "v")


def test_the_expert_runs_only_when_asked_for():
    env = FaultyEnv()
    agent = Episode(env, "t")
    with pytest.raises(RuntimeError, match="without its expert"):
        agent.expert_action()
    assert env.expert_calls == 0
    assert Episode(env, "t", expert=True).expert_action() == "win" and env.expert_calls == 1


def test_the_split_is_checked_and_recorded():
    from envs import check_tasks

    env = FaultyEnv()
    with pytest.raises(ValueError, match="task 'u' belongs to split 'test', not 'train': refusing to mix splits"):
        Episode(env, "u", split="train")
    with pytest.raises(ValueError, match="'u' belongs to split 'test'"):
        check_tasks(env, "train", ["t", "u"])
    assert Episode(env, "u").trajectory().meta == {"max_steps": 4, "split": "test"}
    assert Episode(env, "t", split="train").trajectory().meta["split"] == "train"


def test_scienceworld_passes_an_episode_time_limit_through_without_restarting_its_engine():
    """A step that never returns, inside an episode's time limit: the limit reaches the caller as
    EpisodeTimeout at once; the adapter does not take it for a crashed JVM (no restart, no retry).
    No JVM starts: the engine call is replaced by one that blocks."""
    import threading

    from cb_io.records import EpisodeTimeout
    from envs import time_limit
    from envs.scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv()
    restarts = []
    env._call = lambda fn, timeout: threading.Event().wait()  # never set: a hung engine
    env._restart = lambda: restarts.append(1)
    with pytest.raises(EpisodeTimeout, match="limit of 1 s"), time_limit(1.0):
        env._robust(lambda sw: sw.step("look"), 60.0)
    assert restarts == []


def test_a_time_limit_never_fires_inside_an_import(tmp_path, monkeypatch):
    """A module whose import outlasts the limit is imported whole (the limit waits for the import to
    end, then fires): it is never left half-initialised for the rest of the process."""
    import sys
    import time

    from cb_io.records import EpisodeTimeout
    from envs import time_limit

    (tmp_path / "slow_engine_module.py").write_text("import time\ntime.sleep(1.5)\nREADY = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_engine_module", raising=False)
    with pytest.raises(EpisodeTimeout, match="limit of 0.3 s"), time_limit(0.3):
        import slow_engine_module  # noqa: F401  (runs past the limit inside the import)

        time.sleep(30)  # the limit fires here, once the import is done
    assert sys.modules["slow_engine_module"].READY is True


def test_the_engines_are_imported_before_the_clock_starts(monkeypatch):
    """play_episode imports the adapter's ENGINE_MODULES before its time limit starts."""
    import importlib

    from agent_shell import scheduler
    from envs.textworld import TextWorldEnv

    imported, clock = [], []
    monkeypatch.setattr("envs.episode.play_within", lambda seconds, play, fault: clock.append(seconds) or "played")
    monkeypatch.setattr(importlib, "import_module", lambda name: imported.append((name, list(clock))))
    assert scheduler.play_episode(TextWorldEnv(), object(), "custom-1/test/100001", 5, time_limit=2.0) == "played"
    assert imported == [("textworld", []), ("textworld.gym", [])] and clock == [2.0]


def test_an_agents_thought_reaches_the_episode_as_a_thought_never_parsed_from_text():
    """The agent loop passes a think decision to Episode.think as what it is: even a thought whose
    text does not start with ``think:`` is a think step (feedback OK., no engine call), and an
    environment action whose text happens to read like a thought is never taken for one there."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))
    from agent_doubles import FakeLM, ScriptedEnv
    from agent_shell.agents import Decision, ReActAgent

    class Planner(ReActAgent):
        def next_action(self, view):
            if len(view.steps) == 0:
                return Decision("think", "plan the route to the desk")
            return Decision("env", "go to desk 1")

    env = ScriptedEnv()
    episode = Episode(env, "a/1", 3)
    Planner(FakeLM(), {"fetch": ["DEMO"]}).run(episode)
    assert [(s.kind, s.action, s.observation) for s in episode.steps[:2]] == [
        ("think", "plan the route to the desk", "OK."), ("env", "go to desk 1", episode.steps[1].observation)]
    assert episode.steps[1].observation != "OK."


class LoopEnv(ScriptedEnv):
    """Never ends; candidates ``noop``, ``wait`` and the expert's ``step`` (or an expert that answers
    ``fly``, outside the candidate set, when ``off_set``)."""

    def __init__(self, off_set=False):
        super().__init__()
        self.off_set = off_set

    def step(self, action):
        self.calls.append(action)
        return StepResult(f"did {action}", done=False, won=False, score=0.0)

    def candidates(self):
        return ["noop", "wait", "step"]

    def expert_action(self):
        return "fly" if self.off_set else "step"


def mixed_actions(mix, seed=0, n=200, env=None):
    env = env or LoopEnv()
    ep = Episode(env, "t", max_steps=n, expert=True, expert_mix=mix, mix_seed=seed)
    for i in range(n):
        ep.act("think: hm" if i % 7 == 3 else "noop")
    return ep


def test_expert_mixing_executes_the_experts_action_with_probability_beta_and_records_the_agents():
    from envs.episode import AGENT_ACTION

    always = mixed_actions(1.0, n=20)
    env_steps = [s for s in always.steps if s.kind == "env"]
    assert {s.action for s in env_steps} == {"step"} and all(s.info[AGENT_ACTION] == "noop" for s in env_steps)
    assert always.env.calls[1:] == ["step"] * len(env_steps)  # the engine ran the expert's action
    assert all(s.action.startswith("think:") and not s.info for s in always.steps if s.kind == "think")
    half = mixed_actions(0.5)
    executed = [s.action == "step" for s in half.steps if s.kind == "env"]
    assert all((AGENT_ACTION in s.info) == (s.action == "step") for s in half.steps if s.kind == "env")
    assert 0.35 < sum(executed) / len(executed) < 0.65  # 171 draws at 0.5 (a fixed seed: no flakiness)
    assert executed == [s.action == "step" for s in mixed_actions(0.5).steps if s.kind == "env"]  # same draws
    assert executed != [s.action == "step" for s in mixed_actions(0.5, seed=1).steps if s.kind == "env"]
    # an expert answering outside the candidate set, or the agent already taking its action: the agent's stands
    off = mixed_actions(1.0, n=10, env=LoopEnv(off_set=True))
    assert all(s.action == "noop" and not s.info for s in off.steps if s.kind == "env")
    agrees = Episode(LoopEnv(), "t", max_steps=3, expert=True, expert_mix=1.0)
    agrees.act("step")
    assert agrees.steps[0].action == "step" and AGENT_ACTION not in agrees.steps[0].info
    assert [s.action for s in mixed_actions(0.0, n=10).steps if s.kind == "env"] == ["noop"] * 9


def test_expert_mixing_is_refused_outside_a_probability_or_without_the_expert():
    with pytest.raises(ValueError, match=r"expert_mix must be a probability in \[0, 1\], got 1.5"):
        Episode(LoopEnv(), "t", max_steps=3, expert=True, expert_mix=1.5)
    with pytest.raises(ValueError, match="expert_mix needs the episode's expert"):
        Episode(LoopEnv(), "t", max_steps=3, expert_mix=0.5)
