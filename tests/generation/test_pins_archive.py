"""Pinned and archived conversations: the sidebar's order, the header's buttons, the Archived
page, search with archived ones, export and import, and who may do what."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from django.utils import timezone

from generation import services
from generation.forms import CONVERSATIONS_PER_PAGE
from generation.models import Conversation
from tests.support.chat import HTMX, eager_engine, fast_engine_run_eagerly

__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db

CHAT = reverse("generation:chat")
ARCHIVED = reverse("generation:archived")
SEARCH = reverse("generation:search")
PAGES = reverse("generation:conversation_list")
HOUR = timedelta(hours=1)


def conversations(user, *titles: str) -> list[Conversation]:
    """Conversations of `user`, each changed an hour after the one before (the last is newest)."""
    start = timezone.now() - 10 * len(titles) * HOUR
    made = []
    for number, title in enumerate(titles):
        conversation = Conversation.objects.create(user=user, title=title, model="synthetic")
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=start + number * HOUR)
        conversation.refresh_from_db()
        made.append(conversation)
    return made


def sidebar(client) -> list[str]:
    """The titles in the sidebar of the chat page, top to bottom."""
    page = client.get(CHAT).content.decode()
    listed = page[page.index('<ul id="conversations"') :].split("</ul>")[0]
    return re.findall(r'<a href="/chat/[0-9a-f-]{36}/"[^>]*>(?:.*?Pinned: </span>)?([^<]*)</a>', listed)


def pin(client, conversation: Conversation, value: str = "true", **extra):
    return client.post(reverse("generation:conversation_pin", args=[conversation.id]), {"pinned": value}, **extra)


def archive(client, conversation: Conversation, value: str = "true", **extra):
    url = reverse("generation:conversation_archive", args=[conversation.id])
    return client.post(url, {"archived": value, **extra.pop("data", {})}, **extra)


# The sidebar


def test_pinned_conversations_head_the_sidebar_newest_pin_first_then_the_rest_newest_first(alice, alice_client):
    oldest, middle, _newest, _latest = conversations(alice, "Oldest", "Middle", "Newest", "Latest")

    pin(alice_client, middle)
    pin(alice_client, oldest)

    assert sidebar(alice_client) == ["Oldest", "Middle", "Latest", "Newest"]


def test_pinned_conversations_are_marked_in_the_sidebar(alice, alice_client):
    pinned, plain = conversations(alice, "Pinned one", "Plain one")
    pin(alice_client, pinned)

    page = alice_client.get(CHAT).content.decode()

    assert f'<li id="conversation-{pinned.id}"><a href="{pinned.get_absolute_url()}"><span class="pin-mark"' in page
    assert f'<li id="conversation-{plain.id}"><a href="{plain.get_absolute_url()}">Plain one</a>' in page


def test_pinning_and_archiving_leave_the_last_change_time_as_it_was(alice, alice_client):
    (conversation,) = conversations(alice, "Kept in place")
    before = conversation.updated_at

    pin(alice_client, conversation)
    pin(alice_client, conversation, "false")
    archive(alice_client, conversation)
    archive(alice_client, conversation, "false")

    conversation.refresh_from_db()
    assert conversation.updated_at == before


def test_unpinning_puts_a_conversation_back_in_its_place_among_the_rest(alice, alice_client):
    first, _second, _third = conversations(alice, "First", "Second", "Third")
    pin(alice_client, first)
    assert sidebar(alice_client) == ["First", "Third", "Second"]

    pin(alice_client, first, "false")

    assert sidebar(alice_client) == ["Third", "Second", "First"]


def test_pinning_again_keeps_the_pins_time_so_a_stale_page_changes_nothing(alice, alice_client):
    first, second = conversations(alice, "First", "Second")
    pin(alice_client, first)
    pin(alice_client, second)
    pinned_at = Conversation.objects.get(pk=first.pk).pinned_at

    pin(alice_client, first)  # the Pin button of a page that had not seen the first pin

    assert Conversation.objects.get(pk=first.pk).pinned_at == pinned_at
    assert sidebar(alice_client) == ["Second", "First"]


def test_archived_conversations_leave_the_sidebar_and_its_further_pages(alice, alice_client):
    Conversation.objects.bulk_create(
        Conversation(user=alice, title=f"Chat {number:03d}", model="synthetic")
        for number in range(CONVERSATIONS_PER_PAGE + 1)
    )
    oldest = alice.conversations.order_by("updated_at").first()
    assert oldest is not None
    assert oldest.title in alice_client.get(PAGES, {"page": 2}, **HTMX).content.decode()

    archive(alice_client, oldest)

    assert alice_client.get(PAGES, {"page": 2}, **HTMX).status_code == 404  # it was all page 2 held
    assert oldest.title not in sidebar(alice_client)
    assert len(sidebar(alice_client)) == CONVERSATIONS_PER_PAGE


# The header's buttons


def test_pin_by_htmx_answers_the_header_with_unpin_and_the_sidebar_out_of_band(alice, alice_client):
    older, newer = conversations(alice, "Older", "Newer")

    response = pin(alice_client, older, **HTMX)

    assert response.status_code == 200
    page = response.content.decode()
    assert '<header id="conversation-header"' in page
    assert re.search(
        r'<input type="hidden" name="pinned" value="false">\s*<button[^>]*id="pin-button"[^>]*>Unpin<', page
    )
    assert '<ul id="conversations" class="conversations" hx-swap-oob="true">' in page
    assert page.index(f'id="conversation-{older.id}"') < page.index(f'id="conversation-{newer.id}"')


def test_pin_and_archive_without_javascript_redirect_back_to_the_conversation(alice, alice_client):
    (conversation,) = conversations(alice, "Plans")

    pinned = pin(alice_client, conversation)
    archived = archive(alice_client, conversation)

    assert pinned.status_code == archived.status_code == 302
    assert pinned["Location"] == archived["Location"] == conversation.get_absolute_url()


def test_a_conversation_shows_pin_and_archive_buttons_that_say_what_they_will_do(alice, alice_client):
    (conversation,) = conversations(alice, "Plans")

    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert ">Pin</button>" in page
    assert ">Archive</button>" in page

    pin(alice_client, conversation)
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert ">Unpin</button>" in page


def test_an_archived_conversation_stays_readable_at_its_url_and_says_it_is_archived(alice, alice_client):
    (conversation,) = conversations(alice, "Old plans")
    conversation.messages.create(role="user", content="Where to in May?")

    response = archive(alice_client, conversation, **HTMX)

    assert response.status_code == 200
    assert ">Unarchive</button>" in response.content.decode()
    assert 'id="pin-button"' not in response.content.decode()
    page = alice_client.get(conversation.get_absolute_url())
    assert page.status_code == 200
    shown = page.content.decode()
    assert "Where to in May?" in shown
    assert "Archived " in shown
    assert ">Unarchive</button>" in shown
    assert f'id="conversation-{conversation.id}"' not in shown  # not in the sidebar


def test_archiving_unpins_and_pinning_brings_a_conversation_back_from_the_archive(alice, alice_client):
    (conversation,) = conversations(alice, "Back and forth")
    pin(alice_client, conversation)

    archive(alice_client, conversation)
    conversation.refresh_from_db()
    assert conversation.archived_at is not None
    assert conversation.pinned_at is None

    pin(alice_client, conversation)
    conversation.refresh_from_db()
    assert conversation.archived_at is None
    assert conversation.pinned_at is not None
    assert sidebar(alice_client) == ["Back and forth"]


def test_a_prompt_sent_to_an_archived_conversation_leaves_it_archived(alice, alice_client, fast_engine):
    conversation = services.conversation_create(user=alice)
    archive(alice_client, conversation)

    response = alice_client.post(conversation.get_absolute_url(), {"prompt": "Still here?"})

    assert response.status_code == 302
    conversation.refresh_from_db()
    assert conversation.messages.filter(content="Still here?").exists()
    assert conversation.archived_at is not None
    assert sidebar(alice_client) == []


def test_renaming_an_archived_conversation_sends_no_sidebar_entry(alice, alice_client):
    (conversation,) = conversations(alice, "Old name")
    archive(alice_client, conversation)

    response = alice_client.post(
        reverse("generation:conversation_rename", args=[conversation.id]), {"title": "New name"}, **HTMX
    )

    assert response.status_code == 200
    assert "hx-swap-oob" not in response.content.decode()


# The Archived page


def test_the_sidebar_links_to_the_archived_page(alice_client):
    assert f'href="{ARCHIVED}">Archived</a>' in alice_client.get(CHAT).content.decode()


def test_the_archived_page_lists_only_archived_conversations_most_recently_archived_first(alice, alice_client):
    first, _kept, second = conversations(alice, "First archived", "Still listed", "Second archived")
    archive(alice_client, first)
    archive(alice_client, second)

    page = alice_client.get(ARCHIVED).content.decode()

    assert page.index("Second archived") < page.index("First archived")
    assert "Still listed" not in page
    assert page.count(">Unarchive<") == 2
    assert f'href="{first.get_absolute_url()}"' in page


def test_the_archived_page_says_when_there_is_none(alice_client):
    page = alice_client.get(ARCHIVED).content.decode()
    assert "No archived conversations." in page
    assert ">Unarchive<" not in page


def test_unarchive_from_the_archived_page_by_htmx_says_where_it_went(alice, alice_client):
    (conversation,) = conversations(alice, "Restored")
    archive(alice_client, conversation)

    response = archive(alice_client, conversation, "false", data={"return_to": "archived"}, **HTMX)

    assert response.status_code == 200
    assert "is back in the sidebar." in response.content.decode()
    assert sidebar(alice_client) == ["Restored"]
    assert "Restored" not in alice_client.get(ARCHIVED).content.decode()


def test_unarchive_from_the_archived_page_without_javascript_returns_to_it(alice, alice_client):
    (conversation,) = conversations(alice, "Restored")
    archive(alice_client, conversation)

    response = archive(alice_client, conversation, "false", data={"return_to": "archived"})

    assert response.status_code == 302
    assert response["Location"] == ARCHIVED
    assert sidebar(alice_client) == ["Restored"]


def test_the_archived_page_pages_by_a_hundred(alice, alice_client):
    now = timezone.now()
    Conversation.objects.bulk_create(
        Conversation(user=alice, title=f"Old {number:03d}", model="synthetic", archived_at=now - number * HOUR)
        for number in range(CONVERSATIONS_PER_PAGE + 3)
    )

    first = alice_client.get(ARCHIVED).content.decode()
    second = alice_client.get(ARCHIVED, {"page": 2}).content.decode()

    assert first.count(">Unarchive<") == CONVERSATIONS_PER_PAGE
    assert f"{ARCHIVED}?page=2" in first
    assert second.count(">Unarchive<") == 3
    assert "Old 102" in second
    assert "?page=3" not in second


@pytest.mark.parametrize(
    ("page", "status"),
    [("abc", 400), ("0", 400), ("-1", 400), ("10001", 400), ("2.5", 400), ("9" * 50, 400), ("2", 404)],
)
def test_malformed_out_of_range_or_missing_archived_pages_are_refused(alice, alice_client, page, status):
    (conversation,) = conversations(alice, "Only one")
    archive(alice_client, conversation)

    response = alice_client.get(ARCHIVED, {"page": page})

    assert response.status_code == status
    assert b"Only one" not in response.content


def test_bobs_archived_page_holds_none_of_alices(alice, bob_client, alice_client):
    (conversation,) = conversations(alice, "Alice's secret")
    archive(alice_client, conversation)

    assert b"Alice's secret" not in bob_client.get(ARCHIVED).content


# Search


def test_search_leaves_archived_conversations_out_unless_asked_and_marks_them(alice, alice_client):
    _kept, archived = conversations(alice, "Lisbon in May", "Lisbon in June")
    archive(alice_client, archived)

    plain = alice_client.get(SEARCH, {"q": "lisbon"}, **HTMX).content.decode()
    with_archived = alice_client.get(SEARCH, {"q": "lisbon", "archived": "on"}, **HTMX).content.decode()

    assert "June" not in plain
    assert "1 conversation found" in plain
    assert "Archived" not in plain
    assert "2 conversations found" in with_archived
    assert re.search(r"<mark>Lisbon</mark> in June</span><span class=\"hit-archived\">Archived</span>", with_archived)


def test_the_search_form_offers_include_archived_and_keeps_it_ticked(alice_client):
    blank = alice_client.get(CHAT).content.decode()
    ticked = alice_client.get(SEARCH, {"q": "x", "archived": "on"}).content.decode()

    assert re.search(r'<input type="checkbox" name="archived"\s', blank)
    assert "Include archived" in blank
    assert re.search(r'<input type="checkbox" name="archived" checked', ticked)


# Export and import


def test_the_json_export_carries_the_pin_and_the_archive(alice, alice_client):
    pinned, archived = conversations(alice, "Pinned", "Archived")
    pin(alice_client, pinned)
    archive(alice_client, archived)
    pinned.refresh_from_db()
    archived.refresh_from_db()

    pinned_doc = alice_client.get(reverse("generation:conversation_export_json", args=[pinned.id])).json()
    archived_doc = alice_client.get(reverse("generation:conversation_export_json", args=[archived.id])).json()

    assert datetime.fromisoformat(pinned_doc["pinned_at"]) == pinned.pinned_at
    assert pinned_doc["archived_at"] is None
    assert archived_doc["pinned_at"] is None
    assert datetime.fromisoformat(archived_doc["archived_at"]) == archived.archived_at


def document(**fields: object) -> dict[str, SimpleUploadedFile]:
    body = {
        "format": "chatsite.conversation",
        "version": 1,
        "title": "Imported",
        "messages": [
            {"id": 0, "parent": None, "role": "user", "content": "Hi"},
            {"id": 1, "parent": 0, "role": "assistant", "content": "Hello"},
        ],
        **fields,
    }
    return {"file": SimpleUploadedFile("chat.json", json.dumps(body).encode(), content_type="application/json")}


def imported(client, **fields: object) -> Conversation:
    response = client.post(reverse("generation:your_data"), document(**fields))
    assert response.status_code == 302, response.content.decode()
    return Conversation.objects.get(title="Imported")


def test_an_import_keeps_the_pin(alice_client):
    conversation = imported(alice_client, pinned_at="2026-01-02T03:04:05+00:00")
    assert conversation.pinned_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert conversation.archived_at is None


def test_an_import_keeps_the_archive_and_an_archived_one_is_not_pinned(alice_client):
    conversation = imported(alice_client, pinned_at="2026-01-02T03:04:05Z", archived_at="2026-01-03T00:00:00Z")
    assert conversation.archived_at == datetime(2026, 1, 3, tzinfo=UTC)
    assert conversation.pinned_at is None


def test_an_imported_pin_from_the_future_is_taken_as_now(alice_client):
    before = timezone.now()
    conversation = imported(alice_client, pinned_at="2999-01-01T00:00:00Z")
    assert conversation.pinned_at is not None
    assert before <= conversation.pinned_at <= timezone.now()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pinned_at", "2026-01-02T03:04:05"),
        ("pinned_at", "yesterday"),
        ("archived_at", 1700000000),
        ("archived_at", True),
    ],
)
def test_an_import_refuses_a_pin_or_archive_time_that_is_not_a_time_with_its_zone(alice, alice_client, field, value):
    response = alice_client.post(reverse("generation:your_data"), document(**{field: value}))

    assert response.status_code == 400
    assert f"bad value at {field}" in response.content.decode()
    assert not alice.conversations.exists()


# Bad requests and other people's conversations


@pytest.mark.parametrize("view", ["conversation_pin", "conversation_archive"])
@pytest.mark.parametrize("value", [None, "", "yes", "1", "TRUE", "x" * 10_000])
def test_a_missing_or_malformed_state_is_refused_and_nothing_changes(alice, alice_client, view, value):
    (conversation,) = conversations(alice, "Untouched")
    field = "pinned" if view == "conversation_pin" else "archived"
    data = {} if value is None else {field: value}

    by_htmx = alice_client.post(reverse(f"generation:{view}", args=[conversation.id]), data, **HTMX)
    without_js = alice_client.post(reverse(f"generation:{view}", args=[conversation.id]), data)

    assert by_htmx.status_code == without_js.status_code == 400
    assert field in by_htmx.content.decode()
    conversation.refresh_from_db()
    assert conversation.pinned_at is None
    assert conversation.archived_at is None


def test_an_unknown_page_to_return_to_is_refused(alice, alice_client):
    (conversation,) = conversations(alice, "Untouched")

    response = archive(alice_client, conversation, data={"return_to": "https://evil.example/"})

    assert response.status_code == 400
    assert "return_to is conversation or archived" in response.content.decode()
    conversation.refresh_from_db()
    assert conversation.archived_at is None


@pytest.mark.parametrize("view", ["conversation_pin", "conversation_archive"])
def test_pinning_or_archiving_a_conversation_that_does_not_exist_is_404(alice_client, view):
    url = reverse(f"generation:{view}", args=["00000000-0000-0000-0000-000000000000"])
    assert alice_client.post(url, {"pinned": "true", "archived": "true"}).status_code == 404
    assert alice_client.post(f"/chat/not-a-uuid/{view.split('_')[1]}/", {"pinned": "true"}).status_code == 404


@pytest.mark.parametrize(
    ("view", "data"),
    [
        ("conversation_pin", {"pinned": "true"}),
        ("conversation_pin", {"pinned": "false"}),
        ("conversation_archive", {"archived": "true"}),
        ("conversation_archive", {"archived": "false", "return_to": "archived"}),
    ],
)
def test_bob_gets_404_pinning_archiving_or_unarchiving_alices_conversation(alice, alice_client, bob_client, view, data):
    mine, archived = conversations(alice, "Alice's", "Alice's archived")
    pin(alice_client, mine)
    archive(alice_client, archived)
    before = {c.pk: (c.pinned_at, c.archived_at) for c in Conversation.objects.all()}

    for conversation in (mine, archived):
        url = reverse(f"generation:{view}", args=[conversation.id])
        assert bob_client.post(url, data, **HTMX).status_code == 404
        assert bob_client.post(url, data).status_code == 404

    assert {c.pk: (c.pinned_at, c.archived_at) for c in Conversation.objects.all()} == before


@pytest.mark.parametrize("view", ["conversation_pin", "conversation_archive"])
def test_get_on_pin_or_archive_is_405(alice, alice_client, view):
    (conversation,) = conversations(alice, "Plans")
    assert alice_client.get(reverse(f"generation:{view}", args=[conversation.id])).status_code == 405


def test_the_archived_page_only_answers_get(alice_client):
    assert alice_client.post(ARCHIVED).status_code == 405


@pytest.mark.parametrize("view", ["conversation_pin", "conversation_archive"])
def test_pin_and_archive_need_a_login(alice, client, view):
    (conversation,) = conversations(alice, "Plans")

    response = client.post(
        reverse(f"generation:{view}", args=[conversation.id]), {"pinned": "true", "archived": "true"}
    )

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
    conversation.refresh_from_db()
    assert conversation.pinned_at is None
    assert conversation.archived_at is None


def test_the_archived_page_needs_a_login(client):
    response = client.get(ARCHIVED)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
