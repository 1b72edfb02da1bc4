"""scripts/make_results.sh restores a target's results files from the committed results/*.gz
(runs/ is not committed), so a fresh checkout resumes a long table instead of replaying it, and
writes every table through one function, from the committed results files with its TABLES line."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "make_results.sh"


def function(name: str) -> str:
    """The script's own shell function ``name`` (extracted from it, not a copy)."""
    body = subprocess.run(["sed", "-n", f"/^{name}() {{/,/^}}/p", str(SCRIPT)], capture_output=True, text=True,
                          check=True).stdout
    assert body.startswith(f"{name}() {{"), f"make_results.sh has no {name} function"
    return body


def _seed(tmp_path: Path, target: Path, gz: Path, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run the script's ``seed`` function on target and gz."""
    env = {"PATH": "/usr/bin:/bin"} | ({"FRESH": "1"} if fresh else {})
    return subprocess.run(["bash", "-euo", "pipefail", "-c", function("seed") + '\nseed "$1" "$2"', "seed", str(target),
                           str(gz)], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)


def test_seed_restores_a_missing_results_file_from_the_committed_gz_and_never_overwrites(tmp_path):
    lines = b'{"agent": "react", "task_id": "a"}\n{"agent": "react", "task_id": "b"}\n'
    gz = tmp_path / "t.results.jsonl.gz"
    gz.write_bytes(gzip.compress(lines))
    target = tmp_path / "runs" / "t" / "results.jsonl"

    _seed(tmp_path, target, gz, fresh=True)
    assert not target.exists()  # FRESH=1 starts from nothing

    out = _seed(tmp_path, target, gz)
    assert target.read_bytes() == lines and "(2 lines)" in out.stderr
    assert not target.with_name("results.jsonl.seed").exists()

    target.write_bytes(lines + b'{"agent": "react", "task_id": "c"}\n')  # the run went on
    _seed(tmp_path, target, gz)
    assert target.read_bytes().count(b"\n") == 3  # an existing file is the run's: left alone

    missing = tmp_path / "runs" / "u" / "results.jsonl"
    _seed(tmp_path, missing, tmp_path / "none.gz")
    assert not missing.exists()  # nothing committed: nothing to restore


def test_table_reports_its_committed_results_files_with_the_options_of_its_line(tmp_path):
    """``table NAME`` hands `cb-agent report` the decompressed results files of NAME's TABLES line, in
    order, then its options, and writes results/NAME.md and .png (a stand-in CB records the call)."""
    results = tmp_path / "results"
    results.mkdir()
    for name in ("one", "two"):
        (results / f"{name}.results.jsonl.gz").write_bytes(gzip.compress(f'{{"task_id": "{name}"}}\n'.encode()))
    cb = tmp_path / "cb"  # prints each argument, and a file argument's first line after it
    cb.write_text('#!/bin/bash\nfor a in "$@"; do echo "$a"; if [ -f "$a" ]; then head -n1 "$a"; fi; done > call.txt\n')
    cb.chmod(0o755)
    tables = "TABLES='\nboth: one two --paired --common-games\nalone: two\n'\n"
    run = subprocess.run(["bash", "-euo", "pipefail", "-c", tables + function("table") + "\ntable both"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CB": str(cb)}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    call = (tmp_path / "call.txt").read_text().splitlines()
    assert call[0] == "report" and call[1].endswith("/one.jsonl") and call[3].endswith("/two.jsonl")
    assert call[2] == '{"task_id": "one"}' and call[4] == '{"task_id": "two"}'
    assert call[5:] == ["--paired", "--common-games", "--markdown", "results/both.md", "--chart", "results/both.png"]
    assert not Path(call[1]).exists()  # the decompressed copies are removed
    missing = subprocess.run(["bash", "-euo", "pipefail", "-c", tables + function("table") + "\ntable nosuch"],
                             capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "CB": str(cb)}, cwd=tmp_path)
    assert missing.returncode == 2 and "no table nosuch in TABLES" in missing.stderr
