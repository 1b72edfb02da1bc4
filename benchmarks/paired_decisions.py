"""Two concepts' top-1 accuracy on the same held-out expert decisions, paired.

Reads two ``cb-agent eval-decisions --out`` files made on the same held-out decisions (the same
environment, split, demonstrations and backbone; e.g. ``--lam 1.0`` against ``--lam auto``) and
prints, per task type and over all decisions: each concept's accuracy with its 95% Wilson interval,
the decisions only one of them gets right, the exact two-sided sign test (McNemar's exact test) on
those, and a 95% interval of the accuracy difference by a bootstrap over held-out trajectories
(decisions of one trajectory are resampled together; 10,000 draws, seed 0).

    python benchmarks/paired_decisions.py A.json B.json --names "lam 1.0" "lam auto" [--markdown]

Exit status 2 when the files do not hold the same decisions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from agent_shell.statistics import sign_test, wilson_interval

DRAWS, SEED = 10_000, 0


def hits(path: Path) -> tuple[list[tuple[str, str, int]], np.ndarray]:
    """(decision keys (task type, trajectory, step), [N] bool: the concept's top choice is the expert's)."""
    data = json.loads(Path(path).read_text())
    keys = [(d["task_type"], d["task_id"], d["step"]) for d in data["decisions"]]
    return keys, np.array([int(np.argmax(d["log_p"])) == d["expert"] for d in data["decisions"]])


def bootstrap_difference(a: np.ndarray, b: np.ndarray, groups: list[str]) -> tuple[float, float]:
    """95% percentile interval of mean(b) - mean(a), resampling whole groups (trajectories)."""
    names = sorted(set(groups))
    index = {g: i for i, g in enumerate(names)}
    owner = np.array([index[g] for g in groups])
    diff_sum = np.bincount(owner, weights=b.astype(float) - a, minlength=len(names))
    count = np.bincount(owner, minlength=len(names))
    rng = np.random.default_rng(SEED)
    draws = rng.integers(0, len(names), size=(DRAWS, len(names)))
    estimates = diff_sum[draws].sum(axis=1) / count[draws].sum(axis=1)
    low, high = np.percentile(estimates, [2.5, 97.5])
    return float(low), float(high)


def rows(a_path: Path, b_path: Path) -> list[dict]:
    """One row per task type and one for all: n, each accuracy and interval, only-a, only-b, p, the
    difference and its interval."""
    keys_a, a = hits(a_path)
    keys_b, b = hits(b_path)
    if keys_a != keys_b:
        raise ValueError(f"{a_path} and {b_path} do not hold the same held-out decisions")
    return paired_rows(keys_a, a, b)


def paired_rows(keys: list[tuple[str, str, int]], a: np.ndarray, b: np.ndarray) -> list[dict]:
    """:func:`rows` of two [N] bool hit arrays on the same decisions (``keys``: (task type,
    trajectory, step) of each)."""
    keys_a = keys
    types = [k[0] for k in keys_a]
    out = []
    for name in sorted(set(types)) + ["all"]:
        sel = np.array([name in ("all", t) for t in types])
        x, y = a[sel], b[sel]
        only_a, only_b = int((x & ~y).sum()), int((y & ~x).sum())
        out.append({"task_type": name, "n": int(sel.sum()), "acc_a": float(x.mean()), "ci_a": wilson_interval(int(x.sum()), len(x)),
                    "acc_b": float(y.mean()), "ci_b": wilson_interval(int(y.sum()), len(y)), "only_a": only_a,
                    "only_b": only_b, "p": sign_test(only_b, only_a + only_b), "diff": float(y.mean() - x.mean()),
                    "ci_diff": bootstrap_difference(x, y, [k[1] for k, s in zip(keys_a, sel) if s])})
    return out


def markdown(table: list[dict], names: tuple[str, str]) -> str:
    a, b = names
    lines = [f"| task type | decisions | {a} | {b} | only {a} | only {b} | sign test p | {b} - {a} [95% CI] |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table:
        pct = lambda acc, ci: f"{100 * acc:.1f}% [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"  # noqa: E731
        lines.append(f"| {r['task_type']} | {r['n']} | {pct(r['acc_a'], r['ci_a'])} | {pct(r['acc_b'], r['ci_b'])} | "
                     f"{r['only_a']} | {r['only_b']} | {r['p']:.3g} | {100 * r['diff']:+.1f} pp "
                     f"[{100 * r['ci_diff'][0]:+.1f}, {100 * r['ci_diff'][1]:+.1f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--names", nargs=2, default=("a", "b"))
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    try:
        table = rows(args.a, args.b)
    except (ValueError, OSError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(markdown(table, tuple(args.names)))
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
