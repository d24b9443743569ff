"""Per-token latency of the stream stores: producer thread append → async reader has the event.

    python -m bench.redis_latency [--events 2000]

In one run, on one machine and one Redis (REDIS_URL, default redis://127.0.0.1:6379/0),
measures the same hop three ways: InMemoryStreamStore, RedisStreamStore, and a bare
redis-py XADD (thread) → XREAD BLOCK (asyncio) on a plain stream key, the floor any Redis
store pays. Events go out at a steady pace (one every 2 ms) so each is a single hop rather
than part of a burst; the three are interleaved in rounds so drift hits them alike.
Uses its own key prefix and deletes its keys at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

from inference.redis_streams import RedisStreamStore
from inference.streams import InMemoryStreamStore, StreamStore

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results" / "redis_latency.json"
INTERVAL_S = 0.002
ROUNDS = 4
WARMUP_EVENTS = 200


def paced(count: int, send: Callable[[float], None], finish: Callable[[], None]) -> None:
    """Call send(t) `count` times, one every INTERVAL_S, t being the moment of the call."""
    next_at = time.perf_counter()
    for _ in range(count):
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(time.perf_counter())
        next_at += INTERVAL_S
    finish()


async def store_hop(store: StreamStore, count: int) -> list[float]:
    """Latencies (s) of `count` tokens through `store`, read live by one async reader."""
    stream_id = uuid.uuid4().hex
    store.create(stream_id)
    latencies: list[float] = []

    async def read() -> None:
        async for batch in store.read(stream_id):
            now = time.perf_counter()
            latencies.extend(now - e.data["t"] for e in batch if e.type == "token")

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.05)  # the reader is tailing before the first event
    producer = threading.Thread(
        target=paced,
        args=(
            count,
            lambda t: store.append(stream_id, "token", {"delta": "x", "t": t}),
            lambda: store.append(stream_id, "done", {}),
        ),
    )
    producer.start()
    await reader
    producer.join()
    return latencies


async def bare_hop(url: str, key: str, count: int) -> list[float]:
    """The same hop with bare redis-py: XADD from a thread, XREAD BLOCK in asyncio."""
    sync_client = redis.Redis.from_url(url, decode_responses=True, protocol=2)
    async_client = aredis.Redis.from_url(url, decode_responses=True, protocol=2)
    latencies: list[float] = []

    async def read() -> None:
        last_id = "0-0"
        while True:
            reply: Any = await async_client.xread({key: last_id}, count=100_000, block=15_000)
            now = time.perf_counter()
            for _, entries in reply:
                for entry_id, fields in entries:
                    last_id = entry_id
                    if "done" in fields:
                        return
                    latencies.append(now - float(fields["t"]))

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.05)
    producer = threading.Thread(
        target=paced,
        args=(
            count,
            lambda t: sync_client.xadd(key, {"t": repr(t)}, maxlen=10_000, approximate=True),
            lambda: sync_client.xadd(key, {"done": "1"}),
        ),
    )
    producer.start()
    await reader
    producer.join()
    await async_client.aclose()
    sync_client.close()
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in latencies)
    return {
        "count": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": statistics.quantiles(ms, n=100)[98],
        "mean_ms": statistics.fmean(ms),
        "max_ms": ms[-1],
    }


def delete_keys(client: redis.Redis, prefix: str) -> int:
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    return len(keys)


async def measure(url: str, prefix: str, events: int) -> dict[str, list[float]]:
    memory = InMemoryStreamStore()
    redis_store = RedisStreamStore(url, prefix=prefix)
    runs: dict[str, Callable[[int, int], Any]] = {
        "in_memory": lambda n, _: store_hop(memory, n),
        "redis_store": lambda n, _: store_hop(redis_store, n),
        "bare_redis": lambda n, r: bare_hop(url, f"{prefix}:bare:{r}", n),
    }
    for run in runs.values():
        await run(WARMUP_EVENTS, -1)  # connections, scripts and code paths warm; not counted
    results: dict[str, list[float]] = {name: [] for name in runs}
    per_round = max(1, events // ROUNDS)
    names = list(runs)
    for r in range(ROUNDS):
        for name in names[r % 3 :] + names[: r % 3]:  # rotate who goes first
            results[name].extend(await runs[name](per_round, r))
    await redis_store.aclose()
    redis_store.close()
    return results


def print_table(rows: Iterable[tuple[str, str, str]]) -> None:
    for label, measured, target in rows:
        print(f"{label:<52}{measured:>12}{target:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()

    url = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
    prefix = f"chatsite-bench-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        latencies = asyncio.run(measure(url, prefix, args.events))
        redis_version = client.info("server")["redis_version"]
    finally:
        deleted = delete_keys(client, prefix)
        client.close()

    figures = {name: summary(values) for name, values in latencies.items()}
    memory, store, bare = figures["in_memory"], figures["redis_store"], figures["bare_redis"]
    overhead_ms = store["median_ms"] - memory["median_ms"]
    ratio = store["median_ms"] / bare["median_ms"]
    targets = {
        "redis_minus_in_memory_median_ms": {"measured": overhead_ms, "target": "<= 1", "met": overhead_ms <= 1.0},
        "redis_over_bare_median_ratio": {"measured": ratio, "target": "<= 1.5", "met": ratio <= 1.5},
    }
    result = {
        "command": f"python -m bench.redis_latency --events {args.events}",
        "date": time.strftime("%Y-%m-%d"),
        "cpu_count": os.cpu_count(),
        "redis_version": redis_version,
        "redis_py_version": redis.__version__,
        "interval_ms": INTERVAL_S * 1000,
        "rounds": ROUNDS,
        "warmup_events": WARMUP_EVENTS,
        "figures": figures,
        "targets": targets,
        "keys_deleted": deleted,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    print(f"per-token latency, append in a thread → async reader; {memory['count']} tokens each, 1 per 2 ms")
    print_table([("figure", "measured", "target")])
    for label, name in [
        ("in-memory store", "in_memory"),
        ("Redis store", "redis_store"),
        ("bare redis-py XADD → XREAD BLOCK", "bare_redis"),
    ]:
        print_table(
            [
                (f"{label}: median (ms)", f"{figures[name]['median_ms']:.3f}", ""),
                (f"{label}: p99 (ms)", f"{figures[name]['p99_ms']:.3f}", ""),
            ]
        )
    print_table(
        [
            ("Redis store median - in-memory median (ms)", f"{overhead_ms:.3f}", "<= 1"),
            ("Redis store median ÷ bare redis-py median", f"{ratio:.2f}", "<= 1.5"),
        ]
    )
    for name, target in targets.items():
        print(f"{'met' if target['met'] else 'MISSED'}: {name}")
    print(f"results written to {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
