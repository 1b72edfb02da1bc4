"""Settings resolved once per command: a settings value reads nothing from disk, resolution (the
device, the dtype, the names, the concept round read from provenance) happens once into a
ResolvedRun, and one `cb-agent improve` run queries the devices once."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import agent_shell.agents
import agent_shell.commands._common  # noqa: F401 (its --agent choices ask the registry once, at import)
import agent_shell.lm.factory
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from agent_shell.configure import resolve
from agent_shell.pipeline import prepare
from agent_shell.run_config import ResolvedRun, RunConfig
from test_improve import doubles, improve_args  # noqa: F401 (the fixture)


def counted(monkeypatch, module, name: str) -> list:
    """The calls of ``module.name`` from now on (their arguments)."""
    calls, fn = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return fn(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.fixture()
def device_queries(monkeypatch):
    """The calls of the backbone's device and dtype rule (each imports torch and asks for devices)."""
    return counted(monkeypatch, agent_shell.lm.factory, "device_and_dtype")


@pytest.mark.slow  # a whole improve run with doubles (concept fits included)
def test_one_improve_run_resolves_its_settings_once(tmp_path, doubles, device_queries, monkeypatch):  # noqa: F811
    resolutions = counted(monkeypatch, agent_shell.agents, "agent_names")  # each resolution checks the names
    res = CliRunner().invoke(main, improve_args(tmp_path / "imp", "--rounds", "1", "--games-per-round", "1"))
    assert res.exit_code == 0, res.output
    # the command's resolution (5 before: the command, its game check, the rounds' start, their game
    # check and the set-up each resolved again); the set-up and the rounds take it as it is
    assert len(resolutions) == 1
    # the resolution's device query and the command's check that the device is there (4 before)
    assert len(device_queries) == 2


def test_settings_read_nothing_from_disk_and_resolution_reads_the_concept_round_once(tmp_path, device_queries):
    folder = tmp_path / "concepts"
    settings = RunConfig(concepts=str(folder), demos="ical:" + str(tmp_path / "memory"))  # neither exists: no error
    assert not isinstance(settings, ResolvedRun) and not hasattr(settings, "concept_round")
    with pytest.raises(ValueError, match="ICAL memory folder"):
        resolve(settings, backbone=False)
    with pytest.raises(ValueError, match="no folder of concept files"):
        resolve(RunConfig(concepts=str(folder)), backbone=False)
    folder.mkdir()
    (folder / "fetch.safetensors").write_bytes(b"")
    (folder / "provenance.json").write_text(json.dumps({"round": 3}))
    resolved = resolve(RunConfig(concepts=str(folder), device="cpu", dtype="float32"))
    assert isinstance(resolved, ResolvedRun) and resolved.concept_round == 3 and len(device_queries) == 1
    assert resolved.settings()["concept_round"] == 3 and resolved.split == "valid_unseen"
    (folder / "provenance.json").write_text(json.dumps({"round": 5}))
    assert resolve(resolved) is resolved and len(device_queries) == 1  # nothing resolved nor queried again
    assert resolve(RunConfig(concepts=str(folder)), backbone=False).concept_round == 5


def test_the_set_up_takes_resolved_settings_only(tmp_path):
    with pytest.raises(TypeError, match="prepare takes resolved settings"):
        prepare(RunConfig(env="scripted", cache_dir=str(tmp_path)), False, env=ScriptedEnv(), lm=FakeLM())
