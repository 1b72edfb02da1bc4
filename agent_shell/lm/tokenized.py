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

from typing import TYPE_CHECKING, Any, Sequence

from agent_shell.lm.formatting import PLAIN, Formatter
from agent_shell.lm.layout import cached_length
from agent_shell.lm.protocol import Context, ContextWindowFull, Decided, DeviceScores, LanguageModel, check_candidates
from agent_shell.lm.tokenization import Markers, Tokenization, TokenizedContinuation

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from agent_shell.lm.kv_cache import PrefixCache
    from cb_core import Concept

#: The pools of inner-layer features (:meth:`TokenizedBackend.check_layers`).
POOLS = ("last", "mean")
#: The longest window (tokens) a backend takes from a model's configuration: past it, a
#: configuration's ``max_position_embeddings`` is a placeholder (a tokenizer's unset
#: ``model_max_length`` is 10**30), not a window.
MAX_WINDOW = 10**7


class TokenizedBackend(LanguageModel):
    """Rendering, tokenization and the checks made before a pass, for a backend with a HuggingFace
    tokenizer, and the decision on its device (:meth:`decide`). A subclass calls :meth:`_set_text`
    in its constructor and implements :meth:`score_on_device`.

    Attributes:
        name: the backbone's name (concept metadata, error messages).
        tokenizer: the HuggingFace tokenizer.
        formatter: renders contexts and prompts (:class:`agent_shell.lm.formatting.Formatter`).
        tokens: token ids and the context/action boundary (:class:`agent_shell.lm.tokenization.Tokenization`).
        max_context_tokens: the window (tokens).
    """

    name: str
    hidden_size: int
    cache: PrefixCache  # the backend's prefix KV cache, over its own passes (``_forward``)
    tokenizer: PreTrainedTokenizerBase
    formatter: Formatter
    tokens: Tokenization
    max_context_tokens: int

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

    @property
    def dtype_name(self) -> str:
        """The weights' dtype as a plain name (``"float32"``, ``"bfloat16"``)."""
        raise NotImplementedError

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

    def decide(self, context: Context, candidates: Sequence[str], action_prefix: str, concept: Concept) -> Decided:
        """:meth:`agent_shell.lm.protocol.LanguageModel.decide` on the backend's device: the scores of
        :meth:`score_on_device` (nothing fetched), then the decision kernel where they lie
        (:func:`agent_shell.lm.decision.decide_scores`: one array fetched, after the argmax)."""
        from agent_shell.lm.decision import decide_scores

        return decide_scores(concept, self.score_on_device(context, candidates, action_prefix))

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


__all__ = ["MAX_WINDOW", "POOLS", "TokenizedBackend"]
