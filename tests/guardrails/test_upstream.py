"""Answer rules on a model server's stream (the upstream pool): the same guard as the engine's."""

from __future__ import annotations

from aiohttp import web

from guardrails.matching import BLOCK, MASK, PII, WORDS, AnswerGuard, RuleSpec
from inference.engine import Job
from inference.streams import InMemoryStreamStore
from inference.upstream import UpstreamPool, endpoint_from_json
from tests.support.engines import wait_for_terminal
from tests.support.upstreams import ScriptedServer, event_stream

MESSAGES = [{"role": "user", "content": "Hello"}]
# An e-mail address cut across four chunks, as a model server's tokens would cut it.
PIECES = ["Write to al", "ice@exa", "mple.", "com today."]


def chunk_of(text: str, finish_reason: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish_reason}]}


def run_on_pool(pieces: list[str], guard: AnswerGuard) -> list:
    async def model_server(request: web.Request) -> web.Response:
        chunks = [chunk_of(piece) for piece in pieces[:-1]] + [chunk_of(pieces[-1], "stop")]
        return event_stream(chunks)

    store = InMemoryStreamStore()
    pool = UpstreamPool(store, health_interval_s=60)
    with ScriptedServer(model_server) as upstream:
        endpoint = {"model": "remote", "base_url": upstream.base_url, "upstream_model": "m"}
        pool.configure([endpoint_from_json(endpoint, "e")])
        job = Job("s1", MESSAGES, text_filter=guard)
        pool.submit(job, model="remote", prompt_tokens=1, body={"messages": MESSAGES})
        events = wait_for_terminal(store, "s1", timeout=10)
        pool.shut_down(1)
    return events


def test_a_model_servers_answer_reaches_the_store_masked_across_chunks():
    events = run_on_pool(PIECES, AnswerGuard.of([RuleSpec(1, "pii", PII, "email", MASK)]))

    tokens = "".join(e.data["delta"] for e in events if e.type == "token")
    assert tokens == "Write to [email] today."
    assert all("alice" not in e.data.get("delta", "") for e in events)
    assert events[-1].type == "done"
    assert events[-1].data["finish_reason"] == "stop"


def test_a_block_on_a_model_servers_answer_ends_it_as_content_filter():
    rules = [RuleSpec(1, "no mail", WORDS, "write to", BLOCK, "No letters.")]
    events = run_on_pool([*PIECES, " and more"] + [" words"] * 40, AnswerGuard.of(rules))

    tokens = "".join(e.data["delta"] for e in events if e.type == "token")
    assert tokens == "No letters."
    assert events[-1].data["finish_reason"] == "content_filter"
