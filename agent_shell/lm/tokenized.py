"""The text side of a backend with a HuggingFace tokenizer: one implementation for every forward pass.

A backend renders a context or prompt (:mod:`~agent_shell.lm.formatting`), tokenizes it with its
candidates (:mod:`~agent_shell.lm.tokenization`), checks the window and the candidate set, and
finds the context tokens every candidate shares (:func:`agent_shell.lm.layout.cached_length`)
before any forward pass; :class:`TokenizedBackend` holds all of it, so the PyTorch backend
(:class:`agent_shell.lm.hf.HFLanguageModel`) and the JAX backend
(:class:`agent_shell.lm.jax_backend.JaxLanguageModel`) tokenize, lay out and refuse exactly alike
and differ only in their passes.

Must not import the agents, the environments, torch or JAX.
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agent_shell.lm.formatting import PLAIN, Formatter
from agent_shell.lm.kv_cache import CacheOps, HeadStore, PrefixCache
from agent_shell.lm.layout import CANDIDATE_LAYOUTS, cached_length
from agent_shell.lm.protocol import (Context, ContextWindowFull, Decided, DecisionHead, DeviceScores, check_candidates,
                                     dtype_text)
from agent_shell.lm.tokenization import Markers, Tokenization, TokenizedContinuation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: The pools of inner-layer features (:meth:`TokenizedBackend.check_layers`).
POOLS = ("last", "mean")
#: The longest window (tokens) a backend takes from a model's configuration: past it, a
#: configuration's ``max_position_embeddings`` is a placeholder (a tokenizer's unset
#: ``model_max_length`` is 10**30), not a window.
MAX_WINDOW = 10**7


def load_tokenizer(path: str | os.PathLike) -> PreTrainedTokenizerBase:
    """The HuggingFace tokenizer of a model folder (or cached hub name).

    Raises:
        FileNotFoundError: none can be loaded from ``path`` (one line saying why).
    """
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except OSError as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise FileNotFoundError(f"cannot load a tokenizer from {str(path)!r}: {reason}") from err


class TokenizedBackend:
    """Rendering, tokenization and the checks made before a pass, for a backend with a HuggingFace
    tokenizer, its prefix cache's bookkeeping, its views (:meth:`fork`) and the decision on its
    device (:meth:`decide`). A subclass calls :meth:`_set_text` and :meth:`_set_options` in its
    constructor and implements :meth:`cache_ops`, ``_forward`` and :meth:`score_on_device`.

    Attributes:
        name: the backbone's name (concept metadata, error messages).
        tokenizer: the HuggingFace tokenizer.
        formatter: renders contexts and prompts (:class:`agent_shell.lm.formatting.Formatter`).
        tokens: token ids and the context/action boundary (:class:`agent_shell.lm.tokenization.Tokenization`).
        max_context_tokens: the window (tokens).
        candidate_layout, reuse_cache, draft_tokens: the options of :meth:`_set_options`.
    """

    name: str
    hidden_size: int
    cache: PrefixCache  # the backend's prefix KV cache, over its own passes (``_forward``)
    tokenizer: PreTrainedTokenizerBase
    formatter: Formatter
    tokens: Tokenization
    max_context_tokens: int
    dtype: Any  # the weights' dtype (a torch or JAX dtype)

    def _set_text(self, tokenizer: PreTrainedTokenizerBase, name: str, window: int | None) -> None:
        """Set the tokenizer, the name and the window: ``window`` (the caller's, else the model
        config's), else the tokenizer's ``model_max_length``.

        Raises:
            ValueError: no window can be told.
        """
        window = window or getattr(tokenizer, "model_max_length", None)
        if not window or window > MAX_WINDOW:
            raise ValueError(f"cannot tell the context window of {name!r}; pass max_context_tokens")
        self.tokenizer = tokenizer
        self.name = name
        self.max_context_tokens = int(window)
        self.formatter = Formatter(tokenizer, name)
        self.tokens = Tokenization(tokenizer)

    @staticmethod
    def check_options(candidate_layout: str, draft_tokens: int) -> None:
        """ValueError (one line) for an unknown candidate layout or negative ``draft_tokens``: checked
        before a backend touches its model."""
        if candidate_layout not in CANDIDATE_LAYOUTS:
            raise ValueError(f"candidate_layout={candidate_layout!r} is not one of {CANDIDATE_LAYOUTS}")
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens={draft_tokens} is negative")

    def _set_options(self, candidate_layout: str, reuse_cache: bool, max_heads: int, draft_tokens: int) -> None:
        """Set the candidates' layout, the prefix cache (a new head store of ``max_heads``) and the
        greedy drafts' length.

        Raises:
            ValueError: an unknown candidate layout, or negative ``draft_tokens``.
        """
        self.check_options(candidate_layout, draft_tokens)
        self.candidate_layout = candidate_layout
        self.reuse_cache = reuse_cache
        self.draft_tokens = int(draft_tokens)
        self.cache = PrefixCache(self.cache_ops(), reuse_cache, HeadStore(max_heads))

    def cache_ops(self) -> CacheOps:
        """The operations of this backend's kind of KV cache (a new instance per view)."""
        raise NotImplementedError

    def fork(self) -> "TokenizedBackend":
        """A view of the same weights and tokenizer with its own, empty prefix KV cache (the pinned
        heads are shared).

        CB-Agent alternates routing prompts (demonstrations first) and scoring contexts (task
        first), which share no prefix, so one cache would be re-encoded from scratch at every
        call; a fork per stream keeps each stream's prefix.
        """
        twin = copy.copy(self)
        twin.cache = PrefixCache(twin.cache_ops(), self.reuse_cache, self.cache.heads)
        return twin

    def start_context(self, ids: Sequence[int], s: int) -> tuple[Any, int]:
        """The stream's cache ready for a pass whose leading tokens are the context's uncached ones
        (``ids[lo:s]``, at most a chunk of the cache's, :attr:`~agent_shell.lm.kv_cache.CacheOps.chunk`;
        any excess encoded first): (the cache, holding ``ids[:lo]``, and ``lo``)."""
        cache, start = self.cache.start(ids[:s])
        lo = max(start, s - self.cache.ops.chunk)
        self.cache.encode(cache, ids, start, self._forward, stop=lo)
        self.cache.encoded_tokens += s - lo
        return cache, lo

    def keep_context(self, cache: Any, ids: Sequence[int], s: int) -> None:
        """After a pass of :meth:`start_context`: the context's ``s`` tokens stay in ``cache``, the
        candidates go, and the stream keeps it when it can."""
        self.cache.ops.cut(cache, s)
        if s and self.cache.reusable(cache):
            self.cache.keep(cache, ids[:s])

    def candidate_states(self, context: Context, candidates: Sequence[str], action_prefix: str, layer: int,
                         pool: str = "last") -> np.ndarray:
        """An inner layer's states at the candidates' action tokens, float32 [M, hidden_size].

        ``layer``: 0 = the token embeddings, K = 1..L the output of decoder layer K (before the
        final norm), negative K counts from the end (-1 = layer L). ``pool``: ``"last"`` = the
        state at the final action token, ``"mean"`` = the mean over the action's tokens (the
        same tokens ``score`` counts). Taken from the scoring pass itself (``score_with_layers``;
        feature block ``lm-layer:K``, :mod:`agent_shell.features`).

        Raises:
            ValueError: a layer outside [-L, L], an unknown pool, or what ``score`` raises.
        """
        return self.score_with_layers(context, candidates, action_prefix, [(layer, pool)]).layers[(layer, pool)]

    @property
    def dtype_name(self) -> str:
        """The weights' dtype as a plain name (``"float32"``, ``"bfloat16"``)."""
        return dtype_text(self.dtype)

    @property
    def metadata(self) -> dict[str, Any]:
        """What a fitted concept must record about the backbone (and check when acting): the same
        for every backend of one backbone and dtype, so a concept fitted with one acts with the
        other (their features agree to float32 rounding)."""
        return {
            "name": self.name,
            "formatting": PLAIN,
            "hidden_size": self.hidden_size,
            "hidden": "last-layer state read by the LM head (after the final norm) at the final action token",
            "dtype": self.dtype_name,
        }

    def pin_prefix(self, head: Context) -> int:
        """Encode a fixed prompt head once and keep its KV cache for every later context that
        starts with it (:class:`agent_shell.lm.kv_cache.HeadStore`), e.g. the ReAct header and
        the demonstrations of a task type, reused by every episode of that type.

        ``head`` is rendered like a prompt (a message list through the chat template); a later
        context reuses the longest token prefix it shares with the head, so a head whose last
        tokens merge differently inside the full prompt still saves all tokens before them.
        Numbers are those of the uncached path (within float rounding).

        Returns:
            The number of tokens pinned (0 when this backend keeps no cache, ``reuse_cache=False``).
        """
        ids = self.encode(*self.formatter.rendered(head))
        return len(ids) if self.cache.pin(ids, self._forward) else 0

    def score_on_device(self, context: Context, candidates: Sequence[str], action_prefix: str) -> DeviceScores:
        """:meth:`score`'s log q and hidden states on the backend's device, padded, as JAX arrays."""
        raise NotImplementedError

    def decide(self, context: Context, candidates: Sequence[str], action_prefix: str,
               decision_head: DecisionHead) -> Decided:
        """The decision under ``decision_head`` (:func:`agent_shell.lm.decision.decide`) on the
        backend's device: the scores of :meth:`score_on_device` (nothing fetched), then the head's
        kernel where they lie (:func:`agent_shell.lm.decision.decide_scores`: one array fetched,
        after the argmax)."""
        from agent_shell.lm.decision import decide_scores

        return decide_scores(decision_head, self.score_on_device(context, candidates, action_prefix))

    def reset_cache(self) -> None:
        """Forget the stored prefix cache (e.g. at the start of an unrelated episode)."""
        self.cache.reset()

    def render(self, context: Context, action_prefix: str) -> str:
        """The text every candidate is appended to (:meth:`Formatter.render`)."""
        return self.formatter.render(context, action_prefix)

    def render_prompt(self, prompt: Context) -> str:
        """The text :meth:`generate` continues (:meth:`Formatter.render_prompt`)."""
        return self.formatter.render_prompt(prompt)

    def encode(self, text: str, markers: Markers | None = None) -> list[int]:
        """Token ids of a rendered text (:meth:`Tokenization.encode`)."""
        return self.tokens.encode(text, markers)

    def tokenize_continuations(self, base: str, actions: Sequence[str],
                               markers: Markers | None = None) -> list[TokenizedContinuation]:
        """Tokenize ``base + action`` per action (:meth:`Tokenization.continuations`)."""
        return self.tokens.continuations(base, actions, markers)

    def scoring_tokens(self, context: Context, candidates: Sequence[str],
                       action_prefix: str) -> tuple[list[TokenizedContinuation], int]:
        """(each candidate's tokenization after ``render(context, action_prefix)``, ``s``: the
        context tokens all of them share before their segments, :func:`agent_shell.lm.layout.cached_length`).

        Raises:
            ValueError: an empty candidate list, an empty (or non-string) candidate, a candidate
                with no tokens of its own, or nothing to condition on.
            ContextWindowFull: context plus a candidate longer than ``max_context_tokens``.
        """
        actions = check_candidates(candidates)
        base, markers = self.formatter.rendered(context, action_prefix)
        toks = self.tokens.continuations(base, actions, markers)
        longest = max(toks, key=lambda t: len(t.ids))
        if len(longest.ids) > self.max_context_tokens:
            raise ContextWindowFull(
                f"context is too long: {longest.first} context tokens plus {longest.n_action} tokens of "
                f"candidate {actions[toks.index(longest)]!r} exceed the window of {self.max_context_tokens} "
                f"tokens of {self.name!r}"
            )
        if min(t.first for t in toks) < 1:
            raise ValueError(
                "nothing to condition on: the rendered context and prefix are empty and the tokenizer adds no BOS"
            )
        return toks, cached_length(toks)

    def prompt_ids(self, prompt: Context, max_new_tokens: int) -> tuple[list[int], int]:
        """(the rendered prompt's token ids, the new tokens it leaves room for: at most
        ``max_new_tokens``), as :meth:`generate` and batched decoding
        (:func:`agent_shell.lm.batched.generate_many`) continue it.

        Raises:
            ValueError: an empty rendered prompt, or one that fills the window (when tokens are asked).
        """
        ids = self.encode(*self.formatter.rendered(prompt))
        if not ids:
            raise ValueError("empty prompt: nothing to continue (the tokenizer adds no BOS)")
        room = self.max_context_tokens - len(ids)
        if room < 1 and max_new_tokens > 0:
            raise ContextWindowFull(
                f"prompt is too long: {len(ids)} tokens leave no room in the window of "
                f"{self.max_context_tokens} tokens of {self.name!r}"
            )
        return ids, min(max_new_tokens, room)

    def check_layers(self, layers: Sequence[tuple[int, str]], n_layers: int) -> list[int]:
        """Each ``(layer, pool)`` entry's layer as 0..L (0: the embeddings; K: the output of decoder
        layer K; negative K counts from the end, -1 = L) for a decoder of ``n_layers`` layers.

        Raises:
            ValueError: a layer outside [-L, L], or a pool that is not ``"last"`` or ``"mean"``.
        """
        out = []
        for layer, pool in layers:
            if pool not in POOLS:
                raise ValueError(f"pool={pool!r} is not 'last' or 'mean'")
            if not -n_layers <= layer <= n_layers:
                raise ValueError(f"layer {layer} is outside [-{n_layers}, {n_layers}] for {self.name!r} "
                                 f"({n_layers} decoder layers)")
            out.append(layer if layer >= 0 else n_layers + 1 + layer)
        return out


__all__ = ["MAX_WINDOW", "POOLS", "TokenizedBackend", "load_tokenizer"]
