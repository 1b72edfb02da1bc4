"""The results file: one writer at a time, one rule for fields older lines lack, an episode counted once."""

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.results import read_results
from cb_io.records import Trajectory
from cb_io.storage import FileBusy, append_jsonl
from test_runner import kill_reply, kill_run_args, run_script

ROOT = Path(__file__).parents[2]


def wait_for_claim(path: Path, proc: subprocess.Popen, seconds: float = 120) -> str:
    """The holder line of ``path``'s lock once ``proc`` has claimed it (the sidecar holds its pid)."""
    lock = path.with_name(f".{path.name}.lock")
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        text = lock.read_text() if lock.exists() else ""
        if f"pid {proc.pid} " in text:
            return text.strip()
        time.sleep(0.02)
    raise AssertionError(f"the first writer never claimed {path} (exit code {proc.poll()})")


def test_a_second_run_into_a_results_file_being_written_is_refused_naming_the_writer(tmp_path, monkeypatch):
    """`run --resume` started twice into one folder: the second stops with one line naming the first
    (its pid), before anything loads, and stores nothing; once the first is gone (even killed) the
    folder resumes and no episode is stored twice."""
    out = tmp_path / "run"
    results = out / "results.jsonl"
    loads = []
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda *a, **k: loads.append(1) or FakeLM(kill_reply))
    first = run_script(out, tmp_path / "cache")
    try:
        wait_for_claim(results, first)
        stored = results.read_bytes() if results.exists() else b""
        second = CliRunner().invoke(main, kill_run_args(out))
        assert first.poll() is None, "the first run ended before the second started"
        assert second.exit_code == 1, second.output
        (line,) = second.output.strip().splitlines()
        assert line.startswith(f"Error: {results} is being written by pid {first.pid} (")
        assert line.endswith("; wait for it or stop it") and loads == []
        assert (results.read_bytes() if results.exists() else b"").startswith(stored)
    finally:
        first.kill()
        first.wait(timeout=10)
    resumed = CliRunner().invoke(main, kill_run_args(out))  # the killed writer's lock went with it
    assert resumed.exit_code == 0, resumed.output
    keys = [(r["agent"], r["task_id"]) for r in read_results(results)]
    assert sorted(keys) == sorted((a, t) for a in ("react", "prior-only") for t in ("a/1", "a/2", "a/3", "b/1", "b/2"))


HOLDER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
path = Path({path!r})
{claim}
print("claimed", flush=True)
sys.stdin.read()
"""

#: Each user's resume check, run by a first writer (in a subprocess) and by a second one (here).
CHECKS = {
    "runs": ("from agent_shell.results import check_results_file",
             "check_results_file(path, ['react'], ['a/1'], True, {})"),
    "studies": ("from agent_shell.studies import pending_keys", "pending_keys(path, 'probe', set(), True)"),
    "labels": ("from agent_shell.studies.labels import pending", "pending(path, [], True)"),
    "ical": ("from agent_shell.commands.ical import _done_keys", "_done_keys(path, True, [])"),
}


@pytest.mark.parametrize("user", list(CHECKS))
def test_every_resumable_output_is_written_by_one_process_at_a_time(tmp_path, user):
    path = tmp_path / "out.jsonl"
    imports, call = CHECKS[user]
    script = HOLDER.format(root=str(ROOT), path=str(path), claim=f"{imports}\n{call}")
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert holder.stdout.readline() == b"claimed\n", holder.stderr.read().decode()[-2000:]
        namespace = {"path": path}
        exec(imports, namespace)
        with pytest.raises(FileBusy, match=rf"^{path} is being written by pid {holder.pid} \(-c\); wait for it"):
            eval(call, namespace)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    eval(call, namespace)  # the holder is gone: this process may write now


def old_lines(user: str, **fields) -> dict:
    """A finished line of ``user``'s output as an older version wrote it (without ``layout``)."""
    line = {"runs": {"agent": "react", "task_id": "a/1", "success": True},
            "studies": {"study": "probe", "item": "a/1", "condition": "", "rendering": "raw", "agent": "react"},
            "labels": {"schema": "cb-agent/calibration-label-v1", "item": "react:a/1#0@0"}}[user]
    return {**line, **fields}


def resume(user: str, path: Path, settings: dict):
    """``user``'s resume check of the one finished key in ``path`` with ``settings``."""
    from agent_shell.studies.labels import Transition, pending
    from agent_shell.results import check_results_file
    from agent_shell.studies import RecordedTrial, pending_keys

    if user == "runs":
        return check_results_file(path, ["react"], ["a/1"], True, settings)
    if user == "studies":
        return pending_keys(path, "probe", {("a/1", "", "raw", "react")}, True, settings)
    traj = Trajectory("scripted", "a/1", "fetch", "Solve a/1.", "A room.", [], False, 0.0)
    return pending(path, [Transition(RecordedTrial("r.jsonl", "react", 0, traj), 0)], True, settings)


@pytest.mark.parametrize("user", ["runs", "studies", "labels"])
def test_a_field_an_older_line_lacks_counts_as_its_recorded_default_for_every_user(tmp_path, user):
    """One rule: a line without ``layout`` was played in the text layout (the table of recorded
    defaults), so a chat resume is refused and a text one continues; a field without a recorded
    default (``lam``) is not compared; a recorded value is."""
    path = tmp_path / f"{user}.jsonl"
    append_jsonl(path, old_lines(user, dtype="float32"))
    with pytest.raises(ValueError, match=r"with layout='text', but this run uses layout='chat'; resuming would mix"):
        resume(user, path, {"layout": "chat"})
    resume(user, path, {"layout": "text", "lam": 2.0, "dtype": "float32"})
    with pytest.raises(ValueError, match=r"with dtype='float32', but this run uses dtype='bfloat16'"):
        resume(user, path, {"dtype": "bfloat16"})


def test_report_counts_an_episode_stored_twice_once_with_a_warning(tmp_path):
    """Two writers on one file stored react's a/1 twice: the report counts it once (the first) and
    says so; the same task under another setting is another episode."""
    path = tmp_path / "results.jsonl"
    base = {"task_type": "fetch", "steps": 3, "think_steps": 0, "wall_s": 1.0, "distinct_actions": 2,
            "longest_cycle": {"span": 0}, "budget": 10, "trials": []}
    lines = [{**base, "agent": "react", "task_id": "a/1", "success": True},
             {**base, "agent": "react", "task_id": "a/2", "success": False},
             {**base, "agent": "react", "task_id": "a/1", "success": False},
             {**base, "agent": "react", "task_id": "a/1", "success": True, "budget": 20}]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    res = CliRunner().invoke(main, ["report", str(path), "--markdown", str(tmp_path / "r.md"),
                                    "--chart", str(tmp_path / "r.png")])
    assert res.exit_code == 0, res.output
    warnings = [x for x in res.output.splitlines() if x.startswith("warning:")]
    assert warnings == ["warning: react on a/1 is recorded 2 times with the same settings: counted once"]
    table = (tmp_path / "r.md").read_text()
    assert "| react (budget=10) | all | **1/2** |" in table and "| react (budget=20) | all | **1/1** |" in table
