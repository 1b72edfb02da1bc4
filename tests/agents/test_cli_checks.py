"""Every command checks task ids, splits and variations before anything loads (one line naming the
culprit and what is valid); every option has help text; the package metadata builds cleanly."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import agent_shell.lm
from agent_shell.cli import main

VALID_UNSEEN_GAME = "pick_and_place_simple-Mug-None-Desk-308/trial_T20190909_203041_433487"
TRAIN_GAME = "pick_and_place_simple-AlarmClock-None-Desk-307/trial_T20190907_072303_146844"


@pytest.fixture()
def no_backbone(monkeypatch, tmp_path):
    """The real environments; loading a backbone fails the test (the checks come before it)."""
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))

    def load(*_, **__):
        raise AssertionError("the backbone was loaded before the bad input was refused")

    monkeypatch.setattr(agent_shell.lm, "load_language_model", load)


@pytest.mark.parametrize("args, message", [
    (["run", "--game", "nosuch/x"],
     "Error: unknown ALFWorld task 'nosuch/x': no such game under"),
    (["run", "--game", "pick_and_place_simple-Foo-None-Bar-999/trial_X"],
     "Error: unknown ALFWorld task 'pick_and_place_simple-Foo-None-Bar-999/trial_X'"),
    (["run", "--split", "train", "--demo-split", "valid_unseen", "--game", VALID_UNSEEN_GAME],
     f"Error: alfworld task '{VALID_UNSEEN_GAME}' belongs to split 'valid_unseen', not 'train': refusing to mix "
     "splits (list the valid ids: cb-agent tasks --env alfworld --split train)"),
    (["run", "--split", "valid_unseen", "--game", TRAIN_GAME], "belongs to split 'train', not 'valid_unseen'"),
    (["run", "--demo-split", "valid_unseen"], "--demo-split valid_unseen is the evaluation split"),
    (["run", "--split", "valid"], "Error: unknown ALFWorld split 'valid'"),
    (["run", "--env", "scienceworld", "--split", "test", "--game", "boil/9999"],
     "Error: ScienceWorld task 'boil/9999': boil has variations 0-29 (train 0-13, dev 14-20, test 21-29)"),
    (["run", "--env", "scienceworld", "--split", "test", "--game", "boil/3"],
     "scienceworld task 'boil/3' belongs to split 'train', not 'test'"),
    (["run", "--env", "textworld", "--split", "test", "--game", "cooking/test/7"],
     "seed 7 is outside the test seeds 100001..100020"),
    (["fit-concepts", "--demo-split", "valid"], "Error: unknown ALFWorld split 'valid'"),
    (["eval-decisions", "--heldout-split", "dev"], "Error: unknown ALFWorld split 'dev'"),
    # the held-out split defaults to the environment's own evaluation split (TextWorld: test)
    (["eval-decisions", "--env", "textworld", "--demo-split", "dev"], "Error: unknown TextWorld split 'dev'"),
    (["eval-decisions", "--env", "scienceworld", "--demo-split", "valid_unseen"],
     "Error: unknown ScienceWorld split 'valid_unseen'"),
    (["tasks", "--env", "scienceworld", "--split", "valid"], "Error: unknown ScienceWorld split 'valid'"),
])
def test_bad_ids_and_splits_are_one_line_before_anything_loads(no_backbone, tmp_path, args, message):
    res = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path / "out")] if args[0] == "run" else args)
    assert res.exit_code == 1 and message in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def _commands(group: click.Group, ctx: click.Context, prefix: tuple = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*prefix, name))
        else:
            yield (*prefix, name), command


def test_every_option_of_every_command_has_help():
    ctx = click.Context(main)
    missing = [f"{' '.join(name)} {'/'.join(p.opts)}" for name, command in _commands(main, ctx)
               for p in command.params if isinstance(p, click.Option) and not p.help]
    assert missing == []


def test_resume_defaults_to_off_in_every_command():
    ctx = click.Context(main)
    defaults = {" ".join(name): p.default for name, command in _commands(main, ctx) for p in command.params
                if p.name == "resume"}
    assert {"run", "collect", "probe", "recover"} <= set(defaults) and set(defaults.values()) == {False}


def test_the_license_is_an_spdx_string():
    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "MIT"  # a {text = ...} table is deprecated by setuptools
    assert "setuptools>=77" in meta["build-system"]["requires"]  # the first to read SPDX strings


@pytest.mark.parametrize("command", [["run", "--env", "textworld", "--max-steps", "1"],
                                     ["improve", "--env", "textworld", "--rounds", "1"]])
def test_a_results_folder_under_a_regular_file_is_one_line(tmp_path, command):
    """--out-dir below a regular file: one line naming the folder and the option, before anything loads,
    and the file is left as it was."""
    (tmp_path / "afile").write_text("kept\n")
    res = CliRunner().invoke(main, [*command, "--out-dir", str(tmp_path / "afile" / "sub")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line == (f"Error: the results folder {tmp_path / 'afile' / 'sub'} cannot be created (Not a directory: "
                    f"{tmp_path / 'afile' / 'sub'}); set --out-dir to a folder that can be"), line
    assert (tmp_path / "afile").read_text() == "kept\n"


def test_a_report_file_below_a_regular_file_is_one_line(tmp_path):
    """report --markdown where a regular file stands in the way: one line naming the output and the file."""
    import gzip

    from cb_io.storage import append_jsonl

    gz = Path(__file__).resolve().parents[2] / "results" / "table1_alfworld.results.jsonl.gz"
    with gzip.open(gz, "rt") as f:
        records = [json.loads(next(f)) for _ in range(2)]
    results = tmp_path / "results.jsonl"
    for r in records:
        append_jsonl(results, r)
    (tmp_path / "afile").write_text("kept\n")
    res = CliRunner().invoke(main, ["report", str(results), "--markdown", str(tmp_path / "afile" / "r.md")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("Error")]
    assert line == (f"Error: cannot write {tmp_path / 'afile' / 'r.md'}: {tmp_path / 'afile'} is a file, not a "
                    "folder; choose another path"), line
    assert (tmp_path / "afile").read_text() == "kept\n"


def test_a_read_only_parent_of_the_results_folder_is_one_line(tmp_path):
    """--out-dir in a folder this process may not write into: one line naming the folder that refuses."""
    import os

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere
        pytest.skip("this user writes into read-only folders")
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--out-dir", str(locked / "a" / "b")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line == (f"Error: the results folder {locked / 'a' / 'b'} cannot be created (Permission denied: "
                    f"{locked}); set --out-dir to a folder that can be"), line
    assert list(locked.iterdir()) == []


def test_a_cache_folder_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    """CB_AGENT_CACHE under a regular file: `run` (which needs the cache) stops in one line naming
    the folder before anything loads; `fit` (which needs none) warns once and fits."""
    import numpy as np

    import cb_core

    (tmp_path / "file").write_text("not a folder\n")
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "file" / "cache"))
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--max-steps", "1", "--out-dir", str(tmp_path / "r")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert line.startswith("Error: the cache folder") and "Not a directory" in line and "CB_AGENT_CACHE" in line
    rng, sizes = np.random.default_rng(1), (3, 4, 5)
    with open(tmp_path / "d.npz", "wb") as f:
        cb_core.write_decisions(f, cb_core.decisions_from_lists(
            [rng.normal(size=(m, 4)).astype(np.float32) for m in sizes], [np.zeros(m, np.float32) for m in sizes],
            [np.ones(m, np.int32) for m in sizes], [0, 1, 2]))
    fitted = CliRunner().invoke(main, ["fit", str(tmp_path / "d.npz"), "--out", str(tmp_path / "c.safetensors")])
    assert fitted.exit_code == 0 and (tmp_path / "c.safetensors").exists(), fitted.output
    (warning,) = [ln for ln in fitted.output.splitlines() if ln.startswith("warning")]
    assert f"compiled programs are not kept in {tmp_path / 'file' / 'cache' / 'jax'}" in warning


def test_a_ray_tmpdir_too_long_for_a_socket_is_one_line(tmp_path, monkeypatch):
    """A local Ray cluster's sockets live under RAY_TMPDIR: a folder too long for a Unix socket
    path (107 bytes) is refused in one line before anything loads."""
    from agent_shell.parallel import RAY_SOCKET_SUFFIX, SOCKET_PATH_MAX, check_ray_tmpdir

    longest = "/" + "r" * (SOCKET_PATH_MAX - RAY_SOCKET_SUFFIX - 1)
    monkeypatch.setenv("RAY_TMPDIR", longest)
    check_ray_tmpdir()  # fits exactly
    monkeypatch.setenv("RAY_TMPDIR", longest + "r")
    res = CliRunner().invoke(main, ["run", "--env", "textworld", "--workers", "2", "--out-dir", str(tmp_path / "r")])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "RAY_TMPDIR" in line and "107 bytes" in line and "/tmp/ray" in line


@pytest.mark.parametrize("lam, edge", [("1e39", "overflows"), ("1e-46", "underflows")])
def test_a_strength_float32_cannot_hold_is_refused_before_anything_loads(no_backbone, lam, edge):
    """The concepts are fitted in float32: --lam 1e39 (inf) or 1e-46 (0) is a usage error naming
    lam, before any demonstration is collected or the backbone loads."""
    res = CliRunner().invoke(main, ["fit-concepts", "--env", "textworld", "--lam", lam])
    assert res.exit_code == 2 and f"lam={float(lam)!r} {edge} float32" in res.output, res.output
    assert "Traceback" not in res.output


def test_cache_dir_moves_every_cache_textworld_s_generated_games_too(tmp_path, monkeypatch):
    """``--cache-dir`` is the cache root of the whole command: TextWorld's generated games (the
    folder ``envs.textworld.generate_game`` writes to) go there, not to ``~/.cache/cb-agent``."""
    import agent_shell.commands.fit_concepts as command
    from cb_io.paths import cache_dir

    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "default"))  # restored after the test
    seen = []

    def prepare(config, **kw):
        seen.append(cache_dir("textworld", "cooking", "train"))  # generate_game's folder
        raise SystemExit(0)

    monkeypatch.setattr(command, "prepare", prepare)
    res = CliRunner().invoke(main, ["fit-concepts", "--env", "textworld", "--cache-dir", str(tmp_path / "mine")])
    assert res.exit_code == 0 and seen == [tmp_path / "mine" / "textworld" / "cooking" / "train"], res.output
    assert not (tmp_path / "default").exists()
