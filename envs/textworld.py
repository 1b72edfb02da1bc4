"""TextWorld adapter: games generated offline with ``tw-make``, seeded and cached; walkthrough demos.

A task id is ``<kind>/<split>/<seed>`` (``cooking/train/3``); the task type is the kind, one of
:data:`GAMES` (kind -> ``tw-make`` game and flags):

- ``cooking``: ``tw-make tw-cooking`` (the First TextWorld Problems games) with
  :data:`COOKING_FLAGS`; the game's own food split follows ours (``--split train`` / ``--split test``).
- ``custom``: ``tw-make custom`` with :data:`CUSTOM_FLAGS`.
- ``cooking-1`` .. ``cooking-3`` and ``custom-1`` .. ``custom-3``: easier levels of the same two
  generators (fewer rooms, ingredients, objects and a shorter quest; :data:`GAMES` has the flags),
  ordered by difficulty, for finding where a small backbone is above the floor. ``cooking`` and
  ``custom`` are the hardest level of each.

Train and test use disjoint seed ranges (train ``train_seed0 ..``, test ``test_seed0 ..``;
checked at construction). A game is generated on first use into
``$CB_AGENT_CACHE/textworld/<kind>/<split>/`` (written to a temp folder, then moved into place,
so an interrupted generation never leaves a half game) and reused afterwards. Generation needs
no network (about 3 to 10 s of CPU a game).

Candidates are TextWorld's admissible commands. The expert (episodes reset with ``expert=True``;
``expert_action()`` is None in the others) is the game's walkthrough while the episode follows it,
so the demonstrations are the walkthroughs; after a deviation it is the first of TextWorld's
``policy_commands``, the winning policy from the current state (tracked only in expert episodes:
the game is registered with ``EnvInfos(policy_commands=True)`` then), None when the game is lost
or over. So it answers from any state (``expert_labels_any_state``) where TextWorld finds a
winning policy: on the levels (``cooking-1`` .. ``custom-3``) it does; on the hardest ``cooking``
games it finds none, and off the walkthrough the expert answers None there.

One input is one command. The games' Inform 7 parser runs several commands from one input when they
are separated by ``then``, a full stop or a line break (``go south then go east``), but TextWorld's
state tracker sees only the first one's events, so its admissible commands (our candidate set) would
describe a room the player has left for the rest of the episode. :func:`split_commands` finds such
inputs and :meth:`TextWorldEnv.step` answers them as the parser answers an input it cannot read
(:data:`CHAINED_FEEDBACK`, ``info["invalid"]``, ``info["chained"]`` = the commands) without sending
anything to the engine: one step is never two engine commands. ``,``/`` and `` joins objects, not
commands, in this parser (``take glass and fly larva`` is one tracked command), and ``;`` is no
separator (the parser answers both itself).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from cb_io.feedback import TEXTWORLD_NOT_UNDERSTOOD
from cb_io.paths import cache_dir
from cb_io.records import StepResult, TaskStart

SPLITS = ("train", "test")
COOKING_FLAGS = ("--recipe", "3", "--take", "2", "--go", "6", "--open", "--cook", "--cut", "--drop")
CUSTOM_FLAGS = ("--world-size", "5", "--nb-objects", "10", "--quest-length", "5")
#: Game kind -> (``tw-make`` game, its flags). The numbered kinds are easier levels (1 easiest);
#: ``tw-cooking --go`` takes 1, 6, 9 or 12 rooms.
GAMES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cooking": ("tw-cooking", COOKING_FLAGS),
    "custom": ("custom", CUSTOM_FLAGS),
    "cooking-1": ("tw-cooking", ("--recipe", "1", "--take", "1", "--go", "1")),
    "cooking-2": ("tw-cooking", ("--recipe", "1", "--take", "1", "--go", "6", "--open")),
    "cooking-3": ("tw-cooking", ("--recipe", "2", "--take", "2", "--go", "6", "--open", "--cut")),
    "custom-1": ("custom", ("--world-size", "1", "--nb-objects", "3", "--quest-length", "1")),
    "custom-2": ("custom", ("--world-size", "2", "--nb-objects", "4", "--quest-length", "2")),
    "custom-3": ("custom", ("--world-size", "3", "--nb-objects", "6", "--quest-length", "3")),
}
#: Every kind, in listing order (the two original kinds first, so default slices stay theirs).
KINDS = tuple(GAMES)
#: The parser's own answer to an input it cannot read; given to an input that chains commands.
CHAINED_FEEDBACK = TEXTWORLD_NOT_UNDERSTOOD
_SEPARATOR = re.compile(r"\bthen\b|\.|\n|\r", re.IGNORECASE)


def split_commands(text: str) -> list[str]:
    """The commands Inform 7 would run for ``text``: split at ``then``, full stops and line breaks,
    blanks trimmed, empty pieces dropped (``"go south."`` is one command, ``"go south then go east"``
    two)."""
    return [part.strip() for part in _SEPARATOR.split(text) if part.strip()]


def tw_make_command(kind: str, split: str, seed: int, output: Path) -> list[str]:
    """The ``tw-make`` command line that generates game ``kind/split/seed`` at ``output`` (.z8)."""
    tw_make = Path(sys.executable).parent / "tw-make"
    exe = [str(tw_make)] if tw_make.exists() else [shutil.which("tw-make") or "tw-make"]
    if kind not in GAMES:
        raise ValueError(f"unknown TextWorld game kind {kind!r}; known: {list(KINDS)}")
    generator, flags = GAMES[kind]
    game = [generator, *flags] + (["--split", split] if generator == "tw-cooking" else [])
    return [*exe, *game, "--seed", str(seed), "--output", str(output), "-f", "--silent"]


def generate_game(kind: str, split: str, seed: int, timeout_s: float = 600.0) -> Path:
    """The cached game file of ``kind/split/seed``, generating it with ``tw-make`` if missing.

    Raises:
        RuntimeError: ``tw-make`` failed (its stderr is in the message).
    """
    folder = cache_dir("textworld", kind, split)
    game = folder / f"{kind}-{split}-{seed}.z8"
    if game.exists() and game.with_suffix(".json").exists():
        return game
    with tempfile.TemporaryDirectory(dir=folder, prefix=".gen-") as tmp:
        out = Path(tmp) / game.name
        proc = subprocess.run(tw_make_command(kind, split, seed, out), capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"tw-make failed for {kind}/{split}/{seed} (rc {proc.returncode}): {proc.stderr[-2000:]}")
        for suffix in (".json", ".ni", ".z8"):  # the .z8 last: its presence marks a complete game
            part = out.with_suffix(suffix)
            if part.exists():
                os.replace(part, game.with_suffix(suffix))
    return game


def forget_registration(env_id: str | None) -> None:
    """Drop ``env_id`` from textworld's module-level gym registry (no-op for None or an unknown
    id). ``textworld.gym.register_game`` keeps every registered game, with its wrapper
    instances, for the life of the process; an adapter that moves to another game calls this."""
    if env_id is not None:
        from textworld.gym.utils import registry

        registry.pop(env_id, None)


def _strip_banner(obs: str, objective: str) -> str:
    """The room text of TextWorld's first observation (without the ASCII banner and objective)."""
    if objective and objective in obs:
        return obs.split(objective, 1)[1].strip()
    lines = [ln for ln in obs.splitlines() if sum(ch.isalpha() for ch in ln) > len(ln.strip()) // 2]
    return "\n".join(lines).strip()


class TextWorldEnv:
    """Generated TextWorld games behind :class:`envs.protocol.Environment`.

    Args:
        kinds: game kinds to offer (subset of :data:`KINDS`).
        n_train, n_test: games per kind in each split.
        train_seed0, test_seed0: first seed of each split; the ranges must not overlap.

    Raises:
        ValueError: overlapping seed ranges or an unknown kind.
    """

    name = "textworld"
    #: The engine's modules, imported before an episode's clock starts (:func:`envs.episode.import_engines`).
    ENGINE_MODULES = ("textworld", "textworld.gym")
    splits = SPLITS
    default_max_steps = 100
    expert_name = "textworld-walkthrough"
    #: Off the walkthrough the expert answers the winning policy from the current state.
    expert_labels_any_state = True

    def __init__(
        self,
        kinds: tuple[str, ...] = KINDS,
        n_train: int = 20,
        n_test: int = 20,
        train_seed0: int = 1,
        test_seed0: int = 100_001,
    ):
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"unknown TextWorld game kind {kind!r}; known: {list(KINDS)}")
        train = range(train_seed0, train_seed0 + n_train)
        test = range(test_seed0, test_seed0 + n_test)
        if set(train) & set(test):
            raise ValueError(f"train seeds {train} and test seeds {test} overlap")
        self.kinds = tuple(kinds)
        self._seeds = {"train": train, "test": test}
        self._gym = None
        self._env_id: str | None = None  # our entry in textworld's gym registry
        self._game: Path | None = None
        self._tracks_policy = False  # the registered game computes policy_commands
        self._infos: dict = {}
        self._walkthrough: list[str] = []
        self._pos = 0
        self._on_path = False
        self._expert = False
        self._done = False

    def tasks(self, split: str) -> list[str]:
        """Task ids ``<kind>/<split>/<seed>`` of ``split`` ("train" or "test"), kind-major order."""
        if split not in SPLITS:
            raise ValueError(f"unknown TextWorld split {split!r}; known: {list(SPLITS)}")
        return [f"{kind}/{split}/{seed}" for kind in self.kinds for seed in self._seeds[split]]

    def task_type_of(self, task_id: str) -> str:
        return self._parse(task_id)[0]

    def split_of(self, task_id: str) -> str:
        """The split named in ``task_id`` (``cooking/train/3`` -> train), checked against its seed range."""
        return self._parse(task_id)[1]

    def _parse(self, task_id: str) -> tuple[str, str, int]:
        parts = task_id.split("/")
        if len(parts) != 3 or parts[0] not in KINDS or parts[1] not in SPLITS or not parts[2].isdigit():
            raise ValueError(f"TextWorld task id {task_id!r} is not '<kind>/<split>/<seed>' with kind in "
                             f"{'/'.join(self.kinds)} and split in {'/'.join(SPLITS)}")
        kind, split, seed = parts[0], parts[1], int(parts[2])
        if seed not in self._seeds[split]:
            seeds = self._seeds[split]
            raise ValueError(f"TextWorld task {task_id!r}: seed {seed} is outside the {split} seeds "
                             f"{seeds.start}..{seeds.stop - 1}")
        if kind not in self.kinds:
            raise ValueError(f"TextWorld task {task_id!r}: kind {kind!r} is not offered (kinds: {', '.join(self.kinds)})")
        return kind, split, seed

    def reset(self, task_id: str, expert: bool = False) -> TaskStart:
        import textworld
        import textworld.gym

        kind, split, seed = self._parse(task_id)
        game = generate_game(kind, split, seed)
        if game != self._game or (expert and not self._tracks_policy):
            self.close()
            infos = textworld.EnvInfos(
                admissible_commands=True, won=True, lost=True, objective=True, score=True, max_score=True,
                extras=["walkthrough"], policy_commands=bool(expert),
            )
            self._env_id = textworld.gym.register_game(str(game), infos, max_episode_steps=10**9)
            self._gym = textworld.gym.make(self._env_id)
            self._game, self._tracks_policy = game, bool(expert)
        obs, self._infos = self._gym.reset()
        self._walkthrough = list(self._infos.get("extra.walkthrough") or [])
        self._expert = bool(expert)
        self._pos, self._on_path, self._done = 0, bool(expert and self._walkthrough), False
        objective = (self._infos.get("objective") or "").strip()
        return TaskStart(task_id, kind, objective, _strip_banner(obs, objective))

    def step(self, action: str) -> StepResult:
        if self._gym is None:
            raise RuntimeError("TextWorldEnv.step before reset")
        commands = split_commands(action)
        if len(commands) > 1:  # the engine would run them all; its tracker would see only the first
            self._on_path = False
            return StepResult(CHAINED_FEEDBACK, done=self._done, won=bool(self._infos.get("won")),
                              score=float(self._infos.get("score") or 0), info={"invalid": True, "chained": commands})
        if self._on_path:
            if self._pos < len(self._walkthrough) and action == self._walkthrough[self._pos]:
                self._pos += 1
            else:
                self._on_path = False
        obs, score, done, self._infos = self._gym.step(action)
        won = bool(self._infos.get("won"))
        self._done = self._done or bool(done) or won or bool(self._infos.get("lost"))
        info = {"lost": True} if self._infos.get("lost") else {}
        return StepResult(obs.strip(), done=self._done, won=won, score=float(score or 0), info=info)

    def candidates(self) -> list[str]:
        return list(self._infos.get("admissible_commands") or [])

    def expert_action(self) -> str | None:
        """The walkthrough's next command while the episode follows it, else the first command of
        the winning policy from the current state; None: reset without expert, game over or lost."""
        if not self._expert or self._done:
            return None
        if self._on_path and self._pos < len(self._walkthrough):
            return self._walkthrough[self._pos]
        policy = self._infos.get("policy_commands") or []
        return policy[0] if policy else None

    def config(self) -> dict:
        from importlib.metadata import version

        return {"kinds": list(self.kinds), "games": {k: [GAMES[k][0], *GAMES[k][1]] for k in self.kinds},
                "textworld": version("textworld")}

    def close(self) -> None:
        if self._gym is not None:
            self._gym.close()
        forget_registration(self._env_id)  # textworld's registry keeps every game
        self._gym, self._game, self._infos, self._env_id = None, None, {}, None
        self._tracks_policy = False
