"""One backbone shared by concurrent episodes: a Ray actor per device that batches their calls.

:class:`LMServer` holds the model (the only process that loads it) and one prefix cache per
*stream* (an episode worker's routing view, its scoring fork, ...; all share the pinned heads).
Concurrent ``score`` requests that arrive within ``wait_ms`` of each other are scored in one
forward pass (:func:`agent_shell.lm.batched.score_many`: every candidate set over its own KV
prefix); concurrent one-reply ``generate`` requests are decoded together
(:func:`agent_shell.lm.batched.generate_many`: one token per row per pass). :class:`RemoteLM` is the client: it implements the :class:`LanguageModel` protocol, so env
workers build their agents on it and never load the model.

Ray is imported only in :func:`start_lm_server` (``pip install 'cb-agent[ray]'``). Must not import
the agents or the environments.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agent_shell.lm.protocol import CandidateScores, Context

if TYPE_CHECKING:
    from ray.actor import ActorHandle

    from agent_shell.lm.batched import GenerateRequest, ScoreRequest
    from agent_shell.lm.hf import HFLanguageModel


class LMServer:
    """The actor's body: a loaded backbone, per-stream caches, a batching loop for ``score``.

    Args:
        model, dtype, device: as :func:`agent_shell.lm.load_language_model`.
        lm: an already loaded backend to serve instead (then ``model``, ``dtype`` and ``device``
            are not used), e.g. the actor's body in one process without Ray.
        wait_ms: how long the first request of a batch waits for others (milliseconds).
        max_batch: most requests scored in one pass.
        threads: torch threads of the actor (None: leave torch's default).
        max_streams: streams whose KV caches are kept; the least recently used one beyond it is
            dropped (a dead worker's streams are never used again; a dropped stream that comes
            back starts from an empty cache: the same numbers, its prefix encoded again).
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", device: str | None = None,
                 wait_ms: float = 5.0, max_batch: int = 16, threads: int | None = None, max_streams: int = 64,
                 lm: HFLanguageModel | None = None):
        import torch

        from agent_shell.lm import load_language_model

        if threads:
            torch.set_num_threads(threads)
        self.lm = lm if lm is not None else load_language_model(model, dtype=dtype, device=device)
        self.views: OrderedDict[str, HFLanguageModel] = OrderedDict()
        self.max_streams = max_streams
        self.wait_s = wait_ms / 1000
        self.max_batch = max_batch
        self.pending: list[tuple[ScoreRequest | GenerateRequest, asyncio.Future]] = []
        self.batches: list[int] = []  # sizes of the batched scoring passes so far
        self.generate_batches: list[int] = []  # sizes of the batches of replies decoded together
        self._wake: asyncio.Event | None = None

    def info(self) -> dict[str, Any]:
        return {"name": self.lm.name, "hidden_size": self.lm.hidden_size, "dtype": str(self.lm.dtype),
                "batches": list(self.batches), "generate_batches": list(self.generate_batches)}

    def _view(self, stream: str) -> HFLanguageModel:
        if stream in self.views:
            self.views.move_to_end(stream)
        else:
            self.views[stream] = self.lm.fork()
            while len(self.views) > self.max_streams:
                self.views.popitem(last=False)
        return self.views[stream]

    async def score(self, stream: str, context: Context, candidates: Sequence[str],
                    action_prefix: str) -> CandidateScores:
        from agent_shell.lm.batched import ScoreRequest

        return await self._submit(ScoreRequest(self._view(stream).cache, context, tuple(candidates), action_prefix))

    async def generate(self, stream: str, prompt: Context, max_new_tokens: int = 64, stop: Sequence[str] = (),
                       temperature: float = 0.0, n: int = 1, seed: int | None = None) -> list[str]:
        """One reply (``n == 1``) is decoded together with the other streams' concurrent ones; a
        call for several replies is served alone on its stream."""
        if n != 1:
            return self._view(stream).generate(prompt, max_new_tokens, stop, temperature, n, seed)
        from agent_shell.lm.batched import GenerateRequest

        request = GenerateRequest(self._view(stream).cache, prompt, max_new_tokens, tuple(stop), temperature, seed)
        return [await self._submit(request)]

    async def _submit(self, request: ScoreRequest | GenerateRequest) -> CandidateScores | str:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        if self._wake is None:
            self._wake = asyncio.Event()
            asyncio.get_running_loop().create_task(self._drain())
        self._wake.set()
        return await future

    async def _drain(self) -> None:
        from agent_shell.lm.batched import GenerateRequest, ScoreRequest, generate_many, score_many

        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.wait_s)  # let concurrent requests arrive
            while self.pending:
                batch, self.pending = self.pending[:self.max_batch], self.pending[self.max_batch:]
                for kind, run, sizes in ((ScoreRequest, score_many, self.batches),
                                         (GenerateRequest, generate_many, self.generate_batches)):
                    group = [(r, f) for r, f in batch if isinstance(r, kind)]
                    if group:
                        self._serve(run, group)
                        sizes.append(len(group))

    def _serve(self, run: Callable[[HFLanguageModel, list], list],
               group: list[tuple[ScoreRequest | GenerateRequest, asyncio.Future]]) -> None:
        """Answer a batch of one kind; when the batch fails, one by one, so each caller gets its own error."""
        try:
            results = run(self.lm, [r for r, _ in group])
        except Exception:  # noqa: BLE001
            results = []
            for request, _ in group:
                try:
                    results.append(run(self.lm, [request])[0])
                except Exception as err:  # noqa: BLE001
                    results.append(err)
        for (_, future), result in zip(group, results):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def pin_prefix(self, head: Context) -> int:
        return self.lm.pin_prefix(head)


class RemoteLM:
    """A :class:`LanguageModel` whose calls go to an :class:`LMServer` actor (one stream per view).
    The server batches the streams' ``score`` calls into shared passes and returns each one's
    scores, so a decision is the host decision on them (:func:`agent_shell.lm.decision.decide`).

    Args:
        server: the actor handle (picklable: pass it to env workers).
        info: the server's :meth:`LMServer.info` (fetched when None).
    """

    def __init__(self, server: ActorHandle, info: dict[str, Any] | None = None, stream: str | None = None):
        import ray

        self.server = server
        info = info if info is not None else ray.get(server.info.remote())
        self._info = info
        self.name: str = info["name"]
        self.hidden_size: int = int(info["hidden_size"])
        self.dtype: str = info["dtype"]
        self.stream = stream or uuid.uuid4().hex

    def fork(self) -> "RemoteLM":
        """A new stream (its own prefix cache on the server)."""
        return RemoteLM(self.server, self._info)

    def score(self, context: Context, candidates: Sequence[str], action_prefix: str) -> CandidateScores:
        import ray

        if isinstance(candidates, str):
            raise ValueError("candidates must be a sequence of strings, got one string")
        return ray.get(self.server.score.remote(self.stream, context, list(candidates), action_prefix))

    def generate(self, prompt: Context, max_new_tokens: int = 64, stop: Sequence[str] = (), temperature: float = 0.0,
                 n: int = 1, seed: int | None = None) -> list[str]:
        import ray

        return ray.get(self.server.generate.remote(self.stream, prompt, max_new_tokens, tuple(stop), temperature, n,
                                                   seed))

    def pin_prefix(self, head: Context) -> int:
        import ray

        return ray.get(self.server.pin_prefix.remote(head))


def start_lm_server(model: str | None = None, dtype: str = "auto", *, num_gpus: float = 0, num_cpus: float = 1,
                    **kwargs: Any) -> ActorHandle:
    """Start one :class:`LMServer` actor (one per device: ``num_gpus=1`` on a GPU) and wait until
    its model is loaded; returns the handle (a connected Ray is required)."""
    import ray

    actor = ray.remote(num_gpus=num_gpus, num_cpus=num_cpus, max_concurrency=256)(LMServer).remote(
        model, dtype, **kwargs)
    ray.get(actor.info.remote())
    return actor


__all__ = ["LMServer", "RemoteLM", "start_lm_server"]
