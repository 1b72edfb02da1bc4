"""Rules that choose the L2 strength, side by side on held-out expert decisions, each paired against lam = 1.

For one environment and held-out split, at one or more numbers of demonstrations per task type,
from one features pass (the LM's features are those ``cb-agent eval-decisions`` computes and
caches, so the two share the cache):

1. cross-validation on each type's demonstrations (:func:`cb_core.strength.cross_validate`: every
   type x fold x strength of the grid in one batched fit) gives the held-out scores from which
   every rule picks its strengths (:func:`cb_core.strength.strength_curve`);
2. each type's concept is fitted on all its demonstrations at every strength of the grid (one
   batched fit) and scores that type's held-out decisions (top-1: no candidate above the expert's
   action);
3. each rule's top-1 hits are paired with lam = 1's on the same decisions, per type and over all
   (``paired_decisions.paired_rows``: exact sign test on the decisions only one gets right, 95%
   bootstrap interval of the difference over held-out trajectories).

The rules: fixed strengths of the grid; the cross-validated ``best`` and ``one-se`` picks, raw (as
``--lam auto`` chose before flat curves kept the default) and with the flat-curve guard; the
``default-se`` rule (the default unless a strength beats it by z paired standard errors, z = 1
and 2); each on the log-likelihood and on top-1, per type and pooled (one strength for all
types: every type's folds in one curve).

    PYTHONPATH=. python benchmarks/strength_rules.py --env alfworld --demos-per-type 2 5 10 \\
        --heldout-split valid_unseen --heldout-per-type 5 --dtype float32 --json OUT.json

``--json`` is rewritten (atomically) after each number of demonstrations, so a run stopped early
keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_decisions import paired_rows  # noqa: E402

#: (name, strength_curve keyword arguments, pooled over types)
CV_RULES: list[tuple[str, dict, bool]] = [
    ("log-lik one-se, raw", {"rule": "one-se", "criterion": "log-lik", "z": -math.inf, "guard": None}, False),
    ("log-lik best, raw", {"rule": "best", "criterion": "log-lik", "z": -math.inf, "guard": None}, False),
    ("log-lik one-se, flat keeps 1", {"rule": "one-se", "criterion": "log-lik", "z": 1.0, "guard": None}, False),
    ("log-lik best, flat keeps 1", {"rule": "best", "criterion": "log-lik", "z": 1.0, "guard": None}, False),
    ("log-lik default-se z=1", {"rule": "default-se", "criterion": "log-lik", "z": 1.0, "guard": None}, False),
    ("log-lik default-se z=2", {"rule": "default-se", "criterion": "log-lik", "z": 2.0, "guard": None}, False),
    ("top-1 best, raw", {"rule": "best", "criterion": "top-1", "z": -math.inf, "guard": None}, False),
    ("top-1 one-se, raw", {"rule": "one-se", "criterion": "top-1", "z": -math.inf, "guard": None}, False),
    ("top-1 default-se z=1", {"rule": "default-se", "criterion": "top-1", "z": 1.0, "guard": None}, False),
    ("top-1 default-se z=2", {"rule": "default-se", "criterion": "top-1", "z": 2.0, "guard": None}, False),
    ("top-1 default-se z=1, log-lik guard", {"rule": "default-se", "criterion": "top-1", "z": 1.0, "guard": "log-lik"},
     False),
    ("top-1 default-se z=2, log-lik guard", {"rule": "default-se", "criterion": "top-1", "z": 2.0, "guard": "log-lik"},
     False),
    ("pooled log-lik best, raw", {"rule": "best", "criterion": "log-lik", "z": -math.inf, "guard": None}, True),
    ("pooled log-lik default-se z=1", {"rule": "default-se", "criterion": "log-lik", "z": 1.0, "guard": None}, True),
    ("pooled top-1 best, raw", {"rule": "best", "criterion": "top-1", "z": -math.inf, "guard": None}, True),
    ("pooled top-1 default-se z=1", {"rule": "default-se", "criterion": "top-1", "z": 1.0, "guard": None}, True),
]


def held_out_hits(demo: dict, held: dict, grid: np.ndarray, gamma: float) -> dict[str, np.ndarray]:
    """Task type -> [L, N] bool: each held-out decision's expert action is the top choice of the type's
    concept fitted on all its demonstrations at strength grid[l] (one batched fit for all types)."""
    import cb_core
    from cb_core.strength import held_out_scores

    types = sorted(t for t in held if held[t].n_decisions and t in demo and demo[t].n_decisions)
    results = cb_core.fit_many([demo[t].decisions() for t in types], lam=np.tile(grid, (len(types), 1)), gamma=gamma,
                               certify="structural")
    out = {}
    for t, res in zip(types, results):
        _, rank = held_out_scores(np.stack([r.alpha for r in res]), held[t].decisions(), gamma)
        out[t] = rank == 0
    return out


def rule_choices(demo: dict, grid: np.ndarray, gamma: float) -> tuple[dict[str, dict[str, float]], dict]:
    """Rule name -> task type -> strength, and the curves (rule -> type -> StrengthCurve.to_dict())."""
    from cb_core.strength import DEFAULT_FOLDS, cross_validate, strength_curve

    types = sorted(t for t in demo if demo[t].n_decisions)
    held = dict(zip(types, cross_validate([demo[t].decisions() for t in types],
                                          [demo[t].decision_task_ids for t in types], lams=tuple(grid),
                                          n_folds=DEFAULT_FOLDS, gamma=gamma)))
    choices: dict[str, dict[str, float]] = {f"fixed {lam:g}": {t: float(lam) for t in types} for lam in grid}
    curves: dict[str, dict] = {}
    for name, kwargs, pooled in CV_RULES:
        if pooled:
            c = strength_curve(list(held.values()), **kwargs)
            choices[name] = {t: c.chosen for t in types}
            curves[name] = {"pooled": c.to_dict()}
        else:
            cs = {t: strength_curve(held[t], **kwargs) for t in types}
            choices[name] = {t: c.chosen for t, c in cs.items()}
            curves[name] = {t: c.to_dict() for t, c in cs.items()}
    return choices, curves


def compare(choices: dict[str, dict[str, float]], hits: dict[str, np.ndarray], keys: dict, grid: np.ndarray,
            baseline: str = "fixed 1") -> dict[str, list[dict]]:
    """Rule -> the paired rows (per type and all) of its top-1 hits against the baseline's."""
    types = sorted(hits)
    flat_keys = [k for t in types for k in keys[t]]
    index = {float(lam): i for i, lam in enumerate(grid)}

    def hits_of(rule: str) -> np.ndarray:
        return np.concatenate([hits[t][index[choices[rule][t]]] for t in types])

    base = hits_of(baseline)
    return {rule: paired_rows(flat_keys, base, hits_of(rule)) for rule in choices}


def decision_keys(features: dict) -> dict[str, list[tuple[str, str, int]]]:
    """Task type -> (type, trajectory, index of the decision within it) of each held-out decision."""
    out = {}
    for t, tf in features.items():
        seen: dict[str, int] = {}
        ks = []
        for tid in tf.decision_task_ids:
            ks.append((t, tid, seen.get(tid, 0)))
            seen[tid] = seen.get(tid, 0) + 1
        out[t] = ks
    return out


def summary_line(rule: str, rows: list[dict]) -> str:
    total = rows[-1]
    worst = min(rows[:-1], key=lambda r: (r["p"] if r["diff"] < 0 else 2.0, r["diff"]))
    flag = " SIGNIFICANTLY WORSE" if any(r["diff"] < 0 and r["p"] < 0.05 for r in rows) else ""
    return (f"{rule:34s} all {100 * total['acc_b']:5.1f}% ({100 * total['diff']:+5.1f} pp, p={total['p']:.3g})  "
            f"worst type {worst['task_type']} {100 * worst['diff']:+.1f} pp p={worst['p']:.3g}{flag}")


def markdown(records: list[dict], rules: list[str]) -> str:
    """One row per configuration and rule: over all held-out decisions, lam = 1's top-1 and the rule's,
    the decisions only one gets right, the sign test, the difference with its bootstrap interval,
    and the rule's worst task type (its difference and sign test)."""
    lines = ["| environment, held out, demonstrations per type | rule | decisions | lam 1 | rule's | only 1 / only rule "
             "| sign test p | rule - 1 [95% CI] | worst type: rule - 1, p |", "| --- " * 9 + "|"]
    for rec in records:
        for name, cfg in rec["configs"].items():
            for rule in rules:
                rows = cfg["rows"][rule]
                a = rows[-1]
                worst = min(rows[:-1], key=lambda r: (r["p"] if r["diff"] < 0 else 2.0, r["diff"]))
                lines.append(
                    f"| {rec['env']}, {rec['heldout_split']}, {cfg['demos_per_type']} | {rule} | {a['n']} | "
                    f"{100 * a['acc_a']:.1f}% | {100 * a['acc_b']:.1f}% | {a['only_a']} / {a['only_b']} | {a['p']:.3g} | "
                    f"{100 * a['diff']:+.1f} pp [{100 * a['ci_diff'][0]:+.1f}, {100 * a['ci_diff'][1]:+.1f}] | "
                    f"{worst['task_type']}: {100 * worst['diff']:+.1f} pp, {worst['p']:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="alfworld")
    parser.add_argument("--demo-split", default="train")
    parser.add_argument("--demos-per-type", type=int, nargs="+", default=[2, 5])
    parser.add_argument("--heldout-split", default=None, help="default: the environment's evaluation split")
    parser.add_argument("--heldout-per-type", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--gamma", type=float, default=0.8)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every rule's rows and choices here")
    parser.add_argument("--from-json", type=Path, nargs="+", default=None,
                        help="print the markdown table of these results files instead of measuring")
    parser.add_argument("--rules", nargs="+", default=None, help="the rules of the table (default: all)")
    args = parser.parse_args(argv)

    import orjson

    if args.from_json:
        records = [orjson.loads(p.read_bytes()) for p in args.from_json]
        names = args.rules or list(next(iter(records[0]["configs"].values()))["rows"])
        print(markdown(records, names))
        return 0

    from agent_shell.commands.eval_decisions import heldout_trajectories
    from agent_shell.concepts import collect_features
    from agent_shell.configure import resolve
    from agent_shell.pipeline import prepare
    from agent_shell.run_config import RunConfig
    from cb_core.strength import DEFAULT_GRID
    from cb_io.storage import write_bytes_atomic
    from envs.registry import default_split

    heldout_split = args.heldout_split or default_split(args.env)
    counts = sorted(set(args.demos_per_type))
    config = resolve(RunConfig(env=args.env, demo_split=args.demo_split, demos_per_type=counts[0], dtype=args.dtype,
                               gamma=args.gamma, cache_dir=args.cache_dir))
    setup = prepare(config, need_concepts=False, echo=print)
    grid = np.asarray(DEFAULT_GRID)
    record = {"env": args.env, "demo_split": args.demo_split, "heldout_split": heldout_split,
              "heldout_per_type": args.heldout_per_type, "backbone": setup.lm.name, "dtype": args.dtype,
              "machine": f"{platform.machine()} CPU, {platform.processor() or platform.platform()}",
              "grid": grid.tolist(), "baseline": "fixed 1", "configs": {}}
    try:
        for n in counts:  # the fewest demonstrations first: each count's expert games are collected when needed
            t0 = time.perf_counter()
            cfg = dataclasses.replace(config, demos_per_type=n, concept_per_type=n)
            if n != counts[0]:
                setup = prepare(cfg, need_concepts=False, echo=print, env=setup.env, lm=setup.lm)
            demo_trajs = setup.demo_trajectories
            heldout = heldout_trajectories(setup, cfg, heldout_split, args.heldout_per_type,
                                           on_task=lambda tid: print(f"collecting {tid}"))
            demo = collect_features(setup.lm, demo_trajs, setup.feature_settings, cache_dir=setup.cache,
                                    on_trajectory=lambda t: print(f"features {t.task_id}", flush=True))
            held = collect_features(setup.lm, heldout, setup.feature_settings, cache_dir=setup.cache,
                                    on_trajectory=lambda t: print(f"features {t.task_id}", flush=True))
            # a type needs 2 won demonstrations to cross-validate and held-out decisions to be scored
            usable = {t for t in demo if len(set(demo[t].decision_task_ids)) >= 2 and t in held and held[t].n_decisions}
            demo = {t: demo[t] for t in usable}
            held = {t: held[t] for t in usable}
            choices, curves = rule_choices(demo, grid, args.gamma)
            hits = held_out_hits(demo, held, grid, args.gamma)
            table = compare(choices, hits, decision_keys(held), grid)
            print(f"\n== {args.env}, {n} demonstrations per type, held out: {heldout_split} "
                  f"({sum(h.n_decisions for h in held.values())} decisions)")
            for rule, rows in table.items():
                print(summary_line(rule, rows))
            record["configs"][f"{n} demonstrations per type"] = {
                "demos_per_type": n, "demo_trajectories": {t: demo[t].task_ids for t in sorted(demo)},
                "heldout_trajectories": {t: held[t].task_ids for t in sorted(held)},
                "heldout_decisions": {t: held[t].n_decisions for t in sorted(held)},
                "choices": choices, "rows": table, "curves": curves,
                "seconds": time.perf_counter() - t0}
            if args.json is not None:
                write_bytes_atomic(args.json, orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY))
    finally:
        setup.env.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
