"""The packages' import graph has no circle, counting every import: module-level ones, those under
``if TYPE_CHECKING:`` and those inside functions; reading results imports no agent; and the agent
shell imports the games (``envs``) only where it plays one, reading the records (``cb_io.records``)
everywhere else."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_shell", "cb_core", "cb_io", "envs")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours ``path`` imports anywhere in its text (``from package import name``
    counts as the submodule ``package.name`` when there is one, else as ``package``)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else resolve(node.module))
    return {m for m in found if m is not None}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_circle_closed_only_by_a_type_checking_import(tmp_path):
    """The detector itself: a circle whose one edge is under TYPE_CHECKING and another inside a
    function is found."""
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    known = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert circles({m: imports(p, known) - {m} for m, p in known.items()}) == [["a", "b"]]


def test_no_import_circle_even_counting_type_checking_and_in_function_imports():
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    assert circles(graph) == []


def test_reading_results_imports_no_agent_and_nothing_that_builds_from_the_settings():
    """Reading results may name the recorded settings (the settings module, beneath the agents),
    but loads no agent, no calibrator and not the layer that builds from the settings."""
    code = ("import sys, agent_shell.results\n"
            "print(sorted(m for m in sys.modules if m.startswith(('agent_shell.agents', 'agent_shell.configure', "
            "'agent_shell.calibration', 'agent_shell.lm', 'agent_shell.features', 'envs'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


#: What the settings module (:mod:`agent_shell.run_config`) must never import, at any depth: the
#: agents, the results reader, the feature extractors, the LM layer, ICAL, the layers that build
#: from the settings, and the games (a name stands for the module and everything under it).
ABOVE_THE_SETTINGS = ("agent_shell.agents", "agent_shell.results", "agent_shell.features", "agent_shell.lm",
                      "agent_shell.ical", "agent_shell.configure", "agent_shell.pipeline", "agent_shell.commands",
                      "envs")


def reached(start: str, known: dict[str, Path]) -> set[str]:
    """Every module of ours that ``start`` imports, directly or through others (each import counted
    wherever it stands: module level, under TYPE_CHECKING, inside a function)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for found in imports(known[todo.pop()], known):
            if found not in seen and found != start:
                seen.add(found)
                todo.append(found)
    return seen


def test_the_walk_reaches_an_import_two_levels_down_under_type_checking_and_in_a_function(tmp_path):
    """The walker itself: settings -> helper (in a function) -> agents (under TYPE_CHECKING) is seen."""
    (tmp_path / "settings.py").write_text("def f():\n    import helper\n")
    (tmp_path / "helper.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import agents\n")
    (tmp_path / "agents.py").write_text("")
    known = {name: tmp_path / f"{name}.py" for name in ("settings", "helper", "agents")}
    assert reached("settings", known) == {"helper", "agents"}
    assert under("agents", ("agents",))


def test_the_settings_import_no_agent_results_features_lm_nor_games():
    """The run's settings are a plain value beneath the agents: nothing the settings module
    imports, however deep, is an agent, the results reader, a feature extractor, an LM backend,
    ICAL, the layer that builds from the settings, a command or a game."""
    known = modules()
    found = reached("agent_shell.run_config", known)
    offenders = sorted(m for m in found if under(m, ABOVE_THE_SETTINGS))
    assert offenders == [], f"the settings module reaches {offenders}: move that work to agent_shell.configure"
    assert found <= {"agent_shell", "agent_shell.history", "cb_io", "cb_io.records", "cb_io.storage"}, found


def test_files_records_and_numerics_import_no_other_layer():
    """cb_io (the files and the records beneath the games and the agents) and cb_core import
    nothing else of the project (the LM layer's import of no game: the tests below)."""
    known = modules()
    for name, path in known.items():
        found = imports(path, known)
        if name.split(".")[0] in ("cb_io", "cb_core"):
            assert {m.split(".")[0] for m in found} <= {name.split(".")[0]}, (name, found)


#: The modules of the agent shell that play a game (or make the environment one is played on), and
#: so may import the games (``envs``), each with what it plays. Every other module reads the records
#: beneath both (:mod:`cb_io.records`) and never imports the games.
PLAYS_GAMES = {
    "agent_shell.scheduler": "the episode runner of a run: plays each (agent, game) episode",
    "agent_shell.parallel": "the scheduler's Ray executor: each actor makes its environment and plays jobs",
    "agent_shell.configure": "the run's environment: its default split, task checks and selection",
    "agent_shell.pipeline": "makes the environment, checks the task ids, collects the demonstrations",
    "agent_shell.feature_pool": "makes the environment whose expert trajectories it pools",
    "agent_shell.demos": "collects a missing expert demonstration by letting the expert play",
    "agent_shell.improve": "makes the environment and plays each round's games",
    "agent_shell.improve_rounds": "chooses each round's training games from the environment's split",
    "agent_shell.improve_labels": "replays each training episode with the expert alongside to label its states",
    "agent_shell.calibration.expert_distance": "replays a recorded prefix and lets the expert play on",
    "agent_shell.studies.recovery": "restores an episode at a recorded step and plays on",
    "agent_shell.studies.recorded": "plays a study's cells under the episode runner's wall-clock rule",
    "agent_shell.ical.execution": "executes an ICAL program in the game",
    "agent_shell.ical.constrained": "plays the scratch game of constrained decoding",
    "agent_shell.ical.noisy": "plays the noisy trajectories",
    "agent_shell.ical.learn": "replays a record and plays ICAL's games within their time limit",
    "agent_shell.commands._common": "the shared options: the environment names and the episode time limit",
    "agent_shell.commands._ical": "makes the environment of the ical commands",
    "agent_shell.commands._study": "makes the environment of a study",
    "agent_shell.commands.calibrate": "makes the environment of the labelling study",
    "agent_shell.commands.collect": "makes the environment and collects expert trajectories",
    "agent_shell.commands.concepts_tsne": "makes the environment of the concept pool",
    "agent_shell.commands.eval_decisions": "makes the environment whose decisions it scores",
    "agent_shell.commands.ical": "makes the environment of ICAL's learning and acting",
    "agent_shell.commands.improve": "makes the environment of the improve loop",
    "agent_shell.commands.run": "makes the environment of a run",
    "agent_shell.commands.tasks": "makes the environment whose tasks it lists",
}

#: What reads the records only, whatever the list above says: the agents, the feature extractors,
#: the LM layer, the decision scorer, the renderings and contexts, and calibration (a name stands
#: for the module and everything under it).
READS_RECORDS_ONLY = ("agent_shell.agents", "agent_shell.features", "agent_shell.lm", "agent_shell.embeddings",
                      "agent_shell.decision_scorer", "agent_shell.history", "agent_shell.context",
                      "agent_shell.candidates", "agent_shell.calibration")


def game_importers(known: dict[str, Path], shell: str = "agent_shell", games: str = "envs") -> dict[str, set[str]]:
    """The modules of ``shell`` that import anything of ``games`` anywhere in their text, and what."""
    out = {}
    for name, path in known.items():
        if name.split(".")[0] == shell:
            found = {m for m in imports(path, known) if m.split(".")[0] == games}
            if found:
                out[name] = found
    return out


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_finder_sees_a_game_imported_only_for_type_checking_or_inside_a_function(tmp_path):
    """The walker itself: an agent module that names the games only under TYPE_CHECKING, and one
    that imports them inside a function, are both game importers; a records reader is not."""
    for package in ("shell", "shell/agents", "games", "records"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "games" / "episode.py").write_text("class Episode: ...\n")
    (tmp_path / "records" / "steps.py").write_text("class Step: ...\n")
    (tmp_path / "shell" / "agents" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from games.episode import Episode\n")
    (tmp_path / "shell" / "agents" / "late.py").write_text("def play():\n    import games\n")
    (tmp_path / "shell" / "reader.py").write_text("from records.steps import Step\n")
    known = {}
    for path in tmp_path.rglob("*.py"):
        parts = path.relative_to(tmp_path).with_suffix("").parts
        known[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found = game_importers(known, "shell", "games")
    assert found == {"shell.agents.typed": {"games.episode"}, "shell.agents.late": {"games"}}
    assert under("shell.agents.typed", ("shell.agents",)) and not under("shell.agentsx", ("shell.agents",))


def test_only_the_modules_that_play_a_game_import_the_games():
    """Every module of the agent shell that imports ``envs`` (module level, TYPE_CHECKING or in a
    function) is listed in PLAYS_GAMES with what it plays, and every listed module still does."""
    importers = game_importers(modules())
    unlisted = {m: sorted(f) for m, f in importers.items() if m not in PLAYS_GAMES}
    assert not unlisted, f"import the records (cb_io.records), not the games, or list what it plays: {unlisted}"
    stale = sorted(set(PLAYS_GAMES) - set(importers))
    assert not stale, f"no longer imports envs: drop from PLAYS_GAMES: {stale}"


def test_agents_features_lm_scorer_renderings_and_calibration_import_no_game():
    """The agents, feature extractors, LM layer, decision scorer, renderings, contexts and the
    calibrator read the records only; the one listed exception is the judge that replays games."""
    importers = game_importers(modules())
    offenders = {m: sorted(f) for m, f in importers.items() if under(m, READS_RECORDS_ONLY)}
    assert offenders == {"agent_shell.calibration.expert_distance": ["envs.episode", "envs.protocol"]}
    assert {m for m in PLAYS_GAMES if under(m, READS_RECORDS_ONLY)} == {"agent_shell.calibration.expert_distance"}


def imported_names(path: Path) -> set[str]:
    """Every dotted name ``path`` imports anywhere in its text: ``import a.b`` gives ``a.b``, ``from
    a import b`` gives ``a.b`` (module level, under TYPE_CHECKING, inside functions alike)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


#: What the LM layer may import of cb_core: the shared numerics it runs, named (the concept is not
#: among them: a decision head is handed to the backends, agent_shell.lm.protocol.DecisionHead).
LM_USES_OF_CB_CORE = {
    "cb_core.cache.call_compiled": "the executable store the JAX programs go through",
    "cb_core.mesh.AXIS": "the mesh's one axis, shared by the backbone's layout and the fits",
    "cb_core.mesh.device_mesh": "one mesh over the devices named, the backbone's and its concepts' fits",
    "cb_core.mesh.sharding": "an array's layout on that mesh (one axis split, or none)",
    "cb_core.cache": "imported before JAX starts a platform: importing cb_core sets JAX's memory settings",
}


def test_the_finder_sees_every_kind_of_import_of_a_name(tmp_path):
    (tmp_path / "m.py").write_text("from typing import TYPE_CHECKING\nimport cb_core\nif TYPE_CHECKING:\n"
                                   "    from cb_core import Concept\ndef f():\n    from cb_core.concept import X\n")
    assert imported_names(tmp_path / "m.py") >= {"cb_core", "cb_core.Concept", "cb_core.concept.X"}


def test_the_lm_layer_imports_no_concept_and_its_protocol_nothing_of_cb_core():
    """No module under agent_shell.lm imports cb_core's concept (nor cb_core as a whole), whatever
    the kind of import; the protocol module imports nothing of cb_core; what the layer does import
    of cb_core is the named numerics of LM_USES_OF_CB_CORE."""
    lm = ROOT / "agent_shell" / "lm"
    uses = {}
    for path in sorted(lm.rglob("*.py")):
        names = {n for n in imported_names(path) if n == "cb_core" or n.startswith("cb_core.")}
        concept = {n for n in names if n in ("cb_core", "cb_core.Concept") or n.startswith("cb_core.concept")}
        assert not concept, f"{path.name} imports the concept: {sorted(concept)}"
        uses.update({n: path.name for n in names})
    assert not {n for n in imported_names(lm / "protocol.py") if n.split(".")[0] == "cb_core"}
    assert set(uses) <= set(LM_USES_OF_CB_CORE), sorted(set(uses) - set(LM_USES_OF_CB_CORE))
