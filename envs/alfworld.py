"""ALFWorld (text engine) adapter: the real ALFWorld 0.4 game files played through TextWorld.

Games live in ``<data>/<split>/<task_type>-<Object>-<MovableRecep|None>-<Receptacle>-<scene>/trial_*/game.tw-pddl``
(data: the first folder of :func:`data_places` that holds a split: ``$CB_AGENT_ALFWORLD_DATA``, else
where ``alfworld-download`` puts them, ``$ALFWORLD_DATA/json_2.1.1`` (default
``~/.cache/alfworld/json_2.1.1``), else ``<repo root>/../shared/alfworld/json_2.1.1``). A task id is
that ``<folder>/<trial>`` path relative to the split directory.

The handcoded expert (and ALFWorld's own loader) read a ``traj_data.json`` beside the game file,
which the shared data does not ship. :func:`write_traj_data` rebuilds the fields they need from the
folder name into the cache (``$CB_AGENT_CACHE/alfworld/...``), next to a copy of the game file; the
shared folder is never written.

Quirks handled (ALFWorld 0.4.2):
- The put command is ``move X to Y``; older demos say ``put X in/on Y``, which :meth:`AlfworldEnv.step`
  rewrites to ``move X to Y`` (``info["rewritten_from"]`` records it).
- ``look``, ``inventory`` and ``help`` are in the admissible list; :meth:`candidates` keeps them
  (the environment-supplied set); the agent shell filters them (:data:`META_COMMANDS`) out of
  candidate sets and decision examples.
- An action the engine cannot execute answers ``Nothing happens.`` (``info["invalid"] = True``).
- ALFWorld 0.4.2's handcoded expert issues ``move X to Y`` but its state tracker still recognises a
  successful put only by the word ``put`` in the last command, so after the first placement it
  keeps believing it holds the object (it then fails most pick_two games). The adapter's
  :class:`_Expert04` hands the tracker the legacy spelling of the last command (``put X in/on Y``);
  the engine itself still receives ``move X to Y``.
- The handcoded expert answers ``look`` whenever its own choice is not admissible, and draws from
  Python's global ``random``; the adapter runs the engine under a private RNG state seeded from the
  task id so expert trajectories are reproducible and the caller's ``random`` is untouched.
- The handcoded expert runs inside every engine step of an episode reset with ``expert=True`` only
  (expert collection); an agent's episode never runs it. It gives up by raising (``Timeout`` after
  200 steps, ``HandCodedAgentFailed`` when its subgoals run out): the adapter turns that into "no
  expert action" (:attr:`AlfworldEnv.expert_gave_up` says why) instead of a failed engine step.
- Chained commands: the engine matches an input against its admissible commands as a whole, so
  ``go to desk 1 then go to bed 1`` (or with ``.``, ``,``, ``;``, `` and ``, a line break) is an
  invalid command (``Nothing happens.``) that changes nothing; no adapter guard is needed.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import re
import shutil
import zlib
from pathlib import Path

from cb_io.feedback import ALFWORLD_NOTHING
from cb_io.paths import cache_dir, shared_dir
from cb_io.records import SetupError, StepResult, TaskStart, one_line
from cb_io.storage import atomic_path
from envs.textworld import forget_registration

#: The six ALFWorld task types (the prefix of a game folder's name).
TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")
#: Admissible commands that never change the world; filter them out of decision candidate sets.
META_COMMANDS = ("look", "inventory", "help")
#: The ALFWorld package's data folder when ``$ALFWORLD_DATA`` is unset (``alfworld.info``'s default).
ALFWORLD_DEFAULT_DATA = "~/.cache/alfworld"
#: The engine's answer to an action it cannot execute (:data:`cb_io.feedback.ENGINE_FEEDBACK` has every engine's).
INVALID_FEEDBACK = ALFWORLD_NOTHING
_PUT = re.compile(r"^\s*put\s+(.+?)\s+(?:in/on|in|on)\s+(.+?)\s*$", re.IGNORECASE)
_TASK_MARK = "Your task is to:"


def data_places() -> list[tuple[str, Path]]:
    """Where ALFWorld's ``json_2.1.1`` folder is looked for, in order, as (how the place is named, path).

    ``$CB_AGENT_ALFWORLD_DATA`` (``~`` expanded), when set, is the only place: a folder named on
    purpose is never passed over for another copy. Otherwise: the ALFWorld package's own data folder,
    where ``alfworld-download`` writes (``$ALFWORLD_DATA/json_2.1.1``, default
    :data:`ALFWORLD_DEFAULT_DATA` ``/json_2.1.1``, as ``alfworld.info`` reads it), then the folder
    beside the checkout (``<repo root>/../shared/alfworld/json_2.1.1``).
    """
    override = os.environ.get("CB_AGENT_ALFWORLD_DATA")
    if override:
        return [("$CB_AGENT_ALFWORLD_DATA", Path(override).expanduser())]
    package = os.environ.get("ALFWORLD_DATA")
    return [("$ALFWORLD_DATA/json_2.1.1" if package else "ALFWorld's default ($ALFWORLD_DATA unset)",
             Path(package or ALFWORLD_DEFAULT_DATA).expanduser() / "json_2.1.1"),
            ("beside the checkout", shared_dir() / "alfworld" / "json_2.1.1")]


def holds_games(folder: Path) -> bool:
    """Whether ``folder`` is a ``json_2.1.1`` folder: it holds a split folder (:data:`SPLITS`)."""
    return any((folder / split).is_dir() for split in SPLITS)


def find_data_dir(places: list[tuple[str, Path]] | None = None) -> Path:
    """The first of ``places`` (default :func:`data_places`) that :func:`holds_games`.

    Raises:
        cb_io.records.SetupError: none does; one line listing every place looked in and the command that
            downloads the files.
    """
    places = data_places() if places is None else places
    for _, folder in places:
        if holds_games(folder):
            return folder
    looked = "; ".join(f"{name}: {folder}" for name, folder in places)
    raise SetupError(
        f"ALFWorld game files not found (looked in {looked}); download them with `alfworld-download` "
        "(into $ALFWORLD_DATA, default ~/.cache/alfworld) or set CB_AGENT_ALFWORLD_DATA to a json_2.1.1 "
        "folder (the one holding train/ and valid_unseen/)"
    )


def parse_task_folder(folder: str) -> dict:
    """The ``traj_data.json`` fields the handcoded expert needs, from a game folder's name.

    ``look_at_obj_in_light-AlarmClock-None-DeskLamp-308`` gives task_type
    ``look_at_obj_in_light`` and pddl_params ``object_target="AlarmClock"``,
    ``toggle_target="DeskLamp"`` (for this type the lamp is the toggle target, not a parent),
    ``parent_target=""``, ``mrecep_target=""``, ``object_sliced=False``.

    Raises:
        ValueError: a name that is not ``<task_type>-<Object>-<MRecep|None>-<Receptacle>-<scene>``.
    """
    parts = folder.split("-")
    if len(parts) != 5 or not parts[4].isdigit():
        raise ValueError(f"ALFWorld game folder {folder!r} is not <task_type>-<Object>-<MRecep|None>-<Receptacle>-<scene>")
    task_type, obj, mrecep, recep, _scene = parts
    sliced = obj.endswith("Sliced")
    params = {
        "object_target": obj[: -len("Sliced")] if sliced else obj,
        "parent_target": "" if task_type == "look_at_obj_in_light" else recep,
        "toggle_target": recep if task_type == "look_at_obj_in_light" else "",
        "mrecep_target": "" if mrecep == "None" else mrecep,
        "object_sliced": sliced,
    }
    return {"task_type": task_type, "pddl_params": params}


def write_traj_data(game_file: Path, task_folder: str, target_dir: Path) -> Path:
    """Copy ``game_file`` into ``target_dir`` with a generated ``traj_data.json`` beside it.

    Both files are written atomically (:func:`cb_io.storage.atomic_path`), so concurrent or
    interrupted runs never leave a half file. Returns the cached game file path.
    """
    target_dir.mkdir(parents=True, exist_ok=True)
    cached_game = target_dir / "game.tw-pddl"
    if not cached_game.exists() or cached_game.stat().st_size != game_file.stat().st_size:
        with atomic_path(cached_game) as tmp:
            shutil.copyfile(game_file, tmp)
    traj = target_dir / "traj_data.json"
    content = json.dumps(parse_task_folder(task_folder), sort_keys=True)
    if not traj.exists() or traj.read_text() != content:
        with atomic_path(traj) as tmp:
            Path(tmp).write_text(content)
    return cached_game


_MOVE = re.compile(r"^\s*move\s+(.+?)\s+to\s+(.+?)\s*$", re.IGNORECASE)


def legacy_put(action: str) -> str:
    """The pre-0.4 spelling of a put: ``move X to Y`` -> ``put X in/on Y`` (other actions unchanged)."""
    m = _MOVE.match(action)
    return f"put {m.group(1)} in/on {m.group(2)}" if m else action


def normalize_action(action: str) -> str:
    """ALFWorld 0.4 spelling of an action: ``put X in/on Y`` -> ``move X to Y``; blanks trimmed."""
    m = _PUT.match(action)
    return f"move {m.group(1)} to {m.group(2)}" if m else action.strip()


class AlfworldEnv:
    """The ALFWorld text benchmark behind :class:`envs.protocol.Environment`.

    Args:
        data_dir: the ``json_2.1.1`` folder (default: found by :func:`find_data_dir`).
        expert: ``"handcoded"`` (ALFWorld's rule-based expert, used for demonstrations) or None.

    Raises:
        cb_io.records.SetupError: no game files in ``data_dir``, or in none of :func:`data_places` (the
            message lists the places and how to get the files).
    """

    name = "alfworld"
    #: The engine's modules, imported before an episode's clock starts (:func:`envs.episode.import_engines`).
    ENGINE_MODULES = ("textworld", "textworld.gym", "alfworld.agents.environment.alfred_tw_env")
    default_max_steps = 50
    expert_name = "alfworld-handcoded"
    #: The handcoded expert runs along any episode (its own memory of what it has seen): it answers
    #: from every state an episode reset with ``expert=True`` reaches, until it gives up.
    expert_labels_any_state = True

    def __init__(self, data_dir: str | os.PathLike | None = None, expert: str | None = "handcoded"):
        places = None if data_dir is None else [("data_dir", Path(data_dir))]
        self.data_dir = find_data_dir(places)
        if expert not in ("handcoded", None):
            raise ValueError(f"expert must be 'handcoded' or None, got {expert!r}")
        self.expert = expert
        self._index: dict[str, dict[str, Path]] = {}
        self._gym = None
        self._env_id: str | None = None  # our entry in textworld's gym registry
        self._task_id: str | None = None
        self._infos: dict = {}
        self._rng_state = None
        self._won = False
        self._done = False
        self._expert_wrapper = None
        self._expert_on = False

    # ---------------------------------------------------------------- tasks
    @property
    def splits(self) -> tuple[str, ...]:
        """The splits present under :attr:`data_dir` (of train, valid_seen, valid_unseen)."""
        return tuple(s for s in SPLITS if (self.data_dir / s).is_dir())

    def _split_index(self, split: str) -> dict[str, Path]:
        if split not in self._index:
            root = self.data_dir / split
            if split not in SPLITS or not root.is_dir():
                raise ValueError(f"unknown ALFWorld split {split!r}; available under {self.data_dir}: {list(self.splits)}")
            games = {p.parent.relative_to(root).as_posix(): p for p in root.glob("*/*/game.tw-pddl")}
            self._index[split] = dict(sorted(games.items()))
        return self._index[split]

    def tasks(self, split: str) -> list[str]:
        """Sorted task ids (``<folder>/<trial>``) of ``split`` (train, valid_seen, valid_unseen)."""
        return list(self._split_index(split))

    def task_type_of(self, task_id: str) -> str:
        """The task type (folder-name prefix) of ``task_id``, without loading the game."""
        task_type = task_id.split("/", 1)[0].split("-", 1)[0]
        if task_type not in TASK_TYPES:
            raise ValueError(f"ALFWorld task {task_id!r} has unknown task type {task_type!r}; "
                             f"known: {', '.join(TASK_TYPES)}")
        return task_type

    def split_of(self, task_id: str) -> str:
        """The split whose folder holds game ``task_id`` (no engine is started).

        Raises:
            ValueError: no split holds it; one line with the id, the splits' sizes, the id pattern and
                the closest existing id when one is close.
        """
        return self._locate(task_id)[0]

    def _locate(self, task_id: str) -> tuple[str, Path]:
        splits = self.splits
        for split in splits:
            path = self._split_index(split).get(task_id)
            if path is not None:
                return split, path
        known = [t for s in splits for t in self._split_index(s)]
        close = difflib.get_close_matches(task_id, known, n=1, cutoff=0.8)
        sizes = ", ".join(f"{s} {len(self._split_index(s))}" for s in splits)
        raise ValueError(f"unknown ALFWorld task {task_id!r}: no such game under {self.data_dir} ({sizes} games, "
                         "ids '<type>-<Object>-<MRecep|None>-<Receptacle>-<scene>/trial_*')"
                         + (f"; closest: {close[0]!r}" if close else ""))

    # ---------------------------------------------------------------- engine
    def _engine(self, call, *args):
        """Run an engine call under this task's private RNG state (the expert uses ``random``)."""
        outer = random.getstate()
        random.setstate(self._rng_state)
        try:
            return call(*args)
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    @property
    def expert_gave_up(self) -> str | None:
        """Why the handcoded expert stopped in this episode (its exception, one line), else None."""
        return None if self._expert_wrapper is None else self._expert_wrapper.gave_up

    def reset(self, task_id: str, expert: bool = False) -> TaskStart:
        """Start game ``task_id``; ``expert=True`` runs the handcoded expert along (see module doc)."""
        import textworld
        import textworld.gym
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos

        split, game_file = self._locate(task_id)
        if task_id != self._task_id:
            self._close_gym()
            cached = write_traj_data(game_file, task_id.split("/", 1)[0], cache_dir("alfworld", "json_2.1.1", split, task_id))
            extras = ["gamefile"] + (["expert_plan"] if self.expert else [])
            infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=extras)
            wrappers = [AlfredDemangler(shuffle=False), AlfredInfos]
            self._expert_wrapper = None
            if self.expert:
                self._expert_wrapper = _expert_wrapper(AlfredExpert)(expert_type=self.expert)
                wrappers.append(self._expert_wrapper)
            self._env_id = textworld.gym.register_game(str(cached), infos, max_episode_steps=1_000_000,
                                                       wrappers=wrappers)
            self._gym = textworld.gym.make(self._env_id)
            self._task_id = task_id
        rng = random.Random(zlib.crc32(task_id.encode()))
        self._rng_state = rng.getstate()
        self._expert_on = bool(expert and self._expert_wrapper is not None)
        if self._expert_wrapper is not None:
            self._expert_wrapper.active = self._expert_on
        obs, self._infos = self._engine(self._gym.reset)
        self._won = self._done = False
        instruction, observation = self._split_intro(obs)
        return TaskStart(task_id, self.task_type_of(task_id), instruction, observation)

    @staticmethod
    def _split_intro(obs: str) -> tuple[str, str]:
        body = obs.split("=-", 1)[1] if obs.lstrip().startswith("-=") else obs
        head, mark, goal = body.partition(_TASK_MARK)
        if not mark:
            raise ValueError(f"ALFWorld intro lacks {_TASK_MARK!r}: {obs[:200]!r}")
        return f"{mark} {goal.strip()}", head.strip()

    def step(self, action: str) -> StepResult:
        if self._gym is None:
            raise RuntimeError("AlfworldEnv.step before reset")
        info: dict = {}
        command = normalize_action(action)
        if command != action:
            info["rewritten_from"] = action
        obs, score, done, self._infos = self._engine(self._gym.step, command)
        self._won = self._won or bool(self._infos.get("won"))
        self._done = self._done or bool(done) or self._won
        if obs.strip() == INVALID_FEEDBACK:
            info["invalid"] = True
        return StepResult(obs, done=self._done, won=self._won, score=float(self._won), info=info)

    def candidates(self) -> list[str]:
        return list(self._infos.get("admissible_commands") or [])

    def expert_action(self) -> str | None:
        """The handcoded expert's next command (None: reset without expert, episode over, or it gave up)."""
        plan = self._infos.get("extra.expert_plan") if self._expert_on else None
        return plan[0] if plan and not self._done else None

    def config(self) -> dict:
        """Provenance stored in trajectory metadata."""
        return {"data_dir": str(self.data_dir), "expert": self.expert, "alfworld": _version("alfworld")}

    def _close_gym(self) -> None:
        if self._gym is not None:
            self._gym.close()
        # textworld's module-level registry keeps every registered game with its wrappers (ours,
        # which hold the whole env chain: game, PDDL state, expert): drop ours with the game
        forget_registration(self._env_id)
        self._gym, self._task_id, self._infos, self._env_id = None, None, {}, None
        self._expert_wrapper = None

    def close(self) -> None:
        self._close_gym()


def _expert_wrapper(base):
    """ALFWorld's ``AlfredExpert`` that runs only while ``active`` (episodes reset with ``expert=True``),
    whose handcoded tracker sees ``put X in/on Y`` for ``move X to Y``, and that gives up instead of
    raising (``gave_up`` holds the reason)."""

    class _Expert04(base):
        active = False
        gave_up: str | None = None

        def reset(self):
            self.gave_up = None
            return super().reset()

        def _gather_infos(self):
            if not self.active or self.gave_up is not None:
                self.state["extra.expert_plan"] = []
                return
            self.prev_command = legacy_put(self.prev_command)
            try:
                super()._gather_infos()
            except Exception as err:  # its Timeout after 200 steps, HandCodedAgentFailed, ...
                self.gave_up = one_line(err)
                self.state["extra.expert_plan"] = []

    return _Expert04


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)
