"""The wire format of OpenAI-compatible model servers: the fields passed through, token
estimates when no tokenizer is known, tool-call deltas as OpenAI streams them, and reading
an event stream's JSON chunks from aiohttp."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from inference.generators import Prompt
from inference.upstream.endpoints import UpstreamFailed

# What an upstream model can do that the in-process engine cannot: request fields passed through.
PASSTHROUGH_FIELDS = (
    *("tools", "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs"),
    *("frequency_penalty", "presence_penalty", "logit_bias"),
)


def estimate_tokens(text: str) -> int:
    """Tokens in a text when no tokenizer is known: about four characters each."""
    return math.ceil(len(text) / 4)


def estimate_prompt_tokens(prompt: Prompt) -> int:
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    return sum(estimate_tokens(message["content"]) + 4 for message in prompt)  # + the role's markers


def openai_tool_call_deltas(deltas: list[dict[str, Any]], begun: set[int]) -> list[dict[str, Any]]:
    """Tool-call deltas as OpenAI streams them: a call's `id`, `type` and function `name` in
    its first delta only, its arguments in pieces. llama.cpp's server repeats all three in
    every delta, which clients that join deltas (the openai SDK's stream helper) would turn
    into `get_weatherget_weather…`. `begun`, the indexes seen so far, is updated."""
    normalised = []
    for delta in deltas:
        index = delta.get("index", 0)
        if index in begun:
            delta = {key: value for key, value in delta.items() if key not in ("id", "type")}
            if isinstance(delta.get("function"), dict):
                delta["function"] = {key: value for key, value in delta["function"].items() if key != "name"}
        begun.add(index)
        normalised.append(delta)
    return normalised


# The longest line of an event stream taken from a model server: a chunk of logprobs or of
# a tool call's arguments can be long, but not without end.
MAX_LINE_BYTES = 4 * 2**20


# Seconds an idle connection is kept for the next request: below the 5 s after which
# llama-server (cpp-httplib) and vLLM (uvicorn) close one. aiohttp's own 15 s let a request
# go out on a connection idle for 5-15 s just as the server closed it, and fail (a known
# race of keep-alive: aiohttp#2682, cpp-httplib#1282). `_post` still sends a request lost
# so once more, for servers that close sooner or drop a connection for other reasons.
KEEPALIVE_S = 4.0


def client_session(*, new_connections: bool = False) -> aiohttp.ClientSession:
    """An HTTP session of the pool, made on its running loop. No cap on connections: each endpoint
    caps its own requests (`max_concurrent`). Proxies come with each request (`Endpoint.proxy`):
    trust_env would look them up, and a ~/.netrc entry for the server, on a thread for every
    request, and that entry would fail any request that sends an API key. Connections idle
    longer than KEEPALIVE_S are not used again. With `new_connections`, every request goes
    out on a connection of its own, closed after it."""
    if new_connections:
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S))


async def json_chunks(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI-style event stream, until `data: [DONE]`."""
    lines = response.content
    sent_data = False
    while True:
        try:
            line = await lines.readline(max_line_length=MAX_LINE_BYTES)
        except LineTooLong:
            # One answer's fault, not the server's: it fails over, and opens no circuit.
            raise UpstreamFailed(
                f"The model server sent a line over {MAX_LINE_BYTES} bytes.", opens_circuit=False
            ) from None
        if not line:
            if sent_data:
                return  # the body ended without [DONE]: what came is the answer
            # Not even an empty answer: llama.cpp's Python server, say, ends a stream so
            # when the prompt is longer than its context. This request's fault, like a 500.
            raise UpstreamFailed("The model server ended the answer without sending any of it.", opens_circuit=False)
        if not line.startswith(b"data:"):
            continue  # comments, ids, blank lines
        data, sent_data = line[5:].strip(), True
        if data == b"[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            raise UpstreamFailed("The model server sent a chunk that is not JSON.") from None
        if not isinstance(chunk, dict):
            raise UpstreamFailed("The model server sent a chunk that is not a JSON object.")
        yield chunk
