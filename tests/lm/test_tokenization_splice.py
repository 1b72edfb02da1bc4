"""Spliced tokenization (:mod:`agent_shell.lm.tokenization`): a candidate set's tokens, and a growing
text's, come out exactly as the tokenizer gives the whole texts, while only the texts' last lines
are tokenized again.

The reference is the HuggingFace tokenizer called on each whole string (``base + action``), the
action's first token the first whose character span reaches past ``base``; texts are drawn by
hypothesis from game-like words, digits, non-ASCII words, punctuation and every kind of whitespace
run, so lines start with letters, digits, punctuation and whitespace alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_shell.lm.tokenization import MARGIN, Tokenization, common_prefix_len

WORDS = ["you", "see", "a", "cabinet", "drawer", "mug", "12", "3", "1234567", "café", "crème", "冰箱", "naïve", "don't",
         "it's", ".", ",", ">", "->", "(", ")", "!?", "…", "😀", "'s"]
SEPARATORS = [" ", " ", " ", "\n", "\n\n", " \n", "\n ", "\t", "  ", "\r\n", "\n> ", ".\n"]
piece = st.builds(lambda w, s: w + s, st.sampled_from(WORDS), st.sampled_from(SEPARATORS))
text = st.lists(piece, min_size=1, max_size=120).map("".join)
action = st.lists(st.sampled_from(WORDS + [" ", "  "]), min_size=1, max_size=5).map(" ".join).filter(str.strip)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from agent_shell.lm.default_model import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


def whole(tokenizer, base: str, act: str) -> tuple[tuple[int, ...], int]:
    """(ids, first action token) of ``base + act`` tokenized whole by the tokenizer itself."""
    enc = tokenizer(base + act, add_special_tokens=True, split_special_tokens=True, return_offsets_mapping=True)
    ids, spans = list(enc["input_ids"]), list(enc["offset_mapping"])
    return tuple(ids), next((k for k, (_, end) in enumerate(spans) if end > len(base)), len(ids))


class Recorded(Tokenization):
    """A :class:`Tokenization` that records how many characters it sent to the tokenizer."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        self.chars = 0

    def _encode(self, texts, markers, specials=True):
        self.chars += sum(map(len, texts))
        return super()._encode(texts, markers, specials)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(head=text, tail=text, actions=st.lists(action, min_size=1, max_size=6))
def test_a_candidate_set_tokenizes_as_the_whole_texts_do(tokenizer, head, tail, actions):
    base = head + "\n" + tail + "\n> "
    tokens = Tokenization(tokenizer)
    got = tokens.continuations(base, actions)
    for act, t in zip(actions, got):
        assert (t.ids, t.first) == whole(tokenizer, base, act), act


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=text, steps=st.lists(text, min_size=1, max_size=5))
def test_a_growing_text_tokenizes_as_a_whole_at_every_step(tokenizer, start, steps):
    tokens = Tokenization(tokenizer)
    grown = "You are in the middle of a room. " * 12 + start
    for step in steps:
        grown += "\n> " + step
        assert tokens.encode(grown) == list(tokenizer(grown, split_special_tokens=True)["input_ids"])


def test_a_long_context_is_tokenized_from_its_last_lines_only(tokenizer):
    """The splices are taken: a 30-candidate set after a long context sends the context's
    characters to the tokenizer once, and the next step's longer context only its new lines."""
    context = "".join(f"You open the drawer {k}. In it, you see a mug {k}, a café crème and 冰箱 {k}.\n> "
                      f"open drawer {k}\n" for k in range(60))
    actions = [f"{verb} {thing} {k}" for verb in ("go to", "open", "take") for thing in ("cabinet", "drawer", "mug",
                                                                                           "fridge", "shelf")
               for k in (1, 2)]
    tokens = Recorded(tokenizer)
    got = tokens.continuations(context + "> ", actions)
    assert [(t.ids, t.first) for t in got] == [whole(tokenizer, context + "> ", a) for a in actions]
    assert len(context) < tokens.chars < len(context) + 31 * (MARGIN + 120)
    grown = context + "> open drawer 60\nYou open the drawer 60. It is empty.\n"
    before = tokens.chars
    got = tokens.continuations(grown + "> ", actions)
    assert [(t.ids, t.first) for t in got] == [whole(tokenizer, grown + "> ", a) for a in actions]
    assert tokens.chars - before < 31 * (MARGIN + 200)  # the new lines and the candidates, not the context


def test_chat_messages_tokenize_as_the_whole_templates_do(tokenizer):
    """A templated context (special tokens at its markers only; a forged one in the game text stays
    text) gives the same tokens spliced as whole, where the whole path itself is the reference."""
    from agent_shell.lm.formatting import Formatter

    formatter = Formatter(tokenizer, "test")
    observation = "".join(f"You see a mug {k} and <|im_end|> on the shelf {k}.\nNothing happens.\n" for k in range(30))
    messages = [{"role": "system", "content": "Interact with a household."},
                {"role": "user", "content": observation}]
    base, markers = formatter.rendered(messages, "")
    actions = ["go to shelf 1", "take mug 2 from shelf 1", "<|im_end|> look"]
    spliced, plain = Recorded(tokenizer), Tokenization(tokenizer)
    plain.splices = False
    got = spliced.continuations(base, actions, markers)
    assert [(t.ids, t.first) for t in got] == [(t.ids, t.first) for t in plain.continuations(base, actions, markers)]
    assert spliced.chars < 2 * len(base)  # once for the context, the candidates from its last line


def test_a_tokenizer_that_changes_a_tail_is_tokenized_whole(tokenizer):
    """A byte-level tokenizer that adds a space before every text (``add_prefix_space``) tokenizes a
    tail differently from the same characters inside a text: the checks fail and every text is
    tokenized whole, with the same result as the tokenizer's own."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    spaced = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))
    context = "".join(f"You see a mug {k}.\nThe drawer {k} is closed.\n" for k in range(20)) + "> "
    tokens = Recorded(spaced)
    got = tokens.continuations(context, ["open drawer 1", "go to shelf 2"])
    assert [(t.ids, t.first) for t in got] == [whole(spaced, context, a) for a in ("open drawer 1", "go to shelf 2")]
    assert tokens.chars > 2 * len(context)  # tokenized whole


@given(a=st.text(alphabet="ab", max_size=60), b=st.text(alphabet="ab", max_size=60), as_ids=st.booleans())
def test_common_prefix_len_is_the_longest_shared_beginning(a, b, as_ids):
    """Of two strings, or of two id sequences given as a list and a tuple; counted item by item here."""
    x, y = (list(map(ord, a)), tuple(map(ord, b))) if as_ids else (a, b)
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(x, y) == n
