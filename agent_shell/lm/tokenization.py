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

**Spliced tokenization.** An agent's texts grow: each step's scoring context and routing prompt
extend the last ones, and a candidate set appends 30 actions to one context. With a fast
tokenizer whose pre-tokenizer splits text into pieces that BPE never merges across (the byte-level
tokenizers of Llama 3, Qwen2 and SmolLM2), the tokens before a *line start* (a character after a
newline that is not whitespace: every such pre-tokenizer begins a piece there) do not depend on
the text after it, and the tokens after it are those of the text from there on. So a text that
shares its beginning with a kept tokenization (:data:`KEPT_TEXTS`) is tokenized from the last line
start before the shared part's end, and ``base + action`` from the last line start of ``base``,
the kept tokens before it reused. Each splice is checked, not assumed: the re-tokenized tail must
reproduce the kept tokens (ids and character spans) over the stretch it shares with them (up to
:data:`MARGIN` characters before its end), and the context's tail alone must reproduce the
context's own tokens; a tokenizer or a text for which a check fails is tokenized whole, as before.

Must not import the agents or the environments.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
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
        shared: how many leading ids every candidate of the same set is known to share (a lower
            bound of their common prefix: the context's tokens a splice kept; 0 when unknown).
    """

    ids: tuple[int, ...]
    first: int
    shared: int = 0

    @property
    def n_action(self) -> int:
        return len(self.ids) - self.first


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences (token ids, or two strings), compared
    in slices at C speed rather than item by item (a prefix cache compares contexts of thousands of
    tokens several times a step): first the whole shorter length, then back from its end in doubling
    steps (contexts mostly differ near their ends), then halving."""
    if not isinstance(a, str) or not isinstance(b, str):
        a, b = (x if isinstance(x, tuple) else tuple(x) for x in (a, b))
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo, step = 0, 1
    while step < hi and a[:hi - step] != b[:hi - step]:
        hi, step = hi - step, 2 * step
    lo = max(hi - step, 0)
    hi -= 1  # a[:lo] == b[:lo] (the last step back, or nothing), a[:hi + 1] != b[:hi + 1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


Markers = Sequence[tuple[int, int]]
#: How many tokenized texts a :class:`Tokenization` keeps for later texts to be spliced onto (a
#: stream's last scoring context and routing prompt, a fork's, a review's).
KEPT_TEXTS = 8
#: Characters before the end of a shared stretch whose tokens a splice checks but does not trust
#: (a piece that reaches the end of a text can merge with what follows it).
MARGIN = 16
#: The fewest characters a text must share with a kept one for a splice to be tried.
MIN_SHARED = 256


@dataclass(frozen=True)
class _Tokenized:
    """A rendered text's tokenization: ids, character spans, and the spans' starts (for bisect)."""

    text: str
    markers: tuple[tuple[int, int], ...] | None
    ids: list[int]
    spans: list[tuple[int, int]]
    starts: list[int]

    @classmethod
    def of(cls, text: str, markers: Markers | None, ids: list[int], spans: list) -> "_Tokenized":
        spans = [tuple(x) for x in spans]
        return cls(text, None if markers is None else tuple(markers), ids, spans, [a for a, _ in spans])

    def line_cut(self, limit: int) -> tuple[int, int] | None:
        """(k, p): token k starts at character p <= ``limit``, a line start (after a newline, not
        whitespace) where the token before ends; the last such place (None: none)."""
        at = self.text.rfind("\n", 0, limit)
        while at >= 0:
            p = at + 1
            if p < len(self.text) and not self.text[p].isspace():
                k = bisect.bisect_left(self.starts, p)
                if 0 < k < len(self.ids) and self.starts[k] == p and self.spans[k - 1][1] <= p:
                    return k, p
            at = self.text.rfind("\n", 0, at)
        return None


def _shifted(markers: Markers | None, p: int) -> list[tuple[int, int]] | None:
    """``markers`` after character p, counted from p (None: none; a marker across p: not splittable)."""
    if markers is None:
        return None
    if any(a < p < b for a, b in markers):
        raise _NoSplice
    return [(a - p, b - p) for a, b in markers if a >= p]


class _NoSplice(Exception):
    """A text that is tokenized whole (a splice is not possible or its check failed)."""


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
        # splices need character spans and a tokenizer that adds nothing after a text
        self.splices = self.offsets and self._adds_nothing_after()
        self._kept: OrderedDict[tuple, _Tokenized] = OrderedDict()

    def _adds_nothing_after(self) -> bool:
        with_specials = self.tokenizer(["a\nb"], add_special_tokens=True)["input_ids"][0]
        plain = self.tokenizer(["a\nb"], add_special_tokens=False)["input_ids"][0]
        return list(with_specials[len(with_specials) - len(plain):]) == list(plain)

    def encode(self, text: str, markers: Markers | None = None) -> list[int]:
        """Token ids of a rendered text whose only special tokens are at ``markers`` (None: a
        plain text, no special token read from it)."""
        if self.splices:
            return list(self._whole(text, markers).ids)
        ((ids, _),) = self._encode([text], markers)
        return ids

    def _whole(self, text: str, markers: Markers | None) -> _Tokenized:
        """The tokenization of ``text`` (as :meth:`_encode` gives it), spliced onto the kept text
        that shares the most of its beginning when one shares at least :data:`MIN_SHARED` characters;
        kept for later texts."""
        key = (text, None if markers is None else tuple(markers))
        found = self._kept.get(key)
        if found is None:
            found = self._spliced_whole(text, markers)
            if found is None:
                ((ids, spans),) = self._encode([text], markers)
                found = _Tokenized.of(text, markers, ids, spans)
            self._kept[key] = found
            while len(self._kept) > KEPT_TEXTS:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        return found

    def _spliced_whole(self, text: str, markers: Markers | None) -> _Tokenized | None:
        """:meth:`_whole` by a splice onto a kept text, or None (nothing to splice onto, or the check
        failed)."""
        shared, kept = max(((common_prefix_len(k.text, text), k) for k in self._kept.values()
                            if (k.markers is None) == (markers is None)), default=(0, None), key=lambda x: x[0])
        if kept is None or shared < MIN_SHARED:
            return None
        cut = kept.line_cut(shared - MARGIN)
        if cut is None:
            return None
        k, p = cut
        try:
            tail_markers = _shifted(markers, p)
            if markers is not None and [m for m in markers if m[0] < p] != [m for m in kept.markers if m[0] < p]:
                return None
        except _NoSplice:
            return None
        ((ids, spans),) = self._encode([text[p:]], tail_markers, specials=False)
        sure = bisect.bisect_right([b for _, b in kept.spans[k:]], shared - MARGIN)  # kept tokens the tail must repeat
        if sure < 1 or ids[:sure] != kept.ids[k:k + sure] \
                or [(a + p, b + p) for a, b in spans[:sure]] != kept.spans[k:k + sure]:
            return None
        spans = [(a + p, b + p) for a, b in spans]
        return _Tokenized(text, None if markers is None else tuple(markers), kept.ids[:k] + list(ids),
                          kept.spans[:k] + spans, kept.starts[:k] + [a for a, _ in spans])

    def _encode(self, texts: Sequence[str], markers: Markers | None,
                specials: bool = True) -> list[tuple[list[int], list | None]]:
        """(ids, character offsets or None without a fast tokenizer) of each text, BOS deduplicated;
        ``specials=False``: a plain text gets no special tokens either (a text's tail)."""
        tok, offsets = self.tokenizer, self.offsets
        if markers is None:  # a plain text: nothing in it is special
            enc = tok(list(texts), add_special_tokens=specials, split_special_tokens=True,
                      return_offsets_mapping=offsets)
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
        out = self._spliced_continuations(base, actions, markers) if self.splices else None
        if out is not None:
            for action, tok in zip(actions, out):
                if tok.n_action < 1:
                    raise ValueError(f"candidate {action!r} yields no tokens of its own after the context")
            return out
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

    def _spliced_continuations(self, base: str, actions: Sequence[str],
                               markers: Markers | None) -> list[TokenizedContinuation] | None:
        """:meth:`continuations` with ``base`` tokenized once (:meth:`_whole`) and only its last
        lines re-tokenized with each action, or None (no line start to cut at, or a check failed)."""
        whole = self._whole(base, markers)
        cut = whole.line_cut(len(base) - 1)  # the last line start: "> " of a transcript's action line
        if cut is None:
            return None
        k, p = cut
        try:
            tail_markers = _shifted(markers, p)
        except _NoSplice:
            return None
        tail = base[p:]
        *encoded, (ids_b, spans_b) = self._encode([tail + a for a in actions] + [tail], tail_markers, specials=False)
        if ids_b != whole.ids[k:] or [(a + p, b + p) for a, b in spans_b] != whole.spans[k:]:
            return None
        sure = bisect.bisect_right([b for _, b in spans_b], len(tail) - MARGIN)  # the context's own tokens
        head, out = whole.ids[:k], []
        for ids, spans in encoded:
            if ids[:sure] != ids_b[:sure]:
                return None
            first = next((i for i, (_, end) in enumerate(spans) if end > len(tail)), len(ids))
            out.append(TokenizedContinuation(tuple(head + list(ids)), k + first, k))
        return out


__all__ = ["KEPT_TEXTS", "MARGIN", "MIN_SHARED", "Markers", "TokenizedContinuation", "Tokenization",
           "common_prefix_len"]
