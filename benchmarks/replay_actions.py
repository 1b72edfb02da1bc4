"""Action-for-action replay: does the current code play recorded episodes exactly as they were played?

Plays the games of a committed results file again with its recorded settings (``--play``) and
compares, per (agent, game), every trial's actions step by step (think steps included) with the
recorded ones. The episodes are deterministic (greedy routing, seeded sampling), so a refactor
that keeps behaviour replays every action; the first differing step of each differing episode is
printed.

    # the first 30 games of Table 1 (five per task type), float32, the three Table 1 agents
    python benchmarks/replay_actions.py results/table1_alfworld.results.jsonl.gz \\
        --play runs/replay --per-type 5 --agent react --agent prior-only --agent cb-agent
    # the same games played by the JAX backend (the recorded backbone's folder, read by Flax)
    python benchmarks/replay_actions.py results/table1_alfworld.results.jsonl.gz \\
        --play runs/replay-jax --per-type 1 --model jax:
    # the same on a mesh of three simulated CPU devices (the default backbone's 9 heads and 3 key/value
    # heads are split three ways), against the same recorded actions
    XLA_FLAGS=--xla_force_host_platform_device_count=3 python benchmarks/replay_actions.py \
        results/table1_alfworld.results.jsonl.gz --play runs/replay-mesh --per-type 1 --model jax: --device cpu:0-2
    # compare a results file that is already played
    python benchmarks/replay_actions.py results/table1_alfworld.results.jsonl.gz --played runs/replay/results.jsonl

``--play`` runs ``cb-agent run --resume`` (interrupted replays continue). Exit status: 0 when
every compared episode replays, 1 when one differs or none could be compared, 2 on bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Recorded settings passed back to ``cb-agent run`` (results field -> option); the resume check
#: refuses a replay whose other recorded settings differ from the run's.
RUN_OPTIONS = {"env": "--env", "split": "--split", "dtype": "--dtype", "budget": "--max-steps",
               "rendering": "--history", "layout": "--layout", "seed": "--seed",
               "demos_per_type": "--demos-per-type", "demo_split": "--demo-split", "lam": "--lam",
               "gamma": "--gamma", "features": "--features", "action_space": "--action-space"}


@dataclass(frozen=True)
class Replay:
    """One (agent, game) compared: ``first_difference`` is None when every action replays, else
    ``(trial, step, recorded action or None, played action or None)`` (None: that side ended)."""

    agent: str
    task_id: str
    n_actions: int
    first_difference: tuple[int, int, str | None, str | None] | None


def trial_actions(record: dict) -> list[list[str]]:
    """Per trial, the executed actions in order (``think: ...`` steps included)."""
    return [[step["action"] for step in trial["trajectory"]["steps"]] for trial in record.get("trials", [])]


def compare(recorded: list[dict], played: list[dict]) -> list[Replay]:
    """A :class:`Replay` per played episode that the recorded file also holds, in played order.

    A replay played at a smaller step budget than the recorded episode is compared on the steps
    it played: a trial that spent its budget is the recorded trial's first ``budget`` actions."""
    reference = {(r["agent"], r["task_id"]): r for r in recorded}
    out = []
    for rec in played:
        ref = reference.get((rec["agent"], rec["task_id"]))
        if ref is None:
            continue
        old, new = trial_actions(ref), trial_actions(rec)
        budget = rec.get("budget")
        if budget is not None and budget < ref.get("budget", budget):
            old = [a[:budget] if len(b) == budget else a for a, b in zip(old, new)] + old[len(new):]
        first = None
        for t in range(max(len(old), len(new))):
            a = old[t] if t < len(old) else []
            b = new[t] if t < len(new) else []
            for s in range(max(len(a), len(b))):
                x = a[s] if s < len(a) else None
                y = b[s] if s < len(b) else None
                if x != y:
                    first = (t, s, x, y)
                    break
            if first is not None:
                break
        out.append(Replay(rec["agent"], rec["task_id"], sum(map(len, old)), first))
    return out


def play(reference: list[dict], out_dir: Path, per_type: int, agents: list[str], workers: int,
         model: str | None = None, device: str | None = None) -> Path:
    """``cb-agent run --resume`` of the first ``per_type`` games per task type with the settings
    recorded in ``reference`` (its first record), by ``model`` when given (``--model``: e.g.
    ``jax:`` for the recorded default backbone through the JAX backend) on ``device`` when given
    (``--device``: e.g. ``cpu:0-2``, a mesh of three); returns the results file."""
    settings = reference[0]
    cmd = ["cb-agent", "run", "--per-type", str(per_type), "--games", "0", "--out-dir", str(out_dir), "--resume",
           "--workers", str(workers), *(["--model", model] if model is not None else []),
           *(["--device", device] if device is not None else [])]
    for field, option in RUN_OPTIONS.items():
        if settings.get(field) is not None:
            cmd += [option, str(settings[field])]
    for agent in agents:
        cmd += ["--agent", agent]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return out_dir / "results.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reference", help="recorded results file (.jsonl or .jsonl.gz)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--play", metavar="OUT_DIR", help="play the games again into OUT_DIR, then compare")
    which.add_argument("--played", metavar="RESULTS", help="compare this results file (already played)")
    parser.add_argument("--per-type", type=int, default=5, help="--play: games per task type (default 5)")
    parser.add_argument("--agent", action="append", default=None,
                        help="--play: agent to replay (repeatable; default every agent of the reference)")
    parser.add_argument("--workers", type=int, default=1, help="--play: episodes played at once (default 1)")
    parser.add_argument("--model", default=None,
                        help="--play: the backbone to play with (cb-agent run --model; e.g. jax: for the JAX backend)")
    parser.add_argument("--device", default=None,
                        help="--play: where the backbone runs (cb-agent run --device; e.g. cpu:0-2, a mesh of three "
                             "simulated devices, with XLA_FLAGS=--xla_force_host_platform_device_count=3)")
    args = parser.parse_args(argv)
    from agent_shell.results import read_results  # plain or .gz; a torn line is skipped with a warning

    if not Path(args.reference).is_file():
        print(f"error: no reference results file {args.reference}", file=sys.stderr)
        return 2
    recorded = read_results(args.reference)
    if not recorded:
        print(f"error: {args.reference} holds no episode record", file=sys.stderr)
        return 2
    if args.play:
        agents = args.agent or list(dict.fromkeys(r["agent"] for r in recorded))
        results = play(recorded, Path(args.play), args.per_type, agents, args.workers, args.model, args.device)
    else:
        results = Path(args.played)
        if not results.is_file():
            print(f"error: no played results file {results}", file=sys.stderr)
            return 2
    replays = compare(recorded, read_results(results))
    by_agent: dict[str, list[Replay]] = {}
    for r in replays:
        by_agent.setdefault(r.agent, []).append(r)
    for agent, rows in by_agent.items():
        same = [r for r in rows if r.first_difference is None]
        print(f"{agent}: {len(same)}/{len(rows)} episodes replay action for action "
              f"({sum(r.n_actions for r in same)} actions)")
        for r in rows:
            if r.first_difference is not None:
                t, s, x, y = r.first_difference
                print(f"  differs: {r.task_id} trial {t + 1} step {s + 1}: recorded {x!r}, played {y!r}")
    if not replays:
        print("nothing compared: no played episode is in the reference file")
    return 0 if replays and all(r.first_difference is None for r in replays) else 1


if __name__ == "__main__":
    sys.exit(main())
