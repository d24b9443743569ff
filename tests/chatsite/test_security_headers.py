"""Security headers on every response, pages, the answer stream and the API alike, and
HTTPS behind a proxy: CSRF, HSTS and the redirect."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from django.test import Client
from django.urls import reverse

from accounts.services import api_key_create
from chatsite.handlers import ProgramsHandler
from generation import services
from tests.support import PASSWORD
from tests.support.engines import wait_for_terminal
from tests.support.streams import get_stream, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
    "x-frame-options": "DENY",
}
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# /v1/docs only: Swagger UI's stylesheet draws its icons as data: images.
DOCS_POLICY = POLICY.replace("img-src 'self'", "img-src 'self' data:")
HOST = (b"host", b"localhost")


def lowered(headers) -> dict[str, str]:
    """Header names in lower case, from an ASGI response's pairs or a test client's response."""
    pairs = headers.items() if hasattr(headers, "items") else ((k.decode(), v.decode()) for k, v in headers)
    return {name.lower(): value for name, value in pairs}


def assert_secured(headers: dict[str, str], policy: str = POLICY) -> None:
    assert {name: headers.get(name) for name in SECURITY_HEADERS} == SECURITY_HEADERS
    assert sorted(headers["content-security-policy"].split("; ")) == sorted(policy.split("; "))


def test_the_policy_allows_no_inline_code_or_foreign_source(settings):
    directives = settings.CONTENT_SECURITY_POLICY["DIRECTIVES"]
    assert directives["script-src"] == directives["style-src"] == ["'self'"]
    assert "unsafe" not in POLICY
    assert "data:" not in POLICY
    assert "*" not in POLICY


@pytest.mark.parametrize("path", ["/accounts/login/", "/accounts/signup/", "/chat/", "/accounts/keys/", "/admin/"])
def test_pages_carry_the_security_headers(alice_client, path):
    response = alice_client.get(path, follow=True)

    assert response.status_code == 200
    assert_secured(lowered(response.headers))


def test_a_missing_page_carries_them_too(client):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert_secured(lowered(response.headers))


@pytest.fixture
def answer(alice, fast_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Hello there")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    return answer


async def test_the_answer_stream_carries_the_security_headers(alice_client, answer):
    response = await get_stream(answer.get_stream_url(), session_headers(alice_client))

    assert response["status"] == 200
    assert b"event: done" in response["body"]
    headers = lowered(response["headers"])
    assert headers["content-type"].startswith("text/event-stream")
    assert_secured(headers)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.mark.parametrize(
    ("path", "status"),
    [("/v1/models", 200), ("/v1/usage", 200), ("/v1/models", 401), ("/v1/docs", 200), ("/healthz", 200)],
)
async def test_the_api_and_the_probes_carry_them_without_the_browsers_middleware(alice_key, path, status):
    key = alice_key if status == 200 else "wrong"
    headers = [HOST, (b"authorization", f"Bearer {key}".encode())]

    response = await get_stream(path, headers, handler=ProgramsHandler())

    assert response["status"] == status
    assert_secured(lowered(response["headers"]), DOCS_POLICY if path == "/v1/docs" else POLICY)
    assert b"set-cookie" not in {name.lower() for name, _ in response["headers"]}  # no session, no CSRF cookie


def test_the_apis_event_streams_carry_them_too(alice_key, fast_engine):
    body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    created = Client().post(
        "/v1/chat/completions",
        json.dumps({**body, "stream_options": {"resumable": True}}),
        content_type="application/json",
        headers={"authorization": f"Bearer {alice_key}"},
    )
    first_data = next(line for line in b"".join(created).decode().splitlines() if line.startswith("data: "))
    completion_id = json.loads(first_data.removeprefix("data: "))["id"]
    headers = [HOST, (b"authorization", f"Bearer {alice_key}".encode())]

    response = async_to_sync(get_stream)(f"/v1/streams/{completion_id}", headers, handler=ProgramsHandler())

    assert response["status"] == 200
    assert response["body"].endswith(b"data: [DONE]\n\n")
    headers = lowered(response["headers"])
    assert headers["content-type"].startswith("text/event-stream")
    assert_secured(headers)


# Behind a proxy that ends TLS: daphne sees plain HTTP, the proxy says what the browser used.
PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SITE = "https://chat.example.com"


@pytest.fixture
def behind_proxy(settings):
    settings.ALLOWED_HOSTS = ["chat.example.com", "web"]
    return settings


def login_post(client: Client, *, host: str, origin: str, proto: str = "https"):
    """Log in as the browser does through the proxy: the form's page, then its POST."""
    headers = {"host": host, "x-forwarded-proto": proto}
    client.get(reverse("accounts:login"), headers=headers)
    form = {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    return client.post(reverse("accounts:login"), form, headers={**headers, "origin": origin})


def test_a_form_post_through_an_https_proxy_fails_csrf_while_the_site_thinks_it_is_http(alice, behind_proxy):
    response = login_post(Client(enforce_csrf_checks=True), host="chat.example.com", origin=SITE)

    assert response.status_code == 403


def test_with_the_proxy_header_trusted_a_form_post_from_the_site_itself_passes(alice, behind_proxy):
    behind_proxy.SECURE_PROXY_SSL_HEADER = PROXY_SSL_HEADER

    response = login_post(Client(enforce_csrf_checks=True), host="chat.example.com", origin=SITE)

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")


@pytest.mark.parametrize(("trusted", "status"), [([SITE], 302), (["https://other.example.com"], 403), ([], 403)])
def test_a_proxy_that_rewrites_the_host_needs_the_origin_trusted(alice, behind_proxy, trusted, status):
    behind_proxy.SECURE_PROXY_SSL_HEADER = PROXY_SSL_HEADER
    behind_proxy.CSRF_TRUSTED_ORIGINS = trusted

    response = login_post(Client(enforce_csrf_checks=True), host="web", origin=SITE)

    assert response.status_code == status


def test_the_csrf_failure_page_behind_a_proxy_says_what_to_set_and_keeps_the_policy(alice, behind_proxy):
    response = login_post(Client(enforce_csrf_checks=True), host="chat.example.com", origin=SITE)

    page = response.content.decode()
    assert response.status_code == 403
    assert "DJANGO_SECURE_PROXY_SSL_HEADER" in page
    assert "DJANGO_CSRF_TRUSTED_ORIGINS" in page
    assert "<style" not in page
    assert "style=" not in page
    assert_secured(lowered(response.headers))


def test_https_requests_get_hsts_and_plain_http_pages_are_redirected(behind_proxy):
    behind_proxy.SECURE_PROXY_SSL_HEADER = PROXY_SSL_HEADER
    behind_proxy.SECURE_HSTS_SECONDS = 31536000
    behind_proxy.SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    behind_proxy.SECURE_SSL_REDIRECT = True
    client = Client()

    secure = client.get("/accounts/login/", headers={"host": "chat.example.com", "x-forwarded-proto": "https"})
    plain = client.get("/accounts/login/", headers={"host": "chat.example.com", "x-forwarded-proto": "http"})

    assert secure.status_code == 200
    assert secure["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains"
    assert plain.status_code == 301
    assert plain["Location"] == f"{SITE}/accounts/login/"
    assert "Strict-Transport-Security" not in plain


async def test_probes_over_plain_http_are_not_redirected_and_api_answers_get_hsts_over_https(behind_proxy):
    behind_proxy.SECURE_PROXY_SSL_HEADER = PROXY_SSL_HEADER
    behind_proxy.SECURE_HSTS_SECONDS = 3600
    behind_proxy.SECURE_SSL_REDIRECT = True
    host = (b"host", b"chat.example.com")

    probe = await get_stream("/healthz", [host], handler=ProgramsHandler())
    api = await get_stream("/v1/models", [host, (b"x-forwarded-proto", b"https")], handler=ProgramsHandler())

    assert probe["status"] == 200
    assert "strict-transport-security" not in lowered(probe["headers"])
    assert api["status"] == 401
    assert lowered(api["headers"])["strict-transport-security"] == "max-age=3600"


async def test_the_liveness_probe_keeps_its_headers_and_checks_the_host():
    # /healthz is answered at once, without watching for a disconnect (chatsite.handlers).
    probe = await get_stream("/healthz", [HOST], handler=ProgramsHandler())

    assert probe["status"] == 200
    assert_secured(lowered(probe["headers"]))
    refused = await get_stream("/healthz", [(b"host", b"evil.example")], handler=ProgramsHandler())
    assert refused["status"] == 400
