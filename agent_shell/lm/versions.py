"""The version ranges of the numeric libraries this project is tested with, checked before anything
heavy loads.

The KV-cache code follows transformers internals that change between releases (a cache layer's
``lazy_initialization``, the ``cache`` / ``past_key_values`` keyword of ``forward``), the vLLM
backend follows vLLM's pooling API, and cb_core's compiled programs follow JAX. Outside the
ranges below the code may fail deep inside a model call, so :func:`check_versions` refuses with
one line naming the package, its version, the range and the pip command. ``pyproject.toml`` states
the same ranges (a test keeps them equal).

Reads installed package metadata only (never imports the packages). Must not import the agents or
the environments.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Iterable

#: Package -> the range it is tested in (pip specifier syntax), as ``pyproject.toml`` states it.
TESTED: dict[str, str] = {
    "torch": ">=2.4,<3",
    "transformers": ">=5.0,<6",
    "jax": ">=0.4.30,<0.11",
    "flax": ">=0.12,<0.13",
    "vllm": ">=0.15,<1",
}
#: Set to 1 to run with versions outside :data:`TESTED` anyway (at your own risk).
ALLOW_UNTESTED_ENV = "CB_AGENT_ALLOW_UNTESTED"


class UntestedVersion(ValueError):
    """An installed library lies outside its tested range (the message gives the pip command)."""


def installed_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def untested(names: Iterable[str] = ("torch", "transformers", "jax")) -> dict[str, str]:
    """Package -> installed version, for each of ``names`` installed outside its :data:`TESTED`
    range (packages that are not installed are left to their own import errors)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    out = {}
    for name in names:
        version = installed_version(name)
        if version is None:
            continue
        try:
            release = Version(Version(version).base_version)  # 2.13.0+cpu and 0.16.0rc1 count as releases
        except InvalidVersion:
            out[name] = version
            continue
        if release not in SpecifierSet(TESTED[name]):
            out[name] = version
    return out


def check_versions(names: Iterable[str] = ("torch", "transformers", "jax")) -> None:
    """Refuse libraries outside their tested ranges, unless ``$CB_AGENT_ALLOW_UNTESTED`` is 1.

    Raises:
        UntestedVersion: the first package outside its range, in one line.
    """
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return
    for name, version in untested(names).items():
        raise UntestedVersion(f"{name} {version} is outside the tested range {name}{TESTED[name]}: "
                              f"pip install '{name}{TESTED[name]}' (or set {ALLOW_UNTESTED_ENV}=1 to try it anyway)")


__all__ = ["ALLOW_UNTESTED_ENV", "TESTED", "UntestedVersion", "check_versions", "installed_version", "untested"]
