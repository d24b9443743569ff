"""Which pages may open the chat's WebSocket: its Origin against the site's own scheme, host and port."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from generation import routing
from generation.models import Conversation
from generation.origins import socket_origin_allowed
from tests.support.streams import session_headers

SITE = "localhost:8000"


def socket_scope(origin: str | None, host: str = SITE, scheme: str = "ws", **headers: str) -> dict:
    pairs = {"host": host, **({"origin": origin} if origin else {}), **headers}
    return {"type": "websocket", "scheme": scheme, "headers": [(k.encode(), v.encode()) for k, v in pairs.items()]}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("origin", "opens"), [("http://localhost:8000", True), ("http://localhost:9999", False)])
async def test_a_page_on_another_port_of_the_same_host_cannot_open_the_socket(alice, alice_client, origin, opens):
    conversation = await Conversation.objects.acreate(user=alice, model="smollm2-135m-instruct")
    headers = [*[h for h in session_headers(alice_client) if h[0] != b"host"], (b"host", SITE.encode())]
    communicator = WebsocketCommunicator(
        routing.websocket_application, f"/ws/chat/{conversation.id}/", headers=[*headers, (b"origin", origin.encode())]
    )

    connected, _ = await communicator.connect()
    await communicator.disconnect()

    assert connected is opens


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:8000",
        "http://localhost",  # a site served on port 8000 is not the one on port 80
        "http://localhost:8001",
        "https://localhost:8000",  # over plain ws the site is http
        "http://127.0.0.1:8000",
        "null",
        None,
    ],
)
def test_only_the_sites_own_origin_passes(origin):
    assert socket_origin_allowed(socket_scope(origin)) is (origin == "http://localhost:8000")


def test_a_host_outside_allowed_hosts_is_refused_even_when_the_origin_matches_it():
    # DNS rebinding: evil.example resolves to this server, and its page's origin is its own.
    assert not socket_origin_allowed(socket_scope("http://evil.example:8000", host="evil.example:8000"))


def test_over_tls_the_site_is_https():
    assert socket_origin_allowed(socket_scope("https://localhost:8000", scheme="wss"))
    assert not socket_origin_allowed(socket_scope("http://localhost:8000", scheme="wss"))


def test_behind_an_https_proxy_the_forwarded_scheme_counts_once_its_header_is_trusted(settings):
    through_proxy = socket_scope("https://localhost:8000", **{"x-forwarded-proto": "https"})
    assert not socket_origin_allowed(through_proxy)  # the header is ignored unless configured

    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

    assert socket_origin_allowed(through_proxy)
    assert not socket_origin_allowed(socket_scope("https://localhost:8000", **{"x-forwarded-proto": "http"}))


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:9999", True),
        ("https://app.example.com", True),
        ("https://example.com", True),
        ("http://app.example.com", False),  # the scheme counts
        ("https://app.example.com:8443", False),  # and so does the port
        ("https://app.example.org", False),
    ],
)
def test_trusted_origins_pass_as_they_do_for_forms(settings, origin, allowed):
    settings.CSRF_TRUSTED_ORIGINS = ["http://localhost:9999", "https://*.example.com"]

    assert socket_origin_allowed(socket_scope(origin)) is allowed
