"""The repository describes the software and what was measured, never the people or the process that
built it: no working periods, no people who built or measured something, no tracker numbers, no dates
or clock times in prose.

Every text file of the repository is read (code, comments, docstrings, test names, scripts, docs,
configuration); a match is reported as ``path:line`` with the phrase and the rule it breaks. What is
exempt, and why:

* the results data under ``results/`` (tables, JSON and text that the commands wrote, with their
  recorded settings), which are data, not prose;
* ISO dates (``2026-12-01``) in a Markdown table row: the provenance tables (commit, date, machine,
  dtype, backbone) are where a figure's date belongs;
* a pytest or Ray session (a fixture's scope, a cluster's lifetime), which is a different thing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: folders never read: environments, caches, build outputs, runs, version control
SKIP_DIRS = {".git", ".venv", "venv", "site", "build", "dist", "runs", "__pycache__", ".pytest_cache",
             ".hypothesis", ".cache", ".whl", ".gl", "node_modules", ".mypy_cache", ".ruff_cache"}
#: what is read: source, scripts, docs and configuration
TEXT_SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".cff", ".txt", ".cfg", ".ini", ".json", ""}
#: results data files (written by the commands) are exempt; the scripts beside them are not
DATA_DIR = "results"
DATA_SUFFIXES = {".md", ".txt", ".json", ".jsonl", ".png", ".gz"}

MONTH = r"(?:January|February|March|April|May|June|July|August|September|October|November|December)"
CLOCK = r"(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d)?"

#: rule -> pattern (case-sensitive unless the pattern says otherwise)
RULES: dict[str, re.Pattern[str]] = {
    "a date in prose": re.compile(
        rf"\b\d{{1,2}}(?:st|nd|rd|th)?[ \t]+{MONTH}\b|\b{MONTH}[ \t]+\d{{1,2}}(?:st|nd|rd|th)?\b|\b{MONTH}[ \t]+\d{{4}}\b"
        rf"|\b(?:in|on|since|until|during|early|late|mid)[ \t]+{MONTH}\b"),
    "an ISO date outside a table": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a clock time": re.compile(rf"\b{CLOCK}[ \t]*(?:-|to|until)[ \t]*{CLOCK}\b|\b{CLOCK}[ \t]*(?:UTC|GMT|h\b)|\bUTC\b"),
    "a working period": re.compile(r"(?i)\b(?:working|work|coding|helper|previous|earlier|later|next|this|that|"
                                   r"same|another|other|one|each|every)[ \t]+sessions?\b|\bsessions\b|\bsession's\b"
                                   r"|\bworking period|\b(?:yesterday|last night|this morning|this afternoon"
                                   r"|this week|last week)\b"),
    "a person who built or measured": re.compile(r"(?i)\b(?:developers?|engineers?)\b|\b(?:[Ww]e|I)[ \t]+(?:measured|built"
                                                 r"|wrote|ran|found|fixed|tried|added|noticed|decided)\b"
                                                 r"|\b(?:measured|built|written|run|fixed) by (?:me|us)\b"),
    "a tracker number": re.compile(r"(?<![A-Za-z])[Ii]ssues?[ _#-]*#?\d+|\b(?:PR|pull request)[ \t]*#?\d+"
                                   r"|\btracker (?:numbers?|items?|#?\d+)|\bclosing note"),
}
#: a line that speaks of a pytest or Ray session (or an HTTP one) is no working period
SESSION_OK = re.compile(r"(?i)pytest|\bray\b|scope[ \t]*=[ \t]*[\"']session|whole session|per session|test session"
                        r"|session[- ]scoped|session fixture|requests\.session|http")


def offences(path: str, text: str) -> list[str]:
    """``path:line: 'phrase' (rule)`` for every phrase of ``text`` that a rule forbids."""
    found = []
    for rule, pattern in RULES.items():
        for match in pattern.finditer(text):
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            line = text[start:] if end < 0 else text[start:end]
            if rule == "an ISO date outside a table" and line.lstrip().startswith("|"):
                continue
            if rule == "a working period" and "session" in match.group(0).lower() and SESSION_OK.search(line):
                continue
            found.append((text.count("\n", 0, match.start()) + 1, f"{match.group(0)!r} ({rule})"))
    return [f"{path}:{number}: {what}" for number, what in sorted(found)]


def checked_files(root: Path = ROOT) -> list[Path]:
    """The repository's text files, results data and this file left out."""
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]) or not path.is_file():
            continue
        if path.suffix not in TEXT_SUFFIXES or (path.suffix == "" and path.parent.name != ".ci"):
            continue
        if rel.parts[0] == DATA_DIR and path.suffix in DATA_SUFFIXES:
            continue
        if path == Path(__file__).resolve():
            continue
        files.append(path)
    return files


def test_the_repository_speaks_of_the_software_not_of_who_built_it_or_when():
    files = checked_files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    found = [hit for p in files for hit in offences(str(p.relative_to(ROOT)), p.read_text(errors="replace"))]
    assert not found, ("describe what the software does and what was measured, not who did it or when "
                       "(a figure's date goes in a provenance table row):\n" + "\n".join(found))


@pytest.mark.parametrize("line", [
    "Measured on 2 December 2026 on the quiet machine.",
    "Made in November 2026.",
    "the first 30 games 08:05-09:56 (table1)",
    "finished at 19:33 UTC",
    "Measured 2026-12-01 on the two-core machine.",
    "as noted in an earlier session",
    "other developers' jobs",
    "we measured 1.49x",
    "see the issue-5 closing note",
    "def test_issue_12_fault():",
    "(tracker numbers gone)",
])
def test_each_rule_catches_its_phrase_and_names_file_and_line(line):
    text = "clean first line\n" + line
    hits = offences("docs/page.md", text)
    assert hits and all(h.startswith("docs/page.md:2: ") for h in hits)


@pytest.mark.parametrize("line", [
    "| Table 1 | 9b8f09a | 2026-12-01 | AMD | float32 | SmolLM2-135M-Instruct |",
    '@pytest.fixture(scope="session")',
    "Both parts run in one Ray session; the machine's load average is recorded.",
    "Shared fixtures: the model, loaded once per session in float32.",
    "x = values[10:20]",
    "ALFWorld's state tracker recognises a finished placement only by the word `put`.",
    "May the concept help: a 2-core machine, 24 GiB.",
    "the outcome of each action",
])
def test_allowed_lines_pass(line):
    assert offences("docs/page.md", line) == []
