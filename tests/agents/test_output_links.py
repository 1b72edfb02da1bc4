"""Output files never write through a link: charts and tables replace the link (its target stays as
it was), and a results file that is a link, or holds something other than episode records, is
refused with one line before anything is played or stored."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

import agent_shell.lm
import envs
from agent_doubles import FakeLM, ScriptedEnv
from agent_shell.cli import main
from test_runner import kill_reply, kill_run_args

ELSEWHERE = b"a file of someone else's, not to be touched\n"


def _episode(agent: str, task_id: str, success: bool) -> dict:
    return {"agent": agent, "task_id": task_id, "task_type": task_id.split("/")[0], "success": success, "steps": 4,
            "think_steps": 0, "wall_s": 2.0, "distinct_actions": 3, "longest_cycle": {"span": 0}, "budget": 10,
            "trials": []}


def _link(tmp_path, name: str):
    """``<tmp>/out/<name>``, a link to ``<tmp>/elsewhere/<name>`` (which holds :data:`ELSEWHERE`)."""
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(ELSEWHERE)
    link = tmp_path / "out" / name
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(target)
    return link, target


def test_report_replaces_a_linked_chart_and_table_and_leaves_their_targets_alone(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_bytes(b"".join(orjson.dumps(_episode("react", f"fetch/{i}", i < 2)) + b"\n" for i in range(3)))
    chart, chart_target = _link(tmp_path, "results.png")
    table, table_target = _link(tmp_path, "results.md")
    res = CliRunner().invoke(main, ["report", str(results), "--chart", str(chart), "--markdown", str(table)])
    assert res.exit_code == 0, res.output
    assert chart_target.read_bytes() == ELSEWHERE and table_target.read_bytes() == ELSEWHERE
    assert not chart.is_symlink() and chart.read_bytes().startswith(b"\x89PNG\r\n")
    assert not table.is_symlink() and "| react | all | **2/3** |" in table.read_text()
    assert sorted(p.name for p in chart.parent.iterdir()) == ["results.md", "results.png"]  # no temp files left


def test_a_chart_path_without_a_suffix_is_a_png(tmp_path):
    from agent_shell.charts import bar_chart
    from agent_shell.reporting import summarize

    path = bar_chart(summarize([_episode("react", "fetch/1", True)]), tmp_path / "chart")
    assert path == tmp_path / "chart" and path.read_bytes().startswith(b"\x89PNG\r\n")
    assert [p.name for p in tmp_path.iterdir()] == ["chart"]


def test_a_linked_results_file_is_refused_before_anything_is_stored(tmp_path):
    from agent_shell.results import check_results_file, store_record

    link, target = _link(tmp_path, "results.jsonl")
    for call in (lambda: check_results_file(link, ["react"], ["fetch/1"], True, {}),
                 lambda: store_record(link, _episode("react", "fetch/1", True))):
        with pytest.raises(ValueError, match=rf"^{link} is a symbolic link \(to {target}\); an output is never written"):
            call()
    assert target.read_bytes() == ELSEWHERE and link.is_symlink()


@pytest.mark.parametrize("first", [b'{"study": "probe", "item": "a/1"}\n', b"hidden,log_q\n"])
def test_a_results_file_whose_first_line_is_no_episode_record_is_refused(tmp_path, first):
    from agent_shell.results import check_results_file, store_record

    path = tmp_path / "results.jsonl"
    path.write_bytes(first + orjson.dumps(_episode("react", "fetch/1", True)) + b"\n")
    for call in (lambda: check_results_file(path, ["react"], ["fetch/2"], True, {}),
                 lambda: store_record(path, _episode("react", "fetch/2", True))):
        with pytest.raises(ValueError, match=rf"^{path}: line 1 is not one of its episodes \(.*\); refusing to append"):
            call()
    assert path.read_bytes().startswith(first) and path.read_bytes().count(b"\n") == 2


def test_run_into_a_folder_whose_results_file_is_a_link_stops_in_one_line(tmp_path, monkeypatch):
    """`cb-agent run --resume` with results.jsonl a link to an unrelated file: one line, nothing
    loaded or played, the unrelated file untouched."""
    out = tmp_path / "out"
    link, target = _link(tmp_path, "results.jsonl")
    loads = []
    monkeypatch.setenv("CB_AGENT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "make_env", lambda name, **kw: ScriptedEnv(expert_looks=True))
    monkeypatch.setattr(agent_shell.lm, "load_language_model", lambda *a, **k: loads.append(1) or FakeLM(kill_reply))
    res = CliRunner().invoke(main, kill_run_args(out))
    assert res.exit_code == 1, res.output
    (line,) = res.output.strip().splitlines()
    assert line.startswith(f"Error: {link} is a symbolic link (to {target})") and loads == []
    assert target.read_bytes() == ELSEWHERE
