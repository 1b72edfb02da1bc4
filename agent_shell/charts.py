"""The success chart of ``cb-agent report``, ``run``, ``improve`` and the decision explorer's page: a
grouped bar chart (task type x row of :func:`agent_shell.reporting.summarize`), saved atomically;
and the L2 strength's cross-validation curves (:func:`strength_figure`).

Legible at 1 to 8 rows (agents, settings, rounds) and any number of task types; what the layout
guarantees, measured with matplotlib's own text metrics after a draw:

- each bar's ``won/n`` label stands above its whisker (never crossed by it), level when it is no
  wider than its bar, upright when it is not; the figure widens with the rows so that a bar is
  always wider than an upright label is thick, and labels of neighbouring bars never meet;
- task-type names wrap to the width of their group (never rotated into their neighbours);
- the legend stands right of the axes, and the figure widens by its width, so no entry is cut at
  the edge however long the rows' names;
- the y limit rises until the tallest label is inside the axes (the ticks stay at 0-100%).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Mapping, Sequence

from agent_shell.reporting import ALL, Row
from cb_io.storage import atomic_path

CHART_CAPTION = "bars: success rate; labels: won/n; whiskers: 95% Wilson score intervals"
LABEL_PT = 6  # won/n labels
TEXT_PT = 8  # task-type names and legend entries
#: a task-type group's width (inches) per bar, and its least width; 0.8 of a group holds the bars
GROUP_IN_PER_BAR, GROUP_IN = 0.22, 1.4


def chart_figure(rows: Sequence[Row], title: str = "Success rate by task type"):
    """The grouped bar chart as a matplotlib Figure (constrained layout): one bar per (task type,
    row) at the success rate in percent, a stub on the baseline for a 0% bar (so it is seen), the
    95% Wilson interval as a whisker, ``won/n`` above it, the ``all`` group last, a legend of the
    rows and a caption saying so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    agents = list(dict.fromkeys(r.agent for r in rows))
    types = [t for t in dict.fromkeys(r.task_type for r in rows) if t != ALL] + [ALL]
    cell = {(r.agent, r.task_type): r for r in rows}
    width = 0.8 / max(len(agents), 1)
    group_in = max(GROUP_IN, GROUP_IN_PER_BAR * len(agents))
    x = np.arange(len(types))
    fig, ax = plt.subplots(figsize=(max(6.0, group_in * len(types) + 0.8), 4.4), layout="constrained")
    labels = []
    for i, agent in enumerate(agents):
        cells = [cell.get((agent, t)) for t in types]
        rates = [100 * c.rate if c else 0.0 for c in cells]
        # clamp: for 0/n or n/n the interval's end equals the rate only up to rounding
        err = np.array([[100 * (c.rate - c.low), 100 * (c.high - c.rate)] if c else [0.0, 0.0] for c in cells]).T
        err = np.maximum(err, 0.0)
        centres = x + (i - (len(agents) - 1) / 2) * width
        bars = ax.bar(centres, rates, width, yerr=err, capsize=2, label=agent)
        color = bars.patches[0].get_facecolor()
        zero = [(c - width / 2, c + width / 2) for c, cc, rate in zip(centres, cells, rates) if cc and cc.n and rate == 0]
        if zero:  # a 0% bar has no height: draw it as a thick stub on the baseline
            ax.hlines([0.0] * len(zero), [a for a, _ in zero], [b for _, b in zero], colors=[color], linewidth=4,
                      label="_zero")
        labels += [ax.annotate(f"{c.won}/{c.n}", (centre, rate + top), xytext=(0, 2), textcoords="offset points",
                               ha="center", va="bottom", fontsize=LABEL_PT)
                   for centre, c, rate, top in zip(centres, cells, rates, err[1]) if c]
    wrap = max(8, int(group_in * 72 * 0.9 / (0.6 * TEXT_PT)))  # characters of a name's line (about 0.6 em each)
    ax.set_xticks(x, [textwrap.fill(t.replace("_", " "), wrap) for t in types], fontsize=TEXT_PT)
    ax.set_ylabel("success rate (%)")
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylim(-3, 110)
    ax.axhline(0.0, color="0.6", linewidth=0.6, zorder=0)
    fig.suptitle(title, fontsize=10)
    fig.supxlabel(CHART_CAPTION, x=0.01, ha="left", fontsize=7, color="0.3")
    _fit_legend(fig, ax, len(agents))
    _fit_labels(fig, ax, labels, width)
    return fig


def _fit_legend(fig, ax, n: int) -> None:
    """The legend of the rows right of the axes, top-aligned, one column per 12 rows; the figure
    widened by the legend's width, so the axes keep theirs and no entry is cut at the edge."""
    handles, names = ax.get_legend_handles_labels()
    if not handles:
        return
    legend = fig.legend(handles, names, loc="outside right upper", ncol=-(-n // 12), fontsize=TEXT_PT, frameon=False)
    fig.draw_without_rendering()
    fig.set_figwidth(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi)


def _fit_labels(fig, ax, labels, bar_width: float) -> None:
    """The won/n labels upright when one is wider than its bar (less a point), then the y limit raised
    until the tallest is inside the axes (a label keeps its size in points while the axes' scale
    changes, so the limit is solved for, not stepped)."""
    if not labels:
        return
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    bar_px = abs(ax.transData.transform((bar_width, 0))[0] - ax.transData.transform((0, 0))[0])
    if max(t.get_window_extent(renderer).width for t in labels) > bar_px - fig.dpi / 72:
        for t in labels:
            t.set_rotation(90)
    for _ in range(3):
        fig.draw_without_rendering()
        low, high = ax.get_ylim()
        height = ax.bbox.height
        need = high
        for t in labels:
            anchor = ax.transData.transform((0, t.xy[1]))[1]
            above = t.get_window_extent(renderer).y1 - anchor + fig.dpi / 36  # 2 points clear of the frame
            if above < height:  # top = the limit at which the label's top meets the axes' top
                need = max(need, (t.xy[1] * height - low * above) / (height - above))
        if need <= high * (1 + 1e-9):
            return
        ax.set_ylim(low, need)


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    """Save a matplotlib figure at ``path`` atomically (a temporary file beside it, then one rename:
    a link at ``path`` is replaced, its target untouched), format from the suffix (PNG without
    one), and close it. Returns ``path``."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_path(path, suffix=path.suffix) as tmp, open(tmp, "wb") as f:
            fig.savefig(f, format=path.suffix[1:] or "png", dpi=dpi)
    finally:
        plt.close(fig)
    return path


def strength_figure(curves: Mapping[str, Mapping], title: str = "The L2 strength by cross-validation"):
    """The cross-validation curves of ``--lam auto`` (:meth:`cb_core.StrengthCurve.to_dict` per task
    type) as a matplotlib Figure: one panel per task type, the mean held-out criterion (top-1, or
    the expert log-likelihood in nats per decision) against lam on a log axis with a
    one-standard-error band, the best strength and the chosen one marked (a flat curve, which keeps
    the default, says so in its title), the strengths the guard refuses (held-out log-likelihood
    below the default's) crossed, and the rule and guard in the caption."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = sorted(curves)
    cols = min(4, max(1, len(names)))
    rows = math.ceil(len(names) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.2 * rows + 0.6), squeeze=False,
                             layout="constrained")
    for ax, name in zip(axes.flat, names):
        c = curves[name]
        lams, mean, se = (np.asarray(c[k], float) for k in ("lams", "mean", "se"))
        ax.fill_between(lams, mean - se, mean + se, color="C0", alpha=0.2, linewidth=0)
        ax.plot(lams, mean, "o-", color="C0", markersize=3)
        ax.axvline(c["best"], color="C2", linestyle=":", linewidth=1, label="best")
        ax.axvline(c["chosen"], color="C3", linewidth=1, label="chosen")
        if c.get("guard_diff") is not None:
            refused = np.asarray(c["guard_diff"], float) < 0
            ax.plot(lams[refused], mean[refused], "x", color="C3", markersize=6, label=f"{c['guard']} lower")
        ax.set_xscale("log")
        flat = ", flat" if c.get("flat") else ""  # no strength beats the default beyond noise: it is kept
        ax.set_title(f"{name} ({c['n_trajectories']} traj., {c['n_folds']} folds{flat})", fontsize=TEXT_PT)
        ax.tick_params(labelsize=LABEL_PT + 1)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    first = next(iter(curves.values()), {})
    for ax in axes[:, 0]:  # curves recorded before the criterion was named are log-likelihoods
        ax.set_ylabel("held-out top-1" if first.get("criterion") == "top-1" else "held-out log-lik.\n(nats/decision)",
                      fontsize=TEXT_PT)
    rule = first.get("rule", "")
    guard = f", guarded by the held-out {first['guard']}" if first.get("guard") else ""
    axes.flat[0].legend(fontsize=LABEL_PT, loc="lower left")
    fig.suptitle(title, fontsize=TEXT_PT + 2)
    fig.supxlabel(f"lam (log scale); band: one standard error over folds; chosen by the {rule} rule{guard}",
                  fontsize=TEXT_PT)
    return fig


def bar_chart(rows: Sequence[Row], path: str | Path, title: str = "Success rate by task type") -> Path:
    """:func:`chart_figure` saved as an image at ``path`` (format from the suffix; :func:`save_figure`)."""
    return save_figure(chart_figure(rows, title), path, dpi=120)


__all__ = ["CHART_CAPTION", "bar_chart", "chart_figure", "save_figure", "strength_figure"]
