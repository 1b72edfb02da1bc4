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


FAKE_CB = r'''#!/bin/bash
# records its arguments; as `improve`, writes round 0's results (as played), round 1's training play and labels, the
# rounds file and two rounds' concepts into --out-dir
echo "$*" >> "$CALLS"
if [ "$1" = improve ]; then
  while [ $# -gt 0 ]; do [ "$1" = --out-dir ] && { mkdir -p "$2/round-0/concepts" "$2/round-1/concepts"
    touch "$2/round-0/results.jsonl" "$2/round-1/train.jsonl" "$2/round-1/labelled.jsonl"
    echo '{"round": 0}' > "$2/rounds.jsonl"; }; shift; done
fi
'''


def _relabelled(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """The script's improve_relabelled with a cb-agent that records its calls (``tmp_path/calls``)."""
    cb = tmp_path / "cb"
    cb.write_text(FAKE_CB)
    cb.chmod(0o755)
    body = "\n".join(function(f) for f in ("games", "seed_rounds", "seed_round0", "round_decisions",
                                           "improve_relabelled"))
    setup = "COMMON=(--dtype float32); RUNS=runs; ALF_BUDGET=50; TW_GAMES=1; WORKERS=2\n"
    return subprocess.run(["bash", "-euo", "pipefail", "-c", setup + body + "\nimprove_relabelled"],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "CB": str(cb), "CALLS": str(tmp_path / "calls"), **env})


def test_improve_relabelled_on_alfworld_plays_table1s_games_from_table1s_round_0(tmp_path):
    (tmp_path / "results").mkdir()
    cb = b'{"schema":"cb-agent/episode-v1","agent":"cb-agent","task_id":"a","success":true}\n'
    react = b'{"schema":"cb-agent/episode-v1","agent":"react","task_id":"a","success":false}\n'
    (tmp_path / "results" / "table1_alfworld.results.jsonl.gz").write_bytes(gzip.compress(react + cb))
    res = _relabelled(tmp_path, IMPROVE_ENV="alfworld")
    assert res.returncode == 0, res.stderr
    out = tmp_path / "runs" / "improve-alfworld-expert-lm-hidden"
    assert (out / "round-0" / "results.jsonl").read_bytes() == cb  # Table 1's cb-agent episodes only
    improve = (tmp_path / "calls").read_text().splitlines()[0].split()
    assert improve[:7] == ["improve", "--env", "alfworld", "--split", "valid_unseen", "--all-games", "--max-steps"]
    assert improve[7] == "50" and " --labels expert --features lm-hidden " in " ".join(improve) + " "
    assert improve[improve.index("--workers") + 1] == "2"  # the rounds' games on the WORKERS Ray workers
    assert (tmp_path / "results" / "improve_alfworld_expert_rounds.jsonl").is_file()
    for kind in ("train", "labelled"):  # what a fresh checkout resumes from (seed_rounds)
        assert gzip.decompress((tmp_path / "results" / f"improve_alfworld_expert.{kind}.jsonl.gz").read_bytes()) == b""
    # each finished round's concepts (rounds 0 and 1 here, of 3) on Table 4's held-out expert decisions
    held = [call.split() for call in (tmp_path / "calls").read_text().splitlines()[2:]]
    assert [call[:5] for call in held] == [["eval-decisions", "--env", "alfworld", "--heldout-per-type", "5"]] * 2
    for k, call in enumerate(held):
        assert call[call.index("--features") + 1] == "lm-hidden" and "--dtype" in call
        assert call[call.index("--concepts") + 1] == f"{out.relative_to(tmp_path)}/round-{k}/concepts"
        assert call[call.index("--out") + 1] == f"results/improve_alfworld_expert_decisions_round{k}.json"
    # the novelty arm plays its own round 0 (another concept): nothing is seeded
    assert _relabelled(tmp_path, IMPROVE_ENV="alfworld", FEATURES="lm-hidden,novelty").returncode == 0
    played = tmp_path / "runs" / "improve-alfworld-expert-lm-hidden-novelty" / "round-0" / "results.jsonl"
    assert played.read_bytes() == b""
    assert (tmp_path / "results" / "improve_alfworld_expert_novelty_rounds.jsonl").is_file()
    last = (tmp_path / "calls").read_text().splitlines()[-1].split()
    assert last[last.index("--features") + 1] == "lm-hidden,novelty"
    assert last[last.index("--out") + 1] == "results/improve_alfworld_expert_novelty_decisions_round1.json"


def _episode(round_: int, task: str, split: str) -> str:
    return (f'{{"schema":"cb-agent/episode-v1","agent":"cb-agent","task_id":"{task}","split":"{split}",'
            f'"concept_round":{round_},"model":"m"}}\n')


def test_seed_rounds_restores_a_committed_runs_finished_rounds_by_the_concepts_that_played(tmp_path):
    """Round K's evaluation episodes are those of concept_round K, its training play and labels those of
    concept_round K-1 (round 0 plays no training game), the unfinished round's too where committed; then
    the rounds file; never over a run's own."""
    results, name = tmp_path / "results", "improve_x"
    results.mkdir()
    evaluation = [_episode(k, f"e{i}", "test") for k in (0, 1, 2) for i in (1, 2)]
    train = [_episode(k, f"t{k}{i}", "train") for k in (0, 1, 2) for i in (1, 2, 3)]  # round 3's play: begun
    labelled = [line.replace('"model"', '"labelled":1,"model"') for line in train]
    rounds = "".join(f'{{"schema":"cb-agent/improve-round-v1","round":{k}}}\n' for k in (0, 1, 2))
    for kind, lines in (("results", evaluation), ("train", train), ("labelled", labelled)):
        (results / f"{name}.{kind}.jsonl.gz").write_bytes(gzip.compress("".join(lines).encode()))
    (results / f"{name}_rounds.jsonl").write_text(rounds)

    def seed_rounds(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-euo", "pipefail", "-c", function("seed_rounds") + f"\nseed_rounds out {name}"],
                              capture_output=True, text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", **env})

    assert seed_rounds(FRESH="1").returncode == 0 and not (tmp_path / "out").exists()  # FRESH: from nothing
    res = seed_rounds()
    assert res.returncode == 0 and res.stderr.strip() == f"resuming out from results/{name} (rounds 0-2 finished)"
    out = tmp_path / "out"
    for k in (0, 1, 2):
        assert (out / f"round-{k}" / "results.jsonl").read_text() == "".join(evaluation[2 * k:2 * k + 2])
    assert not (out / "round-0" / "train.jsonl").exists() and not (out / "round-0" / "labelled.jsonl").exists()
    for k in (1, 2, 3):
        assert (out / f"round-{k}" / "train.jsonl").read_text() == "".join(train[3 * (k - 1):3 * k])
        assert (out / f"round-{k}" / "labelled.jsonl").read_text() == "".join(labelled[3 * (k - 1):3 * k])
    assert not (out / "round-3" / "results.jsonl").exists() and not (out / "round-4").exists()
    assert (out / "rounds.jsonl").read_text() == rounds and not list(out.rglob("*.seed"))
    (out / "round-2" / "results.jsonl").write_text(evaluation[4])  # the run went on: its files are its own
    assert seed_rounds().returncode == 0 and (out / "round-2" / "results.jsonl").read_text() == evaluation[4]
    other = tmp_path / "results" / f"{name}.labelled.jsonl.gz"
    other.unlink()  # a run committed without its labels: nothing to resume from, nothing written
    (out / "rounds.jsonl").unlink()
    assert seed_rounds().returncode == 0 and not (out / "rounds.jsonl").exists()


def test_improve_relabelled_without_its_round_0_results_says_so_in_one_line(tmp_path):
    res = _relabelled(tmp_path, IMPROVE_ENV="alfworld")
    out = "runs/improve-alfworld-expert-lm-hidden"
    want = f"no results/table1_alfworld.results.jsonl.gz to seed round 0 of {out} from"
    assert res.returncode == 2 and res.stderr.strip() == want
    assert not (tmp_path / out / "round-0").exists() and not (tmp_path / "calls").exists()


def test_improve_relabelled_names_a_wrong_environment_in_one_line(tmp_path):
    res = _relabelled(tmp_path, IMPROVE_ENV="scienceworld")
    assert res.returncode == 2 and res.stderr.strip() == "IMPROVE_ENV must be textworld or alfworld, not scienceworld"
    assert not (tmp_path / "calls").exists()
