"""Runner: records, loop statistics, resume after an interrupt and after a killed process."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, ScriptedEnv, play_agent
from agent_shell.agents import build_agent
from agent_shell.cli import main
from agent_shell.results import longest_repeat_cycle, loop_statistics, read_results
from cb_io.records import Step

DEMOS = {"fetch": ["d"], "open": ["d"]}
TASKS = ["a/1", "a/2", "b/1"]


@pytest.mark.parametrize("actions, expected", [
    ([], (0, 0, 0)),
    (["a", "b", "c"], (0, 0, 0)),
    (["a", "a", "a"], (1, 3, 3)),
    (["x", "open", "close", "open", "close", "open", "y"], (2, 2, 4)),
    (["go 1", "go 2", "go 1", "go 2", "go 1", "go 2"], (2, 3, 6)),
    (["a", "a", "b", "a", "a", "b"], (3, 2, 6)),
])
def test_longest_repeat_cycle(actions, expected):
    c = longest_repeat_cycle(actions)
    assert (c["period"], c["repeats"], c["span"]) == expected


def test_loop_statistics_ignore_think_steps():
    steps = [Step("env", "go 1", "o", ["go 1"], False, False, 0.0),
             Step("think", "think: hm", "OK.", None, False, False, 0.0),
             Step("env", "go 1", "o", ["go 1"], False, False, 0.0)]
    assert loop_statistics(steps) == {"distinct_actions": 1, "longest_cycle": {"period": 1, "repeats": 2, "span": 2}}


LOOP = [" think: plan"] + [" open box 1", " close box 1"] * 10


def loop_reply(prompt, temperature, n):
    """Stateless: the reply depends only on how many steps the current task's history holds."""
    return [LOOP[prompt.split("Here is the task.")[-1].count("\n> ")]] * n


def looping_lm():
    return FakeLM(loop_reply)


def test_records_hold_counts_loop_statistics_and_the_trajectory(tmp_path):
    out = tmp_path / "results.jsonl"
    before = time.time()
    summary = play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), ["a/1"], out, max_steps=8,
                         meta={"env": "scripted"})
    (rec,) = read_results(out)
    assert rec == summary.records[0]
    assert rec["agent"] == "react" and rec["task_type"] == "fetch" and rec["success"] is False
    assert (rec["steps"], rec["think_steps"], rec["env_steps"], rec["budget"]) == (8, 1, 7, 8)
    assert rec["longest_cycle"]["period"] == 2 and rec["longest_cycle"]["span"] == 6
    assert rec["distinct_actions"] == 2 and rec["env"] == "scripted" and rec["n_trials"] == 1
    assert len(rec["trials"][0]["trajectory"]["steps"]) == 8
    assert not (tmp_path / "results.jsonl.partial").exists()  # no state left behind, not even empty folders
    assert before - 0.1 <= rec["finished_at"] - rec["wall_s"] <= rec["finished_at"] <= time.time() + 0.1


def test_no_resume_refuses_to_duplicate(tmp_path):
    out = tmp_path / "r.jsonl"
    play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1"], out, max_steps=2)
    with pytest.raises(ValueError, match="--resume"):
        play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1"], out, max_steps=2, resume=False)
    # another agent may share the file
    play_agent(ScriptedEnv(), build_agent("prior-only", FakeLM(), DEMOS), ["a/1"], out, max_steps=2, resume=False)
    assert [r["agent"] for r in read_results(out)] == ["react", "prior-only"]


def test_resume_refuses_to_mix_renderings_or_budgets(tmp_path):
    out = tmp_path / "r.jsonl"
    play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1"], out, max_steps=2,
               meta={"rendering": "causal", "layout": "text"})
    with pytest.raises(ValueError, match="rendering='causal'.*rendering='raw'"):
        play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1", "b/2"], out, max_steps=2,
                   meta={"rendering": "raw", "layout": "text"})
    with pytest.raises(ValueError, match="budget=2.*budget=3"):
        play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1"], out, max_steps=3,
                   meta={"rendering": "causal"})
    summary = play_agent(ScriptedEnv(), build_agent("react", FakeLM(), DEMOS), ["a/1"], out, max_steps=2,
                         meta={"rendering": "causal", "layout": "text"})
    assert summary.skipped == ["a/1"] and len(read_results(out)) == 1


def test_read_results_skips_lines_that_are_no_episode_records(tmp_path):
    out = tmp_path / "probe.jsonl"
    out.write_bytes(orjson.dumps({"study": "probe", "agent": "react", "task_id": "a/1", "repeat": True}) + b"\n")
    with pytest.warns(UserWarning, match="probe.jsonl:1: .*not an episode record.*probe study"):
        assert read_results(out) == []


class InterruptingLM(FakeLM):
    """Raises KeyboardInterrupt on its n-th generate call (a Ctrl-C mid-episode)."""

    def __init__(self, at, **kw):
        super().__init__(**kw)
        self.at = at

    def generate(self, *args, **kw):
        if len(self.prompts) + 1 == self.at:
            self.prompts.append("<interrupted>")
            raise KeyboardInterrupt
        return super().generate(*args, **kw)


def untimed(value):
    """A record without its wall-clock fields (which differ between runs)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k not in ("wall_s", "s_per_step", "seconds", "finished_at")}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def test_partial_state_folders_are_removed_only_after_the_executor_closes(tmp_path, monkeypatch):
    """A worker writes the next episode's state into the agent's partial folder while the driver
    stores the last one, so no partial folder is removed while the run's executor is open (the race
    that removing emptied folders after each record invited); once it is closed, the emptied folders go."""
    import agent_shell.scheduler

    events = []
    close, rmdir = agent_shell.scheduler.InProcessExecutor.close, Path.rmdir
    monkeypatch.setattr(agent_shell.scheduler.InProcessExecutor, "close",
                        lambda self: (events.append("closed"), close(self))[1])
    monkeypatch.setattr(Path, "rmdir", lambda self: (events.append(self), rmdir(self))[1])
    out = tmp_path / "results.jsonl"
    play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), TASKS, out, max_steps=3)
    partial = tmp_path / "results.jsonl.partial"
    assert events == ["closed", partial / "react", partial]
    assert not partial.exists() and [r["task_id"] for r in read_results(out)] == TASKS


def test_interrupted_run_resumes_without_loss_or_duplication(tmp_path):
    out = tmp_path / "results.jsonl"
    reference = play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), TASKS,
                           tmp_path / "ref.jsonl", max_steps=4).records
    lm = InterruptingLM(at=7, replies=loop_reply)  # 4 steps of a/1, then 2 of a/2, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        play_agent(ScriptedEnv(), build_agent("react", lm, DEMOS), TASKS, out, max_steps=4)
    assert [r["task_id"] for r in read_results(out)] == ["a/1"]
    partial = list((tmp_path / "results.jsonl.partial" / "react").iterdir())
    assert len(partial) == 1
    state = orjson.loads(partial[0].read_bytes())
    assert state["task_id"] == "a/2" and len(state["trials"][0]["trajectory"]["steps"]) == 2

    summary = play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), TASKS, out, max_steps=4,
                         resume=True)
    assert summary.skipped == ["a/1"]
    records = read_results(out)
    assert [r["task_id"] for r in records] == TASKS
    assert [untimed(r) for r in records][1:] == [untimed(r) for r in reference][1:]
    assert not (tmp_path / "results.jsonl.partial").exists()


#: a stateless script of replies, so that a resumed process replies as the first one did
KILL_STEPS = [" think: plan"] + [" open box 1", " close box 1"] * 10


def kill_reply(prompt, temperature, n):
    return [KILL_STEPS[prompt.split("Here is the task.")[-1].count("\n> ")]] * n


def kill_run_args(out_dir) -> list[str]:
    return ["run", "--env", "textworld", "--split", "test", "--all-games", "--agent", "react", "--agent",
            "prior-only", "--max-steps", "6", "--demos-per-type", "1", "--out-dir", str(out_dir), "--resume"]


KILLED_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
import agent_shell.lm, envs
from agent_doubles import FakeLM, ScriptedEnv, play_agent
from agent_shell.cli import main
from test_runner import kill_reply, kill_run_args


class SlowLM(FakeLM):
    def generate(self, *a, **k):
        time.sleep(0.05)
        return super().generate(*a, **k)


envs.make_env = lambda name, **kw: ScriptedEnv(expert_looks=True)
agent_shell.lm.load_language_model = lambda *a, **k: SlowLM(kill_reply)
main(kill_run_args({out!r}))
"""


def run_script(out_dir: Path, cache: Path) -> subprocess.Popen:
    script = KILLED_SCRIPT.format(tests=str(Path(__file__).parent), out=str(out_dir))
    env = dict(os.environ, CB_AGENT_CACHE=str(cache))
    return subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]


def partial_states(out_dir: Path) -> list[dict]:
    """The in-progress episode states of a run (the runner's ``results.jsonl.partial/``), read
    while the run goes on: a state file being replaced, or an agent's folder the runner removes
    between listing and reading (its episodes are finished), is skipped."""
    states = []
    try:
        paths = sorted((out_dir / "results.jsonl.partial").glob("*/*.json"))
    except FileNotFoundError:  # a folder vanished during the listing
        return partial_states(out_dir)
    for path in paths:
        try:
            states.append(orjson.loads(path.read_bytes()))
        except (OSError, orjson.JSONDecodeError):  # being replaced or removed right now
            pass
    return states


@pytest.mark.slow  # three runs of several agents
def test_a_killed_multi_agent_run_resumes_to_exactly_the_uninterrupted_records(tmp_path, monkeypatch):
    """``cb-agent run`` with two agents (doubles for the LM and the games) is SIGKILLed in the
    middle of the second agent's second episode (the fourth of the schedule: game by game, the
    games round robin over task types); ``--resume`` must then produce, line by line, the records
    of a run that was never interrupted (wall-clock fields aside)."""
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache-reference"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda *a, **k: FakeLM(kill_reply))
    res = CliRunner().invoke(main, kill_run_args(reference_dir))  # uninterrupted, in this process
    assert res.exit_code == 0, res.output
    reference = read_results(reference_dir / "results.jsonl")
    assert [(r["agent"], r["task_id"]) for r in reference] == [
        (agent, t) for t in ("a/1", "b/1", "a/2", "b/2", "a/3") for agent in ("react", "prior-only")]

    proc = run_script(killed_dir, tmp_path / "cache-killed")
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            done = {(r["agent"], r["task_id"]) for r in read_results(killed_dir / "results.jsonl")}
            states = partial_states(killed_dir)  # read after the records: an unfinished one is running
            if len(done) >= 3 and any(s["agent"] == "prior-only" and (s["agent"], s["task_id"]) not in done
                                      and len(s["trials"][0]["trajectory"]["steps"]) >= 2 for s in states):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed mid-episode"
    done_before = [(r["agent"], r["task_id"]) for r in read_results(killed_dir / "results.jsonl")]
    (state,) = partial_states(killed_dir)  # the episode the kill interrupted
    assert state["agent"] == "prior-only" and not state["finished"] and (state["agent"], state["task_id"]) not in done_before
    assert 2 <= len(state["trials"][0]["trajectory"]["steps"]) < 6
    assert done_before == [(r["agent"], r["task_id"]) for r in reference][:len(done_before)]

    finish(run_script(killed_dir, tmp_path / "cache-killed"))
    resumed = read_results(killed_dir / "results.jsonl")
    assert [untimed(r) for r in resumed] == [untimed(r) for r in reference]
    assert not (killed_dir / "results.jsonl.partial").exists()


# -- an engine fault ends its episode only ------------------------------------------------

class FaultyEngine(ScriptedEnv):
    """Its engine raises on `close box 1` in task a/1 (at step 3 of the looping agent) and on every
    reset of a/2, as a simulator or an expert inside it would."""

    def reset(self, task_id, expert=False):
        if task_id == "a/2":
            raise RuntimeError("JVM died\n\tat py4j.Gateway.invoke(Gateway.java:282)")
        return super().reset(task_id, expert)

    def step(self, action):
        if self._task == "a/1" and action == "close box 1":
            raise Exception("Timeout")
        return super().step(action)


def test_an_engine_fault_is_a_recorded_error_episode_and_the_run_goes_on(tmp_path):
    from agent_shell.reporting import summarize

    out = tmp_path / "results.jsonl"
    summary = play_agent(FaultyEngine(), build_agent("reflexion-react", looping_lm(), DEMOS, reflexion_trials=2),
                         TASKS, out, max_steps=6, meta={"env": "scripted", "budget": 6})
    a1, a2, b1 = read_results(out)
    assert [r["task_id"] for r in summary.records] == TASKS and summary.n_errors == 2
    assert a1["success"] is False and a1["error"] == {
        "type": "EngineError", "trial": 1, "step": 3,
        "message": "scripted engine failed in step 'close box 1' at step 3 of 'a/1': Exception: Timeout"}
    assert a1["n_trials"] == 1 and [s["action"] for s in a1["trials"][0]["trajectory"]["steps"]] == [
        "think: plan", "open box 1"]  # the steps before the fault are kept
    assert a2["error"]["message"] == ("scripted engine failed in reset at step 1 of 'a/2': RuntimeError: JVM died")
    assert a2["trials"] == [] and a2["task_type"] == "fetch" and a2["steps"] == 0
    assert "error" not in b1 and b1["n_trials"] == 2  # played to the end, both trials
    rows = {(r.agent, r.task_type): r for r in summarize([a1, a2, b1])}
    fetch, both = rows[("reflexion-react", "fetch")], rows[("reflexion-react", "all")]
    assert (fetch.n, fetch.errors, both.n, both.errors) == (0, 2, 1, 2)  # errors are neither won nor lost
    # --resume --keep-errors treats them as finished: nothing is played again
    kept = play_agent(FaultyEngine(), build_agent("reflexion-react", looping_lm(), DEMOS, reflexion_trials=2),
                      TASKS, out, max_steps=6, meta={"env": "scripted", "budget": 6}, resume=True, keep_errors=True)
    assert kept.skipped == TASKS and not kept.records
    # plain --resume plays the two error episodes again (a restart may fix an engine), not the finished one
    again = play_agent(FaultyEngine(), build_agent("reflexion-react", looping_lm(), DEMOS, reflexion_trials=2),
                       TASKS, out, max_steps=6, meta={"env": "scripted", "budget": 6}, resume=True)
    assert again.skipped == ["b/1"] and [r["task_id"] for r in again.records] == ["a/1", "a/2"]


def test_plain_episode_lines():
    from agent_shell.scheduler import episode_summary

    record = {"agent": "react", "task_id": "a/1", "success": True, "steps": 4, "s_per_step": 0.25}
    assert episode_summary(record) == "react a/1 won steps=4 s/step=0.25"
    failed = {**record, "success": False, "s_per_step": None, "error": {"message": "engine died"}}
    assert episode_summary(failed) == "react a/1 lost steps=4 s/step=- ERROR engine died"
    full = {**record, "success": False, "trials": [{"log": {"replies": []}}, {"log": {"window_full": "too long"}}]}
    assert episode_summary(full) == "react a/1 lost steps=4 s/step=0.25 (context window full)"


def test_an_in_process_run_needs_no_ray(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    summary = play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), ["a/1", "b/1"],
                         tmp_path / "results.jsonl", max_steps=3)
    assert [r["task_id"] for r in summary.records] == ["a/1", "b/1"]


class FlakyLM(FakeLM):
    """Raises on its first ``fails`` generate calls (a fault that is no engine fault)."""

    def __init__(self, fails, **kw):
        super().__init__(**kw)
        self.fails = fails

    def generate(self, *args, **kw):
        if self.fails:
            self.fails -= 1
            raise RuntimeError("CUDA out of memory\nwith a second line")
        return super().generate(*args, **kw)


def test_in_process_a_failed_attempt_is_played_again_then_recorded_as_an_error(tmp_path):
    """The scheduler's retry rule holds in process too: one failed attempt is played again from the
    start (the record equals an unfailed run's), three make an error record naming every reason."""
    reference = play_agent(ScriptedEnv(), build_agent("react", looping_lm(), DEMOS), ["a/1"],
                           tmp_path / "ref.jsonl", max_steps=4).records
    retried = play_agent(ScriptedEnv(), build_agent("react", FlakyLM(1, replies=loop_reply), DEMOS), ["a/1"],
                         tmp_path / "retried.jsonl", max_steps=4).records
    assert [untimed(r) for r in retried] == [untimed(r) for r in reference]
    failed = play_agent(ScriptedEnv(), build_agent("react", FlakyLM(99, replies=loop_reply), DEMOS), ["a/1", "b/1"],
                        tmp_path / "failed.jsonl", max_steps=4).records
    assert [r["task_id"] for r in failed] == ["a/1", "b/1"]  # the run went on to b/1, which failed too
    error = failed[0]["error"]
    assert failed[0]["success"] is False and failed[0]["steps"] == 0 and failed[0]["task_type"] == "unknown"
    assert error["attempts"] == 3 and error["reasons"] == ["RuntimeError: CUDA out of memory"] * 3
    assert error["type"] == "RuntimeError" and error["message"] == "RuntimeError: CUDA out of memory"


class BrokenBackboneLM(FakeLM):
    """Every generate call meets a fault of the backbone itself (as a pass whose shapes do not fit
    its weights raises it)."""

    calls = 0

    def generate(self, *args, **kw):
        from agent_shell.lm.protocol import BackboneFault

        self.calls += 1
        raise BackboneFault.of(TypeError("cannot reshape array of shape (1, 192, 32) into shape (1, 192, 2, 8)"),
                               "the JAX decoder's stream pass")


def test_a_fault_of_the_backbone_stops_the_run_at_once_without_retries(tmp_path):
    """No retry helps a backbone that cannot run: the first attempt's fault leaves the scheduler
    with its one line, no episode is played again and no error record is stored."""
    from agent_shell.lm.protocol import BackboneFault
    from agent_shell.scheduler import InProcessExecutor, play_episodes

    lm = BrokenBackboneLM(replies=loop_reply)
    agent = build_agent("react", lm, DEMOS)
    lines: list[str] = []
    with pytest.raises(BackboneFault) as err:
        play_episodes(InProcessExecutor(ScriptedEnv(), {agent.name: agent}), [agent.name], ["a/1", "b/1"],
                      tmp_path / "results.jsonl", 4, echo=lines.append)
    assert lm.calls == 1 and lines == [] and read_results(tmp_path / "results.jsonl") == []
    assert "\n" not in str(err.value) and "cannot reshape" in str(err.value)


def test_cb_agent_run_with_a_broken_backbone_ends_in_one_line(tmp_path, monkeypatch):
    """``cb-agent run`` whose backbone cannot run ends with the fault's one line after the first
    attempt: no episode retried, none stored as an error record."""
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda *a, **k: BrokenBackboneLM(loop_reply))
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--all-games", "--agent",
                                    "react", "--max-steps", "4", "--demos-per-type", "1", "--out-dir",
                                    str(tmp_path / "out")])
    lines = res.output.strip().splitlines()
    assert res.exit_code == 1, res.output
    assert lines[-1].startswith("Error: the JAX decoder's stream pass cannot run"), res.output
    assert not any("retried" in line or "FAILED" in line for line in lines), res.output
    assert read_results(tmp_path / "out" / "results.jsonl") == []


@pytest.mark.parametrize("kind", ["torch-cpu", "torch-cuda", "jax"])
def test_an_episode_out_of_memory_is_its_error_record_and_the_run_and_resume_go_on(tmp_path, kind):
    """A pass that runs out of memory (each library's own error: PyTorch's plain CPU RuntimeError,
    torch.OutOfMemoryError, XLA's RESOURCE_EXHAUSTED) ends that episode as an error record naming
    the context length and the bytes asked, at the first attempt; the games after it run, and
    ``--resume`` plays it again, stores its error record again and goes on."""
    from agent_shell.scheduler import InProcessExecutor, play_episodes
    from parallel_doubles import ASKED, make_players

    out = tmp_path / "results.jsonl"
    for resume in (False, True):
        env, agents = make_players(oom_on=("a/2",), oom_kind=kind)
        lines: list[str] = []
        play_episodes(InProcessExecutor(env, {"react": agents["react"]}), ["react"], ["a/1", "a/2", "b/1"], out, 4,
                      echo=lines.append, resume=resume)
        records = read_results(out)
        assert [r["task_id"] for r in records] == ["a/1", "a/2", "b/1"] + ["a/2"] * resume
        error = records[-1 if resume else 1]["error"]
        assert error["bytes_asked"] == ASKED[kind] and error["context_tokens"] > 100, error
        assert error["type"] == "PassOutOfMemory" and "ran out of memory on a context of" in error["message"]
        assert "\n" not in error["message"] and not any("retried" in line or "FAILED" in line for line in lines)
        assert all("error" not in r for r in records if r["task_id"] != "a/2")


@pytest.mark.slow  # a whole command twice (~10 s); the scheduler's rule is the test above
def test_cb_agent_run_resume_goes_past_an_episode_out_of_memory(tmp_path, monkeypatch):
    """``cb-agent run`` and ``cb-agent run --resume``: a game whose pass runs out of memory (PyTorch's
    plain CPU RuntimeError) is an error record each time, and both runs end normally."""
    from parallel_doubles import faulty_lm

    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    lm = faulty_lm(oom_on=("a/2",))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda *a, **k: lm)
    args = ["run", "--env", "textworld", "--split", "test", "--all-games", "--agent", "react", "--max-steps", "4",
            "--demos-per-type", "1", "--out-dir", str(tmp_path / "out")]
    for extra in ([], ["--resume"]):
        res = CliRunner().invoke(main, args + extra)
        assert res.exit_code == 0, res.output
        records = read_results(tmp_path / "out" / "results.jsonl")
        assert sorted(r["task_id"] for r in records if "error" not in r) == ["a/1", "a/3", "b/1", "b/2"]
        assert [r["error"]["bytes_asked"] for r in records if "error" in r] == [100_000_000_000_000] * (1 + len(extra))
