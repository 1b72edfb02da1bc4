"""The success chart stays legible at 1 to 8 rows: measured with matplotlib's own renderer after the
chart is drawn, no two pieces of text overlap (won/n labels, task-type names, legend entries, title,
caption), the legend lies inside the figure, and every won/n label inside the axes. The 6-row case
is the committed improve results (react, prior-only and four rounds of cb-agent)."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.text import Text

from agent_shell.charts import chart_figure
from agent_shell.reporting import Row, summarize
from agent_shell.results import read_results
from agent_shell.statistics import wilson_interval

RESULTS = Path(__file__).resolve().parents[2] / "results"
#: ALFWorld's task types: the longest names a chart of this project shows
TYPES = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
         "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")


def texts(fig) -> list[Text]:
    """Every visible, non-empty text of the figure, once each."""
    found = {id(t): t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}
    return list(found.values())


def check_legible(fig, n_rows: int) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    figure, axes = fig.bbox, ax.get_window_extent(renderer)
    (legend,) = fig.legends or [ax.get_legend()]  # the figure's legend, or the axes'
    box = legend.get_window_extent(renderer)
    assert figure.x0 <= box.x0 and box.x1 <= figure.x1 and figure.y0 <= box.y0 and box.y1 <= figure.y1, (box, figure)
    assert not box.overlaps(axes)
    assert [t.get_text() for t in legend.get_texts()] == list(dict.fromkeys(r.agent for r in fig.rows))[:n_rows]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts(fig)]
    for name, b in boxes:
        assert figure.x0 <= b.x0 and b.x1 <= figure.x1 and figure.y0 <= b.y0 and b.y1 <= figure.y1, (name, b)
    overlapping = [(a, b) for (a, x), (b, y) in itertools.combinations(boxes, 2) if x.overlaps(y)]
    assert overlapping == []
    labels = [t for t in ax.texts if "/" in t.get_text()]
    assert len(labels) == len(fig.rows)  # one won/n label a bar
    for t in labels:
        b = t.get_window_extent(renderer)
        assert axes.x0 <= b.x0 and b.x1 <= axes.x1 and axes.y0 <= b.y0 and b.y1 <= axes.y1, (t.get_text(), b)


def figure_of(rows, title):
    fig = chart_figure(rows, title)
    fig.rows = rows
    return fig


@pytest.mark.parametrize("name, n_rows", [("improve_textworld", 6), ("improve_alfworld", 5)])
def test_the_committed_improve_chart_is_legible(tmp_path, name, n_rows):
    plain = tmp_path / "results.jsonl"
    plain.write_bytes(gzip.decompress((RESULTS / f"{name}.results.jsonl.gz").read_bytes()))
    rows = summarize(read_results(plain))
    assert len({r.agent for r in rows}) == n_rows
    fig = figure_of(rows, f"{name}: success rate by task type")
    check_legible(fig, n_rows)
    plt.close(fig)


def row(agent: str, task_type: str, won: int, n: int) -> Row:
    low, high = wilson_interval(won, n)
    return Row(agent, task_type, n, won, low, high, mean_steps=10.0, mean_think_steps=0.0, s_per_step=0.1,
               distinct_actions=4.0, cycle_span=2.0, format_errors=0)


@pytest.mark.parametrize("n_rows", range(1, 9))
def test_the_chart_of_1_to_8_rows_is_legible(n_rows):
    """Six task types with ALFWorld's long names, each cell 0%, 50% or 100% of 20 episodes (whiskers
    reaching 100%; ``60/120`` in the ``all`` group), rows named like improve's rounds."""
    rows = []
    for i in range(n_rows):
        agent = f"cb-agent (concept_round={i})"
        cells = [(t, 10 * ((i + j) % 3), 20) for j, t in enumerate(TYPES)]
        rows += [row(agent, t, won, n) for t, won, n in cells]
        rows.append(row(agent, "all", sum(c[1] for c in cells), sum(c[2] for c in cells)))
    fig = figure_of(rows, "alfworld valid_unseen, budget 50 steps: success rate by task type")
    check_legible(fig, n_rows)
    plt.close(fig)


def test_the_strength_figure_crosses_the_strengths_the_guard_refuses():
    """Per panel, the crossed points are the strengths whose held-out log-likelihood is below the
    default's (guard_diff < 0), at their mean; a curve without a guard has none; the caption names
    the guard."""
    import numpy as np

    from agent_shell.charts import strength_figure

    lams = [0.01, 0.1, 1.0, 10.0]

    def curve(guard_diff, guard="log-lik"):
        return {"lams": lams, "mean": [0.5, 0.6, 0.4, 0.2], "se": [0.05] * 4, "best": 0.1, "chosen": 1.0,
                "flat": True, "n_trajectories": 5, "n_folds": 5, "rule": "default-se", "criterion": "top-1",
                "guard": guard, "guard_diff": guard_diff}

    fig = strength_figure({"a": curve([-0.3, 0.1, 0.0, -1.0]), "b": curve(None, None)})
    crossed = [[line for line in ax.lines if line.get_marker() == "x"] for ax in fig.axes[:2]]
    assert len(crossed[0]) == 1 and not crossed[1]
    np.testing.assert_allclose(crossed[0][0].get_xdata(), [0.01, 10.0])
    np.testing.assert_allclose(crossed[0][0].get_ydata(), [0.5, 0.2])
    assert "guarded by the held-out log-lik" in fig._supxlabel.get_text()
    plt.close(fig)
