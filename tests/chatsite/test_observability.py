"""Request ids, the request and generation log lines, and who may read /metrics and /readyz."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
import re
from logging.config import DictConfigurator

import pytest
from django.conf import settings
from prometheus_client import REGISTRY

from accounts.services import api_key_create
from chatsite.observability import RequestLog, route_of
from infrastructure import logs
from tests.support.api_client import CHAT, post
from tests.support.chat import eager_engine, fast_engine_run_eagerly

# The engine's thread saves the usage record: it must see the test's rows.
__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def run_request(app, path: str, *, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None):
    """One HTTP request through `app` (an ASGI callable); the response's start message."""
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": headers or []}
    asyncio.run(RequestLog(app)(scope, receive, send))
    return sent[0]


async def plain_ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_request_keeps_a_usable_id_it_brings_and_gets_one_otherwise(caplog):
    caplog.set_level(logging.INFO, logger="chatsite.access")
    given = run_request(plain_ok, "/healthz", headers=[(b"x-request-id", b"trace-42")])
    made = run_request(plain_ok, "/healthz")
    hostile = run_request(plain_ok, "/healthz", headers=[(b"x-request-id", b"a\nforged line")])

    assert dict(given["headers"])[b"X-Request-Id"] == b"trace-42"
    assert re.fullmatch(rb"[0-9a-f]{32}", dict(made["headers"])[b"X-Request-Id"])
    assert b"forged" not in dict(hostile["headers"])[b"X-Request-Id"]
    assert caplog.records[0].request_id == "trace-42"


def test_the_request_line_hides_query_values_and_counts_the_route(caplog):
    caplog.set_level(logging.INFO, logger="chatsite.access")
    before = REGISTRY.get_sample_value(
        "chatsite_http_requests_total", {"route": "/v1/models", "method": "GET", "status": "200"}
    )
    run_request(plain_ok, "/v1/models", query=b"api_key=sk-very-secret&after=3")

    (record,) = [r for r in caplog.records if r.name == "chatsite.access"]
    assert record.query == "api_key=***&after=***"
    assert "sk-very-secret" not in caplog.text
    assert record.status == 200
    assert record.path == "/v1/models"
    assert record.duration_ms >= 0
    after = REGISTRY.get_sample_value(
        "chatsite_http_requests_total", {"route": "/v1/models", "method": "GET", "status": "200"}
    )
    assert after == (before or 0) + 1


def test_routes_are_patterns_not_paths():
    assert route_of("/chat/streams/0b7c6d7e-1c3a-4a41-9a51-7a9b1f0c2d3e/") == "/chat/streams/<str:stream_id>/"
    assert route_of("/no/such/page") == "unmatched"
    assert route_of(f"/{settings.STATIC_URL}app.css".replace("//", "/")) == "static"


def test_a_json_log_line_is_one_line_with_its_traceback_inside():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(DictConfigurator({}).configure_formatter(dict(settings.LOGGING["formatters"]["json"])))
    handler.addFilter(logs.RequestContext())
    logger = logging.getLogger("chatsite.test.json")
    logger.addHandler(handler)

    def log_a_failure() -> None:
        logs.request_begin("req-7")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("it failed")

    try:
        contextvars.copy_context().run(log_a_failure)  # a request of its own
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["level"] == "ERROR"
    assert record["request_id"] == "req-7"
    assert record["message"] == "it failed"
    assert "RuntimeError: boom" in record["exc_info"]


def _text_lines_of(run) -> list[str]:
    """The lines LOG_FORMAT=text writes for the access-log records of `run()`."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(DictConfigurator({}).configure_formatter(dict(settings.LOGGING["formatters"]["text"])))
    handler.addFilter(logs.RequestContext())
    access = logging.getLogger("chatsite.access")
    access.addHandler(handler)
    try:
        run()
    finally:
        access.removeHandler(handler)
    return stream.getvalue().splitlines()


@pytest.mark.parametrize(
    ("path", "query", "escaped"),
    [
        ("/x\n2026-12-03 10:00:00,000 INFO chatsite.access [-] POST /admin/login/ 302", b"", "/x\\n2026"),
        ("/x\r\x1b[2J\x85", b"", "/x\\r\\x1b[2J\\x85"),  # carriage return, a terminal escape, NEL
    ],
)
def test_a_text_log_record_is_one_line_whatever_the_client_sends(caplog, path, query, escaped):
    caplog.set_level(logging.INFO, logger="chatsite.access")
    (line,) = _text_lines_of(lambda: run_request(plain_ok, path, query=query))
    assert escaped in line
    assert not any(character in line for character in "\r\x1b\x85")


def test_a_text_log_keeps_a_traceback_in_its_record_line():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(DictConfigurator({}).configure_formatter(dict(settings.LOGGING["formatters"]["text"])))
    handler.addFilter(logs.RequestContext())
    logger = logging.getLogger("chatsite.test.text")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("boom\nforged")
        except RuntimeError:
            logger.exception("it failed")
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert "it failed" in line
    assert "RuntimeError: boom\\nforged" in line


def test_an_api_generation_logs_one_line_with_its_request_and_is_measured(alice_key, fast_engine, caplog):
    caplog.set_level(logging.INFO, logger="chatsite.generation")
    before = REGISTRY.get_sample_value("chatsite_ttft_seconds_count", {"model": "smollm2-135m-instruct"}) or 0
    response = post("/v1/chat/completions", {**CHAT, "max_tokens": 3}, alice_key, HTTP_X_REQUEST_ID="gen-1")

    assert response.status_code == 200
    (record,) = [r for r in caplog.records if r.name == "chatsite.generation"]
    assert record.request_id == "gen-1"
    assert record.completion_tokens == 3
    assert record.status == "complete"
    assert record.ttft_ms is not None
    assert record.queue_wait_ms is not None
    assert "content" not in record.__dict__
    assert "Hello" not in caplog.text  # never the prompt or the answer
    after = REGISTRY.get_sample_value("chatsite_ttft_seconds_count", {"model": "smollm2-135m-instruct"})
    assert after == before + 1


@pytest.mark.parametrize(
    ("remote", "headers", "allowed"),
    [
        ("127.0.0.1", {}, True),
        ("::1", {}, True),
        ("10.1.2.3", {}, False),
        ("127.0.0.1", {"HTTP_X_FORWARDED_FOR": "203.0.113.9"}, False),  # relayed by a local proxy
    ],
)
def test_metrics_are_for_local_callers_without_a_token(client, fast_engine, remote, headers, allowed):
    response = client.get("/metrics", REMOTE_ADDR=remote, **headers)
    assert response.status_code == (200 if allowed else 403)
    if allowed:
        assert "chatsite_active_generations" in response.content.decode()


@pytest.mark.parametrize("address", ["203.0.113.5", "127.0.0.1", "not an address"])
def test_a_local_proxys_client_address_header_makes_the_caller_remote(client, fast_engine, settings, address):
    # nginx on this host sets X-Real-IP to whoever it relays, even another loopback caller.
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    metrics = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP=address)
    readyz = client.get("/readyz", REMOTE_ADDR="127.0.0.1", HTTP_X_REAL_IP=address)
    assert metrics.status_code == 403
    assert readyz.json() == {"status": "ok"}


def test_a_local_caller_without_the_proxys_header_is_an_operator(client, fast_engine, settings):
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200


def test_metrics_take_the_bearer_token_from_anywhere(client, fast_engine, settings):
    settings.METRICS_TOKEN = "scrape-me"
    good = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer scrape-me")
    wrong = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer guess")
    assert good.status_code == 200
    assert "chatsite_generated_tokens_total" in good.content.decode()
    assert wrong.status_code == 403


def test_readyz_tells_strangers_only_whether_it_is_ready(client, fast_engine):
    stranger = client.get("/readyz", REMOTE_ADDR="10.1.2.3")
    operator = client.get("/readyz")
    assert stranger.status_code == operator.status_code == 200
    assert stranger.json() == {"status": "ok"}
    assert operator.json()["checks"]["database"] == "ok"


def test_the_grafana_dashboard_asks_only_for_series_the_service_exports(alice_key, fast_engine, client):
    post("/v1/chat/completions", {**CHAT, "max_tokens": 3}, alice_key)
    post("/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, alice_key)  # an API error
    exported = client.get("/metrics").content.decode()
    dashboard = (settings.BASE_DIR / "docs" / "grafana-dashboard.json").read_text()
    # Model servers' and GPU series exist only with model servers and on CUDA.
    asked = set(re.findall(r"chatsite_(?!upstream_|gpu_)\w+", dashboard))
    missing = {name for name in asked if re.sub(r"_bucket$", "", name) not in exported}
    assert asked
    assert not missing
