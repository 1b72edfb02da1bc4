"""Decoding: greedy or seeded sampled continuations over a cached prompt, cut at stop strings.

Greedy when ``temperature == 0``; otherwise tokens are drawn from softmax(logits / temperature)
with a ``torch.Generator`` seeded by ``seed`` (same seed, same replies on the same machine and
dtype). A reply ends at an end-of-sequence token, after its token budget, or at the first
occurrence of a stop string, which is cut off (the stop string itself excluded).

Must not import the agents or the environments.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from agent_shell.lm.kv_cache import Forward


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


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
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
    if temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(int(seed))
    else:
        generator.seed()
    return generator


def extend_reply(tokens: list[int], token: int, stop_ids: frozenset[int], stop: Sequence[str],
                 tokenizer: Any) -> tuple[bool, str | None]:
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


def decode(forward: Forward, tokenizer: Any, stop_ids: frozenset[int], cache: Any, logits: torch.Tensor,
           length: int, rows: int, budget: int, stop: Sequence[str], temperature: float,
           generator: torch.Generator | None, device: torch.device) -> list[str]:
    """``rows`` continuations of a prompt of ``length`` tokens whose cache is ``cache`` and whose
    next-token logits [1, V] are ``logits``; at most ``budget`` >= 1 new tokens each."""
    if rows > 1:
        cache.batch_repeat_interleave(rows)
        logits = logits.expand(rows, -1)
    new: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    texts: list[str | None] = [None] * rows
    for step in range(budget):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        else:
            nxt = logits.argmax(dim=-1)
        nxt_list = nxt.tolist()
        for r in range(rows):
            if not done[r]:
                done[r], texts[r] = extend_reply(new[r], nxt_list[r], stop_ids, stop, tokenizer)
        if all(done) or step == budget - 1:
            break
        out = forward(nxt[:, None].to(device), cache, position_ids=torch.full((rows, 1), length + step, device=device),
                      logits_to_keep=1)
        logits = out.logits[:, -1].float()
    return [t if t is not None else tokenizer.decode(new[r], skip_special_tokens=True) for r, t in enumerate(texts)]


__all__ = ["check_generation", "decode", "eos_ids", "extend_reply", "sampler"]
