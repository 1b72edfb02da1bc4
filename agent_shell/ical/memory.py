"""ICAL's memory M: kept examples in one JSONL file plus an embedding index, and retrieval.

A memory is a folder::

    MEMORY/examples.jsonl   one example per line (schema :data:`EXAMPLE_SCHEMA_VERSION`), appended
                            with one O_APPEND write + fsync (:func:`cb_io.storage.append_jsonl`)
    MEMORY/index.npz        ids, instruction and textual-state embeddings [n, d] float32, and the
                            embedder's metadata; rewritten atomically (temp file + rename)

The JSONL file is the source of truth; the index is derived from it. A kill during an append
leaves at most a torn last line (reported by line number and skipped; the next append starts on a
fresh line), and a kill between the append and the index rewrite leaves examples the index lacks:
the next :meth:`Memory.open` with an embedder embeds exactly those. An index written by another
embedder (other metadata) is rebuilt.

Retrieval (ICAL Sec. 3.3): for a query with instruction I and textual state x, every example e
scores

    s(e) = lambda_I * cos(I, I_e) + lambda_text * cos(x, x_e) + lambda_visual * cos(v, v_e)

with exact cosines (dot products of L2-normalised vectors, numpy); text games have no visual
embeddings, so ``lambda_visual`` must stay 0 (the term is kept for the source's formula). The
top K by score are returned, ties in memory order.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from agent_shell.ical.program import Program
from cb_io.records import TaskStart, Trajectory

#: Bumped when an example field changes meaning or is removed; readers refuse newer versions.
EXAMPLE_SCHEMA_VERSION = 1
#: Layout version of index.npz.
INDEX_VERSION = 1
EXAMPLES_FILE = "examples.jsonl"
INDEX_FILE = "index.npz"


class Embedder(Protocol):
    """What the memory needs of :class:`agent_shell.embeddings.SentenceEmbedder`."""

    metadata: dict

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[n, d] float32, rows of unit norm."""
        ...


@dataclass(frozen=True)
class Lambdas:
    """Weights of the retrieval score (ICAL Sec. 3.3). Instruction-only retrieval: (1, 0, 0)."""

    instruction: float = 0.8
    text: float = 0.2
    visual: float = 0.0

    def __post_init__(self) -> None:
        for name in ("instruction", "text", "visual"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"lambda_{name} must be a finite number >= 0, got {value}")
        if self.visual != 0:
            raise ValueError("lambda_visual must be 0: the text environments have no visual embeddings")
        if self.instruction + self.text + self.visual == 0:
            raise ValueError("the retrieval lambdas are all 0")


@dataclass(frozen=True)
class Example:
    """One kept ICAL example e = (optimized trajectory, language abstractions).

    Attributes:
        example_id: stable id (the noisy input's id).
        program: the parsed program that won (abstractions, actions, notes).
        trajectory: its execution in the real environment, the annotations as think steps
            (``think: Subgoal: ...``) at their positions; ``won`` is True for every kept example.
        source: where the noisy input came from (``noisy_id``, ``kind``, corruptions, ...).
        rounds: refinement rounds used (0: the first abstraction already won).
        backbone: the LM that wrote it.
    """

    example_id: str
    program: Program
    trajectory: Trajectory
    source: dict = field(default_factory=dict)
    rounds: int = 0
    backbone: str = ""

    @property
    def task_type(self) -> str:
        return self.trajectory.task_type

    @property
    def instruction(self) -> str:
        return self.trajectory.instruction

    @property
    def textual_state(self) -> str:
        """The text embedded as the example's state: the initial observation o0."""
        return self.trajectory.observation

    def to_record(self) -> dict[str, Any]:
        return {"schema_version": EXAMPLE_SCHEMA_VERSION, "example_id": self.example_id,
                "task_type": self.task_type, "instruction": self.instruction,
                "program": self.program.to_record(), "trajectory": self.trajectory.to_record(),
                "source": self.source, "rounds": self.rounds, "backbone": self.backbone}

    @classmethod
    def from_record(cls, record: object) -> "Example":
        """Inverse of :meth:`to_record`. Raises ValueError (missing field, newer schema, ...)."""
        if not isinstance(record, dict):
            raise ValueError(f"an example record must be a JSON object, got {type(record).__name__}")
        version = record.get("schema_version")
        if not isinstance(version, int) or not 1 <= version <= EXAMPLE_SCHEMA_VERSION:
            raise ValueError(f"unsupported example schema_version {version!r} "
                             f"(this code reads 1..{EXAMPLE_SCHEMA_VERSION})")
        try:
            return cls(example_id=str(record["example_id"]), program=Program.from_record(record["program"]),
                       trajectory=Trajectory.from_record(record["trajectory"]), source=dict(record.get("source") or {}),
                       rounds=int(record.get("rounds", 0)), backbone=str(record.get("backbone", "")))
        except KeyError as err:
            raise ValueError(f"example record lacks field {err.args[0]!r}") from None


def retrieval_scores(query_instruction: np.ndarray, query_state: np.ndarray | None, instructions: np.ndarray,
                     states: np.ndarray, lambdas: Lambdas) -> np.ndarray:
    """s(e) of every memory row (ICAL Sec. 3.3), exact cosine.

    Args:
        query_instruction: [d] embedding of the query instruction.
        query_state: [d] embedding of the query's textual state (None: the text term is 0).
        instructions, states: [n, d] the memory's embeddings.

    Returns:
        float64 [n]. Vectors are normalised here (a zero vector has cosine 0 with everything).

    Raises:
        ValueError: dimension mismatch.
    """
    def unit(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float64)
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
        return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)

    instructions, states = np.asarray(instructions), np.asarray(states)
    if instructions.ndim != 2 or instructions.shape != states.shape:
        raise ValueError(f"memory embeddings must be [n, d] alike, got {instructions.shape} and {states.shape}")
    if np.shape(query_instruction) != instructions.shape[1:]:
        raise ValueError(f"query embedding has shape {np.shape(query_instruction)}, memory d={instructions.shape[1]}")
    score = lambdas.instruction * (unit(instructions) @ unit(query_instruction))
    if query_state is not None and lambdas.text:
        score = score + lambdas.text * (unit(states) @ unit(query_state))
    return score + lambdas.visual * 0.0  # no visual embeddings in text environments (Lambdas enforces 0)


def top_k(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` highest scores, best first, ties in index order; raises ValueError for k < 1."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [int(i) for i in np.argsort(-np.asarray(scores), kind="stable")[:k]]


class Memory:
    """ICAL's memory M in ``folder`` (created on first append).

    Args:
        folder: the memory folder.
        embedder: needed to append and to retrieve (and to index examples the index lacks);
            reading examples needs none.
        on_malformed: called with ``"path:LINE: why"`` for each unreadable line (default: a
            warning); such a line (a torn final append) is skipped, never silently.

    Raises:
        ValueError: an example line of a newer schema is reported like any malformed line.
    """

    def __init__(self, folder: str | os.PathLike, embedder: Embedder | None = None,
                 on_malformed: Callable[[str], None] | None = None):
        self.folder = Path(folder)
        self.embedder = embedder
        self.on_malformed = on_malformed or (lambda msg: warnings.warn(msg, stacklevel=3))
        self.examples: list[Example] = []
        self._instr = np.zeros((0, 0), np.float32)
        self._state = np.zeros((0, 0), np.float32)
        self._load()

    @property
    def examples_path(self) -> Path:
        return self.folder / EXAMPLES_FILE

    @property
    def index_path(self) -> Path:
        return self.folder / INDEX_FILE

    def __len__(self) -> int:
        return len(self.examples)

    def ids(self) -> set[str]:
        return {e.example_id for e in self.examples}

    def _load(self) -> None:
        from cb_io.storage import iter_jsonl

        if not self.examples_path.exists():
            return
        seen: set[str] = set()
        for number, example, err in iter_jsonl(self.examples_path, Example.from_record):
            if err is not None:
                self.on_malformed(f"{self.examples_path}:{number}: skipped unreadable example line: {err}")
            elif example.example_id in seen:
                self.on_malformed(f"{self.examples_path}:{number}: duplicate example {example.example_id!r} skipped")
            else:
                seen.add(example.example_id)
                self.examples.append(example)
        if self.embedder is not None:
            self._sync_index()

    # -- index -----------------------------------------------------------------------------
    def _read_index(self) -> tuple[list[str], np.ndarray, np.ndarray] | None:
        import orjson

        if not self.index_path.exists():
            return None
        try:
            with np.load(self.index_path, allow_pickle=False) as z:
                meta = orjson.loads(bytes(z["metadata"]))
                ids = [str(i) for i in z["ids"]]
                instr, state = z["instruction"].astype(np.float32), z["state"].astype(np.float32)
        except (OSError, ValueError, KeyError) as err:
            self.on_malformed(f"{self.index_path}: unreadable index, rebuilt: {err}")
            return None
        if meta.get("index_version") != INDEX_VERSION or meta.get("embedder") != self.embedder.metadata:
            return None
        return ids, instr, state

    def _sync_index(self) -> None:
        """Make the index cover exactly the examples (embedding only the ones it lacks)."""
        have = self._read_index()
        rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if have is not None:
            ids, instr, state = have
            rows = {i: (instr[j], state[j]) for j, i in enumerate(ids)}
        missing = [e for e in self.examples if e.example_id not in rows]
        if missing:
            vi = self.embedder.embed([e.instruction for e in missing])
            vs = self.embedder.embed([e.textual_state for e in missing])
            rows.update({e.example_id: (vi[j], vs[j]) for j, e in enumerate(missing)})
        stale = have is not None and set(have[0]) != self.ids()
        d = int(self.embedder.metadata.get("dim", 0)) or (len(next(iter(rows.values()))[0]) if rows else 0)
        self._instr = np.stack([rows[e.example_id][0] for e in self.examples]) if self.examples \
            else np.zeros((0, d), np.float32)
        self._state = np.stack([rows[e.example_id][1] for e in self.examples]) if self.examples \
            else np.zeros((0, d), np.float32)
        if missing or stale or (have is None and self.examples):
            self._write_index()

    def _write_index(self) -> None:
        import orjson
        from cb_io.storage import atomic_path

        meta = {"index_version": INDEX_VERSION, "embedder": self.embedder.metadata}
        with atomic_path(self.index_path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, ids=np.asarray([e.example_id for e in self.examples], dtype=str),
                         instruction=self._instr.astype(np.float32), state=self._state.astype(np.float32),
                         metadata=np.frombuffer(orjson.dumps(meta), dtype=np.uint8))

    def _need_embedder(self, what: str) -> Embedder:
        if self.embedder is None:
            raise ValueError(f"the memory at {self.folder} needs an embedder to {what}")
        return self.embedder

    # -- writing and retrieval --------------------------------------------------------------
    def add(self, example: Example) -> None:
        """Append ``example`` durably, then index it.

        Raises:
            ValueError: an example whose trajectory was not won (ICAL keeps only successes), a
                duplicate id, or no embedder.
        """
        from cb_io.storage import append_jsonl

        embedder = self._need_embedder("add examples")
        if not example.trajectory.won:
            raise ValueError(f"example {example.example_id!r}: only won trajectories enter the memory")
        if example.example_id in self.ids():
            raise ValueError(f"example {example.example_id!r} is already in {self.examples_path}")
        append_jsonl(self.examples_path, example.to_record())
        vi = embedder.embed([example.instruction])
        vs = embedder.embed([example.textual_state])
        self.examples.append(example)
        self._instr = np.concatenate([self._instr.reshape(-1, vi.shape[1]), vi])
        self._state = np.concatenate([self._state.reshape(-1, vs.shape[1]), vs])
        self._write_index()

    def retrieve(self, instruction: str, textual_state: str | None = None, k: int = 2,
                 lambdas: Lambdas = Lambdas(), exclude_task_ids: Sequence[str] = ()) -> list[tuple[Example, float]]:
        """The top-``k`` examples for a query, with their scores s(e), best first.

        ``exclude_task_ids``: examples of these tasks are left out (no example of the very game
        being played). Returns fewer than ``k`` when the memory holds fewer.
        """
        embedder = self._need_embedder("retrieve")
        keep = [j for j, e in enumerate(self.examples) if e.trajectory.task_id not in set(exclude_task_ids)]
        if not keep:
            return []
        qi = embedder.embed([instruction])[0]
        qs = embedder.embed([textual_state])[0] if textual_state is not None and lambdas.text else None
        scores = retrieval_scores(qi, qs, self._instr[keep], self._state[keep], lambdas)
        return [(self.examples[keep[j]], float(scores[j])) for j in top_k(scores, min(k, len(keep)))]


def examples_for(memory: Memory | None, noisy: Trajectory, k: int) -> list[Example]:
    """The ``k`` examples retrieved for a noisy trajectory's prompt (its instruction and first
    observation; examples of its own task left out); [] without a memory, with ``k == 0`` or
    while the memory is empty."""
    if memory is None or k == 0 or not len(memory):
        return []
    return [e for e, _ in memory.retrieve(noisy.instruction, noisy.observation, k=k,
                                          exclude_task_ids=[noisy.task_id])]


def retrieval_query(memory: Memory, start: TaskStart, query_id: str, k: int, lambdas: Lambdas) -> dict:
    """One retrieval-precision query record: the top-``k`` examples for the instruction and
    observation of ``start`` (an environment's reset step, with ``task_type``), keyed ``query_id``
    (``noisy_id``), with the retrieved ids, their task types and scores."""
    got = memory.retrieve(start.instruction, start.observation, k, lambdas)
    return {"noisy_id": query_id, "task_type": start.task_type, "instruction": start.instruction,
            "retrieved": [e.example_id for e, _ in got], "retrieved_types": [e.task_type for e, _ in got],
            "scores": [round(s, 5) for _, s in got], "k": k, "lambdas": vars(lambdas)}


__all__ = ["EXAMPLE_SCHEMA_VERSION", "Embedder", "Example", "Lambdas", "Memory", "examples_for", "retrieval_query",
           "retrieval_scores", "top_k"]
