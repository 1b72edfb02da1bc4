"""The GPU check's step measurements (``benchmarks/gpu_check.py``): an episode's warm steps on each
backend with the steps that compiled counted apart, the device's busy share of a warm step, several
episodes' steps in one batched call against one call each, and the step targets.

* A *warm step* is one scoring call of an episode whose context grew by one step (about 25
  tokens), after the episode's first call and ``warmup`` steps, that compiled nothing: no XLA
  program compiled in the process (JAX's compile event) and no program new to the backend (its
  ``program_count`` where it has one: one per pass and bucketed shapes, compiled or loaded from
  the executable store). A step that compiled is listed apart (``compiled_s``,
  ``compiled_at_step``), never in the warm median.
* The *busy share* is the device's kernel time over a warm step's wall time: the union of the
  device intervals (kernels, copies) a profiler records over a few more steps (``torch.profiler``
  with CUDA activity; ``jax.profiler``'s trace, the ``Stream #`` lines of its ``/device:GPU:N``
  planes), per step, over the warm median. Where no CUDA device is, both profilers still run, their
  traces hold no device interval, and the share is None with the reason.
* The *batched row*: several episodes' steps in one ``score_many`` call
  (:func:`agent_shell.lm.batched.score_many`, the PyTorch backend's) against one ``score`` call
  each, order alternated round by round; steps/s.

Not a benchmark itself (no ``main``). torch and JAX are imported where they are used.
"""

from __future__ import annotations

import functools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from _targets import median_ratio, rotated, verdict, verdict_line

#: The text between a scoring context and a candidate action.
PREFIX = "\n> "
#: What a target's ``met`` says where the device it is about is absent.
NOT_MEASURED_CPU = "not measured on CPU"
#: JAX's event for one XLA compile (``jax._src.dispatch.BACKEND_COMPILE_EVENT``).
XLA_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: The step targets on the ~1.5B row: key -> (target, at most).
TARGETS = {"warm_median_s": (0.025, True), "max_over_median": (2.0, True), "busy_share": (0.5, False)}

_xla_compiles: list[int] = []  # one entry per XLA compile seen, once the listener is registered


def xla_compiles() -> int:
    """XLA programs compiled in this process since the first call (JAX's compile event; the
    listener is registered on the first call)."""
    if not _xla_compiles:
        import jax

        _xla_compiles.append(0)

        def seen(event: str, _seconds: float, **_kwargs) -> None:
            if event == XLA_COMPILE_EVENT:
                _xla_compiles[0] += 1

        jax.monitoring.register_event_duration_secs_listener(seen)
    return _xla_compiles[0]


def sync(device) -> None:
    """Wait for the torch ``device``'s queued work (a no-op off CUDA)."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device) -> float:
    """Seconds of ``fn()``, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def grown(context: str, step: int) -> str:
    """``context`` after step ``step`` of the synthetic game (about 25 tokens more)."""
    return context + f"> open drawer {step}\nYou open the drawer {step}. In it, you see a mug {step}.\n"


def step_candidates(n: int) -> list[str]:
    """The step's candidate set: ``n`` (at most 30) distinct actions sharing token prefixes."""
    return [f"{v} {o} {k}" for v in ("go to", "open", "take") for o in ("cabinet", "drawer", "mug", "fridge", "shelf")
            for k in (1, 2)][:n]


def padded_forward(lm, context: str, candidates: Sequence[str]) -> None:
    """The naive batch: every candidate's whole sequence, left-padded, in one forward pass of the
    PyTorch backend ``lm``'s model."""
    import torch

    toks = lm.tokenize_continuations(lm.render(context, PREFIX), list(candidates))
    width = max(len(t.ids) for t in toks)
    ids = torch.zeros(len(toks), width, dtype=torch.long)
    mask = torch.zeros(len(toks), width, dtype=torch.long)
    for m, t in enumerate(toks):
        ids[m, width - len(t.ids):], mask[m, width - len(t.ids):] = torch.tensor(t.ids), 1
    with torch.inference_mode():
        lm.model(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                 position_ids=(mask.cumsum(1) - 1).clamp(min=0).to(lm.device),
                 logits_to_keep=max(t.n_action for t in toks) + 1)


def cold_and_naive(make_lm: Callable[[], Any], context: str, candidates: Sequence[str], device) -> dict:
    """A fresh PyTorch backend's (``make_lm()``) first call on ``context`` (empty cache) against one
    naive padded forward, 3 repetitions, order alternated (naive first on odd ones), after one
    untimed naive forward (kernels loaded); seconds and the ratio of the medians."""
    timed(lambda: padded_forward(make_lm(), context, candidates), device)
    cold, naive = [], []
    for rep in range(3):
        fresh = make_lm()
        pair = [("cold", lambda: fresh.score(context, candidates, PREFIX)),
                ("naive", lambda: padded_forward(fresh, context, candidates))]
        for name, fn in pair if rep % 2 == 0 else pair[::-1]:
            (cold if name == "cold" else naive).append(timed(fn, device))
    return {"cold_s": cold, "naive_padded_s": naive,
            "cold_over_naive": statistics.median(cold) / statistics.median(naive)}


class Episode:
    """One backend's episode on the synthetic game: :meth:`step` grows the context by one step and
    scores the candidate set, timed with the device synchronised (a JAX backend's numpy results
    are its device's end)."""

    def __init__(self, lm, context: str, candidates: Sequence[str], device):
        self.lm, self.context, self.candidates, self.device = lm, context, list(candidates), device
        self.steps = 0

    def programs(self) -> int:
        """XLA compiles in the process plus the programs the backend has met (0 without a count)."""
        return xla_compiles() + int(getattr(self.lm, "program_count", 0))

    def score(self) -> tuple[float, bool]:
        """(seconds, whether a program was compiled or loaded) of scoring the current context."""
        before = self.programs()
        seconds = timed(lambda: self.lm.score(self.context, self.candidates, PREFIX), self.device)
        return seconds, self.programs() > before

    def step(self) -> tuple[float, bool]:
        """One more step of the game, scored: see :meth:`score`."""
        self.context = grown(self.context, self.steps)
        self.steps += 1
        return self.score()


def spread(warm: Sequence[float]) -> dict:
    """The warm steps' count, median, max and max / median (seconds; None without a warm step)."""
    if not warm:
        return {"warm_steps": 0, "median_s": None, "max_s": None, "max_over_median": None}
    median = statistics.median(warm)
    return {"warm_steps": len(warm), "median_s": median, "max_s": max(warm), "max_over_median": max(warm) / median}


def warm_steps(episodes: dict[str, Episode], warmup: int, n_warm: int) -> dict[str, dict]:
    """Each episode's first call, ``warmup`` steps, then steps until ``n_warm`` warm ones (at most
    ``2 * n_warm`` steps after the warm-up), the episodes' order rotated step by step. Per episode:
    ``first_s``, ``warmup_s``, ``warm_s`` and ``compiled_s`` (seconds), ``compiled_at_step`` (the
    episode's step numbers, from 1, of the steps that compiled), and :func:`spread` of ``warm_s``."""
    names = list(episodes)
    rows = {}
    for name in names:
        rows[name] = {"first_s": episodes[name].score()[0], "warmup_s": [], "warm_s": [], "compiled_s": [],
                      "compiled_at_step": []}
    for k in range(warmup):
        for name in rotated(names, k):
            rows[name]["warmup_s"].append(episodes[name].step()[0])
    for k in range(2 * n_warm):
        for name in rotated(names, k):
            row = rows[name]
            if len(row["warm_s"]) < n_warm:
                seconds, compiled = episodes[name].step()
                if compiled:
                    row["compiled_s"].append(seconds)
                    row["compiled_at_step"].append(episodes[name].steps)
                else:
                    row["warm_s"].append(seconds)
    for row in rows.values():
        row.update(spread(row["warm_s"]))
    return rows


def union_seconds(intervals: Sequence[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals: time during which at least one ran."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def torch_device_intervals(run: Callable[[], Any], device) -> list[tuple[float, float]]:
    """(start, end) seconds of every device event (kernels, copies) ``torch.profiler`` records
    while ``run()`` runs: CPU activity always, CUDA activity where ``device`` is CUDA."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    return [(e.time_range.start * 1e-6, e.time_range.end * 1e-6) for e in prof.events()
            if e.device_type == DeviceType.CUDA]


def jax_device_intervals(run: Callable[[], Any], device) -> list[tuple[float, float]]:
    """(start, end) seconds of every event on a CUDA stream in ``jax.profiler``'s trace of
    ``run()``: the ``Stream #`` lines of the ``/device:GPU:N`` planes (none on a CPU)."""
    import jax
    from jax.profiler import ProfileData

    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            run()
        space = ProfileData.from_file(str(next(Path(tmp).rglob("*.xplane.pb"))))
        return [(e.start_ns * 1e-9, e.end_ns * 1e-9) for plane in space.planes if plane.name.startswith("/device:GPU")
                for line in plane.lines if line.name.startswith("Stream #") for e in line.events]


def busy_share(name: str, episode: Episode, n: int, warm_median: float | None) -> dict:
    """The device's busy share of ``episode``'s warm step: ``n`` more steps under the profiler of
    backend ``name`` (``torch`` or ``jax``); the union of their device intervals (``kernel_s``)
    per step over ``warm_median``, and over the profiled steps' own wall time (the profiler's
    overhead included). None, with the reason, when the trace holds no device interval or the
    profiler failed (the failure recorded, the check goes on). Two profilers in one process share
    CUPTI, one subscriber at a time: the check runs JAX's trace before ``torch.profiler`` ever runs."""
    walls: list[float] = []

    def run() -> None:
        for _ in range(n):
            walls.append(episode.step()[0])

    try:
        intervals = (torch_device_intervals if name == "torch" else jax_device_intervals)(run, episode.device)
    except Exception as err:  # noqa: BLE001 - e.g. a profiler that cannot start: the share is lost, not the section
        intervals, failure = [], f"the profiler failed: {type(err).__name__}: {err}"
    else:
        failure = None
    out = {"profiled_steps": n, "profiled_wall_s": walls, "device_events": len(intervals)}
    if not intervals or not warm_median:
        reason = failure or (NOT_MEASURED_CPU if episode.device.type != "cuda" else
                             "no device event in the trace, or no warm step")
        return {**out, "kernel_s": None, "busy_share": None, "busy_share_profiled": None, "reason": reason}
    kernel_s = union_seconds(intervals)
    return {**out, "kernel_s": kernel_s, "busy_share": kernel_s / n / warm_median,
            "busy_share_profiled": kernel_s / sum(walls)}


def batched_row(lm, contexts: Sequence[str], candidates: Sequence[str], device, rounds: int) -> dict:
    """``len(contexts)`` episodes' steps scored by one ``score_many`` call against one ``score`` call
    each (each leg on its own forks of ``lm``, their streams holding the episodes' contexts), for
    ``rounds`` steps, the legs' order alternated. Seconds per round, steps/s of the medians, the
    paired speed-up (one call each / score_many) and the largest log q gap of the last round."""
    from agent_shell.lm.batched import ScoreRequest, score_many

    views = {"score_many": [lm.fork() for _ in contexts], "one_by_one": [lm.fork() for _ in contexts]}

    def call(leg: str, texts: Sequence[str]) -> list:
        if leg == "score_many":
            requests = [ScoreRequest(v.cache, c, tuple(candidates), PREFIX) for v, c in zip(views[leg], texts)]
            return score_many(lm, requests)
        return [v.score(c, candidates, PREFIX) for v, c in zip(views[leg], texts)]

    texts = list(contexts)
    last = {leg: call(leg, texts) for leg in views}  # the episodes so far: each stream holds its context

    def run(leg: str, texts: Sequence[str]) -> None:
        last[leg] = call(leg, texts)

    times: dict[str, list[float]] = {leg: [] for leg in views}
    for r in range(rounds):
        texts = [grown(c, r) for c in texts]
        for leg in rotated(list(views), r):
            times[leg].append(timed(functools.partial(run, leg, texts), device))
    gap = max(float(abs(a.log_q - b.log_q).max()) for a, b in zip(last["score_many"], last["one_by_one"]))
    return {"episodes": len(contexts), "rounds": rounds, **{f"{leg}_s": t for leg, t in times.items()},
            **{f"{leg}_steps_per_s": len(contexts) / statistics.median(t) for leg, t in times.items()},
            "score_many_speed_up": median_ratio(times["one_by_one"], times["score_many"]), "log_q_gap": gap}


def targets(rows: dict[str, dict], busy: dict[str, dict], why_not: str | None) -> dict[str, dict]:
    """The step targets (:data:`TARGETS`) per backend, each a :func:`_targets.verdict` (the value
    unrounded; None where nothing was measured, then not met). ``why_not``: None on the ~1.5B row
    on a GPU, else why the targets do not apply there, recorded as ``met``."""
    out = {}
    for name, row in rows.items():
        values = {"warm_median_s": row["median_s"], "max_over_median": row["max_over_median"],
                  "busy_share": busy[name]["busy_share"]}
        for key, (target, at_most) in TARGETS.items():
            v = (verdict(f"{name}_{key}", values[key], target, at_most) if values[key] is not None else
                 {"name": f"{name}_{key}", "value": None, "target": f"{'<=' if at_most else '>='} {target!r}",
                  "met": False})
            out[v["name"]] = v if why_not is None else {**v, "met": why_not}
    return out


def target_line(v: dict) -> str:
    """:func:`_targets.verdict_line`, or its value with the reason a target was not measured."""
    if isinstance(v["met"], bool):
        return verdict_line(v)
    return f"{v['name']} = {v['value']!r} (target {v['target']}): {v['met']}"


__all__ = ["NOT_MEASURED_CPU", "PREFIX", "TARGETS", "Episode", "batched_row", "busy_share", "cold_and_naive", "grown",
           "padded_forward", "spread", "step_candidates", "sync", "target_line", "targets", "timed", "union_seconds",
           "warm_steps", "xla_compiles"]
