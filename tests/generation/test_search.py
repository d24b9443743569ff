"""Searching one's conversations (titles and message text, full-text index) and paging the sidebar."""

from __future__ import annotations

import pytest
from django.db import connection
from django.urls import reverse

from generation.forms import CONVERSATIONS_PER_PAGE
from generation.models import Conversation, Message
from generation.search import MAX_QUERY_CHARS, MAX_TERMS, conversation_search, highlight, search_terms

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
SEARCH = reverse("generation:search")
PAGES = reverse("generation:conversation_list")


def conversation_with(user, title: str, *texts: str) -> Conversation:
    conversation = Conversation.objects.create(user=user, title=title, model="synthetic")
    for index, text in enumerate(texts):
        role = Message.Role.USER if index % 2 == 0 else Message.Role.ASSISTANT
        Message.objects.create(conversation=conversation, role=role, content=text)
    return conversation


def found(user, query: str) -> list[str]:
    return [hit.conversation.title for hit in conversation_search(user=user, terms=search_terms(query))]


def test_search_finds_message_text_and_titles_by_word_prefix_ignoring_case(alice):
    conversation_with(alice, "Trip to Lisbon", "Where should I eat?", "Try the pastéis de nata in Belém.")
    conversation_with(alice, "Taxes", "How do I file my taxes?", "Start with your income statements.")

    assert found(alice, "lisb") == ["Trip to Lisbon"]
    assert found(alice, "INCOME") == ["Taxes"]
    assert found(alice, "nata belém") == ["Trip to Lisbon"]
    if connection.vendor == "sqlite":  # FTS5's unicode61 folds accents; PostgreSQL's `simple` config doesn't
        assert found(alice, "nata belem") == ["Trip to Lisbon"]
    assert found(alice, "nata income") == []  # every word must match in one text


def test_search_follows_edits_renames_and_deletes(alice):
    conversation = conversation_with(alice, "Draft", "first words")
    message = conversation.messages.get()

    message.content = "second words"
    message.save()
    Message.objects.filter(pk=message.pk).update(content="third words")  # as the engine's saves do
    assert found(alice, "first") == []
    assert found(alice, "second") == []
    assert found(alice, "third") == ["Draft"]

    conversation.title = "Final"
    conversation.save()
    assert found(alice, "draft") == []
    assert found(alice, "final") == ["Final"]

    conversation.delete()
    assert found(alice, "third") == []
    assert found(alice, "final") == []


def test_search_never_finds_another_users_conversations(alice, bob):
    conversation_with(alice, "Alice's secret plan", "The password is swordfish.")
    conversation_with(bob, "Bob's notes", "Nothing about swordfish here? swordfish.")

    assert found(bob, "swordfish") == ["Bob's notes"]
    assert found(bob, "secret plan") == []
    assert found(alice, "swordfish") == ["Alice's secret plan"]


def test_search_syntax_in_the_query_is_plain_words(alice):
    conversation_with(alice, "Quotes", 'He said "hello" AND NOT goodbye (maybe) *near* x:y')

    for query in ['"hello', "hello AND", "NOT goodbye", "(maybe", "*near*", "x:y", "NEAR(hello goodbye)"]:
        assert found(alice, query) == ["Quotes"], query
    assert found(alice, "' OR 1=1 --") == []


def test_the_newest_conversations_come_first_and_results_are_capped(alice):
    for number in range(3):
        conversation_with(alice, f"Recipe {number}", "flour and water")

    assert found(alice, "flour") == ["Recipe 2", "Recipe 1", "Recipe 0"]
    assert len(conversation_search(user=alice, terms=["flour"], limit=2)) == 2


def test_search_terms_are_words_deduplicated_and_capped():
    assert search_terms("Hello, hello WORLD! x_y") == ["hello", "world", "x", "y"]
    assert search_terms(" ".join(f"w{number}" for number in range(20))) == [f"w{n}" for n in range(MAX_TERMS)]
    assert search_terms("!!! --- ***") == []


def test_highlight_escapes_the_text_and_marks_only_the_matches():
    html = highlight("<b>Tea</b> & teapots: <script>alert('tea')</script>", ["tea"])

    assert html == (
        "&lt;b&gt;<mark>Tea</mark>&lt;/b&gt; &amp; <mark>tea</mark>pots: "
        "&lt;script&gt;alert(&#x27;<mark>tea</mark>&#x27;)&lt;/script&gt;"
    )


def test_highlight_ignores_accents_and_keeps_the_text_as_written():
    assert highlight("Pastéis de Belém", ["belem", "pasteis"]) == "<mark>Pastéis</mark> de <mark>Belém</mark>"
    assert highlight("Belem", ["belém"]) == "<mark>Belem</mark>"


def test_highlight_shows_the_passage_around_a_late_match():
    text = "word " * 100 + "needle in the haystack " + "word " * 100

    html = highlight(text, ["needle"], width=80)

    assert html.startswith("…")
    assert html.endswith("…")
    assert "<mark>needle</mark> in the haystack" in html
    assert len(html) < 120


def test_search_page_highlights_matches_in_titles_and_excerpts(alice_client, alice):
    conversation = conversation_with(alice, "Garden <plans>", "When to plant <b>tomatoes</b>?")

    response = alice_client.get(SEARCH, {"q": "tomato"}, **HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert conversation.get_absolute_url() in html
    assert "Garden &lt;plans&gt;" in html
    assert "&lt;b&gt;<mark>tomato</mark>es&lt;/b&gt;" in html
    assert "1 conversation found" in html


def test_search_without_htmx_is_the_chat_page_with_results(alice_client, alice):
    conversation_with(alice, "Chess openings", "The Sicilian defence")

    response = alice_client.get(SEARCH, {"q": "sicilian"})

    assert response.status_code == 200
    assert b'<textarea name="prompt"' in response.content
    assert b"<mark>Sicilian</mark>" in response.content


def test_another_users_search_shows_none_of_alices_conversations(bob_client, alice):
    conversation_with(alice, "Alice only", "shared word: albatross")

    response = bob_client.get(SEARCH, {"q": "albatross"}, **HTMX)

    assert response.status_code == 200
    assert b"Alice only" not in response.content
    assert b"albatross</mark>" not in response.content
    assert b"0 conversations found" in response.content


@pytest.mark.parametrize(
    ("query", "error"),
    [
        ("x" * (MAX_QUERY_CHARS + 1), b"Search for at most 200 characters"),
        ("%21%21%21+%2A%2A%2A", b"Search for a word or a number."),
        ("%FF%FE", b"Search for a word or a number."),  # not UTF-8: decoded as replacement characters
        ("tea%00", b"Null characters are not allowed."),
    ],
)
def test_oversized_malformed_or_wordless_searches_say_what_is_wrong(alice_client, query, error):
    htmx = alice_client.get(f"{SEARCH}?q={query}", **HTMX)
    page = alice_client.get(f"{SEARCH}?q={query}")

    assert htmx.status_code == 422
    assert error in htmx.content
    assert page.status_code == 400
    assert error in page.content


def test_an_empty_search_clears_the_results(alice_client):
    response = alice_client.get(SEARCH, {"q": "  "}, **HTMX)

    assert response.status_code == 200
    assert b"data-searching" not in response.content
    assert b"<mark>" not in response.content


@pytest.mark.parametrize(("url", "query"), [(SEARCH, {"q": "anything"}), (PAGES, {"page": 2})])
def test_search_and_pages_need_a_login(client, url, query):
    response = client.get(url, query)

    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


@pytest.mark.parametrize("url", [SEARCH, PAGES])
def test_search_and_pages_only_answer_get(alice_client, url):
    assert alice_client.post(url, {"q": "x", "page": 2}).status_code == 405


def test_the_sidebar_shows_the_newest_page_then_show_more_loads_the_next(alice_client, alice):
    total = CONVERSATIONS_PER_PAGE + 5
    Conversation.objects.bulk_create(
        Conversation(user=alice, title=f"Chat {number:03d}", model="synthetic") for number in range(total)
    )
    titles = list(alice.conversations.values_list("title", flat=True))  # newest first

    first = alice_client.get(reverse("generation:chat")).content.decode()
    assert first.count('<li id="conversation-') == CONVERSATIONS_PER_PAGE
    assert titles[CONVERSATIONS_PER_PAGE - 1] in first
    assert titles[CONVERSATIONS_PER_PAGE] not in first
    assert f"{PAGES}?page=2" in first

    second = alice_client.get(PAGES, {"page": 2}, **HTMX).content.decode()
    assert second.count('<li id="conversation-') == 5
    assert all(title in second for title in titles[CONVERSATIONS_PER_PAGE:])
    assert "Show more" not in second


@pytest.mark.parametrize(
    ("page", "status"),
    [("abc", 400), ("", 400), ("1", 400), ("-3", 400), ("10001", 400), ("2.5", 400), ("9" * 50, 400), ("2", 404)],
)
def test_malformed_out_of_range_or_missing_pages_are_refused(alice_client, alice, page, status):
    conversation_with(alice, "Only one")

    response = alice_client.get(PAGES, {"page": page}, **HTMX)

    assert response.status_code == status
    assert b"Only one" not in response.content


def test_another_users_pages_hold_only_their_own_conversations(bob_client, alice, bob):
    Conversation.objects.bulk_create(
        Conversation(user=alice, title=f"Alice {number}", model="synthetic")
        for number in range(CONVERSATIONS_PER_PAGE + 2)
    )

    assert bob_client.get(PAGES, {"page": 2}, **HTMX).status_code == 404
    assert b"Alice" not in bob_client.get(reverse("generation:chat")).content


def test_the_search_index_is_kept_by_triggers_that_still_exist():
    """A later migration that rebuilds a table on SQLite drops its triggers (see 0004_search_index)."""
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL indexes the expression itself")
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'generation_%_search_%'")
        triggers = {name for (name,) in cursor.fetchall()}
    assert triggers == {
        f"generation_{table}_search_{event}"
        for table in ("message", "conversation")
        for event in ("insert", "delete", "update")
    }
