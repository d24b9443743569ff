"""End to end through a real daphne process, the real model and HTTP on loopback."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support.livesite import ChatClient


@pytest.fixture
def site(live_site):
    return live_site


def test_answer_streams_token_by_token_and_is_saved(site):
    alice = ChatClient(site.base_url)
    alice.signup("alice")
    chat_page = alice.http.get("/chat/").text
    assert 'for="id_prompt">Message</label>' in chat_page
    assert ">Send</button>" in chat_page

    sent = alice.send("Write one sentence about the sea.")
    assert re.fullmatch(r"/chat/[0-9a-f-]{36}/", sent.conversation_url)
    events = list(alice.stream(sent.stream_url))

    tokens, done = events[:-1], events[-1]
    assert len(tokens) >= 5
    assert {e.event for e in tokens} == {"token"}
    # Token by token: the events arrived spread over time, not in one burst at the end.
    assert tokens[-1].at - tokens[0].at > 0.1
    assert [int(e.id) for e in tokens] == sorted(int(e.id) for e in tokens)
    assert done.event == "done"
    assert 'data-status="complete"' in done.data
    text = "".join(ChatClient.delta(e) for e in tokens)
    page = alice.http.get(sent.conversation_url).text
    assert 'data-role="assistant" data-status="complete"' in page
    assert text.strip()[:20].replace("'", "&#x27;") in page


def test_page_assets_are_served(site):
    page = httpx.get(f"{site.base_url}/accounts/login/").text
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', page):
        assert httpx.get(f"{site.base_url}{asset}").status_code == 200, asset
    assert "hx-sse" in page  # the htmx SSE extension from django-htmx, not a CDN


def test_bob_cannot_read_alices_stream_over_http(site):
    alice = ChatClient(site.base_url)
    alice.signup("alice2")
    sent = alice.send("Hi")
    bob = ChatClient(site.base_url)
    bob.signup("bob")
    assert bob.http.get(sent.stream_url).status_code == 404
    assert bob.http.get(sent.conversation_url).status_code == 404
    assert httpx.get(f"{site.base_url}{sent.stream_url}").status_code == 403
    list(alice.stream(sent.stream_url))  # let it finish


def test_health_endpoints(site):
    assert httpx.get(f"{site.base_url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{site.base_url}/readyz").json()["checks"]["model"] == "ok"


def test_sixteen_simultaneous_new_chats_from_one_user_are_answered_or_refused_never_failed(site):
    """Beyond the plan's streams a send is refused (429) before anything is saved, so the
    refused requests leave no conversation behind for the others to trip over."""
    from concurrent.futures import ThreadPoolExecutor

    carol = ChatClient(site.base_url)
    carol.signup("carol-sixteen")

    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda n: carol.htmx_post("/chat/", {"prompt": f"Say {n}."}), range(16)))

    statuses = sorted(response.status_code for response in responses)
    sent = [response for response in responses if response.status_code == 200]
    assert set(statuses) <= {200, 429}, statuses
    assert 1 <= len(sent) <= 2  # the default plan streams two answers at once
    sidebar = carol.http.get("/chat/").text
    assert len(re.findall(r'id="conversation-[0-9a-f-]{36}"', sidebar)) == len(sent)
    for response in sent:
        carol.stop(response.text)
