"""ICAL's noisy inputs: trajectories to abstract, from agent runs or from experts corrupted on purpose.

* :func:`from_results` reads the trials of ``cb-agent run`` results files (failed, won or both):
  real agent noise (loops, invalid actions, wrong objects, unfinished tasks).
* :func:`corrupt_actions` corrupts an expert's action sequence with seeded errors of four kinds
  (:data:`CORRUPTIONS`): an inserted random valid action (from the candidate set of that state),
  a repeated action, a dropped step, and a swapped object (``mug 1`` -> ``mug 2``, or another
  object the candidate sets mention). :func:`corrupted_expert` replays the corrupted sequence in
  a fresh game, so the noisy trajectory has the engine's real observations, and stores the known
  answer: the expert's own actions (``meta["reference_actions"]``) and each corruption
  (``meta["corruptions"]``).

Every noisy trajectory is an :class:`cb_io.records.Trajectory` whose ``meta["noisy_id"]`` names
it stably (the key of resumable ICAL outputs) and ``meta["noisy_source"]`` says where it came from.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from cb_io.records import Trajectory

if TYPE_CHECKING:
    from envs.protocol import Environment

#: Corruption kinds of :func:`corrupt_actions`.
CORRUPTIONS = ("insert", "repeat", "drop", "swap")
#: What ``from_results`` can select.
WHICH = ("failed", "won", "all")
_ENTITY = re.compile(r"\b([a-z]+) (\d+)\b")


def from_results(path: str | os.PathLike, which: str = "failed", min_env_steps: int = 1) -> list[Trajectory]:
    """Every trial trajectory of a ``cb-agent run`` results file, as noisy inputs.

    Args:
        which: ``"failed"`` (trials not won), ``"won"`` or ``"all"``.
        min_env_steps: skip trials with fewer environment steps.

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``"path:LINE: why"`` for a line that is not an episode record with trials
            (a torn or foreign line, a trajectory of a newer schema), or an unknown ``which``.
    """
    from cb_io.storage import iter_jsonl

    if which not in WHICH:
        raise ValueError(f"which must be one of {list(WHICH)}, got {which!r}")
    path = Path(path)
    out: list[Trajectory] = []
    for number, record, err in iter_jsonl(path):
        if err is None and not (isinstance(record, dict) and isinstance(record.get("trials"), list)):
            err = "not an episode record of cb-agent run (no trials)"
        if err is not None:
            raise ValueError(f"{path}:{number}: {err}")
        for t, trial in enumerate(record["trials"]):
            try:
                traj = Trajectory.from_record(trial["trajectory"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{number}: trial {t}: {e}") from None
            if (which == "failed" and traj.won) or (which == "won" and not traj.won):
                continue
            if traj.n_env_steps < min_env_steps:
                continue
            source = {"kind": f"run-{'won' if traj.won else 'failed'}", "file": str(path), "line": number,
                      "agent": record.get("agent"), "trial": t}
            noisy_id = f"run:{path.parent.name}/{path.name}:{record.get('agent')}:{traj.task_id}:trial{t}"
            out.append(_with_meta(traj, noisy_id=noisy_id, noisy_source=source))
    return out


def _with_meta(traj: Trajectory, **meta: Any) -> Trajectory:
    return Trajectory(traj.env, traj.task_id, traj.task_type, traj.instruction, traj.observation,
                      list(traj.steps), traj.won, traj.score, {**traj.meta, **meta})


def _entities(text: str) -> list[str]:
    return [f"{m.group(1)} {m.group(2)}" for m in _ENTITY.finditer(text)]


def corrupt_actions(actions: Sequence[str], candidate_sets: Sequence[Sequence[str]], rng: np.random.Generator,
                    kinds: Sequence[str]) -> tuple[list[str], list[dict]]:
    """Apply one corruption per entry of ``kinds`` to an expert's action sequence.

    Args:
        actions: the expert's environment actions a_0..a_{T-1}.
        candidate_sets: the candidate set of each action's state (same length as ``actions``).
        rng: the seeded generator (positions and replacements are drawn from it).
        kinds: corruption kinds from :data:`CORRUPTIONS`, applied in order.

    Returns:
        (corrupted actions, one record per corruption: ``kind``, ``at`` (index in the sequence
        after that corruption), ``action`` (what is there now; None for a drop) and ``original``).
        A swap with no other object to swap in falls back to an insert (recorded as such).

    Raises:
        ValueError: empty ``actions``, mismatched lengths, or an unknown kind.
    """
    if not actions:
        raise ValueError("cannot corrupt an empty action sequence")
    if len(candidate_sets) != len(actions):
        raise ValueError(f"{len(actions)} actions but {len(candidate_sets)} candidate sets")
    for kind in kinds:
        if kind not in CORRUPTIONS:
            raise ValueError(f"unknown corruption kind {kind!r}; known: {list(CORRUPTIONS)}")
    seq = list(actions)
    sets = [list(s) for s in candidate_sets]
    entities = sorted({e for s in candidate_sets for c in s for e in _entities(c)})
    records: list[dict] = []
    for kind in kinds:
        if kind == "swap":
            options = [i for i, a in enumerate(seq) if _entities(a)]
            if options and len(entities) > 1:
                i = int(rng.choice(options))
                old = str(rng.choice(_entities(seq[i])))
                name = old.split()[0]
                same = [e for e in entities if e != old and e.split()[0] == name]
                pool = same or [e for e in entities if e != old]
                new = str(rng.choice(pool))
                original, seq[i] = seq[i], re.sub(rf"\b{re.escape(old)}\b", new, seq[i], count=1)
                records.append({"kind": "swap", "at": i, "action": seq[i], "original": original})
                continue
            kind = "insert"
        if kind == "insert":
            i = int(rng.integers(0, len(seq) + 1))
            state = sets[min(i, len(sets) - 1)]
            pool = [c for c in state if i >= len(seq) or c != seq[i]] or list(state) or ["look"]
            action = str(rng.choice(pool))
            seq.insert(i, action)
            sets.insert(i, state)
            records.append({"kind": "insert", "at": i, "action": action, "original": None})
        elif kind == "repeat":
            i = int(rng.integers(0, len(seq)))
            seq.insert(i + 1, seq[i])
            sets.insert(i + 1, sets[i])
            records.append({"kind": "repeat", "at": i + 1, "action": seq[i], "original": None})
        elif kind == "drop" and len(seq) > 1:
            i = int(rng.integers(0, len(seq)))
            records.append({"kind": "drop", "at": i, "action": None, "original": seq.pop(i)})
            sets.pop(i)
    return seq, records


def replay(env: Environment, task_id: str, actions: Sequence[str], max_steps: int | None = None) -> Trajectory:
    """Play ``actions`` in order in a fresh game of ``task_id`` (stops early when the engine is done).

    Raises ValueError from the adapter for an unknown task."""
    from envs.episode import Episode

    episode = Episode(env, task_id, max_steps or max(1, len(actions)))
    for action in actions:
        if episode.done:
            break
        episode.act(action)
    return episode.trajectory()


def corrupted_expert(env: Environment, experts: Sequence[Trajectory], seed: int = 0, n_corruptions: int = 2,
                     kinds: Sequence[str] = CORRUPTIONS,
                     on_trajectory: Callable[[Trajectory], None] | None = None, time_limit: float | None = None,
                     on_skip: Callable[[str], None] | None = None) -> list[Trajectory]:
    """Noisy versions of won expert trajectories: seeded corruptions, replayed in the real game.

    Each trajectory gets ``n_corruptions`` corruptions whose kinds are drawn from ``kinds``; the
    generator is seeded from ``(seed, task_id)``, so a trajectory's corruption does not depend on
    which others are corrupted with it. ``meta`` records ``noisy_id``, ``noisy_source``,
    ``corruptions`` and ``reference_actions`` (the expert's environment actions: the known answer).
    Each replay runs within ``time_limit`` seconds of wall-clock time (None: no limit); one that
    runs past it or whose engine fails (:func:`envs.episode.play_within`) gives no noisy
    trajectory: it is skipped with one line to ``on_skip`` (default: a warning) naming the task.

    Raises:
        ValueError: an expert trajectory without environment steps (named), ``n_corruptions < 1``.
    """
    import warnings

    from cb_io.records import one_line
    from envs.episode import play_within

    if n_corruptions < 1:
        raise ValueError(f"n_corruptions must be >= 1, got {n_corruptions}")
    skip = on_skip or (lambda msg: warnings.warn(msg, stacklevel=3))
    out = []
    for expert in experts:
        env_steps = [s for s in expert.steps if s.kind == "env"]
        if not env_steps:
            raise ValueError(f"expert trajectory {expert.task_id!r} has no environment steps to corrupt")
        rng = np.random.default_rng([seed, zlib.crc32(expert.task_id.encode())])
        chosen = [str(k) for k in rng.choice(list(kinds), size=n_corruptions)]
        actions, records = corrupt_actions([s.action for s in env_steps], [s.candidates for s in env_steps], rng,
                                           chosen)

        def skipped(err: BaseException) -> None:
            skip(f"skipped the corrupted expert trajectory of {expert.task_id}: {type(err).__name__}: "
                 f"{one_line(err)}; --resume replays it again")

        played = play_within(time_limit, lambda: replay(env, expert.task_id, actions, max_steps=len(actions)),
                             skipped)
        if played is None:  # skipped
            continue
        noisy = _with_meta(played, noisy_id=corrupted_id(expert.task_id, seed),
                           noisy_source={"kind": "corrupted-expert", "seed": seed, "expert": expert.meta.get("expert")},
                           corruptions=records, reference_actions=[s.action for s in env_steps])
        out.append(noisy)
        if on_trajectory is not None:
            on_trajectory(noisy)
    return out


def noisy_id(traj: Trajectory) -> str:
    """The stable id of a noisy input (``meta["noisy_id"]``, else env and task id)."""
    return str(traj.meta.get("noisy_id") or f"{traj.env}:{traj.task_id}")


def corrupted_id(task_id: str, seed: int) -> str:
    """The noisy id :func:`corrupted_expert` gives the corrupted expert trajectory of ``task_id``."""
    return f"corrupted:seed{seed}:{task_id}"


def finished_ids(path: Path, resume: bool, wanted: Iterable[str], elsewhere: str = "choose another --out",
                 on_skipped: Callable[[str], None] | None = None) -> set[str]:
    """The noisy ids of ``wanted`` already in the JSONL output ``path`` of an ICAL command (every
    output line is keyed by ``noisy_id``), which this process claims for writing
    (:class:`agent_shell.results.ResumableJsonl`); with ``resume`` a torn last line is first moved
    aside (:func:`agent_shell.results.repair_for_resume`).

    ``on_skipped`` is called with ``"path:LINE: skipped unreadable line (why); redone"`` for each
    line without a noisy id (default: a warning); such inputs are done again.

    Raises:
        ValueError: ``path`` holds some of ``wanted`` and ``resume`` is false (the message ends
            with ``elsewhere``).
        agent_shell.results.FileBusy: another process is writing ``path``.
    """
    import warnings

    from agent_shell.results import ResumableJsonl, repair_for_resume
    from cb_io.storage import iter_jsonl

    report = on_skipped or (lambda msg: warnings.warn(msg, stacklevel=3))

    def keyed(path: Path) -> Iterator[dict]:
        for number, record, err in iter_jsonl(path) if path.exists() else ():
            if err is None and isinstance(record, dict) and "noisy_id" in record:
                yield record
            else:
                report(f"{path}:{number}: skipped unreadable line ({err or 'no noisy_id'}); redone")

    if resume and path.exists():
        repair_for_resume(path)
    return set(ResumableJsonl(path, keyed, lambda r: r["noisy_id"], "inputs", lambda r: repr(r["noisy_id"]),
                              elsewhere).finished(set(wanted), resume))


def read_noisy(path: str | os.PathLike) -> list[Trajectory]:
    """The noisy trajectories of a JSONL file (``cb-agent ical noisy``'s output).

    Raises:
        ValueError: the file holds none, or a line is not a trajectory (naming file and line).
        FileNotFoundError: no such file.
    """
    from cb_io.records import read_trajectories

    trajs = read_trajectories(path)
    if not trajs:
        raise ValueError(f"{path}: no noisy trajectories")
    return trajs


def add_trials(out: Path, runs: Sequence[str | os.PathLike], which: str, done: set[str]) -> int:
    """Append to the JSONL file ``out`` the trials of the results files ``runs`` (:func:`from_results`)
    whose noisy id is not in ``done``; ``done`` gains their ids. Returns how many were appended."""
    from cb_io.storage import append_jsonl

    written = 0
    for run in runs:
        for traj in from_results(run, which):
            if noisy_id(traj) not in done:
                append_jsonl(out, traj)
                done.add(noisy_id(traj))
                written += 1
    return written


__all__ = ["CORRUPTIONS", "WHICH", "add_trials", "corrupt_actions", "corrupted_expert", "corrupted_id",
           "finished_ids", "from_results", "noisy_id", "read_noisy", "replay"]
