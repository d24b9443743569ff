from __future__ import annotations

import asyncio
import threading

import pytest

from generation.streams import InMemoryStreamStore, StreamNotFound, sse_comment, sse_event


async def collect(store, stream_id, after=0, heartbeat_s=None):
    events = []
    async for batch in store.read(stream_id, after, heartbeat_s=heartbeat_s):
        events.extend(batch)
    return events


def produce(store, stream_id, words, delay=0.0):
    for word in words:
        store.append(stream_id, "token", {"delta": word})
        if delay:
            threading.Event().wait(delay)
    store.append(stream_id, "done", {"finish_reason": "stop"})


async def test_events_are_numbered_from_one_in_order():
    store = InMemoryStreamStore()
    store.create("s")
    produce(store, "s", ["a", "b", "c"])

    events = await collect(store, "s")

    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.type for e in events] == ["token", "token", "token", "done"]
    assert "".join(e.data["delta"] for e in events[:-1]) == "abc"


async def test_live_readers_and_a_late_reader_see_the_same_events():
    store = InMemoryStreamStore()
    store.create("s")
    readers = [asyncio.create_task(collect(store, "s")) for _ in range(5)]
    await asyncio.sleep(0)
    producer = threading.Thread(target=produce, args=(store, "s", list("hello"), 0.005))
    producer.start()
    live = await asyncio.gather(*readers)
    producer.join()
    late = await collect(store, "s")

    assert all(events == late for events in live)
    assert [e.seq for e in late] == list(range(1, 7))


async def test_resume_after_n_replays_only_what_followed():
    store = InMemoryStreamStore()
    store.create("s")
    produce(store, "s", ["a", "b", "c"])

    events = await collect(store, "s", after=2)

    assert [e.seq for e in events] == [3, 4]
    assert events[0].data == {"delta": "c"}


async def test_resume_after_the_terminal_event_ends_at_once():
    store = InMemoryStreamStore()
    store.create("s")
    produce(store, "s", ["a"])

    assert await asyncio.wait_for(collect(store, "s", after=2), 1) == []


async def test_reader_gets_an_empty_batch_as_heartbeat_during_silence():
    store = InMemoryStreamStore()
    store.create("s")
    reader = store.read("s", heartbeat_s=0.05)

    assert await asyncio.wait_for(anext(reader), 1) == []
    store.append("s", "token", {"delta": "x"})
    assert [e.seq for e in await asyncio.wait_for(anext(reader), 1)] == [1]


async def test_events_that_arrive_together_come_as_one_batch():
    store = InMemoryStreamStore()
    store.create("s")
    produce(store, "s", list("abcdef"))
    batches = [batch async for batch in store.read("s")]
    assert len(batches) == 1 and len(batches[0]) == 7


def test_nothing_can_follow_the_terminal_event():
    store = InMemoryStreamStore()
    store.create("s")
    store.append("s", "error", {"message": "boom"})
    with pytest.raises(ValueError):
        store.append("s", "token", {"delta": "late"})


async def test_unknown_stream_is_not_found():
    store = InMemoryStreamStore()
    assert not store.exists("nope")
    with pytest.raises(StreamNotFound):
        await collect(store, "nope")


def test_cancel_flag_is_per_stream():
    store = InMemoryStreamStore()
    store.create("a")
    store.create("b")
    assert store.cancel("a") is True
    assert store.is_cancelled("a") and not store.is_cancelled("b")
    assert store.cancel("unknown") is False


def test_finished_streams_expire_after_retention(monkeypatch):
    store = InMemoryStreamStore(retention_s=10)
    store.create("old")
    store.append("old", "done", {})
    store.create("running")
    clock = store._streams["old"].finished_at + 11
    monkeypatch.setattr("generation.streams.time.monotonic", lambda: clock)
    store.create("new")
    assert not store.exists("old")
    assert store.exists("running") and store.exists("new")


def test_sse_event_formats_id_event_and_json_data():
    assert sse_event({"delta": "hi"}, event="token", id=3) == b'id: 3\nevent: token\ndata: {"delta":"hi"}\n\n'


def test_sse_event_splits_multi_line_data_into_data_lines():
    assert sse_event("a\nb\r\nc") == b"data: a\ndata: b\ndata: c\n\n"


def test_sse_comment_is_a_colon_line():
    assert sse_comment("ping") == b": ping\n\n"
