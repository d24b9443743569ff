"""Export (Markdown, JSON with every branch, all of one's data) and import of a conversation."""

from __future__ import annotations

import json

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from accounts.models import Account
from accounts.services import account_for
from generation import transfer
from generation.models import Conversation, Message
from generation.selectors import MessageTree

pytestmark = pytest.mark.django_db


def branched(user) -> Conversation:
    """A conversation with an edited prompt and a regenerated answer, showing the newest branch."""
    conversation = Conversation.objects.create(
        user=user, model=settings.CHAT_MODEL, title="Colours", system_prompt="Be brief.", temperature=0.7
    )
    add = conversation.messages.create
    old_prompt = add(role="user", content="Name a colour")
    add(role="assistant", parent=old_prompt, content="Red", completion_tokens=1)
    prompt = Message(conversation=conversation, role="user", content="Name a warm colour")
    prompt.save(root=True)  # an edited first prompt: a version of it, with no parent either
    add(role="assistant", parent=prompt, content="Orange")
    yellow = add(role="assistant", parent=prompt, content="**Yellow**")
    follow = add(role="user", parent=yellow, content="Why?")
    add(role="assistant", parent=follow, content="It is bright.", status="stopped")
    return conversation


def shown(conversation: Conversation) -> list[str]:
    return [message.content for message in MessageTree(conversation).thread()]


def tree_shape(conversation: Conversation) -> list[tuple[str, str, int | None]]:
    messages = list(conversation.messages.all())
    index = {message.pk: i for i, message in enumerate(messages)}
    return [(m.role, m.content, index.get(m.parent_id)) for m in messages]


def upload(data: object, name: str = "chat.json") -> dict[str, SimpleUploadedFile]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return {"file": SimpleUploadedFile(name, raw, content_type="application/json")}


def test_json_export_has_every_branch_and_the_one_shown(alice, alice_client):
    conversation = branched(alice)

    response = alice_client.get(reverse("generation:conversation_export_json", args=[conversation.id]))

    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == 'attachment; filename="colours.json"'
    document = json.loads(response.content)
    assert (document["format"], document["version"], document["title"]) == ("chatsite.conversation", 1, "Colours")
    assert [(m["id"], m["parent"], m["content"]) for m in document["messages"]] == [
        (0, None, "Name a colour"),
        (1, 0, "Red"),
        (2, None, "Name a warm colour"),
        (3, 2, "Orange"),
        (4, 2, "**Yellow**"),
        (5, 4, "Why?"),
        (6, 5, "It is bright."),
    ]
    assert document["current"] == 6
    assert document["messages"][6]["status"] == "stopped"


def test_markdown_export_is_the_branch_shown_with_its_versions_named(alice, alice_client):
    conversation = branched(alice)

    response = alice_client.get(reverse("generation:conversation_export_markdown", args=[conversation.id]))

    assert response.status_code == 200
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"] == 'attachment; filename="colours.md"'
    text = response.content.decode()
    assert text.startswith("# Colours\n")
    assert "> Be brief." in text
    assert "## You (version 2 of 2)\n\nName a warm colour" in text
    assert "## Assistant (version 2 of 2)\n\n**Yellow**" in text
    assert "## You\n\nWhy?" in text
    assert "Orange" not in text
    assert "Red" not in text


def test_import_of_an_export_makes_the_same_conversation_for_the_importer(alice, bob, alice_client, bob_client):
    original = branched(alice)
    exported = alice_client.get(reverse("generation:conversation_export_json", args=[original.id])).content

    response = bob_client.post(reverse("generation:your_data"), upload(exported))

    copy = Conversation.objects.get(user=bob)
    assert response.status_code == 302
    assert response["Location"] == copy.get_absolute_url()
    assert (copy.title, copy.system_prompt, copy.temperature, copy.model) == (
        "Colours",
        "Be brief.",
        0.7,
        settings.CHAT_MODEL,
    )
    assert tree_shape(copy) == tree_shape(original)
    assert shown(copy) == shown(original)
    assert copy.messages.get(content="It is bright.").status == "stopped"
    assert Conversation.objects.filter(user=alice).count() == 1  # hers untouched
    page = bob_client.get(copy.get_absolute_url()).content.decode()
    assert '<span class="versions-position">2/2</span>' in page


SOURCES = [
    {
        "number": 1,
        "document": "handbook.md",
        "passage": 7,
        "excerpt": "Leave is\n25 days.",
        "url": "/documents/passages/7/",
    },
    {"number": 2, "document": "notes.txt", "passage": 9, "excerpt": "Ask HR.", "url": "/documents/passages/9/"},
]


def answered_from_documents(user) -> Conversation:
    conversation = Conversation.objects.create(user=user, model=settings.CHAT_MODEL, title="Leave")
    prompt = conversation.messages.create(role="user", content="How much leave?")
    conversation.messages.create(role="assistant", parent=prompt, content="25 days [1].", sources=SOURCES)
    again = conversation.messages.create(role="user", parent=conversation.messages.last(), content="Thanks")
    conversation.messages.create(role="assistant", parent=again, content="You are welcome.", from_cache=True)
    return conversation


def test_exports_carry_an_answers_sources_and_whether_it_came_from_the_cache(alice, alice_client):
    conversation = answered_from_documents(alice)

    document = json.loads(
        alice_client.get(reverse("generation:conversation_export_json", args=[conversation.id])).content
    )
    text = alice_client.get(reverse("generation:conversation_export_markdown", args=[conversation.id])).content.decode()

    assert [(m["sources"], m["from_cache"]) for m in document["messages"]] == [
        ([], False),
        (SOURCES, False),
        ([], False),
        ([], True),
    ]
    assert "25 days [1].\n\nSources:\n\n1. handbook.md: Leave is 25 days.\n2. notes.txt: Ask HR." in text
    assert "You are welcome.\n\n*(from the response cache)*" in text


def test_an_imported_answer_keeps_its_sources_text_but_no_link_into_the_exporters_documents(
    alice, bob, alice_client, bob_client
):
    exported = json.loads(
        alice_client.get(
            reverse("generation:conversation_export_json", args=[answered_from_documents(alice).id])
        ).content
    )
    exported["messages"][1]["sources"][1]["url"] = "javascript:alert(1)"

    bob_client.post(reverse("generation:your_data"), upload(exported))

    copy = Conversation.objects.get(user=bob)
    answer = copy.messages.get(content="25 days [1].")
    assert answer.sources == [
        {"number": 1, "document": "handbook.md", "excerpt": "Leave is\n25 days."},
        {"number": 2, "document": "notes.txt", "excerpt": "Ask HR."},
    ]
    assert copy.messages.get(content="You are welcome.").from_cache
    page = bob_client.get(copy.get_absolute_url()).content.decode()
    assert "<span>[1] handbook.md</span>" in page
    assert "[2] notes.txt" in page
    assert "javascript:" not in page
    assert "/documents/passages/" not in page


def test_import_keeps_the_chosen_branch_and_settles_a_streaming_answer(alice, alice_client):
    document = transfer.conversation_document(branched(alice))
    document["current"] = 1  # "Red": the first branch
    document["messages"][1]["status"] = "streaming"
    document["model"] = "a-model-not-served-here"
    document["max_tokens"] = 100_000

    alice_client.post(reverse("generation:your_data"), upload(document))

    copy = Conversation.objects.filter(user=alice).order_by("-created_at").first()
    assert copy is not None
    assert shown(copy) == ["Name a colour", "Red"]
    assert copy.messages.get(content="Red").status == "interrupted"
    assert copy.model == settings.CHAT_MODEL  # the default, where the model is not served here
    assert copy.max_tokens == account_for(alice).limits.max_tokens_per_request


def good_document() -> dict:
    return {
        "format": "chatsite.conversation",
        "version": 1,
        "title": "T",
        "messages": [
            {"id": 0, "parent": None, "role": "user", "content": "Hi"},
            {"id": 1, "parent": 0, "role": "assistant", "content": "Hello"},
        ],
    }


def changed(path: str, value: object) -> dict:
    document = good_document()
    target: object = document
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]  # type: ignore[index]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value  # type: ignore[index]
    return document


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"{not json", "The file is not JSON"),
        (b"\xff\xfe", "The file is not JSON"),
        (b"[" * 100_000, "The file is not JSON"),  # deeper than Python's parser goes
        (json.dumps(good_document())[:-1].encode() + b', "x": ' + b"[" * 300 + b"]" * 300 + b"}", "not JSON"),
        (b"[1, 2]", "not a chatsite conversation"),
        (changed("format", "chatgpt"), "not a chatsite conversation"),
        (changed("version", 2), "The file is version 2; this site reads version 1."),
        (changed("version", "1"), "The file is version &#x27;1&#x27;; this site reads version 1."),
        (changed("temperature", 3), "temperature: Input should be less than or equal to 2"),
        (changed("temperature", "0.2"), "temperature: Input should be a valid number"),
        (changed("surprise", True), "surprise: Extra inputs are not permitted"),
        (changed("messages", []), "The conversation has no messages."),
        (changed("messages.1.role", "system"), "messages.1.role: Input should be"),
        (changed("messages.1.id", 5), "Message 1 has the id 5"),
        (changed("messages.1.parent", 1), "Message 1 follows message 1, which comes later."),
        (changed("messages.0.role", "assistant"), "Message 0 is an answer to no prompt."),
        (changed("messages.1.role", "user"), "Message 1 follows a message of the same role (user)."),
        (changed("messages.0.content", "x" * 32_001), "Message 0 is a prompt longer than 32000 characters."),
        (changed("messages.0.content", "a\x00b"), "contains a NUL character"),
        (changed("current", 7), "current names message 7, which does not exist."),
        (changed("title", "t" * 201), "title: String should have at most 200 characters"),
        (changed("messages.1.sources", "none"), "messages.1.sources: Input should be a valid array"),
        (
            changed("messages.1.sources", [{"number": 0, "document": "a.md"}]),
            "messages.1.sources.0.number: Input should be greater than or equal to 1",
        ),
        (changed("messages.1.sources", [{"number": 1}]), "messages.1.sources.0.document: Field required"),
        (changed("messages.1.from_cache", "yes"), "messages.1.from_cache: Input should be a valid boolean"),
        (
            changed("messages.1.status", "finished"),
            "messages.1.status: Value error, is not one of streaming, complete, stopped, error, interrupted",
        ),
    ],
)
def test_a_bad_file_is_refused_with_the_reason_and_nothing_is_made(alice, alice_client, body, error):
    response = alice_client.post(reverse("generation:your_data"), upload(body))

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Conversation.objects.filter(user=alice).exists()
    assert not Message.objects.exists()


def test_an_export_saved_with_a_byte_order_mark_is_imported(alice, alice_client):
    response = alice_client.post(
        reverse("generation:your_data"), upload(b"\xef\xbb\xbf" + json.dumps(good_document()).encode())
    )

    copy = Conversation.objects.get(user=alice)
    assert response.status_code == 302
    assert shown(copy) == ["Hi", "Hello"]


def test_a_lone_surrogate_is_refused(alice, alice_client):
    raw = json.dumps(good_document()).replace('"Hello"', '"\\ud800"').encode()
    response = alice_client.post(reverse("generation:your_data"), upload(raw))
    assert response.status_code == 400
    assert not Conversation.objects.exists()


def test_an_oversized_file_is_refused_before_it_is_read(alice, alice_client, monkeypatch):
    monkeypatch.setattr(transfer, "IMPORT_MAX_BYTES", 100)
    response = alice_client.post(reverse("generation:your_data"), upload(good_document() | {"title": "x" * 200}))
    assert response.status_code == 400
    assert "The file is larger than" in response.content.decode()
    assert not Conversation.objects.exists()


def test_too_many_messages_are_refused(alice, alice_client, monkeypatch):
    document = good_document()
    document["messages"] = [
        {"id": i, "parent": i - 1 if i else None, "role": ("user", "assistant")[i % 2], "content": "x"}
        for i in range(transfer.IMPORT_MAX_MESSAGES + 1)
    ]
    response = alice_client.post(reverse("generation:your_data"), upload(document))
    assert response.status_code == 400
    assert "messages: List should have at most" in response.content.decode()


def test_an_import_without_a_file_says_so(alice, alice_client):
    response = alice_client.post(reverse("generation:your_data"), {})
    assert response.status_code == 400
    assert "Choose a file to import." in response.content.decode()


def test_export_all_my_data_has_all_my_conversations_and_nobody_elses(alice, bob, alice_client):
    branched(alice)
    Conversation.objects.create(user=alice, model="m", title="Second")
    Conversation.objects.create(user=bob, model="m", title="Bob's secret")

    response = alice_client.get(reverse("generation:your_data_export"))

    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="chatsite-data.json"'
    document = json.loads(response.content)
    assert document["format"] == "chatsite.export"
    assert document["user"]["username"] == "alice"
    assert [c["title"] for c in document["conversations"]] == ["Colours", "Second"]
    assert len(document["conversations"][0]["messages"]) == 7
    assert b"Bob's secret" not in response.content


def test_the_data_page_offers_the_export_and_the_import(alice, alice_client):
    branched(alice)
    page = alice_client.get(reverse("generation:your_data")).content.decode()
    assert "all your 1 conversation," in page
    assert 'href="/chat/data/export.json"' in page
    assert 'enctype="multipart/form-data"' in page
    assert "Import conversation" in page
    chat = alice_client.get(reverse("generation:chat")).content.decode()
    assert 'href="/chat/data/">Your data</a>' in chat


def test_bob_gets_404_for_alices_exports(alice, bob_client):
    conversation = branched(alice)
    for name in ("conversation_export_markdown", "conversation_export_json"):
        assert bob_client.get(reverse(f"generation:{name}", args=[conversation.id])).status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        reverse("generation:your_data"),
        reverse("generation:your_data_export"),
        reverse("generation:conversation_export_json", args=["8d1c5c2c-1d8e-4c9b-9a43-3c1f2b0e6a11"]),
        reverse("generation:conversation_export_markdown", args=["8d1c5c2c-1d8e-4c9b-9a43-3c1f2b0e6a11"]),
    ],
)
def test_exports_and_imports_require_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))


def test_exports_are_read_only(alice, alice_client):
    conversation = branched(alice)
    url = reverse("generation:conversation_export_json", args=[conversation.id])
    assert alice_client.post(url).status_code == 405
    assert alice_client.post(reverse("generation:your_data_export")).status_code == 405


def test_an_import_is_capped_by_the_plan_even_when_the_file_asks_for_more(alice, alice_client):
    Account.objects.filter(pk=account_for(alice).pk).update(max_tokens_per_request=64)
    alice_client.post(reverse("generation:your_data"), upload(good_document() | {"max_tokens": 4096}))
    assert Conversation.objects.get(user=alice).max_tokens == 64
