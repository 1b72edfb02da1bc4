"""How much the per-candidate terms add to a results file.

Measures a results file written with the terms (``prior``, ``concept``, ``log_p`` per scored
candidate; sampled ``candidates``; ReAct's ``reply``: :meth:`agent_shell.agents.step.Decision.terms_record`)
against the same records without them, per agent, as lines are written (``orjson``, one per line).
With ``--table`` it carries the measured bytes per scored candidate (and per ReAct decision) over to
a committed table written before the terms existed, by its own candidate and decision counts.

    python benchmarks/results_growth.py runs/replay/results.jsonl --table results/table1_alfworld.results.jsonl.gz
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

NEW_FIELDS = ("prior", "concept", "log_p", "reply")


def without_terms(record: dict) -> dict:
    """``record`` as written before the terms: its decisions without :data:`NEW_FIELDS` (and without
    ``candidates``, which only a decision with terms carries)."""
    out = dict(record, trials=[dict(t, log=dict(t["log"], decisions=[
        {k: v for k, v in d.items() if k not in NEW_FIELDS and not (k == "candidates" and "prior" in d)}
        for d in t["log"]["decisions"]])) for t in record.get("trials", ())])
    return out


def counts(records) -> dict[str, dict[str, int]]:
    """Per agent: ``episodes``, ``decisions``, ``candidates`` (of scored decisions, n > 1) and ``bytes``."""
    import orjson

    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        c = out[r["agent"]]
        c["episodes"] += 1
        c["bytes"] += len(orjson.dumps(r)) + 1
        for t in r.get("trials", ()):
            for d in t["log"]["decisions"]:
                c["decisions"] += 1
                c["candidates"] += d["n_candidates"] if (d.get("n_candidates") or 0) > 1 else 0
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results file written with the terms (.jsonl or .jsonl.gz)")
    parser.add_argument("--table", help="a committed results file without them, to carry the measure over to")
    args = parser.parse_args(argv)
    from agent_shell.results import read_results

    records = read_results(args.results)
    if not records:
        print(f"no records in {args.results}", file=sys.stderr)
        return 2
    new, old = counts(records), counts([without_terms(r) for r in records])
    per_unit = {}
    for agent in new:
        n, o = new[agent], old[agent]
        added = n["bytes"] - o["bytes"]
        unit = "candidates" if n["candidates"] else "decisions"
        per_unit[agent] = (unit, added / max(n[unit], 1))
        print(f"{agent}: {n['episodes']} episodes, {n['decisions']} decisions, {n['candidates']} scored candidates; "
              f"bytes {o['bytes']} -> {n['bytes']} (growth {n['bytes'] / o['bytes'] - 1!r}); "
              f"{per_unit[agent][1]!r} bytes added per {unit[:-1]}")
    total_new, total_old = sum(c["bytes"] for c in new.values()), sum(c["bytes"] for c in old.values())
    print(f"all: bytes {total_old} -> {total_new} (growth {total_new / total_old - 1!r})")
    if args.table:
        table = counts(read_results(args.table))
        added = 0.0
        for agent, c in table.items():
            if agent not in per_unit:
                print(f"{args.table}: no measure for agent {agent!r}", file=sys.stderr)
                return 2
            unit, size = per_unit[agent]
            added += size * c[unit]
        size = sum(c["bytes"] for c in table.values())
        print(f"{args.table}: bytes {size} -> {size + added!r} (growth {added / size!r}) with the measured bytes per "
              f"candidate / decision")
    return 0


if __name__ == "__main__":
    sys.exit(main())
