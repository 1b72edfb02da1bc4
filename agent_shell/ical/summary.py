"""Summaries of ICAL outcome logs and retrieval precision (pure; rich tables for the CLI)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from statistics import mean
from typing import Iterable, Sequence

ALL = "all"


def read_outcomes(path: str | Path) -> list[dict]:
    """The outcome records (lines with ``rounds``) of an ICAL refine or memory log; other and
    unreadable lines are left out."""
    from cb_io.storage import iter_jsonl

    return [r for _, r, err in iter_jsonl(path) if err is None and isinstance(r, dict) and "rounds" in r]


def outcome_rows(records: Iterable[dict]) -> list[dict]:
    """One row per task type (and ``all``) of outcome records (:meth:`Outcome.to_record`).

    Columns: ``tried``; ``abstracted`` (the first output parsed); ``refined`` (kept after at least
    one revision); ``kept``; ``rounds`` (mean rounds per try) and ``kept_rounds`` (mean revisions of
    the kept ones, None if none); ``rejected`` (reason -> count of tries not kept); ``parse``
    (reason -> count over all rounds' outputs).
    """
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        groups[r["task_type"]].append(r)
        groups[ALL].append(r)
    rows = []
    for task_type in sorted(groups, key=lambda t: (t == ALL, t)):
        rs = groups[task_type]
        kept = [r for r in rs if r["kept"]]
        parse = Counter(reason for r in rs for rd in r["rounds"] for reason in rd.get("parse_reasons", ()))
        rows.append({
            "task_type": task_type, "tried": len(rs),
            "abstracted": sum(1 for r in rs if r["rounds"] and r["rounds"][0]["program"] is not None),
            "refined": sum(1 for r in kept if r["n_rounds"] > 1), "kept": len(kept),
            "rounds": mean(r["n_rounds"] for r in rs),
            "kept_rounds": mean(r["n_rounds"] - 1 for r in kept) if kept else None,
            "rejected": dict(Counter(r["reason"] for r in rs if not r["kept"]).most_common()),
            "parse": dict(parse.most_common()),
        })
    return rows


def outcome_table(rows: Sequence[dict], title: str):
    """A rich table of :func:`outcome_rows`."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("task type", "tried", "abstracted", "refined", "kept", "rounds", "why rejected"):
        table.add_column(col, overflow="fold")
    for r in rows:
        why = ", ".join(f"{k} x{v}" for k, v in r["rejected"].items()) or "-"
        table.add_row(r["task_type"], str(r["tried"]), str(r["abstracted"]), str(r["refined"]), str(r["kept"]),
                      f"{r['rounds']:.2f}", why, end_section=r["task_type"] == ALL)
    return table


def precision_rows(queries: Iterable[dict]) -> list[dict]:
    """Retrieval precision per query task type (and ``all``): the share of the top-K examples
    whose task type equals the query's, averaged over queries (``queries``: dicts with
    ``task_type`` and ``retrieved_types``)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for q in queries:
        got = q["retrieved_types"]
        if not got:
            continue
        p = sum(t == q["task_type"] for t in got) / len(got)
        groups[q["task_type"]].append(p)
        groups[ALL].append(p)
    return [{"task_type": t, "queries": len(v), "precision": mean(v)}
            for t, v in sorted(groups.items(), key=lambda kv: (kv[0] == ALL, kv[0]))]
