"""ScienceWorld adapter: the 30 tasks of ``scienceworld==1.2.3`` with their train/dev/test variations.

A task id is ``<task name>/<variation>`` (``boil/3``); the task type is the task name. Splits are
the simulator's own variation splits (``train``, ``dev``, ``test``): for scienceworld 1.2.3 they are
the table :data:`VARIATION_SPLITS` (read from the simulator once and checked against it in the
tests), so task ids and splits are validated without starting the JVM; for another version they
are computed once by loading each task and cached in ``$CB_AGENT_CACHE/scienceworld/``. A variation
outside its task's range is refused before the simulator sees it (the simulator would load some
other variation without a word, or fail with a Java stack trace while making the gold path).

- Candidates: the simulator's valid action-object combinations in the current state (deduplicated,
  engine order). They are *incomplete*: many gold-path actions (``focus on thermometer in
  inventory``, ``examine substance in metal pot``, ``open door to kitchen``) are missing. The
  expert therefore maps a gold action onto an equal candidate spelling where one exists (see
  :func:`candidate_spelling`); otherwise it keeps the gold spelling and :attr:`complete_candidates`
  is False, which tells :func:`envs.collect.play_expert` to append the expert action to the saved
  set and flag the step (``info["expert_appended"] = True``).
- Expert: the gold action sequence (``load(..., generateGoldPath=True)``, only for episodes reset
  with ``expert=True``: it costs several seconds a load and its generation can fail), followed while
  the agent follows it; ``expert_action()`` is None once the agent deviates.
- Ambiguity: an action matching several objects gets a numbered prompt ("Ambiguous request ...").
  :meth:`ScienceWorldEnv.step` answers it explicitly (with the gold path's number when the expert
  is being followed, else ``0`` = the first option) and records the prompt and the answer in
  ``StepResult.info["ambiguity"]``; the observation returned is the answer's.
- Success is score 100 (``won``); a wrong ``focus on`` gives -100 and ends the task.
- The JVM: started on first use, closed by :meth:`close`, and restarted when a call raises a
  py4j error or exceeds its timeout (a hang): the task is reloaded and the actions sent so far
  are replayed (``info["jvm_restarts"]`` counts them). The episode log lives in Python
  (:class:`envs.episode.Episode`) and is never lost. The simulator is stochastic: a replay may
  differ from the original run (``info["replay_diverged"]`` says so). Errors raised by the simulator
  reach the caller as one-line :class:`~cb_io.records.EngineError` (the Java exception's class and
  message, not its stack trace).
- Chained commands: the simulator's parser matches the whole input against its action templates, so
  ``open door to kitchen then go to kitchen`` (or with ``.``, ``,``, ``;``, `` and ``, a line break) is
  answered ``No known action matches that input.`` and changes nothing; no adapter guard is needed.
"""

from __future__ import annotations

import concurrent.futures as futures
import difflib
import gc
import json
import re

from cb_io.paths import cache_dir
from cb_io.records import EngineError, EpisodeTimeout, StepResult, TaskStart, one_line
from cb_io.storage import write_json_atomic

SPLITS = ("train", "dev", "test")
#: scienceworld version -> task name -> (train, dev, test) variation counts; each split is a
#: contiguous range (train 0.., then dev, then test), as ``get_variations_train/dev/test`` return them.
VARIATION_SPLITS: dict[str, dict[str, tuple[int, int, int]]] = {"1.2.3": {
    "boil": (14, 7, 9),
    "change-the-state-of-matter-of": (14, 7, 9),
    "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9),
    "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75),
    "find-living-thing": (150, 75, 75),
    "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75),
    "freeze": (14, 7, 9),
    "grow-fruit": (62, 31, 33),
    "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5),
    "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42),
    "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42),
    "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32),
    "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75),
    "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30),
    "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5),
    "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225),
    "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}}
AMBIGUOUS_PREFIX = "Ambiguous request"
_IN_INVENTORY = re.compile(r"\s+in inventory\b")
_OPEN_DOOR = re.compile(r"^(open|close) door to (.+)$")


def candidate_spelling(action: str, candidates: set[str]) -> str:
    """The spelling of ``action`` in ``candidates`` when an equivalent one exists, else ``action``.

    Equivalences (the simulator parses both spellings to the same action on the same object):
    dropping the ``in inventory`` location qualifier (``focus on X in inventory`` -> ``focus on X``)
    and ``open door to R`` -> ``open R door``.
    """
    if action in candidates:
        return action
    variants = [_IN_INVENTORY.sub("", action)]
    m = _OPEN_DOOR.match(action)
    if m:
        variants.append(f"{m.group(1)} {m.group(2)} door")
    for v in variants:
        if v in candidates:
            return v
    return action


class ScienceWorldEnv:
    """ScienceWorld behind :class:`envs.protocol.Environment`.

    Args:
        simplification: the simulator's simplification string (``"easy"`` or a comma list,
            ``""`` for none; default ``"easy"``, recorded in trajectory metadata).
        step_timeout_s: a step (or candidate query) taking longer is a hang: the JVM restarts.
        load_timeout_s: the same for loading a task (gold-path generation can take a minute).
    """

    name = "scienceworld"
    #: The engine's modules, imported before an episode's clock starts (:func:`envs.episode.import_engines`).
    ENGINE_MODULES = ("scienceworld",)
    splits = SPLITS
    default_max_steps = 100
    expert_name = "scienceworld-gold-path"
    #: The gold path answers only along itself: no labels for states the agent reached off it.
    expert_labels_any_state = False
    complete_candidates = False

    def __init__(
        self,
        simplification: str = "easy",
        step_timeout_s: float = 60.0,
        load_timeout_s: float = 600.0,
    ):
        self.simplification = simplification
        self.step_timeout_s = step_timeout_s
        self.load_timeout_s = load_timeout_s
        self.gold_path = False  # the current episode's: reset(..., expert=True)
        self._sw = None
        self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scienceworld")
        self._splits: dict[str, list[str]] | None = None
        self._range_cache: dict[str, dict[str, tuple[int, int]]] | None = None
        self._task: tuple[str, int] | None = None
        self._sent: list[str] = []  # every string sent to the engine since reset (for replay)
        self._observations: list[str] = []
        self._gold: list[str] = []
        self._gold_pos = 0
        self._on_gold = False
        self._valid: list[str] = []
        self._score = 0.0
        self._done = False
        self.jvm_restarts = 0

    # ---------------------------------------------------------------- JVM
    def _start(self):
        from scienceworld import ScienceWorldEnv as _SW

        self._sw = _SW("", envStepLimit=10**9)

    def _kill(self) -> None:
        sw, self._sw = self._sw, None
        if sw is None:
            return
        proc = getattr(getattr(sw, "_gateway", None), "java_process", None)
        try:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        finally:
            try:
                sw._gateway.shutdown()
            except Exception:
                pass
            # The wrapper's __del__ (and py4j's object finalizers) call into the dead gateway; left to
            # a random GC pass they run inside unrelated code (seen breaking CPython 3.11's ast.parse
            # with "AST constructor recursion depth mismatch"). Disarm and collect them here instead.
            sw.clear_run_histories = lambda: None
            del sw
            gc.collect()

    def _call(self, fn, timeout: float):
        """Run ``fn(sw)`` on the engine thread; raise on py4j errors or after ``timeout`` seconds."""
        if self._sw is None:
            self._start()
        sw = self._sw
        return self._pool.submit(fn, sw).result(timeout=timeout)

    def _robust(self, fn, timeout: float):
        """``_call`` with one JVM restart + task reload + replay on a crash or hang."""
        try:
            return self._call(fn, timeout)
        except (futures.TimeoutError, Exception) as err:
            if isinstance(err, (ValueError, KeyboardInterrupt, EpisodeTimeout)):  # the episode's limit: no restart
                raise
            first = err
        self._restart()
        try:
            return self._call(fn, timeout)
        except EpisodeTimeout:
            raise
        except futures.TimeoutError:
            self._kill()
            raise EngineError(f"ScienceWorld hung twice (>{timeout}s) on task {self._task}; first error: "
                              f"{one_line(first)}") from None
        except Exception as err:
            self._kill()
            raise EngineError(f"ScienceWorld failed twice on task {self._task}: {one_line(err)}") from err

    def _restart(self) -> None:
        self._kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="scienceworld")
        self.jvm_restarts += 1
        self._start()
        if self._task is not None:
            name, variation = self._task
            self._call(lambda sw: sw.load(name, variation, self.simplification, generateGoldPath=self.gold_path), self.load_timeout_s)
            self._call(lambda sw: sw.reset(), self.step_timeout_s)
            diverged = False
            for sent, seen in zip(self._sent, self._observations):
                obs = self._call(lambda sw, a=sent: sw.step(a)[0], self.step_timeout_s)
                diverged = diverged or obs != seen
            self.replay_diverged = diverged

    # ---------------------------------------------------------------- tasks
    def _split_index(self) -> dict[str, list[str]]:
        if self._splits is None:
            from importlib.metadata import version

            installed = version("scienceworld")
            path = cache_dir("scienceworld") / f"variations-{installed}.json"
            table = VARIATION_SPLITS.get(installed)
            if table is not None:
                index = {s: [] for s in SPLITS}
                for name, counts in sorted(table.items()):
                    start = 0
                    for split, count in zip(SPLITS, counts):
                        index[split].extend(f"{name}/{v}" for v in range(start, start + count))
                        start += count
                self._splits = index
            elif path.exists():
                self._splits = json.loads(path.read_text())
            else:
                index: dict[str, list[str]] = {s: [] for s in SPLITS}

                def build(sw):
                    for name in sw.get_task_names():
                        sw.load(name, 0, "")
                        for split, vs in zip(SPLITS, (sw.get_variations_train(), sw.get_variations_dev(), sw.get_variations_test())):
                            index[split].extend(f"{name}/{v}" for v in sorted(vs))

                self._robust(build, self.load_timeout_s)
                write_json_atomic(path, index)
                self._splits = index
        return self._splits

    def tasks(self, split: str) -> list[str]:
        """Task ids ``<task name>/<variation>`` of the simulator's ``train``/``dev``/``test`` split, sorted by task then variation."""
        if split not in SPLITS:
            raise ValueError(f"unknown ScienceWorld split {split!r}; known: {list(SPLITS)}")
        return list(self._split_index()[split])

    def task_type_of(self, task_id: str) -> str:
        return self._parse(task_id)[0]

    def _ranges(self) -> dict[str, dict[str, tuple[int, int]]]:
        """Task name -> split -> (first, last) variation, from the split index."""
        if self._range_cache is None:
            ranges: dict[str, dict[str, tuple[int, int]]] = {}
            for split, ids in self._split_index().items():
                for tid in ids:
                    name, var = self._parse(tid)
                    lo, hi = ranges.setdefault(name, {}).get(split, (var, var))
                    ranges[name][split] = (min(lo, var), max(hi, var))
            self._range_cache = ranges
        return self._range_cache

    def split_of(self, task_id: str) -> str:
        """The simulator split of variation ``task_id`` (no JVM for scienceworld 1.2.3).

        Raises:
            ValueError: a malformed id, an unknown task (the closest name), or a variation outside
                the task's range (the ranges of its splits), in one line.
        """
        name, variation = self._parse(task_id)
        ranges = self._ranges().get(name)
        if ranges is None:
            close = difflib.get_close_matches(name, list(self._ranges()), n=1, cutoff=0.6)
            raise ValueError(f"unknown ScienceWorld task {name!r} in {task_id!r} ({len(self._ranges())} tasks"
                             + (f"; closest: {close[0]!r})" if close else ")"))
        for split, (lo, hi) in ranges.items():
            if lo <= variation <= hi:
                return split
        spans = ", ".join(f"{split} {lo}-{hi}" for split, (lo, hi) in ranges.items())
        first, last = min(lo for lo, _ in ranges.values()), max(hi for _, hi in ranges.values())
        raise ValueError(f"ScienceWorld task {task_id!r}: {name} has variations {first}-{last} ({spans})")

    @staticmethod
    def _parse(task_id: str) -> tuple[str, int]:
        name, _, var = task_id.rpartition("/")
        if not name or not var.isdigit():
            raise ValueError(f"ScienceWorld task id {task_id!r} is not '<task name>/<variation>' (e.g. 'boil/3')")
        return name, int(var)

    # ---------------------------------------------------------------- episode
    def reset(self, task_id: str, expert: bool = False) -> TaskStart:
        """Load variation ``task_id``; ``expert=True`` also generates its gold path (the expert)."""
        self.split_of(task_id)  # a bad id never reaches the simulator
        name, variation = self._parse(task_id)
        self.gold_path = bool(expert)
        self._task = (name, variation)
        self._sent, self._observations = [], []
        self.replay_diverged = False

        def load(sw):
            sw.load(name, variation, self.simplification, generateGoldPath=self.gold_path)
            obs, info = sw.reset()
            gold = list(sw.get_gold_action_sequence()) if self.gold_path else []
            return obs, info, sw.get_task_description(), gold

        obs, info, instruction, gold = self._robust(load, self.load_timeout_s)
        self._gold = [] if gold and gold[0].startswith("ERROR") else gold
        self._gold_pos, self._on_gold = 0, bool(self._gold)
        self._valid = list(dict.fromkeys(info["valid"]))
        self._score, self._done = float(info.get("score", 0)), False
        return TaskStart(task_id, name, instruction.strip(), obs.strip())

    def _engine_step(self, text: str) -> tuple[str, dict]:
        def step(sw):
            obs, _reward, done, info = sw.step(text)
            return obs, done, info

        obs, done, info = self._robust(step, self.step_timeout_s)
        self._sent.append(text)
        self._observations.append(obs)
        info = dict(info)
        info["done"] = bool(done)
        return obs, info

    def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("ScienceWorldEnv.step before reset")
        restarts_before = self.jvm_restarts
        expected = self.expert_action()
        obs, info = self._engine_step(action)
        extras: dict = {}
        if self._on_gold:
            if action == expected:
                self._gold_pos += 1
            else:
                self._on_gold = False
        if obs.startswith(AMBIGUOUS_PREFIX):
            answer = "0"
            if self._on_gold and self._gold_pos < len(self._gold) and self._gold[self._gold_pos].isdigit():
                answer = self._gold[self._gold_pos]
                self._gold_pos += 1
            prompt = obs
            obs, info = self._engine_step(answer)
            extras["ambiguity"] = {"prompt": prompt, "answer": answer}
        self._valid = list(dict.fromkeys(info["valid"]))
        self._score = float(info["score"])
        won = self._score >= 100
        self._done = self._done or bool(info["done"]) or won
        if self.jvm_restarts != restarts_before:
            extras["jvm_restarts"] = self.jvm_restarts - restarts_before
            extras["replay_diverged"] = self.replay_diverged
        return StepResult(obs, done=self._done, won=won, score=self._score, info=extras)

    def candidates(self) -> list[str]:
        return list(self._valid)

    def expert_action(self) -> str | None:
        if not self._on_gold or self._done or self._gold_pos >= len(self._gold):
            return None
        return candidate_spelling(self._gold[self._gold_pos], set(self._valid))

    def config(self) -> dict:
        from scienceworld.version import __version__

        return {"simplification": self.simplification, "scienceworld": __version__}

    def close(self) -> None:
        if self._sw is not None:
            try:
                self._call(lambda sw: sw.close(), 10)
            except Exception:
                pass
            self._kill()
        self._pool.shutdown(wait=False, cancel_futures=True)
