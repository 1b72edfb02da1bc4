"""What a failed forward pass is: a fault of the backbone, or one episode's context too large for
the memory.

A backend's pass fails for two reasons that call for opposite handling. A pass whose shapes do not
fit its weights, or ids past its embedding table, fails again whatever the episode:
:class:`agent_shell.lm.protocol.BackboneFault` stops the run in one line. A pass that runs out of
memory fails because of its size (this episode's context, this candidate set), and a shorter one
runs: :class:`PassOutOfMemory` ends that episode as an error record
(:func:`envs.episode.play_within`, it is an :class:`cb_io.records.EngineError`) and the run goes on;
``--resume`` plays the episode again and, if it runs out of memory again, stores its error record
again and goes on.

Out of memory, as each library says it (:func:`is_out_of_memory`):

* PyTorch on the CPU: a plain ``RuntimeError`` ("DefaultCPUAllocator: can't allocate memory: you
  tried to allocate N bytes");
* PyTorch on CUDA: ``torch.OutOfMemoryError`` ("CUDA out of memory. Tried to allocate 2.00 GiB");
* JAX / XLA: ``JaxRuntimeError`` ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate N
  bytes").

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

import re

from agent_shell.lm.protocol import BackboneFault
from cb_io.records import EngineError

#: What each library's out-of-memory message says (PyTorch CPU and CUDA, XLA's status code).
_OOM = re.compile(r"out of memory|can't allocate memory|not enough memory|cannot allocate memory|"
                  r"RESOURCE_EXHAUSTED", re.IGNORECASE)
#: The allocation a message names: "allocate 2.00 GiB", "allocate 17179869184 bytes".
_ASKED = re.compile(r"allocate\s+([0-9][0-9.,]*)\s*(bytes|[KMGTP]i?B)\b", re.IGNORECASE)
_UNITS = {"bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}


class PassOutOfMemory(EngineError):
    """A forward pass ran out of memory: a fault of the episode's size, not of the backbone. Its
    one-line message names the pass, the context length and the memory asked for; ``details``
    (``context_tokens``, ``bytes_asked``: None when the message names no size) go into the
    episode's error record (:func:`agent_shell.results.error_record`)."""

    def __init__(self, message: str, context_tokens: int | None, bytes_asked: int | None):
        super().__init__(message)
        self.details = {"context_tokens": context_tokens, "bytes_asked": bytes_asked}


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a library's out-of-memory error (the module docstring's list)."""
    return type(err).__name__ == "OutOfMemoryError" or bool(_OOM.search(str(err)))


def bytes_asked(message: str) -> int | None:
    """The allocation an out-of-memory message names, in bytes (None: it names none)."""
    found = _ASKED.search(message)
    if found is None:
        return None
    return int(float(found.group(1).replace(",", "")) * _UNITS[found.group(2).lower()])


def pass_fault(err: BaseException, what: str, context_tokens: int | None) -> EngineError | BackboneFault:
    """The error a backend raises for its pass ``what`` (e.g. ``"the PyTorch forward pass"``) that
    raised ``err`` on a context of ``context_tokens`` tokens: :class:`PassOutOfMemory` when ``err``
    is out of memory, else :meth:`BackboneFault.of`."""
    if not is_out_of_memory(err):
        return BackboneFault.of(err, what)
    first = (str(err).strip().splitlines() or [""])[0]
    asked = bytes_asked(str(err))
    size = f"a context of {context_tokens:,} tokens" if context_tokens is not None else "its context"
    wanted = f", asking for {asked / 2**30:.4g} GiB ({asked:,} bytes)" if asked is not None else ""
    return PassOutOfMemory(f"{what} ran out of memory on {size}{wanted}: this episode ends as an error record, "
                           f"the run goes on ({type(err).__name__}: {first[:120]})", context_tokens, asked)


__all__ = ["PassOutOfMemory", "bytes_asked", "is_out_of_memory", "pass_fault"]
