"""With REDIS_URL, streams live in Redis: any web process serves, resumes or stops any stream."""

from __future__ import annotations

import os
import re

import httpx
import pytest

from tests.support.livesite import ChatClient, LiveSite, scratch_redis_prefix

pytestmark = pytest.mark.skipif(not os.environ.get("REDIS_URL"), reason="needs REDIS_URL (a real Redis)")


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    with scratch_redis_prefix(os.environ["REDIS_URL"], "chatsite-test") as prefix:
        shared = {
            "DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('shared')}/db.sqlite3",
            "REDIS_KEY_PREFIX": prefix,
            "CHAT_ENABLE_SYNTHETIC": "1",
            "CHAT_MODEL": "synthetic",
            "CHAT_SYNTHETIC_TOKENS_PER_S": "20",
        }
        with LiveSite(env=shared) as a, LiveSite(env=shared) as b:
            yield a, b


def test_stream_started_on_a_is_watched_resumed_and_stopped_on_b(two_sites):
    a, b = two_sites
    alice_a = ChatClient(a.base_url)
    alice_a.signup("alice")
    alice_b = alice_a.same_session_on(b.base_url)

    sent = alice_a.send("Stream from process A")

    first = []
    for event in alice_b.stream(sent.stream_url):  # watched through B
        first.append(event)
        if len(first) == 5:
            break
    resumed = []
    for event in alice_b.stream(sent.stream_url, headers={"Last-Event-ID": first[-1].id}):  # resumed on B
        resumed.append(event)
        if len(resumed) == 3:
            break
    assert int(resumed[0].id) > int(first[-1].id)

    assert alice_b.stop(sent.html).status_code == 204

    whole = list(alice_a.stream(sent.stream_url))  # the producer, on A, stopped
    done = whole[-1]
    assert done.event == "done"
    assert 'data-status="stopped"' in done.data
    tokens = [e for e in whole if e.event == "token"]
    words = "".join(ChatClient.delta(e) for e in tokens).split()
    assert 5 <= len(words) < 512
    seen_on_b = "".join(ChatClient.delta(e) for e in first + resumed)
    assert "".join(ChatClient.delta(e) for e in tokens).startswith(seen_on_b)
    page_on_b = alice_b.http.get(sent.conversation_url).text
    assert 'data-status="stopped"' in page_on_b


def test_bob_cannot_read_or_stop_alices_stream_on_the_other_process(two_sites):
    a, b = two_sites
    alice = ChatClient(a.base_url)
    alice.signup("alice2")
    sent = alice.send("Private")
    message_id = ChatClient.answer_id(sent.html)
    bob = ChatClient(b.base_url)
    bob.signup("bob")

    assert bob.http.get(sent.stream_url).status_code == 404
    stop = bob.http.post(f"/chat/messages/{message_id}/stop/", headers={"X-CSRFToken": bob.http.cookies["csrftoken"]})
    assert stop.status_code == 404
    alice.same_session_on(b.base_url).stop(sent.html)
    assert list(alice.stream(sent.stream_url))[-1].event == "done"


def test_a_key_revoked_on_a_is_refused_by_b_on_the_very_next_request(two_sites):
    a, b = two_sites
    carol = ChatClient(a.base_url)
    carol.signup("carol")
    made = carol.htmx_post("/accounts/keys/", {"name": "two processes"})
    assert made.status_code == 201
    plain = re.search(r'data-role="new-api-key">([^<]+)<', made.text)
    revoke_url = re.search(r'action="(/accounts/keys/\d+/revoke/)"', made.text)
    assert plain
    assert revoke_url

    def models_status(site: LiveSite) -> int:
        headers = {"Authorization": f"Bearer {plain.group(1)}"}
        return httpx.get(f"{site.base_url}/v1/models", headers=headers).status_code

    # Each process has seen the key, and remembers it.
    assert [models_status(a), models_status(b), models_status(a), models_status(b)] == [200] * 4
    assert carol.htmx_post(revoke_url.group(1)).status_code == 302
    assert models_status(b) == 401
    assert models_status(a) == 401
