"""ICAL memory: weighted exact-cosine retrieval on a hand-built memory, durability under kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agent_shell.ical import Example, Lambdas, Memory, Program, retrieval_scores, top_k
from agent_shell.ical.program import Annotation
from cb_io.records import Step, Trajectory
from cb_io.storage import append_jsonl


class TableEmbedder:
    """Hand-chosen unit vectors per text (d = 3); unknown texts map to the last axis."""

    metadata = {"model": "table", "dim": 3}

    def __init__(self, table: dict[str, list[float]]):
        self.table = table
        self.calls = 0

    def embed(self, texts):
        self.calls += len(texts)
        rows = [np.asarray(self.table.get(t, [0, 0, 1]), np.float32) for t in texts]
        return np.stack([r / np.linalg.norm(r) for r in rows]).reshape(len(rows), 3)


def example(eid: str, instruction: str, state: str, task_type: str = "t", won: bool = True) -> Example:
    steps = [Step("env", "go to desk 1", "You arrive.", ["go to desk 1"], won, won, float(won))]
    traj = Trajectory("scripted", f"task-{eid}", task_type, instruction, state, steps, won, float(won))
    return Example(eid, Program((Annotation("causal", "x"),), ("go to desk 1",)), traj, {"noisy_id": eid}, 0, "fake")


TABLE = {"clean mug": [1, 0, 0], "heat egg": [0, 1, 0], "clean cup": [0.9, 0.1, 0], "cool egg": [0.2, 0.9, 0],
         "kitchen": [1, 0, 0], "bedroom": [0, 1, 0]}


def build(tmp_path: Path) -> Memory:
    mem = Memory(tmp_path / "mem", TableEmbedder(TABLE))
    mem.add(example("e0", "clean mug", "kitchen", "clean"))
    mem.add(example("e1", "heat egg", "kitchen", "heat"))
    mem.add(example("e2", "cool egg", "bedroom", "cool"))
    return mem


def test_instruction_only_retrieval_finds_the_known_nearest_neighbours(tmp_path):
    mem = build(tmp_path)
    got = mem.retrieve("clean cup", "kitchen", k=3, lambdas=Lambdas(1.0, 0.0))
    assert [e.example_id for e, _ in got] == ["e0", "e2", "e1"]
    q = np.linalg.norm([0.9, 0.1])
    want = [0.9 / q, (0.9 * 0.2 + 0.1 * 0.9) / q / np.linalg.norm([0.2, 0.9]), 0.1 / q]  # e0, e2, e1
    assert [s for _, s in got] == pytest.approx(want, abs=1e-6)


def test_the_textual_state_term_reorders_by_its_weight(tmp_path):
    mem = build(tmp_path)
    # e0 = (clean mug, kitchen), e1 = (heat egg, kitchen), e2 = (cool egg, bedroom)
    assert [e.example_id for e, _ in mem.retrieve("heat egg", "kitchen", k=2, lambdas=Lambdas(1, 0))] == ["e1", "e2"]
    got = mem.retrieve("clean cup", "bedroom", k=3, lambdas=Lambdas(0.2, 0.8))
    assert [e.example_id for e, _ in got] == ["e2", "e0", "e1"]  # e2: 0.8 * 1 + 0.2 * 0.33; e0: 0.2 * 0.99
    assert mem.retrieve("clean cup", None, k=1, lambdas=Lambdas(0.2, 0.8))[0][0].example_id == "e0"
    assert [e.example_id for e, _ in mem.retrieve("clean cup", exclude_task_ids=["task-e0"], k=1)] == ["e2"]


def test_scores_are_exact_weighted_cosines_and_ties_keep_memory_order():
    rng = np.random.default_rng(0)
    instr, state = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    qi, qs = rng.normal(size=4), rng.normal(size=4)
    want = [0.7 * (a @ qi) / np.linalg.norm(a) / np.linalg.norm(qi)
            + 0.3 * (b @ qs) / np.linalg.norm(b) / np.linalg.norm(qs) for a, b in zip(instr, state)]
    np.testing.assert_allclose(retrieval_scores(qi, qs, instr, state, Lambdas(0.7, 0.3)), want, rtol=1e-12)
    assert top_k(np.array([0.5, 0.9, 0.5, 0.9]), 3) == [1, 3, 0]
    with pytest.raises(ValueError, match="lambda_visual must be 0"):
        Lambdas(0.8, 0.1, 0.1)
    with pytest.raises(ValueError, match="shape"):
        retrieval_scores(qi[:3], qs, instr, state, Lambdas())


def test_memory_keeps_only_wins_and_refuses_duplicates(tmp_path):
    mem = build(tmp_path)
    with pytest.raises(ValueError, match="only won trajectories"):
        mem.add(example("e9", "clean mug", "kitchen", won=False))
    with pytest.raises(ValueError, match="already in"):
        mem.add(example("e1", "heat egg", "kitchen"))
    with pytest.raises(ValueError, match="needs an embedder"):
        Memory(tmp_path / "mem").retrieve("clean cup")
    assert [e.example_id for e in Memory(tmp_path / "mem").examples] == ["e0", "e1", "e2"]


def test_a_torn_last_line_is_reported_and_the_next_append_is_clean(tmp_path):
    build(tmp_path)
    path = tmp_path / "mem" / "examples.jsonl"
    whole = path.read_bytes().splitlines(keepends=True)
    with open(path, "ab") as fh:
        fh.write(whole[0][: len(whole[0]) // 2])  # a kill in the middle of a write
    messages: list[str] = []
    mem = Memory(tmp_path / "mem", TableEmbedder(TABLE), on_malformed=messages.append)
    assert len(mem) == 3 and len(messages) == 1 and "examples.jsonl:4:" in messages[0] and "\n" not in messages[0]
    mem.add(example("e3", "heat egg", "bedroom"))
    again = Memory(tmp_path / "mem", TableEmbedder(TABLE), on_malformed=messages.append)
    assert [e.example_id for e in again.examples] == ["e0", "e1", "e2", "e3"]


def test_an_append_the_index_missed_is_embedded_on_open(tmp_path):
    build(tmp_path)
    append_jsonl(tmp_path / "mem" / "examples.jsonl", example("e3", "clean cup", "kitchen").to_record())
    embedder = TableEmbedder(TABLE)
    mem = Memory(tmp_path / "mem", embedder)
    assert embedder.calls == 2  # only the missing example (instruction + state)
    assert mem.retrieve("clean cup", k=1, lambdas=Lambdas(1, 0))[0][0].example_id == "e3"
    embedder = TableEmbedder(TABLE)
    Memory(tmp_path / "mem", embedder)
    assert embedder.calls == 0  # the index is complete now


_WRITER = textwrap.dedent("""
    import sys
    sys.path[:0] = [{tests!r}, {root!r}]
    from test_ical_memory import TableEmbedder, TABLE, example
    from agent_shell.ical import Memory
    mem = Memory({folder!r}, TableEmbedder(TABLE))
    i = 0
    while True:
        mem.add(example(f"x{{i}}", "clean mug " * 2000, "kitchen"))  # long lines: kills land mid-write
        print(i, flush=True)
        i += 1
""")


def test_memory_survives_a_kill_during_appends(tmp_path):
    folder = tmp_path / "mem"
    code = _WRITER.format(tests=str(Path(__file__).parent), root=str(Path(__file__).parents[2]), folder=str(folder))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    for _ in range(5):
        assert proc.stdout.readline().strip() != ""
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    messages: list[str] = []
    mem = Memory(folder, TableEmbedder(TABLE), on_malformed=messages.append)
    ids = [e.example_id for e in mem.examples]
    assert len(ids) >= 5 and ids == [f"x{i}" for i in range(len(ids))] and len(messages) <= 1
    mem.add(example("after", "heat egg", "kitchen"))
    assert Memory(folder, TableEmbedder(TABLE)).retrieve("heat egg", k=1, lambdas=Lambdas(1, 0))[0][0].example_id == "after"
