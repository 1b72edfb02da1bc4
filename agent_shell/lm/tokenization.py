"""Tokenization: token ids of rendered texts, and where a candidate action's own tokens begin.

The string ``render(context, prefix) + action`` is tokenized as a whole (never piece by piece, so
no doubled BOS and no boundary artefacts); the action's tokens are the tokens of that string whose
character span reaches past the end of ``render(context, prefix)``. A token that straddles the
boundary (byte-level BPE glues the prefix's trailing space to the action's first word:
``"\\n> " + "go"`` gives ``"\\n", ">", " go"``) is an action token, as in lm-evaluation-harness,
which moves trailing context whitespace into the continuation. A slow tokenizer without character
offsets falls back to the common-token-prefix rule.

Must not import the agents or the environments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

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


class Tokenization:
    """Token ids of rendered texts for one HuggingFace tokenizer.

    ``templated`` texts (chat template output) bring their own special tokens; plain texts get
    the tokenizer's special tokens once. A doubled leading BOS is collapsed.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer
        self.bos_id = tokenizer.bos_token_id
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()))

    def encode(self, text: str, templated: bool = False) -> list[int]:
        """Token ids of a rendered text."""
        ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
        return self._dedupe_bos(list(ids))

    def _dedupe_bos(self, ids: list, offsets: list | None = None) -> list:
        if self.bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == self.bos_id:
            del ids[0]
            if offsets is not None:
                del offsets[0]
        return ids

    def continuations(self, base: str, actions: Sequence[str], templated: bool = False) -> list[TokenizedContinuation]:
        """Tokenize ``base + action`` for each action and locate its first action token.

        Raises:
            ValueError: an action that yields no token of its own.
        """
        fulls = [base + a for a in actions]
        out = []
        if getattr(self.tokenizer, "is_fast", False):
            enc = self.tokenizer(fulls, add_special_tokens=not templated, return_offsets_mapping=True)
            for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
                ids, offsets = list(ids), list(offsets)
                self._dedupe_bos(ids, offsets)
                # an EOS-style token some tokenizers append is no part of the action
                while ids and ids[-1] in self.special_ids and tuple(offsets[-1]) == (0, 0):
                    ids.pop()
                    offsets.pop()
                first = next((k for k, (_, end) in enumerate(offsets) if end > len(base)), len(ids))
                out.append(TokenizedContinuation(tuple(ids), first))
        else:  # no offsets: the action's tokens are those after the common prefix with base's tokens
            base_ids = self.encode(base, templated)
            for full in fulls:
                ids = self.encode(full, templated)
                out.append(TokenizedContinuation(tuple(ids), common_prefix_len(base_ids, ids)))
        for action, tok in zip(actions, out):
            if tok.n_action < 1:
                raise ValueError(f"candidate {action!r} yields no tokens of its own after the context")
        return out


__all__ = ["TokenizedContinuation", "Tokenization", "common_prefix_len"]
