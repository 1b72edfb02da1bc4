"""A diagnostic for measurements and tests, not for runs: the JAX arrays whose values reach the host.

:func:`host_fetches` patches JAX's array value and NumPy's two constructors for the duration of a
block (process-wide, not thread-safe), so it lives beside the benchmarks and never in the package.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import numpy as np


@contextlib.contextmanager
def host_fetches() -> Iterator[list[tuple[int, ...]]]:
    """Count the JAX arrays whose values reach the host while the context is open: a list that
    grows by the shape of each one (a diagnostic for measurements and tests, not for runs).

    Counted: every first read of an array's value (``int``, ``float``, ``.tolist()``,
    ``jax.device_get``, ...) and every ``np.asarray`` / ``np.array`` of a JAX array (on a CPU
    NumPy reads those through the buffer protocol, below any Python hook). Not thread-safe:
    it patches ``jax.Array``'s value and NumPy's two constructors for the duration.
    """
    from jax._src.array import ArrayImpl

    seen: list[tuple[int, ...]] = []
    value, asarray, array = ArrayImpl._value, np.asarray, np.array

    def read(self):
        if self._npy_value is None:
            seen.append(tuple(self.shape))
        return value.fget(self)

    def converting(make):
        def convert(obj, *args, **kwargs):
            if isinstance(obj, jax.Array):
                seen.append(tuple(obj.shape))
            return make(obj, *args, **kwargs)
        return convert

    ArrayImpl._value, np.asarray, np.array = property(read), converting(asarray), converting(array)
    try:
        yield seen
    finally:
        ArrayImpl._value, np.asarray, np.array = value, asarray, array


__all__ = ["host_fetches"]
