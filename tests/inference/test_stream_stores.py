"""One behaviour suite for every StreamStore: in memory always, Redis when REDIS_URL is set."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from inference.redis_streams import RedisStreamStore
from inference.streams import InMemoryStreamStore, StreamEvent, StreamNotFound, StreamStore

REDIS_URL = os.environ.get("REDIS_URL", "")
NO_REDIS = "REDIS_URL is not set: the Redis stream store is tested only against a real Redis"
pytestmark = pytest.mark.services  # the Redis store: CI's second pass runs it


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix of this test's own; only its keys are deleted afterwards."""
    if not REDIS_URL:
        pytest.skip(NO_REDIS)
    prefix = f"chatsite-test-{uuid.uuid4().hex}"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StreamStore]:
    if request.param == "memory":
        yield InMemoryStreamStore()
        return
    redis_store = RedisStreamStore(REDIS_URL, prefix=request.getfixturevalue("redis_prefix"))
    yield redis_store
    await redis_store.aclose()
    redis_store.close()


async def collect(store: StreamStore, stream_id: str, after: int = 0, heartbeat_s: float | None = None):
    events = []
    async for batch in store.read(stream_id, after, heartbeat_s=heartbeat_s):
        events.extend(batch)
    return events


def produce(store: StreamStore, stream_id: str, words: list[str], delay: float = 0.0) -> None:
    for word in words:
        store.append(stream_id, "token", {"delta": word})
        if delay:
            time.sleep(delay)
    store.append(stream_id, "done", {"finish_reason": "stop"})


def keys_under(prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{prefix}:*", count=1000))
    finally:
        client.close()


async def test_events_are_numbered_from_one_in_order(store):
    store.create("s")
    produce(store, "s", ["a", "b", "c"])

    events = await asyncio.wait_for(collect(store, "s"), 5)

    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.type for e in events] == ["token", "token", "token", "done"]
    assert "".join(e.data["delta"] for e in events[:-1]) == "abc"
    assert store.events("s") == events


async def test_event_data_comes_back_as_the_same_dict(store):
    data = {"delta": "héllo\n“quoted”", "usage": {"prompt_tokens": 3}, "ok": True, "none": None}
    store.create("s")
    store.append("s", "token", data)
    store.append("s", "done", {})

    events = await asyncio.wait_for(collect(store, "s"), 5)

    assert events[0] == StreamEvent(seq=1, type="token", data=data)
    assert events[1].data == {}


def test_created_stream_exists_before_any_event(store):
    store.create("s")

    assert store.exists("s")
    assert store.events("s") == []


def test_creating_a_stream_again_keeps_its_events(store):
    store.create("s")
    store.append("s", "token", {"delta": "a"})
    store.create("s")

    assert [e.seq for e in store.events("s")] == [1]
    assert store.append("s", "done", {}) == 2


def test_events_after_n_lists_only_what_followed(store):
    store.create("s")
    produce(store, "s", ["a", "b", "c"])

    assert [e.seq for e in store.events("s", after=2)] == [3, 4]
    assert store.events("s", after=4) == []


async def test_live_readers_and_a_late_reader_see_the_same_events(store):
    store.create("s")
    readers = [asyncio.create_task(collect(store, "s")) for _ in range(5)]
    await asyncio.sleep(0.05)
    producer = threading.Thread(target=produce, args=(store, "s", list("hello"), 0.005))
    producer.start()
    live = await asyncio.wait_for(asyncio.gather(*readers), 10)
    producer.join()
    late = await asyncio.wait_for(collect(store, "s"), 5)

    assert all(events == late for events in live)
    assert [e.seq for e in late] == list(range(1, 7))


async def test_many_concurrent_readers_all_see_every_event_while_a_thread_appends(store):
    store.create("s")
    words = [f"w{i}" for i in range(100)]
    readers = [asyncio.create_task(collect(store, "s", heartbeat_s=0.05)) for _ in range(200)]
    await asyncio.sleep(0.05)
    producer = threading.Thread(target=produce, args=(store, "s", words, 0.001))
    producer.start()
    results = await asyncio.wait_for(asyncio.gather(*readers), 30)
    producer.join()

    expected = [StreamEvent(seq=i + 1, type="token", data={"delta": w}) for i, w in enumerate(words)]
    expected.append(StreamEvent(seq=101, type="done", data={"finish_reason": "stop"}))
    assert all(events == expected for events in results)


async def test_readers_in_another_event_loop_see_the_same_events(store):
    store.create("s")
    other_loop: list[list[StreamEvent]] = []

    async def read_and_close() -> None:
        other_loop.append(await collect(store, "s"))
        if isinstance(store, RedisStreamStore):
            await store.aclose()  # this loop's connections, before asyncio.run closes it

    reader = threading.Thread(target=asyncio.run, args=(read_and_close(),))
    reader.start()
    here = asyncio.create_task(collect(store, "s"))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(produce, store, "s", list("abc"), 0.005)
    events = await asyncio.wait_for(here, 5)
    reader.join(5)

    assert other_loop == [events]
    assert [e.seq for e in events] == [1, 2, 3, 4]


def test_concurrent_appends_get_distinct_consecutive_numbers(store):
    store.create("s")
    seqs: list[int] = []

    def append_many() -> None:
        seqs.extend(store.append("s", "token", {"delta": "x"}) for _ in range(200))

    threads = [threading.Thread(target=append_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(seqs) == list(range(1, 801))
    assert [e.seq for e in store.events("s")] == list(range(1, 801))


async def test_resume_after_n_replays_only_what_followed(store):
    store.create("s")
    produce(store, "s", ["a", "b", "c"])

    events = await asyncio.wait_for(collect(store, "s", after=2), 5)

    assert [e.seq for e in events] == [3, 4]
    assert events[0].data == {"delta": "c"}


async def test_resume_mid_stream_replays_then_continues_live(store):
    store.create("s")
    store.append("s", "token", {"delta": "a"})
    store.append("s", "token", {"delta": "b"})
    reader = store.read("s", after=1)

    assert [e.seq for e in await asyncio.wait_for(anext(reader), 5)] == [2]
    store.append("s", "done", {})
    assert [e.seq for e in await asyncio.wait_for(anext(reader), 5)] == [3]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(reader), 5)


async def test_resume_after_the_terminal_event_ends_at_once(store):
    store.create("s")
    produce(store, "s", ["a"])

    assert await asyncio.wait_for(collect(store, "s", after=2), 1) == []


async def test_reader_gets_an_empty_batch_as_heartbeat_during_silence(store):
    store.create("s")
    reader = store.read("s", heartbeat_s=0.05)

    assert await asyncio.wait_for(anext(reader), 1) == []
    store.append("s", "token", {"delta": "x"})
    assert [e.seq for e in await asyncio.wait_for(anext(reader), 1)] == [1]
    await reader.aclose()


def test_append_many_numbers_each_stream_in_order_and_reports_refusals(store):
    for stream_id in ("a", "b", "ended"):
        store.create(stream_id)
    store.append("ended", "done", {})

    results = store.append_many(
        [("a", "token", {"delta": "1"}), ("b", "token", {"delta": "x"}), ("a", "token", {"delta": "2"}),
         ("gone", "token", {"delta": "?"}), ("ended", "token", {"delta": "late"}), ("b", "done", {})]
    )  # fmt: skip

    assert results[:3] == [1, 1, 2]
    assert results[5] == 2
    assert isinstance(results[3], StreamNotFound)
    assert isinstance(results[4], ValueError)
    assert [e.data for e in store.events("a")] == [{"delta": "1"}, {"delta": "2"}]
    assert store.events("b")[-1].terminal


async def test_append_many_wakes_the_readers_of_every_stream_it_touches(store):
    for stream_id in ("a", "b"):
        store.create(stream_id)
    readers = [store.read(stream_id) for stream_id in ("a", "b")]
    waiting = [asyncio.ensure_future(anext(reader)) for reader in readers]
    await asyncio.sleep(0.05)  # both wait

    await asyncio.to_thread(store.append_many, [("a", "token", {"delta": "1"}), ("b", "token", {"delta": "x"})])

    batches = await asyncio.wait_for(asyncio.gather(*waiting), 2)
    assert [[event.data["delta"] for event in batch] for batch in batches] == [["1"], ["x"]]
    for reader in readers:
        await reader.aclose()


async def test_a_batch_of_appends_wakes_a_readers_loop_once(monkeypatch):
    store = InMemoryStreamStore()
    loop = asyncio.get_running_loop()
    wakes = []
    wake = store.wake_readers
    monkeypatch.setattr(store, "wake_readers", lambda woken: (wakes.append(woken), wake(woken)))
    for stream_id in ("a", "b", "c"):
        store.create(stream_id)
    readers = [store.read(stream_id) for stream_id in ("a", "b", "c")]
    waiting = [asyncio.ensure_future(anext(reader)) for reader in readers]
    await asyncio.sleep(0.05)

    await asyncio.to_thread(store.append_many, [(stream_id, "token", {"delta": "1"}) for stream_id in "abc"])

    await asyncio.wait_for(asyncio.gather(*waiting), 2)
    assert wakes == [loop]  # one call from the producer's thread, not one per stream
    for reader in readers:
        await reader.aclose()


def test_append_many_loads_its_script_again_after_a_redis_restart(store):
    if not isinstance(store, RedisStreamStore):
        pytest.skip("Redis only")
    store.create("s")
    store._redis.script_flush()  # as a restarted Redis forgets its scripts

    assert store.append_many([("s", "token", {"delta": "a"}), ("s", "token", {"delta": "b"})]) == [1, 2]


async def test_a_silence_longer_than_a_socket_timeout_is_a_heartbeat_not_an_error(store):
    # redis-py times socket reads out after 5 s by default; a reader blocks for longer.
    store.create("s")
    reader = store.read("s", heartbeat_s=6)

    assert await asyncio.wait_for(anext(reader), 10) == []
    await reader.aclose()


async def test_events_that_arrive_together_come_as_one_batch(store):
    store.create("s")
    produce(store, "s", list("abcdef"))

    batches = [batch async for batch in store.read("s")]

    assert len(batches) == 1
    assert len(batches[0]) == 7


async def test_events_that_arrive_while_a_reader_is_busy_come_as_one_batch(store):
    store.create("s")
    store.append("s", "token", {"delta": "a"})
    reader = store.read("s")
    assert [e.seq for e in await asyncio.wait_for(anext(reader), 5)] == [1]

    produce(store, "s", list("bcd"))  # while the reader is away, handling batch 1

    assert [e.seq for e in await asyncio.wait_for(anext(reader), 5)] == [2, 3, 4, 5]
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(reader), 5)


@pytest.mark.parametrize("terminal", ["done", "error"])
def test_nothing_can_follow_the_terminal_event(store, terminal):
    store.create("s")
    store.append("s", terminal, {"message": "end"})

    with pytest.raises(ValueError):
        store.append("s", "token", {"delta": "late"})
    with pytest.raises(ValueError):
        store.append("s", "done", {})
    assert [e.type for e in store.events("s")] == [terminal]


async def test_unknown_stream_is_not_found(store):
    assert not store.exists("nope")
    with pytest.raises(StreamNotFound):
        await collect(store, "nope")
    with pytest.raises(StreamNotFound):
        store.events("nope")
    with pytest.raises(StreamNotFound):
        store.append("nope", "token", {"delta": "x"})
    assert not store.exists("nope")


def test_cancel_flag_is_per_stream(store):
    store.create("a")
    store.create("b")

    assert not store.is_cancelled("a")
    assert store.cancel("a") is True
    assert store.is_cancelled("a")
    assert not store.is_cancelled("b")
    assert store.cancel("unknown") is False


def test_cancelled_among_answers_for_many_streams_at_once(store):
    for name in ("a", "b", "c"):
        store.create(name)
    store.cancel("a")
    store.cancel("c")
    assert store.cancelled_among(["a", "b", "c", "unknown"]) == {"a", "c"}
    assert store.cancelled_among([]) == set()
    assert not store.is_cancelled("unknown")
    assert not store.exists("unknown")


def test_a_stream_is_claimed_once_while_open(store):
    for name in ("open", "ended", "cancelled"):
        store.create(name)
    store.append("ended", "done", {})
    store.cancel("cancelled")  # the engine ends it as stopped when it takes it

    assert store.claim("open", "worker-a") is True
    assert store.claim("open", "worker-b") is False  # a task delivered twice
    assert store.claim("ended", "worker-a") is False  # settled while its task waited
    assert store.claim("cancelled", "worker-a") is True
    assert store.claim("unknown", "worker-a") is False
    assert not store.exists("unknown")
    assert store.claimants(["open", "ended", "cancelled", "unknown"]) == {"open": "worker-a", "cancelled": "worker-a"}
    assert store.claimants([]) == {}


def test_producer_heartbeat_is_alive_until_its_ttl_passes(store):
    assert not store.producer_alive("engine-1")
    store.beat("engine-1", 0.2)

    assert store.producer_alive("engine-1")
    assert not store.producer_alive("engine-2")
    time.sleep(0.3)
    assert not store.producer_alive("engine-1")
    store.beat("engine-1", 5)
    assert store.producer_alive("engine-1")


def test_finished_in_memory_streams_expire_after_retention(monkeypatch):
    store = InMemoryStreamStore(retention_s=10)
    store.create("old")
    store.append("old", "done", {})
    store.create("running")
    clock = store._streams["old"].finished_at + 11
    monkeypatch.setattr("inference.streams.time.monotonic", lambda: clock)
    store.create("new")
    assert not store.exists("old")
    assert store.exists("running")
    assert store.exists("new")


def test_in_memory_streams_expire_in_the_order_they_finished_each_after_its_own_retention(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr("inference.streams.time.monotonic", lambda: clock[0])
    store = InMemoryStreamStore(retention_s=10)
    for name in ("first", "second", "running"):
        store.create(name)
    store.append("first", "done", {})
    clock[0] += 5
    store.append("second", "error", {"message": "x"})
    clock[0] += 6  # the first is 11 s past its end, the second 6 s
    assert store.expire_finished() == 1
    assert not store.exists("first")
    assert store.exists("second")
    assert store.exists("running")
    clock[0] += 5
    assert store.expire_finished() == 1
    assert not store.exists("second")
    assert store.exists("running")
    assert store.expire_finished() == 0


def test_finished_redis_streams_expire_after_retention(redis_prefix):
    store = RedisStreamStore(REDIS_URL, prefix=redis_prefix, retention_s=1)
    store.create("old")
    produce(store, "old", ["a"])
    store.create("running")
    store.append("running", "token", {"delta": "a"})
    client = redis.Redis.from_url(REDIS_URL)

    # Unfinished streams get a generous TTL, so an abandoned one still goes away one day.
    assert client.ttl(store.meta_key("running")) > 3600
    assert client.ttl(store.stream_key("running")) > 3600
    assert 0 < client.pttl(store.stream_key("old")) <= 1000
    time.sleep(1.5)

    assert not store.exists("old")
    assert not client.exists(store.meta_key("old"), store.stream_key("old"))
    assert store.exists("running")
    assert sorted(keys_under(redis_prefix)) == sorted(
        [store.meta_key("running").encode(), store.stream_key("running").encode()]
    )
    client.close()
    store.close()


async def test_two_redis_stores_on_one_prefix_share_events_and_cancel_flag(redis_prefix):
    # Two instances on one prefix stand for two processes: a web worker and an engine.
    web = RedisStreamStore(REDIS_URL, prefix=redis_prefix)
    engine = RedisStreamStore(REDIS_URL, prefix=redis_prefix)
    web.create("s")
    assert engine.exists("s")
    reader = asyncio.create_task(collect(web, "s"))
    await asyncio.sleep(0.05)

    await asyncio.to_thread(produce, engine, "s", list("abc"), 0.005)
    events = await asyncio.wait_for(reader, 5)

    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert events == engine.events("s") == web.events("s")
    web.create("t")
    assert web.cancel("t")
    assert engine.is_cancelled("t")
    assert not engine.is_cancelled("s")
    engine.beat("engine-1", 5)
    assert web.producer_alive("engine-1")
    await web.aclose()
    web.close()
    engine.close()
