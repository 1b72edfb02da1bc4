"""One options system: every leaf command declares a shared flag (environment, backbone, output,
resume, seed...) only through the shared set of ``agent_shell.commands._common``, and the ``ical``
commands' backbone settings are resolved as every other command's."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import envs
from agent_doubles import ScriptedEnv
from agent_shell.cli import leaf_commands, main
from agent_shell.commands import _common
from agent_shell.commands import ical as ical_cmd
from agent_shell.commands._common import SHARED_OPTIONS, SharedClickOption

#: Flags a command declares with another meaning than the shared option of the same flag: (command,
#: flag) -> what it is there. Each is a separate setting, not a second declaration of the shared one.
OTHER_MEANING = {
    ("calibrate eval", "--calibrator"): "the calibrator file to evaluate (an argument of the study, not the run's)",
    ("fit", "--lam"): "cb_core.fit's L2 strength on a decisions file (plain float, no run)",
    ("fit", "--gamma"): "cb_core.fit's length exponent on a decisions file (plain float, no run)",
    ("fit", "--features"): "the feature names recorded in the fitted file (default: the file's metadata)",
    ("probe", "--history"): "several renderings compared (repeatable), not the run's one rendering",
    ("recover", "--history"): "several renderings compared (repeatable), not the run's one rendering",
    ("recover", "--agent"): "the study's actors (react, prior-only, cb-agent), not the run's agents",
}


def redeclared(path: str, command: click.Command) -> list[str]:
    """The shared flags ``command`` declares outside the shared set (other meanings excepted)."""
    shared = {flag for option in SHARED_OPTIONS.values() for flag in option.flags}
    out = []
    for param in command.params:
        if isinstance(param, click.Option) and not isinstance(param, SharedClickOption):
            out += [f for f in param.opts + param.secondary_opts if f in shared and (path, f) not in OTHER_MEANING]
    return out


def test_the_check_finds_a_shared_flag_declared_again():
    """The finder itself: a plain ``--env`` (under another destination) and ``--no-resume`` are
    found; the same flags taken from the shared set are not."""
    @click.command()
    @click.option("--env", "env_name")
    @click.option("--resume/--no-resume")
    def plain(env_name, resume):
        pass

    @click.command()
    @_common.shared_option("env", help="Another help text.")
    @_common.shared_option("resume")
    def shared(env, resume):
        pass

    assert redeclared("plain", plain) == ["--env", "--resume", "--no-resume"]
    assert redeclared("shared", shared) == []


def test_every_leaf_command_takes_the_shared_flags_from_the_shared_set():
    commands = dict(leaf_commands())
    assert len(commands) == 24 and {"ical abstract", "collect", "tasks", "run", "improve"} <= set(commands)
    offenders = {path: found for path, command in commands.items() if (found := redeclared(path, command))}
    assert offenders == {}
    for path, flag in OTHER_MEANING:  # every exception still exists (else it is stale)
        assert any(flag in p.opts for p in commands[path].params if isinstance(p, click.Option)), (path, flag)


def test_the_flags_named_by_the_shared_set_are_each_declared_there_once():
    flags = [flag for option in SHARED_OPTIONS.values() for flag in option.flags]
    assert len(flags) == len(set(flags))
    assert {"--env", "--resume", "--seed", "--model", "--dtype", "--device", "--out-dir"} <= set(flags)


@pytest.fixture()
def captured(monkeypatch, tmp_path):
    """The settings ``ical abstract`` loads its backbone with and those ``fit-concepts`` sets up with."""
    seen = {}

    def load(config):
        seen["ical"] = config
        raise click.ClickException("stop")

    def prepare(config, **kwargs):
        seen["fit-concepts"] = config
        raise click.ClickException("stop")

    monkeypatch.setattr(ical_cmd, "_load_lm", load)
    monkeypatch.setattr("agent_shell.commands.fit_concepts.prepare", prepare)
    monkeypatch.setattr(_common, "check_backbone", lambda model, device: None)
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv())
    return seen


def test_ical_resolves_device_and_dtype_as_the_other_commands(tmp_path, captured):
    """``--device auto --dtype auto`` reach the ical backbone resolved, to what fit-concepts gets."""
    from test_ical_cli import noisy_file

    noisy = noisy_file(tmp_path)
    for args in (["ical", "abstract", str(noisy), "--out", str(tmp_path / "a.jsonl"), "--device", "auto",
                  "--dtype", "auto", "--env", "textworld"],
                 ["fit-concepts", "--device", "auto", "--dtype", "auto", "--env", "textworld",
                  "--cache-dir", str(tmp_path / "cache")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and "stop" in result.output, result.output
    ical, fit = captured["ical"], captured["fit-concepts"]
    assert ical.device == fit.device and ical.device in ("cpu", "cuda")
    assert ical.dtype == fit.dtype and ical.dtype in ("float32", "bfloat16")
    assert ical.env == fit.env == "textworld" and ical.split == "test"


def test_the_cli_reference_table_has_a_row_per_shared_option_with_the_commands_taking_it():
    """docs/cli.md's table (scripts/cli_reference.py, an mkdocs hook) is made from the one option set."""
    import importlib.util
    from pathlib import Path
    from types import SimpleNamespace

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("cli_reference", root / "scripts" / "cli_reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    table = reference.shared_options_markdown()
    rows = {line.split(" | ")[1]: line for line in table.splitlines()[2:]}  # setting -> row
    assert set(rows) == {f"`{name}`" for name in SHARED_OPTIONS}
    for setting, commands in (("env", ("ical abstract", "ical noisy", "collect", "tasks", "run", "improve")),
                              ("device", ("ical refine", "fit-concepts", "probe", "run")),
                              ("out_dir", ("fit-concepts", "run", "improve")),
                              ("seed", ("ical noisy", "probe", "concepts-tsne", "run"))):
        assert all(f"`{c}`" in rows[f"`{setting}`"] for c in commands), (setting, rows[f"`{setting}`"])
    assert "`tasks`" not in rows["`out_dir`"] and "`report`" not in table
    page = SimpleNamespace(file=SimpleNamespace(src_uri="cli.md"))
    assert reference.on_page_markdown(f"a\n{reference.MARKER}\nb", page) == f"a\n{table}\nb"
    with pytest.raises(ValueError, match="marker"):
        reference.on_page_markdown("no marker", page)
    other = SimpleNamespace(file=SimpleNamespace(src_uri="index.md"))
    assert reference.on_page_markdown("x", other) == "x"
    assert reference.MARKER in (root / "docs" / "cli.md").read_text()
