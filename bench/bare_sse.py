"""A bare Channels SSE endpoint: the baseline that bench.fanout compares chatsite with.

    python -m daphne -e tcp:port=PORT:interface=127.0.0.1:backlog=4096 bench.bare_sse:application

GET /sse/?n=<count>&interval=<seconds> answers with SSE headers, then `n` events
(`id: i`, `data: x…`), one every `interval` seconds, then ends the body. No models,
no sessions, no auth: only what Channels and daphne themselves cost.
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

import django
from channels.generic.http import AsyncHttpConsumer
from channels.routing import URLRouter
from django.conf import settings
from django.urls import path

if not settings.configured:
    # Channels reads CHANNEL_LAYERS (none here) from settings when a consumer starts.
    settings.configure(DEBUG=False, ALLOWED_HOSTS=["127.0.0.1", "localhost"], INSTALLED_APPS=[], USE_TZ=True)
    django.setup()

SSE_HEADERS = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"Cache-Control", b"no-cache"),
    (b"X-Accel-Buffering", b"no"),
]
# About the size of a chatsite token event (`{"delta":" word"}`), so bytes per event compare.
PAYLOAD = b"x" * 18


class TickerConsumer(AsyncHttpConsumer):
    """`n` events, one every `interval` seconds, on a fixed schedule (no drift)."""

    async def handle(self, body: bytes) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode())
        try:
            count = int(query.get("n", ["10"])[-1])
            interval = float(query.get("interval", ["0.05"])[-1])
        except ValueError:
            await self.send_response(400, b"n must be an integer and interval a number.\n")
            return
        await self.send_headers(headers=SSE_HEADERS)
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        for seq in range(1, count + 1):
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            await self.send_body(b"id: %d\ndata: %s\n\n" % (seq, PAYLOAD), more_body=True)
        await self.send_body(b"")


application = URLRouter([path("sse/", TickerConsumer.as_asgi())])
