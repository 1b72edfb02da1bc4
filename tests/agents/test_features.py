"""Feature extractors: the protocol, the built-in blocks, selection by name and the entry point.

Also the documented example of a third-party extractor (:class:`WordCount`): a class whose
constructor takes the spec's argument, registered in a package's ``pyproject.toml`` as::

    [project.entry-points."cb_agent.feature_extractors"]
    word-count = "my_package.features:WordCount"
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

import cb_core
from agent_doubles import FakeLM
from entry_point_doubles import install_entry_point
from agent_shell.features import (DecisionInput, FeatureExtractor, FeatureSet, available_extractors,
                                  check_extractors, make_extractor, parse_features, recorded_extractors)
from agent_shell.features import registry
from agent_shell.features.actions import names_in, split_action
from agent_shell.features.goal import GoalSimilarity
from agent_shell.features.novelty import Novelty


class WordCount:
    """Example third-party extractor: one column, the candidate's number of words (``word-count``),
    or of words longer than N letters (``word-count:N``)."""

    def __init__(self, arg: str | None = None):
        self.min_len = int(arg) if arg else 0
        self.name = "word-count" + (f":{arg}" if arg else "")
        self.metadata = {"columns": ["n_words"], "min_len": self.min_len}

    def size(self, lm) -> int:
        return 1

    def extract(self, decision, lm, scores) -> np.ndarray:
        return np.array([[sum(len(w) > self.min_len for w in c.split())] for c in decision.candidates], np.float32)


def step(action: str, observation: str, kind: str = "env"):
    return SimpleNamespace(kind=kind, action=action, observation=observation)


def decision(candidates, history=(), instruction="Your task is to: put a clean mug in coffeemachine.",
             observation="You are in the middle of a room.", context="ctx") -> DecisionInput:
    return DecisionInput(context, instruction, observation, tuple(history), tuple(candidates))


@pytest.fixture()
def plugin(site):
    for name in ("word-count", "lm-hidden", "misnamed"):
        install_entry_point(site, registry.ENTRY_POINT_GROUP, name, "test_features:WordCount", f"cb-{name}-plugin")


# ---------------------------------------------------------------------------------- actions

@pytest.mark.parametrize("action, parts", [
    ("take mug 2 from countertop 1", ("take", "mug 2", "countertop 1")),
    ("go to cabinet 3", ("go to", "cabinet 3", "")),
    ("move mug 2 to coffeemachine 1", ("move", "mug 2", "coffeemachine 1")),
    ("put soap bar 1 in/on toilet 1", ("put", "soap bar 1", "toilet 1")),
    ("pick up red apple", ("pick up", "red apple", "")),
    ("go north", ("go", "north", "")),
    ("look", ("look", "", "")),
    ("  ", ("", "", "")),
])
def test_split_action(action, parts):
    p = split_action(action)
    assert (p.verb, p.obj, p.receptacle) == parts


def test_names_in_ignores_numbers_and_plural_s():
    words = frozenset("your task is to put two cellphones in bed".split())
    assert names_in("cellphone 3", words) and names_in("bed 1", words)
    assert not names_in("desk 1", words) and not names_in("", words) and not names_in("12", words)


# ---------------------------------------------------------------------------------- novelty

def test_novelty_counts_repeats_objects_and_outcomes():
    history = [step("go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed."),
               step("think: open it", "OK.", kind="think"),
               step("open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see nothing."),
               step("examine drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see nothing."),
               step("go to shelf 1", "Nothing happens."),
               step("go to shelf 1", "Nothing happens.")]
    cands = ["go to shelf 1", "examine drawer 1", "open drawer 1", "close drawer 1", "go to desk 1", "look"]
    block = Novelty().extract(decision(cands, history), None, None)
    assert block.shape == (6, 13) and block.dtype == np.float32
    expected = np.array([
        # taken >= 1 2 4 8 16, object taken >= 1 2 4 8 16, taken last, last nothing, last unchanged
        [1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1],   # the second "Nothing happens." equals the one before it
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 1],   # examine repeated open's observation
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
        [0] * 13,
        [0] * 13,                                  # no object
    ], np.float32)
    np.testing.assert_array_equal(block, expected)
    fresh = Novelty().extract(decision(cands), None, None)
    assert not fresh.any()  # no history, nothing is a repeat


# ---------------------------------------------------------------------------------- goal similarity

class BagOfWordsEmbedder:
    """Unit bag-of-words vectors (hashed words), so a cosine counts shared words; counts calls."""

    metadata = {"model": "bag-of-words", "dim": 64}

    def __init__(self):
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        out = np.zeros((len(texts), 64), np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().replace(".", " ").split():
                out[i, int(hashlib.sha256(w.encode()).hexdigest(), 16) % 64] += 1
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def test_goal_similarity_columns_and_embedding_memo():
    emb = BagOfWordsEmbedder()
    ext = GoalSimilarity(embedder=emb)
    history = [step("go to countertop 1", "On the countertop 1, you see a mug 2 and a bread 1.")]
    cands = ["take mug 2 from countertop 1", "take bread 1 from countertop 1", "go to coffeemachine 1",
             "go to bed 1"]
    d = decision(cands, history)
    block = ext.extract(d, None, None)
    assert block.shape == (4, 4)
    e = emb.embed(cands + [d.instruction, d.latest_observation])
    np.testing.assert_allclose(block[:, 0], e[:4] @ e[4], atol=1e-6)
    np.testing.assert_allclose(block[:, 1], e[:4] @ e[5], atol=1e-6)
    assert block[:, 2].tolist() == [1, 0, 1, 0]   # mug, bread, coffeemachine, bed
    assert block[:, 3].tolist() == [0, 0, 0, 0]   # countertop is not in the instruction
    assert block[2, 0] > block[3, 0]              # shares "coffeemachine" with the task
    assert d.latest_observation == history[0].observation
    n_texts = sum(map(len, emb.calls[:1]))
    ext.extract(d, None, None)                    # everything memoised: no new embedding call
    assert len(emb.calls) == 2 and n_texts == 6
    assert ext.metadata == {"columns": ["cos_instruction", "cos_observation", "object_in_instruction",
                                        "receptacle_in_instruction"], "embedder": BagOfWordsEmbedder.metadata}


def test_goal_similarity_with_the_offline_embedder_prefers_the_goal_receptacle():
    ext = GoalSimilarity()
    block = ext.extract(decision(["go to coffeemachine 1", "go to bed 1", "go to sidetable 2"]), None, None)
    assert block[0, 0] > block[1, 0] + 0.1 and block[0, 0] > block[2, 0] + 0.1
    assert ext.metadata["embedder"]["model"] == "sentence-transformers/all-MiniLM-L6-v2"


# ---------------------------------------------------------------------------------- the set

def test_feature_set_concatenates_blocks_in_order_and_describes_them():
    lm = FakeLM(hidden_size=8)
    d = decision(["go to shelf 1", "open drawer 1", "take mug 2 from shelf 1"],
                 [step("go to shelf 1", "Nothing happens.")])
    scores = lm.score(d.context, list(d.candidates), "\n> ")
    fs = FeatureSet.from_spec("novelty, lm-hidden")
    x = fs.extract(d, lm, scores)
    assert fs.names == ("novelty", "lm-hidden") and fs.spec == "novelty,lm-hidden" and not fs.is_default
    assert x.shape == (3, 13 + 8) and fs.size(lm) == 21
    np.testing.assert_array_equal(x[:, :13], Novelty().extract(d, lm, scores))
    np.testing.assert_array_equal(x[:, 13:], scores.hidden)
    desc = fs.describe(lm)
    assert [(b["name"], b["size"]) for b in desc] == [("novelty", 13), ("lm-hidden", 8)]
    assert FeatureSet.from_spec().is_default and FeatureSet.from_spec().names == ("lm-hidden",)


def test_composed_features_fit_in_cb_core_unchanged():
    """The blocks replace hidden in cb_core: columns constant in a set give feature 0, the fit's
    Hessian stays >= lam I, and alpha has one entry per column plus the bias."""
    lm = FakeLM(hidden_size=4)
    fs = FeatureSet.from_spec("lm-hidden,novelty")
    rows = []
    for t in range(6):
        cands = [f"go to shelf {i}" for i in range(1, 4)] + ["open drawer 1"]
        d = decision(cands, [step("go to shelf 1", "Nothing happens.")] * (t % 3), context=f"ctx {t}")
        s = lm.score(d.context, cands, "\n> ")
        rows.append((fs.extract(d, lm, s), s.log_q, s.n_tokens, t % 4))
    dec = cb_core.decisions_from_lists(*map(list, zip(*rows)))
    phi = np.asarray(cb_core.features(dec))
    assert phi.shape == (24, 4 + 13 + 1)
    assert np.all(phi[:4, 4:17] == 0)  # first decision: no history, every novelty column constant
    res = cb_core.fit(dec, lam=0.5)
    assert res.converged and res.alpha.shape == (18,)
    assert np.linalg.eigvalsh(np.asarray(cb_core.hessian(res.alpha, dec, lam=0.5))).min() >= 0.5 - 1e-5


def test_blocks_of_the_wrong_shape_or_non_finite_are_named():
    class Bad(WordCount):
        def extract(self, decision, lm, scores):
            return np.full((len(decision.candidates), 1), np.nan) if self.min_len else np.zeros((1, 1))

    d = decision(["a b", "c"])
    with pytest.raises(ValueError, match=r"'word-count' returned shape \(1, 1\), expected \[M, k\] = \[2, 1\]"):
        FeatureSet((Bad(),)).extract(d, None, None)
    with pytest.raises(ValueError, match="'word-count:3' returned a non-finite value for candidate 0"):
        FeatureSet((Bad("3"),)).extract(d, None, None)


@pytest.mark.parametrize("selection, message", [
    ("", "empty feature selection"),
    ("lm-hidden,,novelty", "empty entry"),
    ("novelty,novelty", "'novelty' is selected twice"),
    ("lm-layer:3,lm-layer:3:last", "'lm-layer:3' is selected twice"),
    ("lm-hiden", r"unknown feature extractor 'lm-hiden'; known: \['goal-similarity', 'lm-hidden'"),
    ("lm-hidden:2", "takes no argument"),
    ("lm-layer", "needs an integer layer"),
    ("lm-layer:x", "needs an integer layer"),
    ("lm-layer:2:max", "pooling 'max'"),
    ("novelty:1", "takes no argument"),
])
def test_bad_selections_are_refused_with_one_line(selection, message):
    with pytest.raises(ValueError, match=message):
        FeatureSet.from_spec(selection)


def test_a_selection_is_checked_without_loading_the_embedder(monkeypatch):
    """`run --features ...,goal-similarity` checks its spec and its results file before anything
    heavy loads: building the set must not evaluate goal-similarity's metadata (its embedder)."""
    import agent_shell.features.goal as goal
    from agent_shell.features import registry

    def no_model():
        raise AssertionError("the embedder was loaded while checking a feature selection")

    goal.shared_embedder.cache_clear()
    monkeypatch.setattr(goal, "shared_embedder", no_model)
    fs = FeatureSet.from_spec("lm-hidden,goal-similarity,novelty")
    assert [e.name for e in fs.extractors] == ["lm-hidden", "goal-similarity", "novelty"]

    class NoExtract:
        name, metadata = "x", {}

        def size(self, lm):
            return 1

    assert not registry._is_extractor(NoExtract()) and registry._is_extractor(fs.extractors[1])


def test_parse_features_accepts_lists_and_spaces():
    assert parse_features(" lm-hidden , goal-similarity") == ("lm-hidden", "goal-similarity")
    assert parse_features(["lm-hidden", "novelty,goal-similarity"]) == ("lm-hidden", "novelty", "goal-similarity")
    assert make_extractor("lm-layer:-2:mean").name == "lm-layer:-2:mean"
    assert make_extractor("lm-layer:4:last").name == "lm-layer:4"


# ---------------------------------------------------------------------------------- lm-layer

class LayerLM(FakeLM):
    """FakeLM with an inner-layer view: layer K's state is the hidden state times K (mean: + 1)."""

    def candidate_states(self, context, candidates, action_prefix, layer, pool="last"):
        return self.score(context, candidates, action_prefix).hidden * layer + (pool == "mean")


def test_lm_layer_reads_candidate_states_and_needs_a_backend_that_has_them():
    d = decision(["go to shelf 1", "open drawer 1"])
    lm = LayerLM(hidden_size=4)
    s = lm.score(d.context, list(d.candidates), "\n> ")
    np.testing.assert_allclose(make_extractor("lm-layer:3").extract(d, lm, s), s.hidden * 3)
    np.testing.assert_allclose(make_extractor("lm-layer:2:mean").extract(d, lm, s), s.hidden * 2 + 1)
    with pytest.raises(ValueError, match="needs a backend with candidate_states"):
        make_extractor("lm-layer:3").extract(d, FakeLM(hidden_size=4), s)


# ---------------------------------------------------------------------------------- entry points

def test_third_party_extractor_through_the_entry_point(plugin):
    assert available_extractors()["word-count"] == "test_features:WordCount"
    assert available_extractors()["lm-hidden"] == "built-in"  # built-ins cannot be overridden
    fs = FeatureSet.from_spec("lm-hidden,word-count:3")
    assert isinstance(fs.extractors[1], WordCount) and isinstance(fs.extractors[1], FeatureExtractor)
    d = decision(["take mug 2 from countertop 1", "go to bed 1"])
    lm = FakeLM(hidden_size=4)
    x = fs.extract(d, lm, lm.score("ctx", list(d.candidates), "\n> "))
    assert x.shape == (2, 5) and x[:, 4].tolist() == [3, 0]  # words longer than 3 letters: take, from, countertop
    with pytest.raises(ValueError, match="calls itself 'word-count'"):
        make_extractor("misnamed")


def test_an_entry_point_that_is_no_factory_is_one_line(site):
    install_entry_point(site, registry.ENTRY_POINT_GROUP, "constant", "math:pi", "cb-constant-plugin")
    with pytest.raises(ValueError, match=r"^feature extractor 'constant': its entry point gives a float, not a factory$"):
        make_extractor("constant")


# ---------------------------------------------------------------------------------- metadata check

def test_old_concepts_read_as_lm_hidden_and_mismatches_are_named():
    lm = FakeLM(hidden_size=8)
    seed = FeatureSet.from_spec().describe(lm)
    assert recorded_extractors({"formatting": "plain"}, 8) == seed  # concept file from before extractors
    check_extractors(recorded_extractors({"formatting": "plain"}, 8), seed)
    with pytest.raises(ValueError, match="fitted with features 'lm-hidden', but acting uses 'lm-hidden,novelty'"):
        check_extractors(seed, FeatureSet.from_spec("lm-hidden,novelty").describe(lm))
    other = [{**seed[0], "size": 16}]
    with pytest.raises(ValueError, match="'lm-hidden' was fitted with size=16"):
        check_extractors(other, seed)
    emb = FeatureSet((GoalSimilarity(embedder=BagOfWordsEmbedder()),)).describe(lm)
    changed = [{**emb[0], "metadata": {**emb[0]["metadata"], "embedder": {"model": "other"}}}]
    with pytest.raises(ValueError, match="'goal-similarity' was fitted with metadata="):
        check_extractors(changed, emb)
    with pytest.raises(ValueError, match="empty candidate set"):
        decision([])
