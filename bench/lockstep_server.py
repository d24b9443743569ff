"""A scripted OpenAI-compatible model server for bench.upstream_cost, with no model.

    python -m bench.lockstep_server PORT ARRIVALS_FILE CHUNKS GAP_S

Streams CHUNKS one-word chunks (then a finish chunk, a usage chunk and `data: [DONE]`) to
every chat completion, all of its streams together every GAP_S seconds, as a batching
server's decoding steps do, and appends each request's arrival time (`time.monotonic()`,
the same clock across processes) to ARRIVALS_FILE, one JSON line each.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from aiohttp import web


def chunk(choices: list[dict[str, object]], **fields: object) -> bytes:
    body = {"id": "lockstep", "object": "chat.completion.chunk", "created": 0, "model": "lockstep"}
    return f"data: {json.dumps({**body, 'choices': choices, **fields})}\n\n".encode()


def application(arrivals: Path, chunks: int, gap_s: float) -> web.Application:
    log = arrivals.open("a", buffering=1)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "lockstep", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        await request.read()
        log.write(json.dumps({"arrived": arrived}) + "\n")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}}]))
        for number in range(chunks):
            await asyncio.sleep(gap_s - time.monotonic() % gap_s)  # the next step of the shared clock
            await response.write(chunk([{"index": 0, "delta": {"content": f" w{number}"}, "finish_reason": None}]))
        await response.write(chunk([{"index": 0, "delta": {}, "finish_reason": "length"}]))
        usage = {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": chunks + 10}
        await response.write(chunk([], usage=usage) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def main() -> None:
    port, arrivals, chunks, gap_s = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    web.run_app(application(arrivals, chunks, gap_s), host="127.0.0.1", port=port, print=None, access_log=None)


if __name__ == "__main__":
    main()
