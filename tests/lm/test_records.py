"""The named records between the host and the compiled programs (:mod:`agent_shell.lm.records`):
built and read in that module alone, one kind per program, nothing outside it reading by offset."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from agent_shell.lm import records
from agent_shell.lm.buckets import Sizes
from agent_shell.lm.scores import CandidateScores
from agent_shell.lm.records import (DecideInputs, DecisionFields, StreamInputs, pack, pack_decision,
                                    read_decision, unpack)

LM = Path(records.__file__).parent


def test_a_record_travels_in_one_array_and_comes_back_by_name():
    sizes = Sizes(t=4, k=2, p=3, c=1, l=2)
    record = StreamInputs(tokens=[5, 6, 7, 8], positions=[0, 1, 2, 3], at=9, head=[2, 3], pair_row=[0, 1, 1],
                          pair_target=[11, 12, 13], capture=[3], layers=[0, 2])
    flat = pack(record, sizes)
    assert flat.dtype == np.int32 and flat.shape == (4 + 4 + 1 + 2 + 3 + 3 + 1 + 2,)
    back = unpack(StreamInputs, sizes, flat)
    assert back.at.shape == () and int(back.at) == 9
    for name in StreamInputs._fields:
        assert np.asarray(getattr(back, name)).tolist() == np.asarray(getattr(record, name)).tolist(), name


def test_a_field_of_the_wrong_size_is_refused_naming_it():
    sizes = Sizes(t=2, k=1, p=1, m=8)
    record = DecideInputs(tokens=[1, 2], positions=[0, 1], at=0, head=[1], pair_row=[0], pair_target=[3],
                          owner=[0], final=[0] * 7, n_tokens=[1] * 8, count=1)
    with pytest.raises(ValueError, match=r"DecideInputs\.final: shape \(7,\)"):
        pack(record, sizes)


def test_a_decision_comes_to_the_host_in_one_array_and_a_non_finite_one_is_told():
    import jax.numpy as jnp

    out = DecisionFields(jnp.array([-0.5, -1.0, -9.0, -9.0]), jnp.array([-0.1, -0.2, 0.0, 0.0]),
                         jnp.array([0.3, -0.3, 0.0, 0.0]), jnp.int32(1), jnp.bool_(True))
    record = np.asarray(pack_decision(out))
    assert record.shape == (3 * 4 + 2,) and record.dtype == np.float32
    fetched = []

    class Head:  # a head whose host check names candidate 1
        def check(self, hidden, log_q, n_tokens):
            raise ValueError(f"candidate 1: non-finite log_q {log_q[1]}")

    def culprit():
        fetched.append(True)
        return CandidateScores(np.array([-1.0, np.nan], np.float32), np.ones(2, np.int32), np.zeros((2, 3), np.float32))

    decided = read_decision(record, 2, culprit, Head())
    assert decided.chosen == 1 and fetched == []  # the scores are fetched only for a non-finite input
    assert decided.log_p.tolist() == [-0.5, -1.0] and decided.concept_term.tolist() == pytest.approx([0.3, -0.3])
    with pytest.raises(ValueError, match="candidate 1: non-finite log_q nan"):
        read_decision(np.asarray(pack_decision(out._replace(finite=jnp.bool_(False)))), 2, culprit, Head())
    assert fetched == [True]


#: Names under which the old modules sliced the packed arrays by offset.
PACKED = {"ints", "record", "flat", "vector"}


def test_no_module_but_the_records_one_indexes_a_packed_array():
    """Every ``lm`` module but :mod:`agent_shell.lm.records`: no subscript of a packed array (the
    inputs ``ints``, a fetched ``record``, a concept ``vector``), so its layout is read in one place."""
    offenders = []
    for path in sorted(LM.glob("*.py")):
        if path.name == "records.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in PACKED:
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


@pytest.mark.slow  # two fresh backends compile their programs
def test_the_backend_reads_no_offset_of_its_own_a_reversed_layout_decides_alike(tiny_backbones, monkeypatch,
                                                                               no_executable_store):
    """The JAX backend's passes with every record laid out in reverse field order (a change made in
    the records module alone) give the same stream, scores and decision as the natural order: no
    other module knows where a field lies. The store of compiled programs is off: the patched layout
    has the same source, hence the same key, as the natural one."""
    import cb_core
    from agent_shell.lm import decision as decision_module
    from agent_shell.lm import load_language_model

    _, jax_lm = tiny_backbones["llama"]
    path = jax_lm.name  # its folder: a new backend on it has programs of its own
    candidates = ["go to desk 1", "go to drawer 2", "open drawer 2", "take mug 1"]
    concept = cb_core.Concept(np.random.default_rng(1).normal(0, 0.3, jax_lm.hidden_size + 1).astype(np.float32),
                              0.8, 1e-6)

    def run():
        lm = load_language_model(f"jax:{path}", dtype="float32", device="cpu")
        decision_module._program.cache_clear()
        scores = lm.score("You are in a room.", candidates, "\n> ")
        decided = lm.decide("You are in a room. You see a desk.", candidates, "\n> ", concept.decision_head)
        reply = lm.generate("You are in a room.", max_new_tokens=4)
        return scores, decided, reply

    natural = run()
    spans = records._spans
    monkeypatch.setattr(records, "_spans", lambda kind, sizes: _reversed(spans(kind, sizes)))
    flipped = run()
    assert flipped[2] == natural[2]
    np.testing.assert_array_equal(flipped[0].log_q, natural[0].log_q)
    np.testing.assert_array_equal(flipped[0].hidden, natural[0].hidden)
    assert flipped[1].chosen == natural[1].chosen
    np.testing.assert_array_equal(flipped[1].log_p, natural[1].log_p)
    np.testing.assert_array_equal(flipped[1].concept_term, natural[1].concept_term)
    decision_module._program.cache_clear()


def _reversed(spans: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """The same fields' spans, laid out last field first."""
    total = sum(b - a for a, b, _ in spans)
    return [(total - b, total - a, shape) for a, b, shape in spans]
