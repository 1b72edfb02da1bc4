"""The host's share of a warm CB-Agent step, side by side with another checkout, on both backends.

A CB-Agent step (:meth:`agent_shell.agents.cb_agent.CBAgent.next_action` on an environment step:
the routing peek, then the decision over 30 candidates under a concept) is run with a tiny random
Llama (``gpu_check``'s builder: two layers, width ``--width``, default 16, two heads of 8) whose
compute is negligible, so what a step costs is the host's work
around the passes: rendering, tokenizing, laying out the candidates, building and moving arrays,
dispatching ops or programs, fetching results. On an accelerator that work is what keeps the device
idle; on a CPU it is measured directly.

On a CPU, "negligible" needs a smaller model than on a GPU: with ``gpu_check``'s width-64 model
(four heads of 16) attention over the 1,000 to 1,300 cached tokens and the LM head over the
default backbone's 49,152-token vocabulary cost several milliseconds a step on one core. So the
width is 16, and the vocabulary is the default backbone's tokenizer cut to its first ``--vocab``
tokens (its byte-level alphabet, special tokens and first merges; the same pre-tokenizer and chat
template, texts tokenize into more, shorter tokens); ``--width 64 --vocab 0`` is ``gpu_check``'s
tiny model with the whole tokenizer.

Each *leg* is a fresh process running one checkout (``PYTHONPATH`` set to its root; the code it
imports is checked) on one backend: PyTorch (``hf``) or JAX (``jax:``), float32 on the CPU. A leg
plays ``--warmup`` untimed steps (the JAX backend compiles there), ``--steps`` timed ones and
``--count-steps`` more under counters, on one growing episode (a 1,000-token task, one step of
history added per step, the same 30 candidates, the same random concept). Every leg is pinned
alike (:func:`_targets.pinned`): one CPU (the process's affinity: its first allowed CPU, as
``taskset -c 0``), one thread for torch, OpenMP and BLAS, and XLA's CPU client on one thread (no
Eigen pool). The legs of a backend alternate their
order from repeat to repeat; each ratio is the median over repeats of the paired ratio of the
legs' median step times (this checkout over the other), printed unrounded and compared unrounded
with the target (at most 1/5). Both legs must take the same actions (checked: the script fails
otherwise).

Counted per step (``--count-steps`` steps after the timed ones, averaged):

* ``ops``: ``torch_ops``, the PyTorch ops dispatched (a ``TorchDispatchMode``: every aten op below
  autograd, views included: what launches kernels on a GPU), plus ``jax_programs``, the compiled
  JAX programs executed (XLA executions in a ``jax.profiler`` trace, eager ops included: each is a
  program too); both libraries are counted on both backends (the decision runs in JAX);
* ``syncs``: reads of a device value on the host (PyTorch: ``.item()``, ``int()``/``float()``/
  ``bool()`` of a tensor, ``.tolist()``, ``.numpy()``; JAX: every first read of an array's value,
  :func:`_fetches.host_fetches`);
* ``to_device``: host arrays that enter the library (PyTorch: ``torch.tensor``, ``torch.as_tensor``,
  ``torch.from_numpy``; JAX: device puts and host arguments of compiled programs in the trace);
* ``to_host``: arrays whose values reach the host (the syncs' arrays);
* ``tokenizer_calls`` and ``tokenized_chars``: calls into the tokenizer's Rust core (encode and
  decode, single or batched) and the characters they encoded;
* ``compiled``: programs compiled (JAX's backend compile events; PyTorch compiles nothing).

    .venv/bin/python benchmarks/host_share.py --base ../base --out results/host_share.json
    .venv/bin/python benchmarks/host_share.py --tiny          # a smoke run of this checkout alone
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _targets import machine, median_ratio, pinned, report, rotated, verdict  # noqa: E402

TARGET = 0.2  # this checkout's step time over the other's, at most
BACKENDS = ("torch", "jax")
TASK_TYPE = "pick"


# ----------------------------------------------------------------------------------- the inputs
def small_tokenizer(tokenizer: Any, size: int) -> Any:
    """``tokenizer`` (a fast byte-level BPE tokenizer) restricted to its first ``size`` ids: the
    vocabulary's first ``size`` tokens (every byte-level character among them) and the merges that
    build them. The same pre-tokenizer, special tokens and chat template; texts tokenize into more,
    shorter tokens."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = {t: i for t, i in spec["model"]["vocab"].items() if i < size}
    merges = []
    for merge in spec["model"]["merges"]:
        a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(merge)
    spec["model"]["vocab"], spec["model"]["merges"] = vocab, merges
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < size]
    small = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                    **{k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "unk_token",
                                                                          "pad_token") if getattr(tokenizer, k)})
    small.chat_template = tokenizer.chat_template
    return small


def build_inputs(folder: Path, vocab: int, width: int, context_tokens: int, n_candidates: int) -> dict:
    """The tiny model's HuggingFace folder (``gpu_check``'s random Llama, float32, ``width`` wide: two
    layers, heads of 8, one key-value head per two) and the episode every leg plays: the task's
    texts, a demonstration, the candidates."""
    import torch
    from transformers import AutoTokenizer

    from agent_shell.lm.default_model import default_model_dir
    from gpu_check import SIZES, llama, saved, text_of

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    if vocab:
        tokenizer = small_tokenizer(tokenizer, vocab)
    shape = dict(SIZES["tiny"][0], hidden_size=width, intermediate_size=2 * width, num_attention_heads=width // 8,
                 num_key_value_heads=max(width // 16, 1))
    saved(llama(tokenizer, shape, torch.float32, torch.device("cpu"), seed=2), tokenizer, folder)
    candidates = [f"{v} {o} {k}" for v in ("go to", "open", "take", "examine") for o in
                  ("cabinet", "drawer", "mug", "fridge", "shelf", "countertop", "sinkbasin", "desk")
                  for k in (1, 2)][:n_candidates]
    return {"folder": str(folder), "vocab": len(tokenizer), "instruction": "Your task is to: put a mug in shelf.",
            "observation": text_of(tokenizer, context_tokens, seed=7), "demo": text_of(tokenizer, 300, seed=1),
            "candidates": candidates}


def history_step(k: int, candidates: list[str]) -> Any:
    """Step ``k`` of the episode's history (the same text in every leg, whatever was chosen)."""
    try:
        from cb_io.records import Step
    except ImportError:  # a checkout from before cb_io.records held the records
        from envs.trajectory import Step

    return Step("env", f"open drawer {k}", f"You open the drawer {k}. In it, you see a mug {k}.", candidates,
                False, False, 0.0)


# ----------------------------------------------------------------------------------- counters
class _Counting:
    """A proxy of a tokenizer's Rust core that counts its encode and decode calls."""

    CALLS = ("encode", "encode_batch", "encode_batch_fast", "decode", "decode_batch")

    def __init__(self, inner: Any, counts: collections.Counter):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_counts", counts)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in self.CALLS:
            return value

        def counted(first, *args, **kwargs):
            self._counts["tokenizer_calls"] += 1
            if name.startswith("encode"):
                texts = first if name != "encode" else [first]
                self._counts["tokenized_chars"] += sum(len(t) if isinstance(t, str) else sum(map(len, t))
                                                       for t in texts)
            return value(first, *args, **kwargs)

        return counted

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


@contextlib.contextmanager
def tokenizer_counts(tokenizer: Any, counts: collections.Counter) -> Iterator[None]:
    """Count the calls into ``tokenizer``'s Rust core (a fast HuggingFace tokenizer) in the block."""
    inner = tokenizer._tokenizer
    tokenizer._tokenizer = _Counting(inner, counts)
    try:
        yield
    finally:
        tokenizer._tokenizer = inner


@contextlib.contextmanager
def torch_counts(counts: collections.Counter) -> Iterator[None]:
    """Count PyTorch's dispatched ops, host reads of tensor values and tensors made from host data."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            counts["torch_ops"] += 1
            return func(*args, **(kwargs or {}))

    def reads(name: str) -> Callable:
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            counts["syncs"] += 1
            counts["to_host"] += 1
            return method(self, *args, **kwargs)
        return read

    def makes(make: Callable) -> Callable:
        def made(*args, **kwargs):
            counts["to_device"] += 1
            return make(*args, **kwargs)
        return made

    saved = {name: getattr(torch.Tensor, name) for name in ("numpy", "tolist", "item", "__int__", "__float__",
                                                            "__bool__", "__index__")}
    makers = {name: getattr(torch, name) for name in ("tensor", "as_tensor", "from_numpy")}
    for name in saved:
        setattr(torch.Tensor, name, reads(name))
    for name, make in makers.items():
        setattr(torch, name, makes(make))
    try:
        with Ops():
            yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        for name, make in makers.items():
            setattr(torch, name, make)


#: Trace events of the JAX profiler: a program run, a host array put on the device, a compile.
JAX_EXECUTE = "ExecuteHelperOnSingleDevice"
JAX_PUTS = ("DevicePut", "BatchedCopyToDeviceWithSharding: dispatch")
JAX_COMPILE = "PjRtCpuClient::Compile"


@contextlib.contextmanager
def jax_counts(counts: collections.Counter, host_fetches: Callable) -> Iterator[None]:
    """Count JAX's program executions and host-to-device puts (from a ``jax.profiler`` trace of the
    block), compiles and the arrays read on the host (``host_fetches``)."""
    import jax

    with tempfile.TemporaryDirectory() as trace, host_fetches() as fetched:
        jax.profiler.start_trace(trace)
        try:
            yield
        finally:
            jax.profiler.stop_trace()
            counts["syncs"] += len(fetched)
            counts["to_host"] += len(fetched)
            (path,) = Path(trace).rglob("*.xplane.pb")
            names = collections.Counter(e.name for plane in jax.profiler.ProfileData.from_file(str(path)).planes
                                        for line in plane.lines for e in line.events)
            counts["jax_programs"] += sum(n for name, n in names.items() if name.endswith(JAX_EXECUTE))
            counts["to_device"] += sum(names[name] for name in JAX_PUTS)
            counts["compiled"] += names[JAX_COMPILE]


# ----------------------------------------------------------------------------------- one leg
def leg(spec: dict, backend: str, warmup: int, steps: int, count_steps: int) -> dict:
    """One checkout's steps in this process (pinned: :func:`_targets.pinned`): their seconds, actions
    and counts."""
    import numpy as np

    import agent_shell
    import cb_core
    from agent_shell.agents import AgentConfig, CBAgent
    from agent_shell.agents.step import View
    from agent_shell.lm import load_language_model
    from cb_core.cache import enable_persistent_cache
    from envs.protocol import TaskStart

    store = tempfile.TemporaryDirectory()
    enable_persistent_cache(Path(store.name), lambda path, data: (path.parent.mkdir(parents=True, exist_ok=True),
                                                                 path.write_bytes(data)))
    model = ("jax:" if backend == "jax" else "") + spec["folder"]
    lm = load_language_model(model, dtype="float32", device="cpu")
    concept = cb_core.Concept(np.random.default_rng(3).normal(0, 0.3, lm.hidden_size + 1).astype(np.float32),
                              0.8, 1e-6, {})
    agent = CBAgent(lm, {TASK_TYPE: [spec["demo"]]}, concepts={TASK_TYPE: concept},
                    config=AgentConfig.for_env("alfworld"), scoring_lm=lm.fork())
    start = TaskStart("host-share", TASK_TYPE, spec["instruction"], spec["observation"])
    candidates = spec["candidates"]
    agent.pin_head(TASK_TYPE)
    compiles = collections.Counter()
    if backend == "jax":
        import jax

        jax.monitoring.register_event_duration_secs_listener(
            lambda event, *_a, **_k: compiles.update(["compiled"]) if event.endswith("backend_compile_duration")
            else None)
    history, rows = [], []
    counts = collections.Counter()
    for k in range(warmup + steps + count_steps):
        history.append(history_step(k, candidates))
        view = View(start, tuple(history), tuple(candidates))
        counted = k >= warmup + steps
        before = compiles["compiled"]
        with contextlib.ExitStack() as stack:
            if counted:  # both libraries: the PyTorch backend's decision runs in JAX (cb_core's kernel)
                from _fetches import host_fetches

                stack.enter_context(tokenizer_counts(lm.tokenizer, counts))
                stack.enter_context(jax_counts(counts, host_fetches))
                stack.enter_context(torch_counts(counts))
            t = time.perf_counter()
            decision = agent.next_action(view)
            seconds = time.perf_counter() - t
        rows.append({"seconds": seconds, "route": decision.seconds.get("route"),
                     "choose": decision.seconds.get("choose"), "kind": decision.kind, "action": decision.action,
                     "chosen": decision.chosen, "compiled": compiles["compiled"] - before, "timed": warmup <= k < warmup
                     + steps})
    timed = [r for r in rows if r["timed"]]
    counts["ops"] = counts["torch_ops"] + counts["jax_programs"]
    per_step = {key: counts[key] / count_steps for key in ("ops", "torch_ops", "jax_programs", "syncs", "to_device",
                                                           "to_host", "tokenizer_calls", "tokenized_chars", "compiled")}
    import torch

    return {"code": str(Path(agent_shell.__file__).resolve().parents[1]), "backend": backend,
            "pinned": {"cpus": sorted(os.sched_getaffinity(0)), "torch_threads": torch.get_num_threads(),
                       "xla_flags": os.environ.get("XLA_FLAGS", "")},
            "step_s": statistics.median(r["seconds"] for r in timed),
            "route_s": statistics.median(r["route"] or 0.0 for r in timed),
            "choose_s": statistics.median(r["choose"] or 0.0 for r in timed),
            "max_step_s": max(r["seconds"] for r in timed), "per_step": per_step,
            "compiled_in_timed_steps": sum(r["compiled"] for r in timed), "steps": rows}


def run_leg(root: Path, spec_file: Path, backend: str, args: argparse.Namespace) -> dict:
    """A leg in a fresh process importing the checkout at ``root``, pinned to one CPU and thread."""
    env = dict(os.environ, PYTHONPATH=str(root), TOKENIZERS_PARALLELISM="false",
               CB_AGENT_CACHE=str(spec_file.parent / "cache"))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--leg", str(spec_file), "--backends", backend,
           "--warmup", str(args.warmup), "--steps", str(args.steps), "--count-steps", str(args.count_steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=str(root))
    if out.returncode != 0:
        raise SystemExit(f"leg {backend} of {root} failed:\n{out.stderr[-4000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["code"]).resolve() != root.resolve():
        raise SystemExit(f"leg of {root} imported agent_shell from {result['code']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=None, help="the other checkout's root (default: none, this checkout alone)")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--context-tokens", type=int, default=1000)
    parser.add_argument("--vocab", type=int, default=4096, help="the tokenizer's first VOCAB ids (0: all of them)")
    parser.add_argument("--width", type=int, default=16, help="the model's width (a multiple of 8)")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--count-steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="2 warm-up, 2 timed, 1 counted step, one repeat")
    parser.add_argument("--out", default=None, help="write the figures here as JSON")
    parser.add_argument("--leg", default=None, help=argparse.SUPPRESS)  # a leg's process: the inputs' file
    args = parser.parse_args(argv)
    if args.tiny:
        args.warmup, args.steps, args.count_steps, args.repeats = 2, 2, 1, 1
    backends = args.backends.split(",")
    if args.leg:
        spec = json.loads(Path(args.leg).read_text())
        with pinned(1):  # one CPU, one thread: torch, OpenMP, BLAS and XLA alike, before they load
            print(json.dumps(leg(spec, backends[0], args.warmup, args.steps, args.count_steps)))
        return 0
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"--backends: unknown {unknown}; choose from {list(BACKENDS)}")
    here = HERE.parent
    roots = {"this": here, **({"base": Path(args.base).resolve()} if args.base else {})}
    for name, root in roots.items():
        if not (root / "agent_shell" / "__init__.py").is_file():
            raise SystemExit(f"--base {root}: no agent_shell package there")
    sys.path.insert(0, str(here))
    figures: dict = {"candidates": args.candidates, "context_tokens": args.context_tokens, "warmup": args.warmup,
                     "steps": args.steps, "count_steps": args.count_steps, "repeats": args.repeats,
                     "dtype": "float32", "threads": 1, "roots": {k: str(v) for k, v in roots.items()},
                     "target_ratio": TARGET, "machine_before": machine()}
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = build_inputs(Path(tmp) / "model", args.vocab, args.width, args.context_tokens, args.candidates)
        spec_file = Path(tmp) / "episode.json"
        spec_file.write_text(json.dumps(spec))
        figures["vocab"], figures["width"] = spec["vocab"], args.width
        for backend in backends:
            legs: dict[str, list[dict]] = {name: [] for name in roots}
            for r in range(args.repeats):
                for name in rotated(list(roots), r):
                    legs[name].append(run_leg(roots[name], spec_file, backend, args))
                    print(f"{backend} {name} repeat {r}: step {legs[name][-1]['step_s']!r} s, "
                          f"per step {legs[name][-1]['per_step']}", flush=True)
            row: dict = {}
            for name, runs in legs.items():
                row[name] = {"pinned": runs[0]["pinned"], "step_s": [x["step_s"] for x in runs],
                             "route_s": [x["route_s"] for x in runs],
                             "choose_s": [x["choose_s"] for x in runs], "max_step_s": [x["max_step_s"] for x in runs],
                             "per_step": runs[0]["per_step"],
                             "compiled_in_timed_steps": [x["compiled_in_timed_steps"] for x in runs],
                             "actions": [s["action"] for s in runs[0]["steps"]]}
                if any([s["action"] for s in x["steps"]] != row[name]["actions"] for x in runs):
                    raise SystemExit(f"{backend}: the {name} legs took different actions from repeat to repeat")
            if "base" in legs:
                if row["base"]["actions"] != row["this"]["actions"]:
                    raise SystemExit(f"{backend}: this checkout took other actions than the base: "
                                     f"{row['this']['actions']} against {row['base']['actions']}")
                row["same_actions"] = True
                row["ratio"] = median_ratio(row["this"]["step_s"], row["base"]["step_s"])
                row["ratio_choose"] = median_ratio(row["this"]["choose_s"], row["base"]["choose_s"])
                v = verdict(f"{backend}: this checkout's warm step / the base's, {args.candidates} candidates, "
                            "tiny model, one CPU", row["ratio"], TARGET, at_most=True)
                verdicts.append(v)
                row["verdict"] = v
            figures[backend] = row
    figures["verdicts"] = verdicts
    figures["machine_after"] = machine()
    return report(figures, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
