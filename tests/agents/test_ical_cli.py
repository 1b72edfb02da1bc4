"""`cb-agent ical ...` end to end with doubles: outputs, resume, summary table, one-line errors."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

import envs
from agent_doubles import TASKS, FakeLM, HangingEnv, ScriptedEnv
from agent_shell.cli import main
from agent_shell.commands import ical as ical_cmd
from agent_shell.ical.noisy import replay
from cb_io.storage import append_jsonl
from test_ical_memory import TableEmbedder


def fixed_program(prompt, temperature, n):
    """Writes the solution of the task named in the prompt's last 'Task:' line."""
    task = prompt.rsplit("Task: Your task is to: solve ", 1)[1].split(".", 1)[0]
    body = "\n".join(f"> {a}" for a in TASKS[task][1])
    return [f"causal: do it in order.\nstate: the room\nProgram:\nsubgoal: solve it\n{body}"] * n


@pytest.fixture()
def doubles(monkeypatch):
    lm = FakeLM(replies=fixed_program)
    monkeypatch.setattr(ical_cmd, "_load_lm", lambda config: lm)
    monkeypatch.setattr(envs, "make_env", lambda name: ScriptedEnv())
    import agent_shell.embeddings

    monkeypatch.setattr(agent_shell.embeddings, "SentenceEmbedder", lambda: TableEmbedder({}))
    return lm


def noisy_file(tmp_path):
    env = ScriptedEnv()
    path = tmp_path / "noisy.jsonl"
    for tid in ("a/1", "b/1", "b/2"):
        actions = ["go to window 1"] + TASKS[tid][1][:-1]  # a detour, and the last step dropped
        traj = replay(env, tid, actions)
        append_jsonl(path, traj)
    return path


def test_build_memory_keeps_winners_resumes_and_prints_the_summary(tmp_path, doubles):
    noisy = noisy_file(tmp_path)
    mem = tmp_path / "mem"
    result = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem), "--max-rounds", "1"])
    assert result.exit_code == 0, result.output
    assert "tried" in result.output and "kept" in result.output
    lines = [orjson.loads(x) for x in (mem / "log.jsonl").read_bytes().splitlines()]
    assert [r["kept"] for r in lines] == [True, True, True] and all(r["n_rounds"] == 1 for r in lines)
    assert len((mem / "examples.jsonl").read_bytes().splitlines()) == 3
    calls = len(doubles.prompts)
    again = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem)])
    assert again.exit_code == 1 and "pass --resume" in again.output and "\n" not in again.output.strip()
    assert "choose another --memory" in again.output
    again = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem), "--resume"])
    assert again.exit_code == 0 and len(doubles.prompts) == calls  # nothing left to do
    # the second input's prompt showed a retrieved example from the memory, not the built-in one
    assert "Task: Your task is to: solve a/1.\nClean example:" in doubles.prompts[1]


def test_build_memory_records_an_input_whose_execution_hangs_and_goes_on(tmp_path, doubles, monkeypatch):
    """The execution of a/1's program hangs on its last action: at --episode-timeout the input ends
    as a failed outcome naming the limit; the next inputs are learned as without a/1 (whose
    example never enters the memory)."""
    noisy = noisy_file(tmp_path)
    without_a1 = tmp_path / "without_a1.jsonl"
    without_a1.write_bytes(b"\n".join(noisy.read_bytes().splitlines()[1:]) + b"\n")
    clean = CliRunner().invoke(main, ["ical", "build-memory", str(without_a1), "--max-rounds", "1",
                                      "--memory", str(tmp_path / "clean")])
    assert clean.exit_code == 0, clean.output
    args = ["ical", "build-memory", str(noisy), "--max-rounds", "1"]
    monkeypatch.setattr(envs, "make_env", lambda name: HangingEnv(hang_on=("a/1",), action="take key 1 from desk 1"))
    mem = tmp_path / "mem"
    result = CliRunner().invoke(main, args + ["--memory", str(mem), "--episode-timeout", "1"])
    assert result.exit_code == 0, result.output
    assert "engine: time limit x1" in result.output
    untimed = lambda r: {**r, "rounds": [{**rd, "seconds": 0} for rd in r["rounds"]]}  # noqa: E731
    lines = [untimed(orjson.loads(x)) for x in (mem / "log.jsonl").read_bytes().splitlines()]
    expected = [untimed(orjson.loads(x)) for x in (tmp_path / "clean" / "log.jsonl").read_bytes().splitlines()]
    assert [r["noisy_id"] for r in lines] == ["scripted:a/1", "scripted:b/1", "scripted:b/2"]
    assert lines[0] == {"noisy_id": "scripted:a/1", "task_type": "fetch", "kept": False, "n_rounds": 0,
                        "reason": "engine: time limit", "rounds": [], "example_id": None,
                        "error": {"type": "EpisodeTimeout", "message": "episode ran past its wall-clock limit of 1 s",
                                  "round": 0},
                        "examples": [], "decoding": "free", "notes": "inline", "backbone": "fake-lm"}
    assert lines[1:] == expected and all(r["kept"] for r in lines[1:])
    assert len((mem / "examples.jsonl").read_bytes().splitlines()) == 2


def test_abstract_then_refine(tmp_path, doubles):
    noisy = noisy_file(tmp_path)
    abstract = tmp_path / "abstract.jsonl"
    result = CliRunner().invoke(main, ["ical", "abstract", str(noisy), "--out", str(abstract)])
    assert result.exit_code == 0, result.output
    assert "parsed 3/3" in result.output
    refined = tmp_path / "refine.jsonl"
    result = CliRunner().invoke(main, ["ical", "refine", str(abstract), "--noisy", str(noisy), "--out", str(refined),
                                       "--max-rounds", "0"])
    assert result.exit_code == 0, result.output
    assert len(doubles.prompts) == 3  # refinement with 0 rounds executes the written abstraction only
    assert all(orjson.loads(x)["kept"] for x in refined.read_bytes().splitlines())


@pytest.mark.parametrize("content, message", [
    (b'{"schema_version": 1, "env": "x"', "noisy.jsonl:1: malformed trajectory line: truncated line"),
    (b'{"schema_version": 1, "env": "x"}\n', "noisy.jsonl:1: malformed trajectory line: trajectory record lacks field"),
    (b'{"schema_version": 99}\n', "unsupported trajectory schema_version 99"),
    (b"", "noisy.jsonl: no noisy trajectories"),
])
def test_corrupted_inputs_give_one_line_errors(tmp_path, doubles, content, message):
    bad = tmp_path / "noisy.jsonl"
    bad.write_bytes(content)
    result = CliRunner().invoke(main, ["ical", "build-memory", str(bad), "--memory", str(tmp_path / "m")])
    assert result.exit_code == 1 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_missing_files_and_foreign_lines_are_one_line_errors(tmp_path, doubles):
    result = CliRunner().invoke(main, ["ical", "abstract", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 1 and "none.jsonl" in result.output and len(result.output.strip().splitlines()) == 1
    foreign = tmp_path / "abstract.jsonl"
    foreign.write_text('{"agent": "react"}\n')
    result = CliRunner().invoke(main, ["ical", "refine", str(foreign), "--noisy", str(noisy_file(tmp_path))])
    assert result.exit_code == 1 and "abstract.jsonl:1: not a line of cb-agent ical abstract" in result.output
    result = CliRunner().invoke(main, ["ical", "noisy", "--from-run", str(foreign), "--out", str(tmp_path / "n.jsonl")])
    assert result.exit_code == 1 and "abstract.jsonl:1: not an episode record" in result.output


def test_retrieve_lists_the_top_k(tmp_path, doubles):
    noisy = noisy_file(tmp_path)
    mem = tmp_path / "mem"
    CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem), "--max-rounds", "0"])
    result = CliRunner().invoke(main, ["ical", "retrieve", str(mem), "--instruction", "solve b/1", "--k", "2"])
    assert result.exit_code == 0, result.output
    assert "top 2 of 3 examples" in result.output
    result = CliRunner().invoke(main, ["ical", "retrieve", str(mem), "--split", "test", "--k", "2",
                                       "--lambda-visual", "0.1"])
    assert result.exit_code == 1 and "lambda_visual must be 0" in result.output
    result = CliRunner().invoke(main, ["ical", "retrieve", str(mem), "--split", "test", "--k", "1",
                                       "--out", str(tmp_path / "p.jsonl")])
    assert result.exit_code == 0 and "precision@1" in result.output
    lines = [orjson.loads(x) for x in (tmp_path / "p.jsonl").read_bytes().splitlines()]
    assert len(lines) == 5 and all(len(q["retrieved"]) == 1 for q in lines)
    # the table echo: 5 queries over 2 types, 3 examples (fetch 1, open 2)
    result = CliRunner().invoke(main, ["ical", "retrieve", str(mem), "--split", "test", "--k", "1", "--per-type", "1",
                                       "--out", str(tmp_path / "p.jsonl")])
    assert result.exit_code == 1 and "pass --resume" in result.output


def test_resume_moves_a_torn_output_line_aside(tmp_path):
    from agent_shell.commands.ical import _done_keys

    out = tmp_path / "abstract.jsonl"
    out.write_bytes(b'{"noisy_id": "a"}\n{"noisy_id": "b"}\n')
    whole = out.read_bytes()
    with open(out, "ab") as fh:
        fh.write(b'{"noisy_id": "c", "pro')
    assert _done_keys(out, True, ["a", "c"]) == {"a", "b"}
    assert out.read_bytes() == whole and (tmp_path / "abstract.jsonl.torn").read_bytes() == b'{"noisy_id": "c", "pro\n'


def test_build_memory_with_anchored_decoding_records_how_programs_were_written(tmp_path, monkeypatch):
    from test_ical_constrained import ChoosingLM

    solutions = {f"> {a}" for _, steps in TASKS.values() for a in steps}
    lm = ChoosingLM(lambda o: 0.0 if o in solutions else (-1.0 if o.startswith("> ") else -5.0))
    monkeypatch.setattr(ical_cmd, "_load_lm", lambda config: lm)
    monkeypatch.setattr(envs, "make_env", lambda name: ScriptedEnv())
    import agent_shell.embeddings

    monkeypatch.setattr(agent_shell.embeddings, "SentenceEmbedder", lambda: TableEmbedder({}))
    noisy = noisy_file(tmp_path)  # a detour first, the last step dropped
    mem = tmp_path / "mem"
    result = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem), "--max-rounds", "0",
                                       "--decoding", "anchored"])
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(x) for x in (mem / "log.jsonl").read_bytes().splitlines()]
    assert all(r["decoding"] == "anchored" and r["notes"] == "inline" for r in lines)
    assert all(r["rounds"][0]["program"] is not None for r in lines)  # every output parsed
    # the record's detour skipped, its missing last step put in from the admissible commands
    assert [r["kept"] for r in lines] == [True, True, True]
    assert lines[0]["rounds"][0]["program"]["actions"] == TASKS["a/1"][1]
    bad = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(mem), "--decoding", "beam"])
    assert bad.exit_code == 2 and "'beam' is not one of" in bad.output
    calls = len(lm.contexts)
    bad = CliRunner().invoke(main, ["ical", "build-memory", str(noisy), "--memory", str(tmp_path / "m2"),
                                    "--notes", "chat"])  # chat notes belong to constrained decoding
    assert bad.exit_code == 1 and "needs decoding 'constrained' or 'anchored'" in bad.output
    assert len(lm.contexts) == calls and not (tmp_path / "m2").exists()  # refused before anything ran
