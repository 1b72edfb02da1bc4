"""The language-model protocol the agents use; any feature extractor plugs in by implementing it.

CB-Agent needs three numbers per candidate action ``a`` in a text context ``x`` (seed App. B):
the summed log-probability of ``a``'s tokens given ``x`` (log Q(a|x)), their count L(a), and the
last-layer hidden state at ``a``'s final token. ReAct routing, thoughts and open action spaces
need free generation. The text between a context and a candidate (the *action prefix*, e.g. the
transcript's ``"\\n> "``) belongs to the caller's layout (:func:`agent_shell.context.action_prefix`),
so :meth:`LanguageModel.score` takes it as an argument.

A decision (Eq. 3, Eq. 7) is a *head* handed to the backend (:class:`DecisionHead`): a traceable
kernel over a candidate set's padded scores (the pass's hidden states and log-probabilities) with
its parameters, which a backend with a device of its own runs inside its scoring program (a method
``decide(context, candidates, action_prefix, head)``: one fetch to the host, after the argmax). The
protocol says nothing of what the head computes: a concept's (:attr:`cb_core.Concept.decision_head`) is one.
Any other backend needs nothing but :class:`LanguageModel`'s members, implemented structurally
(no base class): :func:`agent_shell.lm.decision.decide` takes the host decision on its scores.

Imports nothing of cb_core; must not import the agents or the environments.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, Union, runtime_checkable

from agent_shell.lm.scores import CandidateScores, Decided, DeviceScores

#: A context or prompt: one text, or chat messages (``{"role": ..., "content": ...}`` dicts, roles
#: system / user / assistant) that a backend lays out with its chat template and a generation
#: prompt (a candidate is then the next assistant message; pass ``action_prefix=""``). A text is
#: used as it is.
Context = Union[str, Sequence[Mapping[str, str]]]


class HeadOutput(Protocol):
    """What a head's kernel returns over one padded candidate set of M_pad slots (a pytree of arrays,
    traced): ``log_p``, ``prior`` and ``concept_term`` float32 [M_pad] (what the results record),
    ``chosen`` int32 [] (the argmax over the real candidates) and ``finite`` bool [] (False: an input
    was not finite; the terms are then meaningless)."""

    log_p: Any
    prior: Any
    concept_term: Any
    chosen: Any
    finite: Any


@runtime_checkable
class DecisionHead(Protocol):
    """What a fused decision needs: a traceable head over a scoring pass's outputs, with its
    parameters on the backend's device.

    Attributes:
        width: d, the width of the hidden states it reads.
        kernel: ``kernel(parameters, hidden, log_q, n_tokens, count) -> HeadOutput``, traceable:
            ``hidden`` float32 [M_pad, d] (the LM head's input at each candidate's final action
            token), ``log_q`` float32 [M_pad] (nats), ``n_tokens`` int32 [M_pad] (1 in padded
            slots), ``count`` int32 [] (M, the real candidates first). A static argument of the
            backend's compiled program: hashable, equal for every head that computes alike, and
            with a ``repr`` that names its code (a stored program's name holds it).
    """

    width: int
    kernel: Any

    def parameters(self, device: Any = None) -> Any:
        """The kernel's parameters as a pytree of arrays on ``device`` (a JAX device, or a
        ``jax.sharding.Sharding``: every device of a mesh holding them whole; None: JAX's default
        device), put there once."""
        ...

    def check(self, hidden: Any, log_q: Any, n_tokens: Any) -> None:
        """The host's checks of one candidate set's unpadded scores ([M, d], [M], [M]), made when
        the kernel reported a non-finite input.

        Raises:
            ValueError: naming the candidate at fault.
        """
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A frozen language model that scores candidate sets and generates text.

    A backend implements these members (structurally: no base class is needed). A backend that
    decides on a device of its own also has ``decide(context, candidates, action_prefix, head) ->
    Decided`` (the PyTorch and JAX backends); :func:`agent_shell.lm.decision.decide` calls it, or
    takes the host decision on :meth:`score`'s numbers."""

    name: str  # identifies the backbone in concept metadata
    hidden_size: int  # d

    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        """Score each candidate as a continuation of ``context + action_prefix`` (a message list:
        of the chat template's generation prompt + ``action_prefix``).

        Raises:
            ValueError: empty candidate list, an empty candidate string, or a context longer
                than the model's window.
        """
        ...

    def generate(
        self,
        prompt: Context,
        max_new_tokens: int = 64,
        stop: Sequence[str] = (),
        temperature: float = 0.0,
        n: int = 1,
        seed: int | None = None,
    ) -> list[str]:
        """Return ``n`` continuations of ``prompt`` (greedy when temperature is 0), each cut at
        the first stop string (the stop string itself excluded)."""
        ...

    def fork(self) -> "LanguageModel":
        """A view of the same backbone (weights shared, nothing copied) with its own prefix KV
        cache, for a second stream of contexts (scoring contexts beside routing prompts, reviews);
        a backend without such state returns itself."""
        ...


def pin_prefix(lm: LanguageModel, head: Context) -> int:
    """Ask ``lm`` to keep the KV cache of a fixed prompt head for the contexts that start with it
    (a backend with a prefix cache has ``pin_prefix``, e.g. :meth:`agent_shell.lm.tokenized.TokenizedBackend.pin_prefix`);
    an optional capability: a backend without it is left alone. Returns the tokens pinned (0: none)."""
    pin = getattr(lm, "pin_prefix", None)
    return int(pin(head)) if callable(pin) else 0


class ContextWindowFull(ValueError):
    """A prompt or scoring context (with a candidate) does not fit the backbone's context window:
    an episode's transcript has outgrown it. Backends raise it instead of a plain ValueError, so
    an agent can end the episode (:class:`agent_shell.agents.step.WindowFull`) rather than fail."""


class BackboneFault(RuntimeError):
    """A fault of the backbone itself that the same call meets again, whatever the episode: a
    forward pass whose shapes do not fit its weights, an index past its embedding table. No retry
    helps, so the scheduler ends the run with its one-line message instead of retrying every
    episode (:mod:`agent_shell.scheduler`). Backends raise it from the error of their pass
    (:meth:`of`)."""

    @classmethod
    def of(cls, err: BaseException, what: str) -> "BackboneFault":
        """The fault of ``what`` (e.g. ``"the JAX decoder's stream pass"``) that raised ``err``:
        one line, the error's type and first line."""
        reason = (str(err).strip().splitlines() or [""])[0][:300]
        return cls(f"{what} cannot run: {type(err).__name__}: {reason} (a fault of the backbone, not of the "
                   "episode: the run stops)")


def check_candidates(candidates: Sequence[str]) -> list[str]:
    """The candidate set as a list, after the checks every backend's ``score`` makes.

    Raises:
        ValueError: one string instead of a sequence, an empty list, or an empty (or non-string)
            candidate, naming its index.
    """
    if isinstance(candidates, str):
        raise ValueError("candidates must be a sequence of strings, got one string")
    actions = list(candidates)
    if not actions:
        raise ValueError("empty candidate list: score() needs at least one candidate")
    for i, a in enumerate(actions):
        if not isinstance(a, str) or not a:
            raise ValueError(f"candidate {i} is {a!r}: every candidate must be a non-empty string")
    return actions


def dtype_text(dtype: object) -> str:
    """A torch, JAX or numpy dtype (or its spelling) as one plain name: ``"float32"``, ``"bfloat16"``
    (what cache keys, concept metadata and results record, whichever backend computed)."""
    return str(dtype).lower().removeprefix("torch.")


def backbone_dtype(lm: LanguageModel) -> str:
    """The backbone's compute dtype as text ("" when the backend does not say)."""
    return dtype_text(getattr(lm, "dtype", ""))
