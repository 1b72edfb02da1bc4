"""results/make_results.sh restores a target's results files from the committed results/*.gz
(runs/ is not committed), so a fresh checkout resumes a long table instead of replaying it."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "results" / "make_results.sh"


def _seed(tmp_path: Path, target: Path, gz: Path, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run the script's own ``seed`` function (extracted from it, not a copy) on target and gz."""
    body = subprocess.run(["sed", "-n", "/^seed() {/,/^}/p", str(SCRIPT)], capture_output=True, text=True,
                          check=True).stdout
    assert body.startswith("seed() {"), "make_results.sh has no seed function"
    env = {"PATH": "/usr/bin:/bin"} | ({"FRESH": "1"} if fresh else {})
    return subprocess.run(["bash", "-euo", "pipefail", "-c", body + '\nseed "$1" "$2"', "seed", str(target), str(gz)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, check=True)


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
