"""The agent registry (built-ins and plug-ins from the entry-point group ``cb_agent.agents``), the
run configuration's nested agent configuration and its recorded settings, and agents that do not
change after construction."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.agents import (AgentConfig, CBAgent, ReActAgent, agent_names, available_agents, build_agent,
                                 needs_concepts)
from agent_shell.agents.joint import JointCBAgent, JointReActAgent, joint_config
from agent_shell.agents.registry import ENTRY_POINT_GROUP, agent_entry
from agent_shell.cli import main
from agent_shell.configure import resolve
from agent_shell.run_config import RunConfig
from entry_point_doubles import install_entry_point
from envs.episode import Episode

ROOT = Path(__file__).resolve().parents[2]
DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}
#: The agents and the order ``--agent`` offered before the registry.
BUILT_IN = ("cb-agent", "prior-only", "react", "reflexion-cb-agent", "reflexion-prior-only", "reflexion-react",
            "joint-react", "joint-cb-agent")


def install_plugin(site: Path, name: str, target: str) -> None:
    """What ``pip install`` of a package declaring the agent entry point leaves on the path."""
    install_entry_point(site, ENTRY_POINT_GROUP, name, target, f"agent-plugin-{name}")


# ------------------------------------------------------------------------------------- registry


def test_the_builtin_agents_are_the_registry_s_and_declare_their_needs():
    assert agent_names()[:len(BUILT_IN)] == BUILT_IN
    assert [n for n in BUILT_IN if needs_concepts(n)] == ["cb-agent", "reflexion-cb-agent", "joint-cb-agent"]
    assert not needs_concepts("joint-prior-only") and not needs_concepts("no-such-agent")
    names = {name: build_agent(name, FakeLM(), DEMOS, concepts={"fetch": None}).name for name in BUILT_IN}
    assert names == {n: n for n in BUILT_IN}  # the records name an agent as the registry does
    assert build_agent("reflexion-react", FakeLM(), DEMOS, reflexion_trials=1).name == "react"
    assert [n for n in BUILT_IN if agent_entry(n).trials] == ["reflexion-cb-agent", "reflexion-prior-only",
                                                              "reflexion-react"]


def test_unknown_agents_get_one_clear_line():
    with pytest.raises(ValueError) as err:
        build_agent("gpt", FakeLM(), DEMOS)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("unknown agent 'gpt'; known: ['cb-agent', ") and ENTRY_POINT_GROUP in str(err.value)
    with pytest.raises(ValueError, match="unknown agent 'gpt'"):
        resolve(RunConfig(agents=("gpt",)), backbone=False)
    res = CliRunner().invoke(main, ["run", "--agent", "gpt"])
    assert res.exit_code == 2 and "'gpt' is not one of" in res.output


def test_a_plugin_agent_is_listed_built_and_played(site):
    install_plugin(site, "first-candidate", "first_candidate_agent:ENTRY")
    assert available_agents()["first-candidate"] == "first_candidate_agent:ENTRY"
    assert agent_names()[:len(BUILT_IN)] == BUILT_IN and "first-candidate" in agent_names()
    assert not needs_concepts("first-candidate")
    assert resolve(RunConfig(agents=("first-candidate", "react")), backbone=False).agents == ("first-candidate", "react")
    agent = build_agent("first-candidate", FakeLM(), DEMOS)
    env = ScriptedEnv()
    result = agent.run(lambda: Episode(env, "a/1", 3))
    assert agent.name == "first-candidate" and not result.won
    # the scripted game's candidates less look / inventory / help: "go to window 1" comes first
    assert env.engine_actions == ["go to window 1"] * 3
    out = CliRunner().invoke(main, ["agents"])
    assert out.exit_code == 0, out.output
    assert "first-candidate\tfirst_candidate_agent:ENTRY\t-" in out.output
    assert "cb-agent\tbuilt-in\tconcepts, reviewer, scoring_lm" in out.output


def test_run_offers_plugin_agents(site):
    install_plugin(site, "first-candidate", "first_candidate_agent:ENTRY")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(Path(__file__).parent), str(ROOT)])}
    res = subprocess.run([sys.executable, "-m", "agent_shell.cli", "run", "--help"], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "first-candidate" in res.stdout and "joint-cb-agent" in res.stdout


def test_a_plugin_declares_its_needs_and_bad_plugins_fail_with_one_line(site):
    install_plugin(site, "first-candidate-concepts", "first_candidate_agent:CONCEPT_ENTRY")
    assert needs_concepts("first-candidate-concepts")
    with pytest.raises(ValueError, match="'first-candidate-concepts' needs fitted concepts"):
        build_agent("first-candidate-concepts", FakeLM(), DEMOS)
    assert build_agent("first-candidate-concepts", FakeLM(), DEMOS,
                       concepts={"fetch": None}).name == "first-candidate-concepts"
    for name, target, message in (("misnamed", "first_candidate_agent:MISNAMED", "entry of 'something-else'"),
                                  ("not-an-entry", "builtins:dict", "gives a type, not an"),
                                  ("broken", "no_such_module_xyz:ENTRY", r"failed to load: ModuleNotFoundError")):
        install_plugin(site, name, target)
        with pytest.raises(ValueError, match=message) as err:
            build_agent(name, FakeLM(), DEMOS)
        assert "\n" not in str(err.value)


def test_a_plugin_cannot_take_a_builtin_name(site):
    install_plugin(site, "react", "first_candidate_agent:ENTRY")
    assert available_agents()["react"] == "built-in"
    assert type(build_agent("react", FakeLM(), DEMOS).agent).__name__ == "ReActAgent"


# ------------------------------------------------------------------------- immutable agents


def test_joint_actors_get_their_rendering_before_construction_and_never_change():
    assert joint_config(AgentConfig()) == AgentConfig(rendering="experience")
    assert joint_config(AgentConfig(rendering="experience")) == AgentConfig(rendering="experience")
    with pytest.raises(ValueError, match="text only"):
        joint_config(AgentConfig(layout="chat"))
    given = AgentConfig(seed=4)
    react = JointReActAgent(FakeLM(), DEMOS, config=given)
    prior = JointCBAgent(FakeLM(), DEMOS, concepts=None, config=given)
    assert given.rendering == "raw"  # the caller's config is not touched
    for agent, name in ((react, "joint-react"), (prior, "joint-prior-only")):
        config = agent.config
        assert name == agent.name and config == AgentConfig(rendering="experience", seed=4)
        agent.run(Episode(ScriptedEnv(), "a/1", 3))
        assert agent.config is config and agent.name == name


def test_agent_names_are_given_at_construction():
    from agent_shell.agents import CBAgent

    assert CBAgent(FakeLM(), DEMOS, concepts=None).name == "prior-only"
    assert CBAgent(FakeLM(), DEMOS, concepts={"fetch": None}).name == "cb-agent"
    assert JointCBAgent(FakeLM(), DEMOS, concepts={"fetch": None}).name == "joint-cb-agent"


# ---------------------------------------------------------------------------- configuration


def test_the_agents_config_of_the_run_settings():
    from agent_shell.configure import agent_config

    config = RunConfig(env="textworld", rendering="causal", layout="chat", action_space="open", gamma=0.5, seed=7)
    # what the players were built with when the agents' config was nested in the settings
    assert agent_config(config) == AgentConfig.for_env("textworld", rendering="causal", layout="chat",
                                                       action_space="open", seed=7, gamma=0.5)
    assert (config.rendering, config.layout, config.action_space, config.gamma, config.seed) == \
        ("causal", "chat", "open", 0.5, 7)
    assert agent_config(config).header.startswith("Interact with a text game")
    moved = dataclasses.replace(config, env="alfworld", rendering="raw")
    assert agent_config(moved) == AgentConfig.for_env("alfworld", layout="chat", action_space="open", seed=7,
                                                      gamma=0.5)
    assert agent_config(dataclasses.replace(config, budget=3)) == agent_config(config)
    assert agent_config(RunConfig()) == AgentConfig()  # the settings' defaults are the agents' defaults
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rendering = "raw"
    shared = set(RunConfig.field_names()) & {f.name for f in dataclasses.fields(AgentConfig)}
    assert shared == {"rendering", "layout", "action_space", "gamma", "seed"}


def test_recorded_settings_and_resume_of_a_committed_results_file_are_unchanged(tmp_path):
    from agent_shell.results import check_results_file

    path = ROOT / "results" / "table1_alfworld.results.jsonl.gz"
    with gzip.open(path, "rt") as f:
        line = f.readline()
    record = json.loads(line)
    old_keys = ["env", "split", "dtype", "seed", "rendering", "layout", "action_space", "demos_per_type", "demo_split",
                "lam", "gamma", "features", "reflexion_trials", "budget", "demos", "concept_data", "calibrator",
                "concept_per_type", "fit_candidates"]
    recorded = {k: record[k] for k in old_keys if k in record}
    assert len(recorded) == 17  # the file predates concept_per_type, fit_candidates and concept_round
    config = resolve(RunConfig(**recorded), backbone=False)
    settings = config.settings()
    assert list(settings) == old_keys + ["concept_round"]
    assert {k: settings[k] for k in recorded} == recorded
    assert (settings["concept_per_type"], settings["fit_candidates"], settings["concept_round"]) == (2, 0, 0)
    assert json.loads(json.dumps(settings)) == settings
    assert list(config.to_dict()) == [
        "env", "split", "demo_split", "demos_per_type", "concept_per_type", "fit_candidates", "model", "dtype", "device",
        "rendering", "layout", "lam", "gamma", "features", "agents", "action_space", "reflexion_trials", "budget",
        "seed", "per_type", "games", "game_ids", "cache_dir", "out_dir", "resume", "keep_errors", "demos",
        "concept_data", "workers",
        "ray_address", "shared_lm", "episode_timeout", "calibrator", "concepts"]
    copy = tmp_path / "results.jsonl"
    copy.write_text(line)
    current = {**settings, "model": record["model"]}
    assert check_results_file(copy, [record["agent"]], [record["task_id"]], True, current) == \
        {record["agent"]: {record["task_id"]}}
    with pytest.raises(ValueError, match="seed=0, but this run uses seed=1"):
        check_results_file(copy, [record["agent"]], [record["task_id"]], True,
                           {**current, **resolve(RunConfig(**{**recorded, "seed": 1}), backbone=False).settings()})


@pytest.mark.parametrize("build", [
    lambda lm, other: CBAgent(lm, DEMOS, None, AgentConfig(), other),
    lambda lm, other: ReActAgent(lm, DEMOS, AgentConfig(), other),
    lambda lm, other: build_agent("cb-agent", lm, DEMOS, {"fetch": None}, AgentConfig(), 2, other),
], ids=["CBAgent", "ReActAgent", "build_agent"])
def test_agents_take_their_parts_by_keyword_so_two_language_models_cannot_swap(build):
    """Past the backbone and the demonstrations every part is keyword-only: a second language model
    passed by position (the scoring or reviewer view) is refused, never silently taken for another."""
    with pytest.raises(TypeError, match="positional argument"):
        build(FakeLM(), FakeLM(name="other"))
    agent = CBAgent(FakeLM(), DEMOS, concepts=None, scoring_lm=FakeLM(name="scoring"))
    assert agent.scoring_lm.name == "scoring" and agent.lm.name == "fake-lm"
