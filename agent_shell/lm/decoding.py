"""Decoding: greedy or seeded sampled continuations over a cached prompt, cut at stop strings.

Greedy when ``temperature == 0``; otherwise tokens are drawn from softmax(logits / temperature)
with a ``torch.Generator`` seeded by ``seed`` (same seed, same replies on the same machine and
dtype). A reply ends at an end-of-sequence token, after its token budget, or at the first
occurrence of a stop string, which is cut off (the stop string itself excluded).

Greedy single replies are decoded with *prompt-lookup drafts* (Saxena 2023, "Prompt lookup
decoding"; the draft-and-verify scheme of speculative decoding, Leviathan et al. 2023, Sec. 2,
with the prompt as the draft model): the last n <= 3 tokens are looked up in the prompt and the
reply so far, the tokens that followed their latest occurrence are proposed as a draft, and one
forward pass over the draft verifies it; the longest prefix that greedy decoding would have
chosen is kept, plus the token greedy chooses after it. The reply is the greedy reply (up to
floating-point rounding: a pass over several tokens rounds differently from several one-token
passes, in float32 by ~1e-6 nats, in bfloat16 by up to ~1 logit), in fewer passes whenever the
reply copies from its prompt: an agent's action names objects of its observations, and its
lines repeat earlier ones.

Must not import the agents or the environments.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agent_shell.lm.torch_kv import Forward

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from transformers.cache_utils import Cache

    from agent_shell.lm.shared_prefix import SharedPrefix


def check_generation(max_new_tokens: int, stop: Sequence[str] | str, temperature: float, n: int) -> tuple[str, ...]:
    """The stop strings as a tuple, after checking the generation arguments.

    Raises:
        ValueError: ``n < 1``, ``max_new_tokens < 0``, ``temperature < 0`` or an empty stop string.
    """
    if n < 1:
        raise ValueError(f"n={n}: need at least one reply")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is negative")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} is negative")
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(not s for s in stop):
        raise ValueError(f"stop={stop!r} contains an empty string")
    return stop


def eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """End-of-sequence ids of the model's generation config and of the tokenizer."""
    eos: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            eos.add(value)
        elif value is not None:
            eos.update(int(v) for v in value)
    return frozenset(eos)


def sampler(temperature: float, seed: int | None, device: torch.device) -> torch.Generator | None:
    """The generator of a sampled generation (None when greedy); unseeded when ``seed`` is None."""
    import torch

    if temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(int(seed))
    else:
        generator.seed()
    return generator


def extend_reply(tokens: list[int], token: int, stop_ids: frozenset[int], stop: Sequence[str],
                 tokenizer: PreTrainedTokenizerBase) -> tuple[bool, str | None]:
    """Add the sampled ``token`` to a reply's ``tokens``: (the reply is finished, its text when a
    stop string cut it, else None). An end-of-sequence token finishes it without being added."""
    if token in stop_ids:
        return True, None
    tokens.append(token)
    if stop:
        text = tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
        if cut >= 0:
            return True, text[:cut]
    return False, None


#: Draft tokens proposed per verification pass (prompt lookup); 0 turns drafts off.
DRAFT_TOKENS = 8
#: The longest n-gram (the reply's last n tokens) looked up in the prompt for a draft.
LOOKUP_NGRAM = 3


def lookup_draft(ids: Sequence[int], n_max: int = LOOKUP_NGRAM, k: int = DRAFT_TOKENS) -> list[int]:
    """Prompt-lookup draft: the (at most ``k``) tokens that followed the latest earlier occurrence
    of the last n tokens of ``ids``, for the longest n <= ``n_max`` that occurs; [] if none does."""
    if k < 1:
        return []
    for n in range(min(n_max, len(ids) - 1), 0, -1):
        tail = list(ids[-n:])
        for start in range(len(ids) - n - 1, -1, -1):  # latest occurrence first, the tail itself excluded
            if ids[start] == tail[0] and list(ids[start:start + n]) == tail:
                follow = list(ids[start + n:start + n + k])
                if follow:
                    return follow
    return []


def decode(forward: Forward, tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int], cache: Cache,
           logits: torch.Tensor, length: int, rows: int, budget: int, stop: Sequence[str], temperature: float,
           generator: torch.Generator | None, device: torch.device, prompt_ids: Sequence[int] | None = None,
           draft_tokens: int = DRAFT_TOKENS, shared: SharedPrefix | None = None) -> list[str]:
    """``rows`` continuations of a prompt of ``length`` tokens whose cache is ``cache`` and whose
    next-token logits [1, V] are ``logits``; at most ``budget`` >= 1 new tokens each.

    With ``prompt_ids`` (the prompt's ``length`` token ids), a greedy single reply (``rows == 1``,
    ``temperature == 0``) is decoded with prompt-lookup drafts of at most ``draft_tokens``
    tokens (see the module docstring), which needs a cache that :func:`restore` can cut back
    (:func:`agent_shell.lm.torch_kv.truncatable`). Several rows (``rows > 1``) read the prompt's
    cache once through ``shared`` (:mod:`agent_shell.lm.shared_prefix`; their own tokens go to a
    new per-row cache), else from ``rows`` copies of it. Either way the cache may hold more than
    the prompt afterwards: the caller restores the prompt's keys and values."""
    if prompt_ids is not None and rows == 1 and temperature <= 0 and draft_tokens > 0:
        return [_decode_with_drafts(forward, tokenizer, stop_ids, cache, logits, list(prompt_ids), budget, stop,
                                    draft_tokens, device)]
    extra: dict[str, Any] = {}
    scope: AbstractContextManager[Any] = nullcontext()
    if rows > 1:
        if shared is not None:  # the rows' tokens in a cache of their own; the prompt's is read in place
            from agent_shell.lm.shared_prefix import PromptKV

            extra = {"shared_prefix": PromptKV(cache, length)}
            cache, scope = shared.new_cache(), shared.active()
        else:
            cache.batch_repeat_interleave(rows)
        logits = logits.expand(rows, -1)
    with scope:
        return _decode_rows(forward, tokenizer, stop_ids, cache, logits, length, rows, budget, stop, temperature,
                            generator, device, extra)


def _decode_rows(forward: Forward, tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int], cache: Cache,
                 logits: torch.Tensor, length: int, rows: int, budget: int, stop: Sequence[str], temperature: float,
                 generator: torch.Generator | None, device: torch.device, extra: dict[str, Any]) -> list[str]:
    """The token loop of :func:`decode` (``extra``: more keyword arguments of every forward pass)."""
    import torch

    def pick(logits: torch.Tensor) -> list[int]:
        if temperature > 0:
            return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)[:, 0].tolist()
        return logits.argmax(dim=-1).tolist()

    def advance(tokens: list[int], step: int) -> list[int]:
        out = forward(torch.tensor(tokens, device=device)[:, None], cache,
                      position_ids=torch.full((rows, 1), length + step, device=device), logits_to_keep=1, **extra)
        return pick(out.logits[:, -1].float())

    return reply_rows(pick(logits), advance, budget, stop, tokenizer, stop_ids)


def reply_rows(first: Sequence[int], advance: Callable[[list[int], int], list[int]], budget: int,
               stop: Sequence[str], tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int]) -> list[str]:
    """The replies of rows decoded one token per pass, whatever runs the passes: ``first`` holds
    each row's first token; ``advance(tokens, step)`` feeds the rows' tokens of ``step`` (one per
    row, at the position ``prompt length + step``) and returns the rows' next tokens. A row ends at
    an end-of-sequence token, a stop string (cut off) or after ``budget`` >= 1 tokens; the passes
    stop once every row has ended."""
    rows = len(first)
    new: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    texts: list[str | None] = [None] * rows
    nxt = list(first)
    for step in range(budget):
        for r in range(rows):
            if not done[r]:
                done[r], texts[r] = extend_reply(new[r], nxt[r], stop_ids, stop, tokenizer)
        if all(done) or step == budget - 1:
            break
        nxt = advance(nxt, step)
    return [t if t is not None else tokenizer.decode(new[r], skip_special_tokens=True) for r, t in enumerate(texts)]


def _holds_stop(tokenizer: PreTrainedTokenizerBase, token: int, stop: Sequence[str]) -> bool:
    """Whether the text of ``token`` alone contains one of the ``stop`` strings."""
    text = tokenizer.decode([token], skip_special_tokens=True)
    return any(s in text for s in stop)


def _decode_with_drafts(forward: Forward, tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int],
                        cache: Cache, logits: torch.Tensor, ids: list[int], budget: int, stop: Sequence[str],
                        draft_tokens: int, device: torch.device) -> str:
    """The greedy reply of :func:`decode`, verified draft by draft (``ids``: the prompt's tokens,
    extended in place by the reply's)."""
    import torch

    from agent_shell.lm.torch_kv import restore, snapshot

    def verify(feed: list[int], cached: int) -> list[int]:
        tokens = torch.tensor([feed], device=device)
        positions = torch.arange(cached, cached + len(feed), device=device)[None, :]
        return forward(tokens, cache, position_ids=positions, logits_to_keep=len(feed)).logits[0].argmax(dim=-1).tolist()

    return greedy_with_drafts(int(logits.argmax(dim=-1)[0]), verify, lambda n: restore(cache, snapshot(cache), n),
                              tokenizer, stop_ids, ids, budget, stop, draft_tokens)


def greedy_with_drafts(first: int, verify: Callable[[list[int], int], list[int]], cut: Callable[[int], None],
                       tokenizer: PreTrainedTokenizerBase, stop_ids: frozenset[int], ids: list[int], budget: int,
                       stop: Sequence[str], draft_tokens: int) -> str:
    """The greedy reply after a prompt, verified draft by draft, whatever runs the passes.

    Args:
        first: greedy's first reply token (the argmax after the prompt).
        verify: ``verify(feed, cached)`` runs one pass over the tokens ``feed`` at positions
            ``cached, cached + 1, ...`` (the cache holds ``cached`` tokens) and returns greedy's
            choice after each fed token (``len(feed)`` tokens).
        cut: ``cut(n)`` drops the cache's keys and values beyond its first ``n`` tokens.
        ids: the prompt's tokens, extended in place by the reply's.
        budget: at most this many new tokens (>= 1); ``draft_tokens``: at most this many drafted
            tokens per pass.
    """
    new: list[int] = []

    def emit(token: int) -> str | None:
        """Add greedy's ``token`` to the reply: the reply's text once it is finished, else None."""
        done, text = extend_reply(new, token, stop_ids, stop, tokenizer)
        if done or len(new) == budget:  # until then every emitted token is in ``new``
            return text if text is not None else tokenizer.decode(new, skip_special_tokens=True)
        return None

    nxt = first
    while (reply := emit(nxt)) is None:
        cached = len(ids)  # tokens in the cache; nxt is not yet among them
        ids.append(nxt)
        draft = lookup_draft(ids, k=min(draft_tokens, budget - len(new) - 1))
        if stop:  # the reply ends at a stop string: verifying tokens after it would be wasted work
            draft = draft[:next((i + 1 for i, t in enumerate(draft) if _holds_stop(tokenizer, t, stop)), len(draft))]
        greedy = verify([nxt, *draft], cached)  # greedy[i]: the token after the fed tokens up to i
        accepted = 0
        while accepted < len(draft) and greedy[accepted] == draft[accepted]:
            accepted += 1
        for token in draft[:accepted]:  # greedy decoding would have chosen these, one by one
            if (reply := emit(token)) is not None:
                return reply
            ids.append(token)
        if accepted < len(draft):  # drop the rejected draft tokens' keys and values
            cut(cached + 1 + accepted)
        nxt = greedy[accepted]
    return reply


__all__ = ["DRAFT_TOKENS", "check_generation", "decode", "eos_ids", "extend_reply", "greedy_with_drafts", "lookup_draft",
           "reply_rows", "sampler"]
