"""The Redis cache keeps its connections for the process, whatever the request context."""

from __future__ import annotations

import os

import httpx
import pytest
import redis
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

from accounts.services import api_key_create
from chatsite.cache import RedisCache

# Redis itself: CI's second pass runs it (tests marked services).
pytestmark = [
    pytest.mark.services,
    pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real Redis)"),
]


REDIS_CACHES = {
    "default": {
        "BACKEND": "chatsite.cache.RedisCache",
        "LOCATION": os.environ.get("REDIS_URL"),
        "KEY_PREFIX": "chatsite-test-cache",
    }
}


def connections_opened() -> int:
    return int(redis.Redis.from_url(os.environ["REDIS_URL"]).info("stats")["total_connections_received"])


def test_cache_objects_share_one_pool_per_server_and_options():
    url = os.environ["REDIS_URL"]
    first, second = RedisCache(url, {}), RedisCache(url, {})
    other_options = RedisCache(url, {"OPTIONS": {"socket_timeout": 5}})

    assert first._cache.get_client().connection_pool is second._cache.get_client().connection_pool
    assert other_options._cache.get_client().connection_pool is not first._cache.get_client().connection_pool


def test_many_cache_objects_open_one_connection():
    url = os.environ["REDIS_URL"]
    RedisCache(url, {"KEY_PREFIX": "chatsite-test-cache"}).set("warm", 1)
    before = connections_opened()

    for number in range(20):  # as Django makes one per request context under ASGI
        RedisCache(url, {"KEY_PREFIX": "chatsite-test-cache"}).set(f"key-{number}", number, timeout=10)

    assert connections_opened() - before <= 1  # the one that counts connections


@pytest.mark.django_db(transaction=True)
async def test_api_requests_under_asgi_reuse_the_cache_connection(settings, alice):
    settings.CACHES = REDIS_CACHES
    key = (await sync_to_async(api_key_create)(user=alice, name="test"))[1]
    transport = httpx.ASGITransport(app=get_asgi_application())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        headers = {"Authorization": f"Bearer {key}"}
        assert (await client.get("/v1/usage", headers=headers)).status_code == 200  # reads the rate-limit counter
        before = await sync_to_async(connections_opened)()

        for _ in range(10):
            assert (await client.get("/v1/usage", headers=headers)).status_code == 200

    assert await sync_to_async(connections_opened)() - before <= 1
