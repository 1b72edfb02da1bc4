"""The pipeline layer (:mod:`agent_shell.pipeline`) raises plain ValueError / FileNotFoundError
with one-line messages (no click), and the commands turn them into the same one-line click errors."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import agent_shell.lm
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell import pipeline
from agent_shell.cli import main
from agent_shell.configure import resolve
from agent_shell.run_config import RunConfig


def test_prepare_refuses_an_unknown_demonstrations_split_before_collecting_anything(tmp_path):
    config = resolve(RunConfig(env="scripted", agents=("react",), demo_split="nosuch", cache_dir=str(tmp_path)),
                     backbone=False)
    lines: list[str] = []
    with pytest.raises(pipeline.UnknownTasks) as info:
        pipeline.prepare(config, False, lines.append, env=ScriptedEnv(), lm=FakeLM())
    err = info.value
    assert isinstance(err, ValueError) and not isinstance(err, click.ClickException)
    assert "nosuch" in str(err) and "\n" not in str(err) and err.split == "nosuch"
    assert lines == [] and not (tmp_path / "expert").exists()


def test_load_calibrator_names_the_file_in_a_plain_error(tmp_path):
    missing = tmp_path / "none.safetensors"
    with pytest.raises(FileNotFoundError) as info:
        pipeline.load_calibrator(missing, FakeLM())
    assert str(info.value).startswith(f"calibrator {missing}: ")
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError) as info:
        pipeline.load_calibrator(bad, FakeLM())
    assert str(info.value).startswith(f"calibrator {bad}: ") and "\n" not in str(info.value)


def test_a_command_turns_an_unknown_split_into_one_click_line_naming_the_listing(monkeypatch, tmp_path):
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))

    def load(*_, **__):
        raise AssertionError("the backbone was loaded before the bad split was refused")

    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)
    res = CliRunner().invoke(main, ["fit-concepts", "--demo-split", "valid"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: unknown ALFWorld split 'valid'")
    assert lines[0].endswith(" (list the valid ids: cb-agent tasks --env alfworld)")
