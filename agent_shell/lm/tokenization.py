"""Tokenization: token ids of rendered texts, and where a candidate action's own tokens begin.

The string ``render(context, prefix) + action`` is tokenized as a whole (never piece by piece, so
no doubled BOS and no boundary artefacts); the action's tokens are the tokens of that string whose
character span reaches past the end of ``render(context, prefix)``. A token that straddles the
boundary (byte-level BPE glues the prefix's trailing space to the action's first word:
``"\\n> " + "go"`` gives ``"\\n", ">", " go"``) is an action token, as in lm-evaluation-harness,
which moves trailing context whitespace into the continuation. A slow tokenizer without character
offsets falls back to the common-token-prefix rule.

Special tokens are read only where the rendered text's ``markers`` put them (the chat template's
own, :class:`agent_shell.lm.formatting.Rendered`); the same characters anywhere else (game text,
memories, replies, candidates) are ordinary text. A text whose special tokens all sit at its
markers is tokenized as a whole, exactly as before; a text that forges one is tokenized piece by
piece between the markers, each piece with special-token parsing off.

Must not import the agents or the environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from agent_shell.lm.formatting import special_tokens

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class TokenizedContinuation:
    """One candidate's tokenization.

    Attributes:
        ids: token ids of ``render(context, prefix) + action`` (special tokens included).
        first: index in ``ids`` of the first action token; ``ids[first:]`` are the action's tokens.
    """

    ids: tuple[int, ...]
    first: int

    @property
    def n_action(self) -> int:
        return len(self.ids) - self.first


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


Markers = Sequence[tuple[int, int]]


class Tokenization:
    """Token ids of rendered texts for one HuggingFace tokenizer.

    A templated text (``markers`` given: chat template output) brings its own special tokens, at
    its markers; a plain text (``markers=None``) gets the tokenizer's special tokens once and has
    none read from it. A doubled leading BOS is collapsed.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.bos_id = tokenizer.bos_token_id
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()))
        self.control_ids = frozenset(special_tokens(tokenizer))  # the ids a text can yield as special tokens
        self.offsets = bool(getattr(tokenizer, "is_fast", False))

    def encode(self, text: str, markers: Markers | None = None) -> list[int]:
        """Token ids of a rendered text whose only special tokens are at ``markers`` (None: a
        plain text, no special token read from it)."""
        ((ids, _),) = self._encode([text], markers)
        return ids

    def _encode(self, texts: Sequence[str], markers: Markers | None) -> list[tuple[list[int], list | None]]:
        """(ids, character offsets or None without a fast tokenizer) of each text, BOS deduplicated."""
        tok, offsets = self.tokenizer, self.offsets
        if markers is None:  # a plain text: nothing in it is special
            enc = tok(list(texts), add_special_tokens=True, split_special_tokens=True, return_offsets_mapping=offsets)
            out = [(list(ids), list(enc["offset_mapping"][k]) if offsets else None)
                   for k, ids in enumerate(enc["input_ids"])]
        else:
            enc = tok(list(texts), add_special_tokens=False, split_special_tokens=False, return_offsets_mapping=offsets)
            out = []
            for k, (text, ids) in enumerate(zip(texts, enc["input_ids"])):
                spans = list(enc["offset_mapping"][k]) if offsets else None
                if not self._only_at(markers, list(ids), spans):
                    ids, spans = self._pieces(text, markers)
                out.append((list(ids), spans))
        for ids, spans in out:
            self._dedupe_bos(ids, spans)
        return out

    def _only_at(self, markers: Markers, ids: list[int], spans: list | None) -> bool:
        """Whether the special tokens of a whole-text tokenization are exactly those at ``markers``."""
        found = [k for k, i in enumerate(ids) if i in self.control_ids]
        if len(found) != len(markers):
            return False
        return spans is None or all(spans[k][0] <= a and b <= spans[k][1] for k, (a, b) in zip(found, markers))

    def _pieces(self, text: str, markers: Markers) -> tuple[list[int], list | None]:
        """``text`` tokenized between its markers with special-token parsing off, each marker one token."""
        ids: list[int] = []
        spans: list | None = [] if self.offsets else None
        at = 0
        for a, b in [*markers, (len(text), len(text))]:
            if a > at:
                enc = self.tokenizer(text[at:a], add_special_tokens=False, split_special_tokens=True,
                                     return_offsets_mapping=self.offsets)
                ids.extend(enc["input_ids"])
                if spans is not None:
                    spans.extend((at + x, at + y) for x, y in enc["offset_mapping"])
            if b > a:
                ids.append(self.tokenizer.convert_tokens_to_ids(text[a:b]))
                if spans is not None:
                    spans.append((a, b))
            at = b
        return ids, spans

    def _dedupe_bos(self, ids: list, offsets: list | None = None) -> list:
        if self.bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == self.bos_id:
            del ids[0]
            if offsets is not None:
                del offsets[0]
        return ids

    def continuations(self, base: str, actions: Sequence[str],
                      markers: Markers | None = None) -> list[TokenizedContinuation]:
        """Tokenize ``base + action`` for each action and locate its first action token; the only
        special tokens are at ``markers`` (spans in ``base``; None: a plain text).

        Raises:
            ValueError: an action that yields no token of its own.
        """
        fulls = [base + a for a in actions]
        out = []
        if self.offsets:
            for ids, offsets in self._encode(fulls, markers):
                # an EOS-style token some tokenizers append is no part of the action
                while ids and ids[-1] in self.special_ids and tuple(offsets[-1]) == (0, 0):
                    ids.pop()
                    offsets.pop()
                first = next((k for k, (_, end) in enumerate(offsets) if end > len(base)), len(ids))
                out.append(TokenizedContinuation(tuple(ids), first))
        else:  # no offsets: the action's tokens are those after the common prefix with base's tokens
            base_ids = self.encode(base, markers)
            for full in fulls:
                ids = self.encode(full, markers)
                out.append(TokenizedContinuation(tuple(ids), common_prefix_len(base_ids, ids)))
        for action, tok in zip(actions, out):
            if tok.n_action < 1:
                raise ValueError(f"candidate {action!r} yields no tokens of its own after the context")
        return out


__all__ = ["Markers", "TokenizedContinuation", "Tokenization", "common_prefix_len"]
