"""Wilson intervals and the sign test, the success table and chart, paired comparisons and `cb-agent report`."""

import math

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

from agent_shell.cli import main
from agent_shell.charts import bar_chart
from agent_shell.reporting import rich_table, summarize
from agent_shell.statistics import wilson_interval


@pytest.mark.parametrize("k, n, low, high", [
    (0, 5, 0.0, 0.4345), (5, 5, 0.5655, 1.0), (3, 10, 0.1078, 0.6032), (0, 0, 0.0, 1.0),
])
def test_wilson_interval_known_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert math.isclose(lo, low, abs_tol=1e-4) and math.isclose(hi, high, abs_tol=1e-4)


def test_wilson_interval_rejects_bad_counts():
    with pytest.raises(ValueError, match="k=6, n=5"):
        wilson_interval(6, 5)


def record(agent, task_type, success, steps=10):
    return {"agent": agent, "task_type": task_type, "success": success, "steps": steps, "think_steps": 2,
            "wall_s": steps * 0.5, "distinct_actions": 4, "longest_cycle": {"span": 2}, "format_errors": 1}


def test_summarize_and_chart(tmp_path):
    recs = [record("cb-agent", "fetch", True), record("cb-agent", "fetch", False), record("cb-agent", "open", True),
            record("react", "open", False, steps=20)]
    rows = summarize(recs)
    assert [(r.agent, r.task_type, r.won, r.n) for r in rows] == [
        ("cb-agent", "fetch", 1, 2), ("cb-agent", "open", 1, 1), ("cb-agent", "all", 2, 3),
        ("react", "open", 0, 1), ("react", "all", 0, 1)]
    assert rows[2].s_per_step == pytest.approx(0.5) and rows[2].format_errors == 3
    path = bar_chart(rows, tmp_path / "chart.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_table_has_one_line_per_row_with_counts_and_intervals(tmp_path):
    from agent_shell.reporting import markdown_table

    rows = summarize([record("cb-agent", "fetch", True), record("cb-agent", "fetch", False),
                      {**record("react", "fetch", False), "error": {"type": "EngineError"}}])
    lines = markdown_table(rows).splitlines()
    assert len(lines) == 2 + len(rows) and lines[0].endswith("| errors |")
    assert lines[2].startswith("| cb-agent | fetch | 1/2 | 50.0% | [9.5, 90.5] | 10.0 | 2.0 | 4.0 | 2.0 | 2 |")
    assert "| react | all | **0/0** |" in lines[-1] and lines[-1].endswith("| 1 |")
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join(orjson.dumps({**record("react", "fetch", bool(i)), "task_id": f"t/{i}"}) + b"\n"
                              for i in range(3)))
    res = CliRunner().invoke(main, ["report", str(path), "--markdown", str(tmp_path / "r.md")])
    assert res.exit_code == 0, res.output
    assert "| react | all | **2/3** |" in (tmp_path / "r.md").read_text()


def test_graded_scores_get_a_column_with_failures_counted_as_zero():
    """ScienceWorld's 0-100 scores (its -100 of a failed task counted as 0) get a mean-score
    column; won/lost scores of 0 and 1 (ALFWorld) add none."""
    from agent_shell.reporting import final_score, markdown_table

    def scored(success, score):
        return {**record("cb-agent", "boil", success), "trials": [{"trajectory": {"score": 3.0}},
                                                                  {"trajectory": {"score": score}}]}

    recs = [scored(False, 25.0), scored(False, -100.0), scored(True, 100.0)]
    assert [final_score(r) for r in recs] == [25.0, 0.0, 100.0]  # the final trial's score
    assert final_score(record("react", "boil", False)) is None
    rows = summarize(recs + [record("react", "boil", False)])
    assert rows[0].graded and rows[0].mean_score == pytest.approx(125 / 3)
    assert math.isnan(rows[-1].mean_score)
    lines = markdown_table(rows).splitlines()
    assert lines[0].endswith("| score |") and lines[2].endswith("| 41.7 |") and lines[-1].endswith("| - |")
    binary = summarize([scored(True, 1.0), scored(False, 0.0)])
    assert not any(r.graded for r in binary) and "score" not in markdown_table(binary)
    console_rows = rich_table(rows)
    assert [c.header for c in console_rows.columns][-1] == "score"


def test_summarize_separates_renderings_and_layouts():
    recs = [record("react", "open", True), {**record("react", "open", False), "rendering": "causal"},
            {**record("react", "open", False), "rendering": "experience", "layout": "chat"},
            {**record("react", "open", True), "rendering": "raw", "layout": "text"}]
    rows = [r for r in summarize(recs) if r.task_type == "all"]
    assert [(r.agent, r.won, r.n) for r in rows] == [
        ("react", 2, 2), ("react (causal)", 0, 1), ("react (experience, chat)", 0, 1)]


def test_table_shows_the_experience_rate_only_when_there_were_reviews():
    plain = summarize([record("react", "open", True)])
    reviewed = summarize([{**record("react", "open", True), "rendering": "experience", "reviews": 8,
                           "experiences": 2}])
    assert reviewed[-1].reviews == 8 and reviewed[-1].experiences == 2
    assert "exp/reviews" not in _text(plain) and "2/8" in _text(reviewed)
    assert "react (experience)" in _text(reviewed)


def _text(rows):
    from rich.console import Console

    console = Console(width=220, record=True)
    console.print(rich_table(rows))
    return console.export_text()


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 17, 30])
def test_interval_ends_never_cross_the_rate_and_all_fail_charts_draw(tmp_path, n):
    """0/n and n/n: rounding in the Wilson formula must not put an end past the rate (a chart's
    error bar would be negative and matplotlib refuses it)."""
    for k in (0, n):
        lo, hi = wilson_interval(k, n)
        assert lo <= k / n <= hi
    recs = [dict(record("react", "open", False), budget=20) for _ in range(n)]
    rows = summarize(recs)
    assert rows[0].budgets == (20,)
    assert bar_chart(rows, tmp_path / "zero.png").stat().st_size > 0


def test_rows_are_keyed_by_every_setting_that_differs():
    base = {"env": "alfworld", "split": "valid_unseen", "dtype": "float32", "budget": 50, "model": "m"}
    recs = [{**record("react", "open", True), **base}, {**record("react", "open", False), **base, "budget": 15},
            {**record("react", "open", False), **base, "dtype": "bfloat16"},
            {**record("react", "open", True), **base}]
    rows = [r for r in summarize(recs) if r.task_type == "all"]
    assert [(r.agent, r.won, r.n) for r in rows] == [
        ("react (dtype=float32, budget=50)", 2, 2), ("react (dtype=float32, budget=15)", 0, 1),
        ("react (dtype=bfloat16, budget=50)", 0, 1)]
    same = [{**record("react", "open", True), **base}, {**record("react", "open", False), **base}]
    assert [r.agent for r in summarize(same)] == ["react", "react"]  # nothing differs: the plain name


def test_the_calibrator_file_labels_only_calibrator_rendering_rows():
    raw = {**record("cb-agent", "open", True), "calibrator": None}
    one = {**record("cb-agent", "open", False), "rendering": "calibrator", "calibrator": "a.safetensors"}
    rows = [r.agent for r in summarize([raw, one]) if r.task_type == "all"]
    assert rows == ["cb-agent", "cb-agent (calibrator)"]  # one calibrator file: not a differing setting
    two = {**one, "calibrator": "b.safetensors"}
    rows = [r.agent for r in summarize([raw, one, two]) if r.task_type == "all"]
    assert rows == ["cb-agent", "cb-agent (calibrator, calibrator=a.safetensors)",
                    "cb-agent (calibrator, calibrator=b.safetensors)"]


def test_report_says_which_settings_differ(tmp_path):
    import orjson

    path = tmp_path / "results.jsonl"
    lines = [{**record("react", "open", True), "task_id": "a/1", "env": "alfworld", "split": "valid_unseen",
              "budget": b, "trials": []} for b in (15, 50)]
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines) + b'{"agent": "react", "task')  # torn
    res = CliRunner().invoke(main, ["report", str(path), "--chart", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    assert "settings differ between the episodes (budget): one row per setting" in res.output
    assert "react (budget=15)" in res.output and "react (budget=50)" in res.output
    assert f"warning: {path}:3: skipped malformed results line" in res.output and "UserWarning" not in res.output


def test_the_chart_shows_0_percent_bars_and_says_what_it_shows():
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    from agent_shell.charts import CHART_CAPTION, chart_figure
    from agent_shell.reporting import describe_run

    recs = [dict(record("react", "open", False), env="alfworld", split="valid_unseen", budget=20) for _ in range(5)]
    recs += [dict(record("cb-agent", "open", True), env="alfworld", split="valid_unseen", budget=20)]
    title = describe_run(recs)
    assert title == "alfworld valid_unseen, budget 20 steps"
    fig = chart_figure(summarize(recs), f"{title}: success rate by task type")
    ax = fig.axes[0]
    assert fig.get_suptitle() == "alfworld valid_unseen, budget 20 steps: success rate by task type"
    fig.canvas.draw()  # the legend stands right of the bars, where it covers no won/n label
    assert fig.legends[0].get_window_extent().x0 >= ax.get_window_extent().x1
    assert CHART_CAPTION in [t.get_text() for t in fig.texts] and "95% Wilson" in CHART_CAPTION
    assert ax.get_ylim()[0] < 0  # room below the baseline for the stub
    stubs = [c for c in ax.collections if isinstance(c, LineCollection) and c.get_label() == "_zero"]
    segments = [seg for c in stubs for seg in c.get_segments()]
    assert len(segments) == 2 and all(seg[0][1] == seg[1][1] == 0 and seg[1][0] > seg[0][0] for seg in segments)
    assert all(c.get_linewidth()[0] >= 3 for c in stubs)  # react's 0/5 in "open" and in "all"
    plt.close(fig)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_sign_test_is_scipy_s_exact_binomial_test(kn):
    from scipy.stats import binomtest

    from agent_shell.statistics import sign_test

    k, n = kn
    expected = binomtest(k, n, 0.5).pvalue if n else 1.0
    assert sign_test(k, n) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_sign_test_rejects_bad_counts():
    from agent_shell.statistics import sign_test

    with pytest.raises(ValueError, match="k=3, n=2"):
        sign_test(3, 2)


def game(agent, task_id, success, **extra):
    return {**record(agent, task_id.split("/")[0], success), "task_id": task_id, **extra}


def test_paired_comparisons_count_games_by_outcome_on_the_shared_games_only():
    from agent_shell.reporting import paired_comparisons

    won_a = [True, True, True, False, False, True]
    won_b = [True, False, False, False, False, False]
    recs = [game("cb-agent", f"t/{i}", w) for i, w in enumerate(won_a)]
    recs += [game("react", f"t/{i}", w) for i, w in enumerate(won_b)]
    recs += [game("react", "t/9", True),  # cb-agent never played it: not paired
             game("cb-agent", "t/8", True, error={"type": "EngineError"})]  # an error episode: left out
    (pair,) = paired_comparisons(recs)
    assert (pair.a, pair.b, pair.n, pair.both, pair.only_a, pair.only_b, pair.neither) == \
        ("cb-agent", "react", 6, 1, 3, 0, 2)
    assert pair.p_value == pytest.approx(0.25)  # 3 of 3 discordant games one way: 2 / 2**3


def test_paired_comparisons_label_agents_by_the_settings_that_differ():
    from agent_shell.reporting import paired_comparisons

    recs = [game("cb-agent", "t/1", True, features="lm-hidden"), game("cb-agent", "t/1", False, features="novelty")]
    (pair,) = paired_comparisons(recs)
    assert (pair.a, pair.b, pair.only_a) == ("cb-agent (features=lm-hidden)", "cb-agent (features=novelty)", 1)


def test_paired_comparisons_refuse_an_agent_that_played_a_game_twice():
    from agent_shell.reporting import paired_comparisons

    with pytest.raises(ValueError, match="react played t/1 twice"):
        paired_comparisons([game("react", "t/1", True), game("react", "t/1", False)])


def test_report_paired_prints_and_writes_the_same_games_table(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [game("cb-agent", f"t/{i}", i < 4) for i in range(5)] + [game("react", f"t/{i}", i == 0) for i in range(5)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    res = CliRunner().invoke(main, ["report", str(path), "--paired", "--markdown", str(tmp_path / "r.md"),
                                    "--chart", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    assert "same games, agent against agent" in res.output
    assert "| cb-agent | react | 5 | 1 | 3 | 0 | 1 | 0.25 |" in (tmp_path / "r.md").read_text()
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes(b"".join(orjson.dumps(game("react", "t/1", s)) + b"\n" for s in (True, False)))
    res = CliRunner().invoke(main, ["report", str(twice), "--paired", "--chart", str(tmp_path / "c2.png")])
    # one episode stored twice (two writers on one file) is counted once, with a warning: nothing left to pair
    assert res.exit_code == 0 and "react on t/1 is recorded 2 times with the same settings: counted once" in res.output
    assert "the results hold one agent only" in res.output and "1/1" in res.output


def test_concept_settings_label_only_the_agents_that_act_by_a_concept():
    recs = [game(agent, "t/1", False, features=f) for agent in ("react", "cb-agent") for f in ("lm-hidden", "novelty")]
    labels = [r.agent for r in summarize(recs) if r.task_type == "all"]
    assert labels == ["react", "cb-agent (features=lm-hidden)", "cb-agent (features=novelty)"]
    lam = [game("prior-only", f"t/{i}", True, lam=lam, budget=budget)
           for i, (lam, budget) in enumerate([(0.5, 20), (1.0, 20), (0.5, 50)])]
    rows = [r for r in summarize(lam) if r.task_type == "all"]  # lam differs too, but labels no prior-only
    assert [(r.agent, r.n) for r in rows] == [("prior-only (budget=20)", 2), ("prior-only (budget=50)", 1)]


def test_report_of_several_files_leaves_each_run_s_chart_alone(tmp_path, monkeypatch):
    runs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        path = tmp_path / name / "results.jsonl"
        path.write_bytes(orjson.dumps(game("react" if name == "one" else "cb-agent", "t/1", True)) + b"\n")
        (tmp_path / name / "results.png").write_bytes(b"the run's own chart")
        runs.append(str(path))
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["report", *runs, "--paired"])
    assert res.exit_code == 0, res.output
    assert "chart: report.png" in res.output and (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert all((tmp_path / name / "results.png").read_bytes() == b"the run's own chart" for name in ("one", "two"))
    res = CliRunner().invoke(main, ["report", runs[0], "--paired"])  # one file: its chart beside it, as `run` writes
    assert res.exit_code == 0, res.output
    assert "nothing to pair" in res.output and (tmp_path / "one" / "results.png").read_bytes()[:4] == b"\x89PNG"


def test_records_written_before_feature_extractors_read_as_lm_hidden():
    """A results line of an older version has no ``features``: its concept saw ``lm-hidden`` (the
    only choice then), so it shares a row and pairs with a new line of the same setting."""
    from agent_shell.reporting import paired_comparisons

    recs = [game("cb-agent", "t/1", True), game("cb-agent", "t/2", False, features="lm-hidden"),
            game("react", "t/1", False), game("react", "t/2", False)]
    assert [(r.agent, r.n) for r in summarize(recs) if r.task_type == "all"] == [("cb-agent", 2), ("react", 2)]
    (pair,) = paired_comparisons(recs)
    assert (pair.n, pair.only_a) == (2, 1)
    assert [r.agent for r in summarize(recs + [game("cb-agent", "t/3", True, features="novelty")])
            if r.task_type == "all"] == ["cb-agent (features=lm-hidden)", "react", "cb-agent (features=novelty)"]


def test_common_games_keep_the_games_every_agent_finished():
    from agent_shell.reporting import common_games

    recs = [game("react", f"t/{i}", i == 0) for i in range(6)]  # the bigger run
    recs += [game("react", f"t/{i}", False, rendering="causal") for i in (1, 2, 4)]
    recs += [game("react", "t/5", False, rendering="causal", error={"type": "EngineError"})]  # not finished
    kept, left_out = common_games(recs)
    assert sorted({r["task_id"] for r in kept}) == ["t/1", "t/2", "t/4"] and left_out == 3
    assert len(kept) == 6 and all(not r.get("error") for r in kept)
    with pytest.raises(ValueError, match=r"no game was finished by every agent \(react, react \(causal\)\)"):
        common_games([game("react", "t/1", True), game("react", "t/2", True, rendering="causal")])


def test_report_common_games_tabulates_the_shared_games_only(tmp_path):
    big, small = tmp_path / "raw.jsonl", tmp_path / "causal.jsonl"
    big.write_bytes(b"".join(orjson.dumps(game("cb-agent", f"t/{i}", i < 3)) + b"\n" for i in range(10)))
    small.write_bytes(b"".join(orjson.dumps(game("cb-agent", f"t/{i}", False, rendering="causal")) + b"\n"
                               for i in (0, 5)))
    res = CliRunner().invoke(main, ["report", str(big), str(small), "--common-games", "--markdown",
                                    str(tmp_path / "r.md"), "--chart", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    assert "2 games finished by every agent, 8 left out" in res.output
    text = (tmp_path / "r.md").read_text()
    assert "8 left out" in text and "| cb-agent | all | **1/2** |" in text and "| cb-agent (causal) | all | **0/2** |" in text


def test_running_time_counts_concurrent_episodes_once_and_skips_pauses():
    from agent_shell.reporting import running_time

    recs = [{"finished_at": 110.0, "wall_s": 10.0}, {"finished_at": 115.0, "wall_s": 10.0},  # two workers: 100-115
            {"finished_at": 112.0, "wall_s": 1.0},  # inside the two above
            {"finished_at": 1030.0, "wall_s": 30.0},  # a resumed segment after a pause
            {"wall_s": 5.0}]  # an older line without finished_at
    t = running_time(recs)
    assert (t.episodes, t.busy_s, t.span_s, t.untimed) == (4, 45.0, 930.0, 1)
    assert t.per_hour == pytest.approx(4 * 3600 / 45)
    assert math.isnan(running_time([{"wall_s": 1.0}]).per_hour)


def test_report_states_the_running_time(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [{**game("react", f"t/{i}", False), "finished_at": 1000.0 + 60 * i, "wall_s": 60.0} for i in range(3)]
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    res = CliRunner().invoke(main, ["report", str(path), "--markdown", str(tmp_path / "r.md"),
                                    "--chart", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    line = "3 episodes in 0.05 h while any episode ran (60.0 episodes per hour"
    assert line in res.output and line in (tmp_path / "r.md").read_text()


def test_report_rounds_counts_a_round_0_seeded_from_a_plain_run(tmp_path):
    # round 0's episodes come from `cb-agent run` (no concept_round), round 1's from improve
    base = {"agent": "cb-agent", "task_type": "fetch", "steps": 5, "think_steps": 0, "wall_s": 1.0,
            "distinct_actions": 3, "longest_cycle": {"span": 0}, "format_errors": 0}
    won0, won1 = [True, True, False, False], [True, False, True, False]
    runs = tmp_path / "run.jsonl", tmp_path / "round1.jsonl"
    runs[0].write_bytes(b"".join(orjson.dumps({**base, "task_id": f"g/{i}", "success": w}) + b"\n"
                                 for i, w in enumerate(won0)))
    runs[1].write_bytes(b"".join(orjson.dumps({**base, "task_id": f"g/{i}", "success": w, "concept_round": 1})
                                 + b"\n" for i, w in enumerate(won1)))
    line = {"schema": "cb-agent/improve-round-v1", "train_games": [], "won_games": [], "new_decisions": {},
            "in_expert_states": 0, "new_states": 0, "kept_last": False}
    rounds = tmp_path / "rounds.jsonl"
    rounds.write_bytes(b"".join(orjson.dumps({**line, "round": k}) + b"\n" for k in (0, 1)))
    md = tmp_path / "r.md"
    res = CliRunner().invoke(main, ["report", *map(str, runs), "--rounds", str(rounds), "--markdown", str(md),
                                    "--chart", str(tmp_path / "r.png")])
    assert res.exit_code == 0, res.output
    text = md.read_text()
    # 4 games each; game 1 only round 0 won, game 2 only round 1: one discordant game each way
    assert "| 0 | wins | - | 0 | 0 | 0 | - | - | 2/4 | 50.0% |" in text
    assert "| 1 | wins | 0/0 | 0 | 0 | 0 | - | 0 | 2/4 | 50.0% |" in text and "| 1 / 1 | 1 |" in text
