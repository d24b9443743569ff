"""Database work on a few threads that keep their connections: the API's requests and
the saves of every generation's progress and result.

Django runs a request's synchronous code (`sync_to_async`) on a thread of that request,
with a database connection of its own, opened on first use and closed as the request
ends: on SQLite that is 2-3 ms of every request (connecting, the pragmas, the functions
Django registers), more on PostgreSQL, and a new thread per request on top. An engine's
finisher thread, which saves what a generation made, opened and closed one per save for
the same reason (it lives as long as the process). The hot paths run here instead: a small
pool of threads, each with its connection kept open between tasks. A few threads, not
one, so that one request's slow work (tokenizing a long prompt, a busy database) holds
up no other. A kept connection is checked before each task, and a connection that failed
is closed: that thread's next task connects afresh.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections

from infrastructure import logs

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 4
THREAD_NAME = "chatsite-db"
_threads = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix=THREAD_NAME)
_on_callers_thread = False  # on_the_callers_thread()


@contextmanager
def on_the_callers_thread() -> Iterator[None]:
    """For tests whose transaction rolls back: while it lasts, the work given to the
    database threads runs on the caller's thread instead (an async caller's: Django's
    thread for sync work), whose connection holds the test's transaction, so that what
    the work saves is seen by the test and rolled back with it. With an eager engine
    (inference.engine, scheduler "eager") a whole generation then runs there."""
    global _on_callers_thread
    _on_callers_thread = True
    try:
        yield
    finally:
        _on_callers_thread = False


async def in_database_thread(work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)` on one of the database threads, as part of this request.

    Unlike `sync_to_async`, the request's context is not copied into the thread: the
    thread's own context holds its database connection, which must outlive the request.
    The request's log fields are carried over by hand.
    """
    if _on_callers_thread:
        return await sync_to_async(work, thread_sensitive=True)(*args, **kwargs)
    task = partial(_run, logs.request_fields(), partial(work, *args, **kwargs))
    return await asyncio.get_running_loop().run_in_executor(_threads, task)


def on_database_thread(work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)` on one of the database threads, from a thread that waits for
    it (an engine's finisher: its saves stay in order)."""
    if _on_callers_thread:
        return work(*args, **kwargs)
    return _threads.submit(_run, logs.request_fields(), partial(work, *args, **kwargs)).result()


def close_connections() -> None:
    """Close every thread's connection (a test database is dropped with none open).

    One task per thread: each waits at the barrier until every thread holds one."""
    barrier = threading.Barrier(THREADS)

    def close_this_threads() -> None:
        barrier.wait()
        connections.close_all()

    for done in [_threads.submit(close_this_threads) for _ in range(THREADS)]:
        done.result()


def _run(fields: dict[str, Any] | None, work: Callable[[], T]) -> T:
    with logs.request_context(fields):
        _drop_dead_connections()
        try:
            return work()
        except DatabaseError:
            # A broken connection (a database restart, a killed session) is not kept.
            connections.close_all()
            raise


def _drop_dead_connections() -> None:
    """A kept connection can die while idle (a database restart, a killed session): each
    task checks its thread's before use, as CONN_HEALTH_CHECKS does for Django's own, and a
    dead one is replaced. One round trip on PostgreSQL; nothing on SQLite."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None and not connection.is_usable():
            connection.close()
