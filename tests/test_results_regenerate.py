"""Every committed table regenerates, byte for byte, from the committed data: the tables of
``cb-agent report`` from the committed results files (``results/*.results.jsonl.gz``) with the
options of their line in ``scripts/make_results.sh``'s TABLES (the lines its targets and its
``tables`` target report with), and Table 4's data-size table from its committed JSON.

The reports run in this process (``cb-agent report`` through click) with the chart left out: the
Markdown is what is compared, and drawing 19 charts would triple the test's time."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent_shell.cli import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SCRIPT = ROOT / "scripts" / "make_results.sh"


def script_tables() -> dict[str, tuple[list[str], list[str]]]:
    """TABLES of the script: table -> (the results files it is reported from, report's options)."""
    block = re.search(r"^TABLES='\n(.*?)^'$", SCRIPT.read_text(), re.S | re.M)
    assert block, "scripts/make_results.sh has no TABLES block"
    tables = {}
    for line in block.group(1).splitlines():
        name, _, rest = line.partition(":")
        words = rest.split()
        tables[name] = ([w for w in words if not w.startswith("--")], [w for w in words if w.startswith("--")])
    return tables


TABLES = script_tables()
#: written by `cb-agent concept-data-size` (the script's table4 target) beside its JSON
DATA_SIZE = "table4_concept_data_size"


def test_every_committed_table_has_a_line_and_its_results_files_are_committed():
    assert sorted(p.stem for p in RESULTS.glob("*.md")) == sorted([*TABLES, DATA_SIZE])
    for name, (sources, options) in TABLES.items():
        assert sources and set(options) <= {"--paired", "--common-games", "--rounds"}, name
        assert all((RESULTS / f"{s}.results.jsonl.gz").is_file() for s in sources), name
        assert "--rounds" not in options or (RESULTS / f"{name}_rounds.jsonl").is_file(), name


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """name -> the committed results file decompressed (once per module)."""
    folder = tmp_path_factory.mktemp("results")
    out = {}
    for name in sorted({s for sources, _ in TABLES.values() for s in sources}):
        out[name] = folder / f"{name}.jsonl"
        out[name].write_bytes(gzip.decompress((RESULTS / f"{name}.results.jsonl.gz").read_bytes()))
    return out


def test_every_report_table_regenerates_from_its_committed_results_files(plain, tmp_path, monkeypatch):
    import agent_shell.charts

    charts = []
    monkeypatch.setattr(agent_shell.charts, "bar_chart", lambda rows, path, title: charts.append(path) or path)
    differ = []
    for name, (sources, options) in TABLES.items():
        out = tmp_path / f"{name}.md"
        options = [w for o in options for w in ([o, str(RESULTS / f"{name}_rounds.jsonl")] if o == "--rounds" else [o])]
        res = CliRunner().invoke(main, ["report", *(str(plain[s]) for s in sources), *options,
                                        "--markdown", str(out), "--chart", str(tmp_path / f"{name}.png")])
        assert res.exit_code == 0, (name, res.output, repr(res.exception))
        if out.read_text() != (RESULTS / f"{name}.md").read_text():
            differ.append(name)
    assert differ == []
    assert len(charts) == len(TABLES)  # the stub stood in for every chart


def test_the_data_size_table_regenerates_from_its_committed_json():
    from agent_shell.studies.concept_data import data_size_markdown

    table = json.loads((RESULTS / f"{DATA_SIZE}.json").read_text())
    assert data_size_markdown(table) == (RESULTS / f"{DATA_SIZE}.md").read_text()
