"""Faults with real processes: no generation worker, a worker killed mid-answer, Redis
stopped and restarted mid-stream, PostgreSQL connections killed mid-stream.

Each must end in a clean error or a recovery, with no answer lost and no 5xx but the
documented 503 (docs/operations.md, "When things fail").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import psycopg
import pytest

from tests.support.livesite import (
    ROOT,
    ChatClient,
    LiveSite,
    LiveWorker,
    free_port,
    scratch_database,
    scratch_redis_prefix,
    stop_process,
    unlimited_api_key,
)

SYNTHETIC = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "20"}
LEDGER = """
import json
from accounts.models import UsageRecord
print(json.dumps({r.stream_id: [r.status, r.completion_tokens] for r in UsageRecord.objects.all()}))
"""
needs_redis = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real Redis)")


def ask(site: LiveSite, key: str, *, max_tokens: int = 8, timeout: float = 30) -> httpx.Response:
    """A whole (not streamed) chat completion."""
    return httpx.post(
        f"{site.base_url}/v1/chat/completions",
        json={"model": "synthetic", "messages": [{"role": "user", "content": "Go on."}], "max_tokens": max_tokens},
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
    )


def streamed(site: LiveSite, key: str, *, max_tokens: int) -> Iterator[dict | str]:
    """A streamed chat completion's `data:` payloads as they come (chunks, errors, "[DONE]")."""
    body = {"model": "synthetic", "messages": [{"role": "user", "content": "Go on."}], "max_tokens": max_tokens}
    with httpx.stream(
        "POST",
        f"{site.base_url}/v1/chat/completions",
        json={**body, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,  # between bytes: a stream that hangs fails the test
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                yield line[6:] if line == "data: [DONE]" else json.loads(line[6:])


def text_of(payloads: list[dict | str]) -> str:
    return "".join(
        p["choices"][0]["delta"].get("content") or "" for p in payloads if isinstance(p, dict) and p.get("choices")
    )


def ledger(site: LiveSite) -> dict[str, list]:
    shell = [sys.executable, "manage.py", "shell", "-c", LEDGER]
    output = subprocess.run(shell, cwd=ROOT, env=site.env, capture_output=True, text=True, check=True).stdout
    return json.loads(output.strip().splitlines()[-1])


# 1. No generation worker, and a worker killed mid-answer (GENERATION_BACKEND=celery)


@needs_redis
def test_no_worker_is_a_503_and_a_killed_worker_ends_its_stream_with_interrupted():
    with scratch_database() as database_url, scratch_redis_prefix(os.environ["REDIS_URL"], "chatsite-faults") as prefix:
        env = {**SYNTHETIC, "DATABASE_URL": database_url, "REDIS_KEY_PREFIX": prefix, "GENERATION_BACKEND": "celery"}
        with LiveSite(env=env) as site, LiveWorker(site.env, queue="housekeeping", beat=True):
            key = unlimited_api_key(site)
            worker = LiveWorker(site.env)

            refused = ask(site, key)  # no generation worker has started yet
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "server_overloaded"
            assert int(refused.headers["Retry-After"]) > 0

            with worker:
                assert ask(site, key).status_code == 200  # a worker is back: served
                payloads = []
                for payload in streamed(site, key, max_tokens=400):
                    payloads.append(payload)
                    if len(payloads) == 10:
                        worker.kill()
                        killed_at = time.monotonic()
                ended_after_s = time.monotonic() - killed_at

                assert payloads[-1] == "[DONE]"
                interrupted = {
                    "message": "interrupted",
                    "type": "server_error",
                    "param": None,
                    "code": "generation_failed",
                }
                assert payloads[-2] == {"error": interrupted}
                # The heartbeat's lapse (6 s) and a reaper round (3 s): about 9 s here, 15 s
                # promised (docs/scaling.md); the bound only says it ends, whatever the load.
                assert ended_after_s <= 45
                assert len(text_of(payloads).split()) >= 8  # the text streamed before the kill
                stream_id = payloads[0]["id"].split("-", 1)[1]
                assert ledger(site)[stream_id][0] == "interrupted"

                time.sleep(1)  # no worker beats any more: refused again, not queued for nobody
                assert ask(site, key).status_code == 503

                worker.start()
                answer = ask(site, key)
                assert answer.status_code == 200
                assert answer.json()["choices"][0]["finish_reason"] == "length"


# 2. Redis stopped and restarted mid-stream


@contextmanager
def generating_site(backend: str, **env: str) -> Iterator[LiveSite]:
    """A web process that generates in-process, or one with a Celery generation worker."""
    env = {**SYNTHETIC, **env}
    if backend == "inprocess":
        with LiveSite(env=env) as site:
            yield site
        return
    redis_url = env.get("REDIS_URL") or os.environ.get("REDIS_URL")
    if not redis_url:
        pytest.skip("needs REDIS_URL (a real Redis)")
    with scratch_redis_prefix(redis_url, "chatsite-faults") as prefix:
        env.update(REDIS_KEY_PREFIX=prefix, GENERATION_BACKEND="celery")
        with LiveSite(env=env) as site, LiveWorker(site.env):
            yield site


def start_redis(port: int) -> subprocess.Popen[bytes]:
    server = shutil.which("redis-server") or "redis-server"
    command = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).stdout.strip() != b"PONG":
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    return process


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server (a Redis of the test's own)")
@pytest.mark.parametrize("backend", ["inprocess", "celery"])
def test_redis_restarted_mid_stream_ends_the_stream_cleanly_and_service_resumes(backend):
    port = free_port()
    redis = start_redis(port)
    try:
        with generating_site(backend, REDIS_URL=f"redis://127.0.0.1:{port}/0") as site:
            key = unlimited_api_key(site)
            before = ask(site, key)
            assert before.status_code == 200  # a complete answer, before the fault

            payloads = []
            for payload in streamed(site, key, max_tokens=400):
                payloads.append(payload)
                if len(payloads) == 10:
                    stop_process(redis)
                    stopped_at = time.monotonic()
            assert time.monotonic() - stopped_at < 20  # the stream ended: nothing hangs
            assert payloads[-1] == "[DONE]"
            assert payloads[-2]["error"]["code"] == "server_overloaded", payloads[-2]

            during = ask(site, key)  # Redis is down: a 503 to retry, not a 500
            assert during.status_code == 503 and during.json()["error"]["code"] == "server_overloaded", during.text
            assert int(during.headers["Retry-After"]) > 0

            redis = start_redis(port)
            after = ask(site, key)
            deadline = time.monotonic() + 10
            while after.status_code == 503 and time.monotonic() < deadline:  # as clients retry
                time.sleep(1)  # a Celery worker beats again within 2 s into the new Redis
                after = ask(site, key)
            assert after.status_code == 200, after.text
            assert after.json()["choices"][0]["finish_reason"] == "length"

            saved = ledger(site)
            assert saved[before.json()["id"].split("-", 1)[1]] == ["complete", 8]  # not lost
            assert saved[after.json()["id"].split("-", 1)[1]] == ["complete", 8]
            assert "streaming" not in [status for status, _ in saved.values()]  # the cut one was settled
    finally:
        stop_process(redis)


@pytest.mark.skipif(not shutil.which("redis-server"), reason="needs redis-server (a Redis of the test's own)")
def test_redis_stopped_mid_answer_ends_the_browsers_stream_and_the_saved_answer_follows():
    port = free_port()
    redis = start_redis(port)
    try:
        with LiveSite(env={**SYNTHETIC, "REDIS_URL": f"redis://127.0.0.1:{port}/0"}) as site:
            alice = ChatClient(site.base_url)
            alice.signup("alice")
            sent = alice.send("Go on.")
            seen = []
            for event in alice.stream(sent.stream_url):
                seen.append(event)
                if len(seen) == 5:
                    stop_process(redis)
                    stopped_at = time.monotonic()
            assert time.monotonic() - stopped_at < 10  # ended, so that EventSource reconnects
            assert seen[-1].event == "token"

            redis = start_redis(port)
            time.sleep(1)  # EventSource reconnects a second later (retry: 1000)
            rest = list(alice.stream(sent.stream_url, headers={"Last-Event-ID": seen[-1].id}))
            assert rest[-1].event == "done"
            assert 'data-status="stopped"' in rest[-1].data  # as its producer saved it
            assert "".join(ChatClient.delta(e) for e in seen).split()[0] in rest[-1].data  # its text kept
    finally:
        stop_process(redis)


# 3. PostgreSQL connections killed mid-stream


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="needs DATABASE_URL (a real PostgreSQL)"
)
@pytest.mark.parametrize("backend", ["inprocess", "celery"])
def test_postgres_connections_killed_mid_stream_the_answer_is_still_saved(backend):
    with scratch_database() as database_url, generating_site(backend, DATABASE_URL=database_url) as site:
        key = unlimited_api_key(site)
        name = database_url.rpartition("/")[2]
        killed = 0
        with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
            payloads = []
            for payload in streamed(site, key, max_tokens=60):
                payloads.append(payload)
                if isinstance(payload, dict) and len(payloads) % 5 == 0:  # again and again, mid-answer
                    killed += admin.execute(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()",
                        [name],
                    ).fetchone()[0]
        assert payloads[-1] == "[DONE]"
        assert payloads[-2]["choices"][0]["finish_reason"] == "length"
        assert killed > 0  # the site's connections were killed while it streamed

        assert ask(site, key).status_code == 200  # later requests reconnect
        assert sorted(ledger(site).values()) == [["complete", 8], ["complete", 60]]
