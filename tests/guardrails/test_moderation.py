"""A moderation service (OpenAI's /v1/moderations shape) as a rule: a real local HTTP server
that flags, answers slowly, or is not there at all."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from accounts.models import UsageRecord
from accounts.services import api_key_create
from guardrails.models import PolicyEvent, PolicyRule
from tests.support.api_client import MODEL, assert_error, post

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_S = 2.0


class ModerationHandler(BaseHTTPRequestHandler):
    """Flags any input with "forbidden" in it; /slow/ answers after SLOW_S seconds."""

    seen: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"body": body, "authorization": self.headers.get("Authorization")})
        if self.path.startswith("/slow/"):
            time.sleep(SLOW_S)
        flagged = "forbidden" in body["input"]
        answer = json.dumps({"id": "modr-1", "model": "test", "results": [{"flagged": flagged, "categories": {}}]})
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer.encode())
        except (BrokenPipeError, ConnectionResetError):  # the client gave up at its timeout, as it should
            pass

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def moderation() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ModerationHandler)
    ModerationHandler.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def down_url() -> str:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1/moderations"


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def moderated(url: str, **fields) -> PolicyRule:
    defaults = {"name": "moderation", "matcher": "moderation", "pattern": url, "stage": "prompt", "action": "block"}
    return PolicyRule.objects.create(**(defaults | fields))


def ask(key: str, content: str):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    started = time.monotonic()
    response = post("/v1/chat/completions", body, key)
    return response, time.monotonic() - started


def test_a_prompt_the_service_flags_is_refused_and_one_it_passes_runs(alice, alice_key, fast_engine, moderation):
    moderated(f"{moderation}/v1/moderations", message="The moderation service refused this.", moderation_token="t0k")

    refused, _ = ask(alice_key, "something forbidden")
    allowed, _ = ask(alice_key, "something fine")

    error = assert_error(refused, 400, "content_policy_violation")
    assert error["message"] == "The moderation service refused this."
    assert allowed.status_code == 200
    assert [seen["body"]["input"] for seen in ModerationHandler.seen] == ["something forbidden", "something fine"]
    assert ModerationHandler.seen[0]["authorization"] == "Bearer t0k"
    assert UsageRecord.objects.filter(user=alice).count() == 1
    assert PolicyEvent.objects.get().excerpt == "something forbidden"


def test_a_flag_from_the_service_lets_the_prompt_run_and_queues_it(alice, alice_key, fast_engine, moderation):
    moderated(f"{moderation}/v1/moderations", action="flag")

    response, _ = ask(alice_key, "forbidden but allowed")

    assert response.status_code == 200
    event = PolicyEvent.objects.get()
    assert (event.action, event.review, event.user) == ("flag", "open", alice)


def test_a_slow_service_that_fails_open_costs_only_its_timeout(alice_key, fast_engine, moderation):
    moderated(f"{moderation}/slow/v1/moderations", moderation_timeout_s=0.3, moderation_fail_open=True)

    response, took = ask(alice_key, "forbidden, but the service is too slow to say")

    assert response.status_code == 200
    assert took < SLOW_S


def test_a_slow_service_that_fails_closed_refuses_within_its_timeout(alice_key, fast_engine, moderation):
    moderated(f"{moderation}/slow/v1/moderations", moderation_timeout_s=0.3, moderation_fail_open=False)

    response, took = ask(alice_key, "harmless")

    assert_error(response, 400, "content_policy_violation")
    assert took < SLOW_S


@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 400)])
def test_a_service_that_is_down_allows_or_refuses_as_its_rule_says(alice_key, fast_engine, down_url, fail_open, status):
    moderated(down_url, moderation_fail_open=fail_open)

    response, _ = ask(alice_key, "anything")

    assert response.status_code == status, response.content
