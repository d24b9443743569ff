"""Django's Redis cache with one connection pool per process.

Under ASGI Django keeps a cache object per request context, and Django's RedisCache opens
a connection pool per object: every request connected to Redis afresh (TCP handshake and
HELLO) on the one thread that also runs the ORM for all requests, which cost tens of
milliseconds per request under load. Here the pools are shared by every cache object of
the process with the same server and options.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, ClassVar

from django.core.cache.backends import redis as django_redis


class SharedPoolRedisCacheClient(django_redis.RedisCacheClient):
    # Set by Django's RedisCacheClient, which its type stubs don't describe.
    _servers: list[str]
    _pool_class: Any
    _pool_options: dict[str, Any]
    _get_connection_pool_index: Callable[[bool], int]

    _shared_pools: ClassVar[dict[tuple[str, str], Any]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def _get_connection_pool(self, write: bool) -> Any:
        server = self._servers[self._get_connection_pool_index(write)]
        key = (server, repr((self._pool_class, sorted(self._pool_options.items(), key=lambda item: item[0]))))
        with self._shared_lock:
            pool = self._shared_pools.get(key)
            if pool is None:
                pool = self._shared_pools[key] = self._pool_class.from_url(server, **self._pool_options)
        return pool


class RedisCache(django_redis.RedisCache):
    """`django.core.cache.backends.redis.RedisCache`, its connections kept for the process."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedPoolRedisCacheClient
