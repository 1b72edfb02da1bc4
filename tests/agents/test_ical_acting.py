"""Acting with an ICAL memory: retrieved examples (with thoughts) as ReAct demos, and as concept data."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import agent_shell.embeddings
import agent_shell.lm
import envs
from agent_doubles import TASKS, FakeLM, ScriptedEnv, play_agent
from agent_shell.agents import build_agent
from agent_shell.cli import main
from agent_shell.ical import Lambdas, Memory, execute, parse_program
from agent_shell.ical.acting import RetrievedDemos
from agent_shell.run_config import demos_with_thoughts, parse_demos
from agent_shell.ical.memory import Example
from agent_shell.results import read_results
from test_ical_memory import TableEmbedder

TABLE = {"Your task is to: solve a/1.": [1, 0, 0], "Your task is to: solve a/2.": [0.9, 0.2, 0],
         "Your task is to: solve b/1.": [0, 1, 0], "Your task is to: solve b/2.": [0.1, 0.9, 0],
         "Your task is to: solve a/3.": [0.95, 0.1, 0]}


def memory_of(folder, task_ids):
    env = ScriptedEnv()
    mem = Memory(folder, TableEmbedder(TABLE))
    for tid in task_ids:
        text = "Abstractions:\ncausal: go, then act.\nProgram:\nsubgoal: reach it\n" + "\n".join(
            f"> {a}" for a in TASKS[tid][1])
        program = parse_program(text).program
        run = execute(env, tid, program)
        mem.add(Example(f"ex-{tid}", program, run.trajectory, {"noisy_id": tid}, 0, "fake"))
    return mem


def test_retrieved_demos_show_the_nearest_examples_with_their_thoughts(tmp_path):
    mem = memory_of(tmp_path / "mem", ["a/1", "a/2", "b/1"])
    demos = RetrievedDemos(mem, k=2, lambdas=Lambdas(1, 0))
    lm = FakeLM(replies=[" go to desk 1"])
    agent = build_agent("react", lm, demos)
    play_agent(ScriptedEnv(), agent, ["a/3"], tmp_path / "r.jsonl", max_steps=1)
    prompt = lm.prompts[0]
    assert prompt.startswith("Interact with a household to solve a task. Here are 2 examples.")
    assert "solve a/1." in prompt and "solve a/2." in prompt and "solve b/1." not in prompt
    assert "> think: Subgoal: reach it\nOK." in prompt and "> think: Principle: go, then act.\nOK." in prompt
    assert [i for i, _ in demos.retrieved["a/3"]] == ["ex-a/1", "ex-a/2"]
    demos.for_task(ScriptedEnv().reset("a/1"))  # the game itself is never its own demonstration
    assert [i for i, _ in demos.retrieved["a/1"]] == ["ex-a/2", "ex-b/1"]


def test_ical_actions_demos_leave_the_annotations_out(tmp_path):
    mem = memory_of(tmp_path / "mem", ["a/1", "a/2", "b/1"])
    with_notes = RetrievedDemos(mem, k=2, lambdas=Lambdas(1, 0)).for_task(ScriptedEnv().reset("a/3"))
    without = RetrievedDemos(mem, k=2, lambdas=Lambdas(1, 0), thoughts=False).for_task(ScriptedEnv().reset("a/3"))
    assert all("think:" in d for d in with_notes) and not any("think:" in d for d in without)
    assert [d.replace("> think: Principle: go, then act.\nOK.\n", "").replace("> think: Subgoal: reach it\nOK.\n", "")
            for d in with_notes] == without  # the same actions and observations
    assert not demos_with_thoughts("ical-actions:runs/mem") and demos_with_thoughts("ical:runs/mem")


def test_demos_option_values():
    assert parse_demos("expert") is None and parse_demos("ical:runs/mem") == "runs/mem"
    assert parse_demos("ical-actions:runs/mem") == "runs/mem"
    from agent_shell.configure import resolve
    from agent_shell.run_config import RunConfig

    settings = RunConfig(demos="ical-actions:/nonexistent/mem")  # a plain value: nothing read from disk
    with pytest.raises(ValueError, match="ICAL memory folder /nonexistent/mem does not exist"):
        resolve(settings, backbone=False)
    with pytest.raises(ValueError, match="'ical:MEMORY_FOLDER'"):
        parse_demos("ical:")
    with pytest.raises(ValueError, match="holds no examples"):
        RetrievedDemos(Memory("/nonexistent/mem", TableEmbedder({})))


@pytest.fixture()
def doubles(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    lms = []

    def load(name=None, dtype="bfloat16", formatting="plain", **_):
        lms.append(FakeLM([" think: plan", " go to desk 1", " take key 1 from desk 1", " go to door 1"]))
        return lms[-1]

    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)
    monkeypatch.setattr(agent_shell.embeddings, "SentenceEmbedder", lambda: TableEmbedder(TABLE))
    return lms


def test_run_with_an_ical_memory_as_demos_and_concept_data(tmp_path, doubles):
    memory_of(tmp_path / "mem", ["a/2", "b/2"])
    out = tmp_path / "run"
    args = ["run", "--env", "textworld", "--split", "test", "--agent", "react", "--agent", "cb-agent",
            "--per-type", "1", "--max-steps", "3", "--out-dir", str(out), "--demos", f"ical:{tmp_path / 'mem'}",
            "--concept-data", "ical", "--demos-per-type", "1"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    records = read_results(out / "results.jsonl")
    assert len(records) == 4 and all(r["demos"] == f"ical:{tmp_path / 'mem'}" for r in records)
    assert all(r["concept_data"] == "ical" for r in records)
    assert "features: " in res.output  # concepts fitted on the ICAL examples
    routing = [p for p in doubles[-1].prompts if isinstance(p, str) and "Here are 1 examples" in p]
    assert routing and all("think: Subgoal: reach it" in p for p in routing)
    expert = [a for a in args if a not in ("--demos", f"ical:{tmp_path / 'mem'}", "--concept-data", "ical")]
    mixed = CliRunner().invoke(main, expert + ["--resume"])
    assert mixed.exit_code == 1 and "demos=" in mixed.output


def test_concept_data_ical_needs_an_example_of_every_played_type(tmp_path, doubles):
    memory_of(tmp_path / "mem", ["a/2"])
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--split", "test", "--agent", "cb-agent",
                                    "--per-type", "1", "--out-dir", str(tmp_path / "r"),
                                    "--demos", f"ical:{tmp_path / 'mem'}", "--concept-data", "ical"])
    assert res.exit_code == 1 and "has no example of open" in res.output
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--concept-data", "ical"])
    assert res.exit_code == 2 and "concept_data='ical' needs demos='ical:MEMORY'" in res.output
