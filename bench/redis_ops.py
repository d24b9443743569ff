"""Redis operations per generated token, with GENERATION_BACKEND=celery.

    .venv/bin/python -m bench.redis_ops [--streams 20] [--tokens 200] [--readers 1]

One web process and one generation worker (the synthetic model, so that only the
plumbing costs anything) on a Redis of their own key prefix. `--streams` users each
send one prompt and `--readers` SSE readers follow each answer to its end. Redis's
INFO commandstats before and after give the commands run, and the round trips (a Lua
script or a pipeline counts once as a call but runs several commands), per token.
Writes bench/results/redis_ops.json. Needs REDIS_URL (default 127.0.0.1:6379/0).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from tests.support.livesite import ChatClient, LiveSite, LiveWorker, scratch_database, scratch_redis_prefix

RESULTS = Path(__file__).parent / "results" / "redis_ops.json"


def command_calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--readers", type=int, default=1, help="SSE readers per answer")
    args = parser.parse_args()
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, decode_responses=True)

    with scratch_database() as database_url, scratch_redis_prefix(url) as prefix:
        env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": url,
            "REDIS_KEY_PREFIX": prefix,
            "GENERATION_BACKEND": "celery",
            "CHAT_ENABLE_SYNTHETIC": "1",
            "CHAT_MODEL": "synthetic",
            "CHAT_SYNTHETIC_TOKENS_PER_S": "50",
            "CHAT_AUTO_TITLE": "0",
        }
        with LiveSite(env=env) as site, LiveWorker(site.env):
            users, conversations = [], []
            for _ in range(args.streams):
                user = ChatClient(site.base_url)
                user.signup(f"bench-{uuid.uuid4().hex[:8]}")
                # The first prompt makes the conversation; stopped at once, it only sets
                # up the conversation whose answers are then made --tokens words long.
                warm_up = user.send("warm up")
                user.stop(warm_up.html)
                list(user.stream(warm_up.stream_url))
                conversations.append(set_length(user, warm_up.conversation_url, args.tokens))
                users.append(user)
            before = command_calls(client)
            started = time.monotonic()
            tokens = _stream_all(users, conversations, args.readers)
            wall_s = time.monotonic() - started
            after = command_calls(client)

    calls = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    calls = {name: count for name, count in sorted(calls.items()) if count > 0}
    generated = args.streams * args.tokens
    result = {
        "command": " ".join([Path(sys.executable).name, "-m", "bench.redis_ops", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": vars(args),
        "tokens_generated": generated,
        "tokens_read": tokens,
        "wall_s": round(wall_s, 2),
        "calls": calls,
        "calls_per_token": {name: round(count / generated, 3) for name, count in calls.items()},
        "all_calls_per_token": round(sum(calls.values()) / generated, 3),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("tokens_generated", "calls_per_token", "all_calls_per_token")}, indent=2))


def set_length(user: ChatClient, conversation_url: str, tokens: int) -> str:
    """Make the conversation's answers `tokens` words long (the synthetic model's length)."""
    response = user.htmx_post(
        f"{conversation_url}settings/",
        {"model": "synthetic", "system_prompt": "", "temperature": "0.7", "max_tokens": str(tokens)},
    )
    assert response.status_code in (200, 204), response.text
    return conversation_url


def _stream_all(users: list[ChatClient], conversations: list[str], readers: int) -> int:
    """Send one prompt per user and read every answer with `readers` readers; tokens read."""
    counts: list[int] = []
    lock = threading.Lock()

    def read(user: ChatClient, stream_url: str) -> None:
        reader = user.same_session_on(str(user.http.base_url))
        count = sum(len(ChatClient.delta(e).split()) for e in reader.stream(stream_url) if e.event == "token")
        with lock:
            counts.append(count)

    threads = []
    for user, conversation in zip(users, conversations, strict=True):
        sent = user.send("Count the plumbing.", conversation_url=conversation)
        for _ in range(readers):
            thread = threading.Thread(target=read, args=(user, sent.stream_url))
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    return sum(counts)


if __name__ == "__main__":
    main()
