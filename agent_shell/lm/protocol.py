"""The language-model protocol the agents use; any feature extractor plugs in by implementing it.

CB-Agent needs three numbers per candidate action ``a`` in a text context ``x`` (seed App. B):
the summed log-probability of ``a``'s tokens given ``x`` (log Q(a|x)), their count L(a), and the
last-layer hidden state at ``a``'s final token. ReAct routing, thoughts and open action spaces
need free generation.

A decision under a concept (Eq. 3, Eq. 7) is the protocol's too (:meth:`LanguageModel.decide`):
a backend with a device of its own scores the candidates and decides there, fetching to the host
only what the results record, after the argmax; any other backend inherits the host decision
by subclassing :class:`LanguageModel`. The text between a context and a candidate (the *action prefix*, e.g.
the transcript's ``"\\n> "``) belongs to the caller's layout (:func:`agent_shell.context.action_prefix`),
so :meth:`LanguageModel.score` takes it as an argument.

Must not import the agents or the environments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol, Sequence, Union, runtime_checkable

from agent_shell.lm.scores import CandidateScores, Decided, DeviceScores

if TYPE_CHECKING:
    from cb_core import Concept

#: A context or prompt: one text, or chat messages (``{"role": ..., "content": ...}`` dicts, roles
#: system / user / assistant) that a backend lays out with its chat template and a generation
#: prompt (a candidate is then the next assistant message; pass ``action_prefix=""``). A text is
#: used as it is.
Context = Union[str, Sequence[Mapping[str, str]]]


@runtime_checkable
class LanguageModel(Protocol):
    """A frozen language model that scores candidate sets, decides among them and generates text.

    A backend implements :meth:`score`, :meth:`generate` and :meth:`fork`; :meth:`decide` is
    inherited by subclassing this class (the host decision) unless the backend decides on a device
    of its own (the PyTorch and JAX backends)."""

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

    def decide(self, context: Context, candidates: Sequence[str], action_prefix: str, concept: Concept) -> Decided:
        """The decision among ``candidates`` under ``concept`` (seed Eq. 3 and Eq. 7, phi = the
        hidden states of :meth:`score`): log P, the prior and concept terms and their argmax,
        computed where the scores are (on the backend's device: one fetch to the host, after the
        argmax, of what the results record). This body scores on the host and decides with the
        concept's kernel (:func:`agent_shell.lm.decision.decide_scores`).

        Raises:
            ValueError: what :meth:`score` raises; features whose width differs from the concept's
                d; non-finite scores (naming the candidate).
        """
        from agent_shell.lm.decision import decide_scores

        return decide_scores(concept, DeviceScores.padded(self.score(context, candidates, action_prefix)))

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


def backbone_dtype(lm: LanguageModel) -> str:
    """The backbone's compute dtype as text ("" when the backend does not say)."""
    return str(getattr(lm, "dtype", "")).removeprefix("torch.")
