"""chatsite.handlers.ProgramsHandler: Django's request cycle for the API and the probes,
without a thread of each request's own for the request signals or the database."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished, request_started
from django.db.backends.signals import connection_created

from accounts.services import api_key_create
from chatsite.handlers import ProgramsHandler
from infrastructure.database import THREAD_NAME, close_connections
from tests.support.api_client import MODEL
from tests.support.engines import wait_for_terminal
from tests.support.streams import get_stream

pytestmark = pytest.mark.django_db(transaction=True)

HOST = (b"host", b"localhost")


async def test_the_request_signals_are_sent_in_the_thread_of_the_request():
    # Django sends them through sync_to_async: a thread made for each request, joined on
    # another as it ends; their receivers have nothing to do for a program's request.
    threads: list[threading.Thread] = []

    def record(sender: object, **kwargs: object) -> None:
        threads.append(threading.current_thread())

    request_started.connect(record)
    request_finished.connect(record)
    try:
        probe = await get_stream("/healthz", [HOST], handler=ProgramsHandler())
        api = await get_stream("/v1/models", [HOST], handler=ProgramsHandler())
    finally:
        request_started.disconnect(record)
        request_finished.disconnect(record)

    assert probe["status"] == 200
    assert api["status"] == 401
    assert threads == [threading.current_thread()] * 4  # started and finished, twice


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def opened_on() -> Iterator[list[str]]:
    """The names of the threads that open a database connection while the test runs; the
    database threads start it without one."""
    close_connections()
    names: list[str] = []

    def record(sender: object, **kwargs: object) -> None:
        names.append(threading.current_thread().name)

    connection_created.connect(record)
    yield names
    connection_created.disconnect(record)


async def test_the_api_opens_database_connections_only_on_threads_that_keep_them(alice_key, fast_engine, opened_on):
    # A connection opened on a request's own thread would outlive the request: nothing
    # closes it (the request signals run on the request's thread, above). The engine's
    # saves of each result run on the same kept threads (infrastructure/database.py).
    transport = httpx.ASGITransport(app=ProgramsHandler())
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", headers={"Authorization": f"Bearer {alice_key}"}
    ) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        whole = await client.post("/v1/chat/completions", json=body)
        streamed = await client.post(
            "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"resumable": True}}
        )
        completion_id = whole.json()["id"]
        await sync_to_async(wait_for_terminal)(fast_engine.store, completion_id.split("-", 1)[-1])
        resumed = await client.get(f"/v1/streams/{completion_id}")
        cancelled = await client.post(f"/v1/streams/{completion_id}/cancel")
        usage = await client.get("/v1/usage")
        models = await client.get("/v1/models")

    assert [r.status_code for r in (whole, streamed, resumed, cancelled, usage, models)] == [200] * 6
    assert "data: [DONE]" in streamed.text
    assert opened_on and all(name.startswith(THREAD_NAME) for name in opened_on), opened_on


class NeverAnswers(ProgramsHandler):
    async def run_get_response(self, request):
        await asyncio.Event().wait()


async def test_a_request_cancelled_as_the_server_stops_leaves_no_task_behind():
    # daphne cancels the requests still open as it stops. A disconnect watcher left
    # running would raise RequestAborted once the connection closes, with no one to
    # await it: "Task exception was never retrieved" in the log of a clean stop.
    scope = {"type": "http", "method": "GET", "path": "/v1/models", "query_string": b"", "headers": [HOST]}
    communicator = ApplicationCommunicator(NeverAnswers(), scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    await asyncio.sleep(0.1)  # the view is waiting, the disconnect watched
    communicator.future.cancel()
    with pytest.raises(asyncio.CancelledError):
        await communicator.future
    await communicator.input_queue.put({"type": "http.disconnect"})  # the connection closes
    await asyncio.sleep(0.1)

    assert asyncio.all_tasks() == {asyncio.current_task()}
