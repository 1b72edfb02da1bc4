"""Crafted decision-set and concept files are refused from their headers, before anything large is
allocated, inflated or read (a header claiming 10^6 x 10^6 floats, a small compressed member that
inflates hugely, a concept whose tensor disagrees with its hidden_size)."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

import cb_core
from cb_core.decision_file import load_decisions_metadata
from core_helpers import random_decisions

MIB = 1 << 20


def _npy(array: np.ndarray | None = None, *, shape=None, dtype="<f4", data: bytes = b"") -> bytes:
    """One .npy member: ``array`` as numpy writes it, or a header claiming ``shape`` and ``dtype``
    followed by ``data``."""
    buf = io.BytesIO()
    if array is not None:
        np.lib.format.write_array(buf, array, allow_pickle=False)
    else:
        np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
        buf.write(data)
    return buf.getvalue()


def _archive(path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> None:
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, content in members.items():
            z.writestr(name + ".npy", content)


def _valid_members(**replace: bytes) -> dict[str, bytes]:
    dec = random_decisions(0, [3, 2], 4)
    members = {k: _npy(np.asarray(getattr(dec, k))) for k in ("hidden", "log_q", "n_tokens", "offsets", "expert")}
    members.update(replace)
    return members


def _peak_while(fn) -> int:
    """Peak bytes Python and numpy allocate while ``fn()`` runs (numpy reports to tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_a_header_claiming_a_trillion_floats_is_refused_in_one_line(tmp_path):
    """The member declares float32 (10^6, 10^6) (4 TB) but stores 16 bytes: refused naming the
    field and both sizes, not an uncaught _ArrayMemoryError."""
    path = tmp_path / "crafted.npz"
    _archive(path, _valid_members(hidden=_npy(shape=(10**6, 10**6), data=b"\0" * 16)))
    with pytest.raises(ValueError, match=r"field hidden declares float32 \(1000000, 1000000\) "
                                         r"\(4000000000000 bytes\) but the archive stores 16 bytes"):
        cb_core.load_decisions(path)
    from agent_shell.commands.fit import fit as fit_cmd

    res = CliRunner().invoke(fit_cmd, [str(path), "--out", str(tmp_path / "c"), "--no-cache"])
    assert res.exit_code == 1 and res.exception is not None and isinstance(res.exception, SystemExit)
    (line,) = res.output.strip().splitlines()
    assert line.startswith("Error: ") and "field hidden declares" in line


def test_a_small_member_that_inflates_hugely_is_refused_before_inflating(tmp_path):
    """A 64 MiB member of zeros compresses to about 64 KiB; with a 16 MiB cap it is refused from
    its header, and loading allocates well under the member's size (nothing was inflated)."""
    path = tmp_path / "bomb.npz"
    zeros = _npy(np.zeros((4096, 4096), np.float32))
    _archive(path, _valid_members(hidden=zeros), compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < MIB
    del zeros

    def load():
        with pytest.raises(ValueError, match=r"declare over 0\.0156 GiB \(field hidden: float32 \(4096, 4096\)\)"):
            cb_core.load_decisions(path, max_bytes=16 * MIB)

    assert _peak_while(load) < 4 * MIB
    with pytest.raises(ValueError, match=r"log_q must be \[T\] = \[4096\]"):  # under the cap: read, then validated
        cb_core.load_decisions(path, max_bytes=128 * MIB)
    from agent_shell.commands.fit import fit as fit_cmd

    res = CliRunner().invoke(fit_cmd, [str(path), "--out", str(tmp_path / "c"), "--no-cache", "--max-gib", "0.01"])
    assert res.exit_code == 1 and "declare over 0.01 GiB" in res.output and "Traceback" not in res.output


def test_a_metadata_member_claiming_a_huge_string_is_refused(tmp_path):
    path = tmp_path / "crafted.npz"
    _archive(path, _valid_members(metadata=_npy(shape=(10**9,), dtype="<U1", data=b"{}")))
    with pytest.raises(ValueError, match="field metadata declares"):
        load_decisions_metadata(path)


def test_a_header_that_is_no_npy_header_is_named(tmp_path):
    path = tmp_path / "crafted.npz"
    _archive(path, _valid_members(log_q=b"\x93NUMPY\x09\x00 not a header"))
    with pytest.raises(ValueError, match="field log_q has no valid .npy header"):
        cb_core.load_decisions(path)


def test_files_numpy_writes_still_load(tmp_path):
    """savez and savez_compressed archives (every existing file) load as before."""
    dec = random_decisions(3, [4, 2, 5], 6)
    arrays = dict(hidden=dec.hidden, log_q=dec.log_q, n_tokens=dec.n_tokens, offsets=dec.offsets,
                  expert=dec.expert, metadata=np.asarray(json.dumps({"backbone": "x"})))
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "d.npz", **arrays)
        back = cb_core.load_decisions(tmp_path / "d.npz")
        np.testing.assert_array_equal(back.hidden, dec.hidden)
        np.testing.assert_array_equal(back.expert, dec.expert)
        assert load_decisions_metadata(tmp_path / "d.npz") == {"backbone": "x"}


def test_running_out_of_memory_is_one_line(tmp_path, monkeypatch):
    from agent_shell.commands.fit import fit as fit_cmd

    path = tmp_path / "d.npz"
    _archive(path, _valid_members())

    def no_memory(*_args, **_kwargs):
        raise MemoryError("Unable to allocate 18.6 GiB for an array with shape (976563, 5120)")

    monkeypatch.setattr(cb_core, "load_decisions", no_memory)
    res = CliRunner().invoke(fit_cmd, [str(path), "--out", str(tmp_path / "c"), "--no-cache"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
    (line,) = res.output.strip().splitlines()
    assert "not enough memory" in line and "Unable to allocate 18.6 GiB" in line


def test_a_concept_header_is_checked_before_its_tensor_is_read(tmp_path):
    """A concept file whose alpha (2^21 floats, 8 MiB) disagrees with its hidden_size (4) is
    refused from the header: loading it allocates far less than the tensor."""
    from safetensors.numpy import save_file

    meta = dict(backbone="tiny-lm", features="App. B", gamma=0.8, lam=1.0, eps=1e-6, task_type="pick",
                trajectories=[], versions={}, hidden_size=4)
    path = tmp_path / "c.safetensors"
    save_file({"alpha": np.zeros(1 << 21, np.float32)}, str(path),
              metadata={"format": "cb-agent-concept/1", "metadata": json.dumps(meta)})

    def load():
        with pytest.raises(ValueError, match="metadata field 'hidden_size' = 4 but alpha has 2097152"):
            cb_core.Concept.load(path)

    assert _peak_while(load) < MIB
