"""SIGTERM stops a server gracefully: real daphne and Celery processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.support.livesite import ROOT, LiveSite, unlimited_api_key

SLOW_SYNTHETIC = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "20"}
LEDGER = """
import json
from accounts.models import UsageRecord
print(json.dumps({r.stream_id: [r.status, r.completion_tokens] for r in UsageRecord.objects.all()}))
"""


class Reader(threading.Thread):
    """Reads one streamed completion to its end, keeping every `data:` line."""

    def __init__(self, site: LiveSite, key: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.site, self.key, self.max_tokens = site, key, max_tokens
        self.lines: list[str] = []
        self.status: int | None = None

    def run(self) -> None:
        body = {
            "model": "synthetic",
            "messages": [{"role": "user", "content": "Go on."}],
            "max_tokens": self.max_tokens,
        }
        with httpx.stream(
            "POST",
            f"{self.site.base_url}/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"resumable": True}},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        ) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: "):
                    self.lines.append(line[6:])

    def chunks(self) -> list[dict]:
        return [json.loads(line) for line in self.lines if line.startswith("{")]

    def text(self) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in self.chunks() if c.get("choices"))


def test_sigterm_lets_the_answers_under_way_finish_interrupts_the_rest_and_exits_0(live_sites):
    with live_sites.own({**SLOW_SYNTHETIC, "GRACEFUL_TIMEOUT": "3"}) as site:
        key = unlimited_api_key(site)
        short, long = Reader(site, key, 30), Reader(site, key, 2_000)  # 1.5 s and 100 s at 20 tokens/s
        short.start()
        long.start()
        deadline = time.monotonic() + 30
        while not (short.text() and long.text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert short.text()
        assert long.text()

        assert site.process is not None
        site.process.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        time.sleep(0.3)
        late = httpx.post(
            f"{site.base_url}/v1/chat/completions",
            json={"model": "synthetic", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
            headers={"Authorization": f"Bearer {key}"},
        )
        ready = httpx.get(f"{site.base_url}/readyz")
        exit_code = site.process.wait(timeout=20)
        took_s = time.monotonic() - stopped_at
        short.join(5)
        long.join(5)
        ledger = json.loads(
            subprocess.run(
                [sys.executable, "manage.py", "shell", "-c", LEDGER],
                cwd=ROOT,
                env=site.env,
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        log = site.log_path.read_text()

    # New generations are refused while it drains, and load balancers are told.
    assert late.status_code == 503
    assert late.json()["error"]["code"] == "server_overloaded"
    assert late.headers["Retry-After"]
    assert ready.status_code == 503
    # The short answer finished whole while its reader stayed connected.
    assert len(short.text().split()) == 30
    assert short.lines[-1] == "[DONE]"
    assert [c["choices"][0]["finish_reason"] for c in short.chunks() if c.get("choices")][-1] == "length"
    # The long one was interrupted after the grace period, its text kept in the ledger.
    # It waits out GRACEFUL_TIMEOUT (3 s), then exits: about 3.5 s on a quiet machine.
    assert exit_code == 0
    assert 2.5 < took_s < 30
    statuses = sorted(status for status, _ in ledger.values())
    assert statuses == ["complete", "interrupted"]
    (interrupted_tokens,) = [tokens for status, tokens in ledger.values() if status == "interrupted"]
    assert interrupted_tokens > 0
    assert "terminate called" not in log
    assert "Traceback" not in log


@pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real Redis)")
def test_a_celery_generation_worker_drains_on_sigterm_and_exits_0():
    from tests.support.livesite import LiveWorker, scratch_database, scratch_redis_prefix

    with scratch_database() as database_url, scratch_redis_prefix(os.environ["REDIS_URL"], "chatsite-drain") as prefix:
        env = {
            **SLOW_SYNTHETIC,
            "DATABASE_URL": database_url,
            "REDIS_KEY_PREFIX": prefix,
            "GENERATION_BACKEND": "celery",
            "GRACEFUL_TIMEOUT": "3",
        }
        with LiveSite(env=env) as site, LiveWorker(site.env) as worker:
            key = unlimited_api_key(site)
            short, long = Reader(site, key, 30), Reader(site, key, 2_000)
            short.start()
            long.start()
            deadline = time.monotonic() + 60
            while not (short.text() and long.text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert short.text()
            assert long.text()

            assert worker.process is not None
            worker.process.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            exit_code = worker.process.wait(timeout=30)
            took_s = time.monotonic() - stopped_at
            short.join(10)
            long.join(10)

    assert exit_code == 0
    assert took_s < 20
    assert len(short.text().split()) == 30
    assert short.lines[-1] == "[DONE]"
    errors = [c["error"] for c in long.chunks() if "error" in c]
    assert long.text()
    assert errors
    assert errors[0]["message"] == "interrupted"
