"""One backbone behind a Ray actor, shared by concurrent streams: their score calls are batched
into shared passes and give the numbers of unbatched calls (fp32, 1e-4 nats); their one-reply
generations are decoded together and give the unbatched replies."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from agent_shell.context import action_prefix
from test_lm_batched import REQUESTS

PREFIX = action_prefix("text")


@pytest.mark.slow  # a Ray LM server and the real backbone (about 25 s)
def test_concurrent_streams_are_batched_with_unbatched_numbers(ray_cluster, fresh):
    from agent_shell.lm.server import RemoteLM, start_lm_server

    # a long wait: the concurrent calls land in one batch whatever the machine's load, so the
    # batch (and its padding, hence the float rounding of the replies) is the same every run
    server = start_lm_server(None, "float32", threads=1, wait_ms=500)
    try:
        lm = RemoteLM(server)
        assert lm.hidden_size == 576
        streams = [lm] + [lm.fork() for _ in REQUESTS[1:]]
        assert len({s.stream for s in streams}) == len(REQUESTS)
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            got = list(pool.map(lambda sr: sr[0].score(sr[1][0], sr[1][1], PREFIX), zip(streams, REQUESTS)))
        assert max(ray_cluster.get(server.info.remote())["batches"]) > 1  # some calls shared a pass
        for g, (context, cands) in zip(got, REQUESTS):
            r = fresh(reuse_cache=False).score(context, cands, PREFIX)
            assert np.array_equal(g.n_tokens, r.n_tokens)
            assert np.abs(g.log_q - r.log_q).max() < 1e-4
            assert np.abs(g.hidden - r.hidden).max() / np.abs(r.hidden).max() < 1e-4
        # one-reply generations of concurrent streams are decoded together, with unbatched replies
        prompts = [context + "\n>" for context, _ in REQUESTS]
        with ThreadPoolExecutor(len(REQUESTS)) as pool:
            replies = list(pool.map(lambda sp: sp[0].generate(sp[1], max_new_tokens=6, stop=("\n",)),
                                    zip(streams, prompts)))
        assert max(ray_cluster.get(server.info.remote())["generate_batches"]) == len(REQUESTS)
        assert replies == [fresh(reuse_cache=False).generate(p, max_new_tokens=6, stop=("\n",)) for p in prompts]
        assert streams[0].generate(prompts[0], max_new_tokens=6, n=2, temperature=0.5, seed=1) == \
            fresh(reuse_cache=False).generate(prompts[0], max_new_tokens=6, n=2, temperature=0.5, seed=1)
        # a decision over a stream: the host decision on the server's scores
        import cb_core

        from agent_shell.lm.decision import decide

        context, cands = REQUESTS[0]
        concept = cb_core.Concept(np.random.default_rng(3).normal(0, 0.3, 577).astype(np.float32), 0.8, 1e-6)
        decided = decide(lm.fork(), context, cands, PREFIX, concept.decision_head)
        r = fresh(reuse_cache=False).score(context, cands, PREFIX)
        want = concept.terms(r.hidden, r.log_q, r.n_tokens)
        assert decided.chosen == int(np.argmax(want.log_p))
        np.testing.assert_allclose(decided.log_p, want.log_p, atol=1e-3)
        with pytest.raises(ValueError, match="temperature"):
            lm.generate("context", temperature=-1.0)
        with pytest.raises(ValueError, match="non-empty string"):
            lm.score("context", ["ok", ""], PREFIX)
    finally:
        ray_cluster.kill(server)


def test_the_server_keeps_the_caches_of_its_recent_streams_only(fresh):
    """A dead worker's streams are never used again: beyond ``max_streams`` the least recently
    used stream's cache is dropped, and a dropped stream that comes back gets the same numbers."""
    from agent_shell.lm.server import LMServer

    server = LMServer(lm=fresh(), wait_ms=0.0, max_streams=2)  # the actor's body without Ray
    context, cands = REQUESTS[0]

    async def score(stream):
        return await server.score(stream, context, cands, PREFIX)

    async def scenario():
        first = await score("a")
        await score("b")
        await score("a")  # a is the most recent again
        await score("c")  # b goes
        assert list(server.views) == ["a", "c"]
        again = await score("b")  # b comes back with an empty cache: a goes
        assert list(server.views) == ["c", "b"]
        return first, again

    first, again = asyncio.run(scenario())
    assert np.abs(first.log_q - again.log_q).max() < 1e-4
    assert np.abs(first.hidden - again.hidden).max() / np.abs(first.hidden).max() < 1e-4
