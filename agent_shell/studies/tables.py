"""Study tables: rates with 95% Wilson intervals per group of study lines (rich tables)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from agent_shell.history import RENDERINGS
from agent_shell.statistics import wilson_interval

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class RateRow:
    """One cell of a study table: ``k`` of ``n`` with a 95% Wilson interval, plus counts."""

    group: tuple[str, ...]
    k: int
    n: int
    low: float
    high: float
    extra: dict

    @property
    def rate(self) -> float:
        return self.k / self.n if self.n else 0.0


def rate_rows(records: Iterable[dict], group_by: Sequence[str], success: str,
              extra: Mapping[str, Callable[[list[dict]], Any]] | None = None) -> list[RateRow]:
    """Rows of ``success`` rates grouped by the ``group_by`` fields (first-seen order, renderings
    in :data:`agent_shell.history.RENDERINGS` order); ``extra`` name -> function of the group's
    records."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[tuple(str(r.get(g, "")) for g in group_by)].append(r)
    order = list(RENDERINGS)

    def sort_key(key: tuple) -> tuple:
        return tuple(order.index(v) if g == "rendering" and v in order else 0 for g, v in zip(group_by, key))

    rows = []
    for key in sorted(groups, key=sort_key):  # stable: first-seen order within a rendering
        rs = groups[key]
        k = sum(bool(r[success]) for r in rs)
        rows.append(RateRow(key, k, len(rs), *wilson_interval(k, len(rs)),
                            {name: fn(rs) for name, fn in (extra or {}).items()}))
    return rows


def rate_table(rows: Sequence[RateRow], columns: Sequence[str], rate_name: str, title: str,
               caption: str = "") -> Table:
    """A :class:`rich.table.Table`: the group columns, k/n, rate, 95% Wilson interval, extras."""
    from rich.table import Table

    table = Table(title=title)
    for c in columns:
        table.add_column(c)
    for c in (f"{rate_name} k/n", "rate", "95% CI"):
        table.add_column(c, justify="right")
    extras = list(rows[0].extra) if rows else []
    for c in extras:
        table.add_column(c, justify="right")
    for r in rows:
        table.add_row(*r.group, f"{r.k}/{r.n}", f"{100 * r.rate:.1f}%", f"[{100 * r.low:.1f}, {100 * r.high:.1f}]",
                      *[str(r.extra[c]) for c in extras])
    table.caption = caption or None
    return table


__all__ = ["RateRow", "rate_rows", "rate_table"]
