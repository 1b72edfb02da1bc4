"""Success tables of episode results (``cb-agent report``, end of ``cb-agent run``); their bar chart
is :mod:`agent_shell.charts`.

Rates come with a 95% Wilson score interval (:func:`agent_shell.statistics.wilson_interval`), which
stays inside [0, 1] and is sensible for the small counts of a per-type table (0 of 5 gives [0, 0.43]).

Records are never pooled across settings: every run setting (:data:`agent_shell.results.RUN_SETTINGS`:
env, split, model, dtype, seed, rendering, layout, action space, demonstrations, lam, gamma, trials,
budget) whose value differs
between the records becomes part of the row's label (``react (budget=15)``), so episodes run
under different settings stay in different rows. Episodes that ended by an engine fault
(``record["error"]``) are counted apart (``errors``), never as won or lost.

Charts and tables are written to a temporary file beside their path and renamed over it
(:func:`agent_shell.charts.save_figure`, :func:`cb_io.storage.write_bytes_atomic`): a link at the
path is replaced, never written through.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from statistics import mean
from typing import Iterable, Sequence

from agent_shell.results import RUN_SETTINGS, setting
from agent_shell.statistics import sign_test, wilson_interval

ALL = "all"


@dataclass(frozen=True)
class Row:
    """One (agent, task type) cell of the success table."""

    agent: str
    task_type: str
    n: int
    won: int
    low: float
    high: float
    mean_steps: float
    mean_think_steps: float
    s_per_step: float
    distinct_actions: float
    cycle_span: float
    format_errors: int
    budgets: tuple[int, ...] = ()  # distinct step budgets of the episodes (think steps included)
    reviews: int = 0  # experience review calls (rendering "experience")
    experiences: int = 0  # of which kept an experience
    errors: int = 0  # episodes ended by an engine fault (not in n)
    mean_score: float = float("nan")  # mean final score (:func:`final_score`), nan when none is recorded
    graded: bool = False  # some episode's score says more than won/lost (ScienceWorld's 0-100)

    @property
    def rate(self) -> float:
        return self.won / self.n if self.n else 0.0


def differing_settings(records: Iterable[dict]) -> list[str]:
    """The run settings (:data:`agent_shell.results.RUN_SETTINGS`) whose values are not the same in
    all ``records``, in that order."""
    values: dict[str, set] = defaultdict(set)
    for r in records:
        for key in RUN_SETTINGS:
            if key != "calibrator" or uses_calibrator(r):
                values[key].add(repr(setting(r, key)))
    return [key for key in RUN_SETTINGS if len(values[key]) > 1]


def uses_calibrator(record: dict) -> bool:
    """Whether the episode's history was written by a learned calibrator (rendering ``calibrator``):
    only then does the ``calibrator`` setting (its file) change the agent, so only then can it
    label a row."""
    return setting(record, "rendering") == "calibrator"


#: Settings of the concept (its fit and what it sees): they do not change an agent without one.
CONCEPT_SETTINGS = ("features", "lam", "concept_data", "concept_per_type", "fit_candidates", "concept_round")


def agent_label(record: dict, differing: Sequence[str] = ()) -> str:
    """The agent's name, with its history rendering and layout when they are not the default
    (``react (causal)``, ``cb-agent (experience, chat)``) and ``key=value`` for every other setting
    in ``differing`` (``react (budget=15)``), so no row mixes settings. The concept's settings
    (:data:`CONCEPT_SETTINGS`) label only agents that act by a concept: react or prior-only episodes
    of runs that differ only in ``--features`` share one row; the calibrator file (setting
    ``calibrator``) labels only episodes with the calibrator rendering, among which it is compared."""
    from agent_shell.agents import needs_concepts  # the agent registry, imported on first use

    concept = needs_concepts(record["agent"])
    extras = [x for x in (setting(record, "rendering"), setting(record, "layout")) if x not in ("raw", "text")]
    extras += [f"{key}={setting(record, key)}" for key in differing
               if key not in ("rendering", "layout") and (concept or key not in CONCEPT_SETTINGS)
               and (key != "calibrator" or uses_calibrator(record))]
    return f"{record['agent']} ({', '.join(extras)})" if extras else record["agent"]


def describe_run(records: Sequence[dict]) -> str:
    """``"<env> <split>, budget <b> steps"`` of the records; several values joined by ``/``."""
    def values(key: str) -> str:
        found = sorted({str(setting(r, key)) for r in records if setting(r, key) is not None})
        return "/".join(found) or "?"

    return f"{values('env')} {values('split')}, budget {values('budget')} steps"


def final_score(record: dict) -> float | None:
    """The episode's score as ScienceWorld reports it (Wang et al. 2022, Sec. 3): the final
    trial's last score, 0-100, with the engine's -100 of a failed task (e.g. a wrong ``focus
    on``) counted as 0, as in the benchmark's reported scores; None when no trial recorded one."""
    trials = record.get("trials") or []
    score = (trials[-1].get("trajectory") or {}).get("score") if trials else None
    return None if score is None else max(float(score), 0.0)


def summarize(records: Iterable[dict]) -> list[Row]:
    """Rows per (agent, task type), then each agent's ``all`` row; agents (labelled by
    :func:`agent_label` with the settings that differ between the records) in first-seen order.
    Error episodes (``record["error"]``) are counted in ``errors`` only."""
    records = list(records)
    differing = differing_settings(records)
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        label = agent_label(r, differing)
        groups[(label, r["task_type"])].append(r)
        groups[(label, ALL)].append(r)
    agents = list(dict.fromkeys(a for a, _ in groups))
    rows = []
    nan = float("nan")
    for agent in agents:
        types = sorted(t for a, t in groups if a == agent and t != ALL) + [ALL]
        for task_type in types:
            everything = groups[(agent, task_type)]
            rs = [r for r in everything if not r.get("error")]
            won = sum(bool(r["success"]) for r in rs)
            steps = sum(r["steps"] for r in rs)
            scored = [(final_score(r), bool(r["success"])) for r in rs]
            scores = [x for x, _ in scored if x is not None]
            rows.append(Row(
                agent, task_type, len(rs), won, *wilson_interval(won, len(rs)),
                mean_steps=mean(r["steps"] for r in rs) if rs else nan,
                mean_think_steps=mean(r["think_steps"] for r in rs) if rs else nan,
                s_per_step=sum(r["wall_s"] for r in rs) / steps if steps else nan,
                distinct_actions=mean(r["distinct_actions"] for r in rs) if rs else nan,
                cycle_span=mean(r["longest_cycle"]["span"] for r in rs) if rs else nan,
                format_errors=sum(r.get("format_errors", 0) for r in rs),
                budgets=tuple(sorted({int(r["budget"]) for r in everything if r.get("budget") is not None})),
                reviews=sum(_review_counts(r)[0] for r in rs),
                experiences=sum(_review_counts(r)[1] for r in rs),
                errors=len(everything) - len(rs),
                mean_score=mean(scores) if scores else nan,
                graded=any(x != float(w) for x, w in scored if x is not None),  # not just won = 1, lost = 0
            ))
    return rows


def _review_counts(record: dict) -> tuple[int, int]:
    """(review calls, kept experiences) of an episode record; counted from the trials' logs for
    records written before the totals were stored."""
    if "reviews" in record:
        return int(record["reviews"]), int(record.get("experiences", 0))
    reviews = [rv for t in record.get("trials", ()) for rv in t.get("log", {}).get("reviews", ())]
    return len(reviews), sum(1 for rv in reviews if rv.get("experience"))


@dataclass(frozen=True)
class Pair:
    """Two agents (row labels of :func:`summarize`) on the games both finished without an error.

    ``both``, ``only_a``, ``only_b``, ``neither``: games won by both, by ``a`` alone, by ``b``
    alone, by neither; ``p_value``: the exact two-sided sign test (McNemar's exact test) on the
    discordant games, P(|X - d/2| >= |only_a - d/2|) for X ~ Binomial(d = only_a + only_b, 1/2)
    (1.0 when no game is discordant).
    """

    a: str
    b: str
    n: int
    both: int
    only_a: int
    only_b: int
    neither: int
    p_value: float


def paired_comparisons(records: Iterable[dict]) -> list[Pair]:
    """Every pair of agents (labelled as in :func:`summarize`, first-seen order) compared game by
    game on the tasks both played (``task_id``; error episodes left out): a same-games comparison
    is far more sensitive than two overlapping intervals. An agent that played a task more than
    once (another seed in another file) is refused: which episode to pair would be a guess.

    Raises ValueError naming the agent and task played twice.
    """
    records = list(records)
    differing = differing_settings(records)
    outcome: dict[str, dict[str, bool]] = {}
    for r in records:
        if r.get("error"):
            continue
        label = agent_label(r, differing)
        games = outcome.setdefault(label, {})
        if r["task_id"] in games:
            raise ValueError(f"{label} played {r['task_id']} twice: cannot pair its episodes")
        games[r["task_id"]] = bool(r["success"])
    labels = list(outcome)
    pairs = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            shared = set(outcome[a]) & set(outcome[b])
            won = Counter((outcome[a][t], outcome[b][t]) for t in shared)  # (a won, b won) -> games
            only_a, only_b = won[True, False], won[False, True]
            pairs.append(Pair(a, b, len(shared), won[True, True], only_a, only_b, won[False, False],
                              sign_test(only_a, only_a + only_b)))
    return pairs


def common_games(records: Iterable[dict]) -> tuple[list[dict], int]:
    """The records of the tasks (``task_id``) that every agent (labelled as in :func:`summarize`)
    finished without an error, in their order, and the number of tasks left out: runs of
    different sizes (a 134-game Raw run beside 30-game Causal runs) compared on the same games.

    Raises ValueError when no task was finished by every agent (naming the agents).
    """
    records = list(records)
    differing = differing_settings(records)
    finished: dict[str, set[str]] = {}
    tasks: set[str] = set()
    for r in records:
        tasks.add(r["task_id"])
        games = finished.setdefault(agent_label(r, differing), set())
        if not r.get("error"):
            games.add(r["task_id"])
    shared = set.intersection(*finished.values()) if finished else set()
    if not shared:
        raise ValueError(f"no game was finished by every agent ({', '.join(finished)})")
    return [r for r in records if r["task_id"] in shared], len(tasks) - len(shared)


@dataclass(frozen=True)
class RunningTime:
    """How long a run's episodes kept the run busy (:func:`running_time`).

    Attributes:
        episodes: episodes with a timing (``finished_at`` and ``wall_s``).
        busy_s: seconds during which at least one of them was being played (the union of the
            intervals ``[finished_at - wall_s, finished_at]``): pauses between resumed segments
            and the workers' start-up (backbone load, expert features, fits) are not counted.
        span_s: first start to last finish, pauses included.
        untimed: episodes without ``finished_at`` (written before it was recorded).
    """

    episodes: int
    busy_s: float
    span_s: float
    untimed: int

    @property
    def per_hour(self) -> float:
        """Episodes per hour of ``busy_s`` (nan when nothing was timed)."""
        return 3600.0 * self.episodes / self.busy_s if self.busy_s > 0 else math.nan


def running_time(records: Iterable[dict]) -> RunningTime:
    """The running time of ``records`` (results lines of one or several runs): the union of their
    episodes' wall-time intervals, so episodes played at once on several workers count once and a
    run resumed in segments counts only its segments."""
    intervals, untimed = [], 0
    for r in records:
        end, wall = r.get("finished_at"), r.get("wall_s")
        if end is None or wall is None:
            untimed += 1
            continue
        intervals.append((float(end) - float(wall), float(end)))
    intervals.sort()
    busy, reach = 0.0, -math.inf
    for lo, hi in intervals:
        if hi > reach:
            busy += hi - max(lo, reach)
            reach = hi
    span = reach - intervals[0][0] if intervals else 0.0
    return RunningTime(len(intervals), busy, span, untimed)


def _markdown(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown table: the header, its rule, one line per row (a ``|`` in a cell becomes ``/``)."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def markdown_cells(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table of cells (strings) as Markdown (the header, its rule, one line per row)."""
    return _markdown(head, rows)


def cells_table(title: str, head: Sequence[str], rows: Iterable[Sequence[str]], caption: str = ""):
    """A table of cells (strings) as a :class:`rich.table.Table`: the first column and the text
    columns (``labels``, ``task type``) left-aligned, the numbers right-aligned."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, caption=caption or None)
    for i, name in enumerate(head):
        table.add_column(name, justify="left" if i == 0 or name in ("labels", "task type") else "right")
    for cells in rows:
        table.add_row(*(escape(c) for c in cells))
    return table


def pairs_markdown(pairs: Sequence[Pair]) -> str:
    """The pairs as a Markdown table: a, b, games, both won, only a, only b, neither, p."""
    return _markdown(["a", "b", "games", "both won", "only a", "only b", "neither", "sign test p"],
                     ([q.a, q.b, str(q.n), str(q.both), str(q.only_a), str(q.only_b), str(q.neither),
                       f"{q.p_value:.3g}"] for q in pairs))


def pairs_table(pairs: Sequence[Pair], title: str = "Same games, agent against agent"):
    """A :class:`rich.table.Table` of :func:`paired_comparisons`."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for name in ("a", "b", "games", "both won", "only a", "only b", "neither", "sign test p"):
        table.add_column(name, justify="left" if name in ("a", "b") else "right")
    for q in pairs:
        table.add_row(escape(q.a), escape(q.b), str(q.n), str(q.both), str(q.only_a), str(q.only_b),
                      str(q.neither), f"{q.p_value:.3g}")
    table.caption = ("games both agents finished without an engine fault; sign test: exact two-sided "
                     "binomial test on the games only one of them won")
    return table


def rich_table(rows: Sequence[Row], title: str = "Success per task type"):
    """A :class:`rich.table.Table` of the rows."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for name, justify in (("agent", "left"), ("task type", "left"), ("won/n", "right"), ("rate", "right"),
                          ("95% CI", "right"), ("steps", "right"), ("think", "right"), ("s/step", "right"),
                          ("distinct", "right"), ("cycle", "right"), ("fmt err", "right"), ("budget", "right")):
        table.add_column(name, justify=justify, no_wrap=name == "agent")
    with_reviews = any(r.reviews for r in rows)
    if with_reviews:
        table.add_column("exp/reviews", justify="right")
    with_errors = any(r.errors for r in rows)
    if with_errors:
        table.add_column("errors", justify="right")
    with_score = any(r.graded for r in rows)
    if with_score:
        table.add_column("score", justify="right")
    for r in rows:
        style = "bold" if r.task_type == ALL else None
        table.add_row(escape(r.agent), r.task_type, f"{r.won}/{r.n}", f"{100 * r.rate:.1f}%",
                      f"[{100 * r.low:.1f}, {100 * r.high:.1f}]", f"{r.mean_steps:.1f}",
                      f"{r.mean_think_steps:.1f}", f"{r.s_per_step:.2f}", f"{r.distinct_actions:.1f}",
                      f"{r.cycle_span:.1f}", str(r.format_errors), ",".join(map(str, r.budgets)),
                      *([f"{r.experiences}/{r.reviews}"] if with_reviews else []),
                      *([str(r.errors)] if with_errors else []),
                      *([_score(r)] if with_score else []), style=style)
    table.caption = ("steps/think: mean per episode; distinct: distinct actions per episode; cycle: mean span "
                     "of the longest back-to-back repeated block of actions; budget: step budget (think steps "
                     "included)" + ("; exp/reviews: experience review calls that kept an experience"
                                    if with_reviews else "")
                     + ("; errors: episodes ended by an engine fault, not counted in won/n" if with_errors else "")
                     + ("; score: mean final score (a failed task's -100 counted as 0)" if with_score else ""))
    return table


def _score(row: Row) -> str:
    return "-" if math.isnan(row.mean_score) else f"{row.mean_score:.1f}"


def table_cells(rows: Sequence[Row], bold_all: bool = False) -> tuple[list[str], list[list[str]]]:
    """The success table as (header, one list of cells per row): agent, task type, won/n, rate, 95%
    Wilson interval, mean steps, think steps, distinct actions, mean longest-cycle span, format
    errors, budget (and errors when there are any, and the mean final score when some episode's
    score is graded, :func:`final_score`); with ``bold_all`` the ``all`` rows' won/n in Markdown bold."""
    with_errors = any(r.errors for r in rows)
    with_score = any(r.graded for r in rows)
    head = ["agent", "task type", "won/n", "rate", "95% CI", "steps", "think", "distinct", "cycle", "fmt err",
            "budget"] + (["errors"] if with_errors else []) + (["score"] if with_score else [])

    def cells(r: Row) -> list[str]:
        bold = "**" if bold_all and r.task_type == ALL else ""
        return [r.agent, r.task_type, f"{bold}{r.won}/{r.n}{bold}", f"{100 * r.rate:.1f}%",
                f"[{100 * r.low:.1f}, {100 * r.high:.1f}]", f"{r.mean_steps:.1f}", f"{r.mean_think_steps:.1f}",
                f"{r.distinct_actions:.1f}", f"{r.cycle_span:.1f}", str(r.format_errors),
                ",".join(map(str, r.budgets))] + ([str(r.errors)] if with_errors else []) \
            + ([_score(r)] if with_score else [])

    return head, [cells(r) for r in rows]


def markdown_table(rows: Sequence[Row]) -> str:
    """The rows of :func:`rich_table` as a Markdown table (results/*.md, docs/results.md), one line
    per row, the cells of :func:`table_cells` (the ``all`` rows' won/n in bold)."""
    return _markdown(*table_cells(rows, bold_all=True))
