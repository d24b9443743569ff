"""Attaching, listing and removing documents: the owner's, and nobody else's."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from accounts.services import account_for
from documents.models import Document, Passage
from documents.services import document_limits
from generation.models import Conversation
from tests.documents.pdfs import encrypted_pdf, pdf_with_text
from tests.support.uploads import upload

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
NOTES = "# Lighthouses\n\nKeepers trimmed the wicks every night.\n\nFresnel lenses focus the beam far out to sea.\n"


@pytest.fixture
def conversation(alice):
    return Conversation.objects.create(user=alice, model="smollm2-135m-instruct", title="Notes")


def attach(client, conversation, name: str = "notes.md", data: bytes = NOTES.encode()) -> Document:
    response = upload(client, conversation, name, data)
    assert response.status_code == 200, response.content
    return Document.objects.get(conversation=conversation, name=name)


def test_owner_attaches_a_markdown_file_and_sees_it_listed(alice_client, conversation):
    response = upload(alice_client, conversation, "notes.md", NOTES.encode())

    assert response.status_code == 200
    assert 'id="documents"' in response.text
    assert "notes.md" in response.text
    assert "Documents (1)" in response.text
    document = Document.objects.get(conversation=conversation)
    assert (document.name, document.kind, document.size_bytes) == ("notes.md", "markdown", len(NOTES.encode()))
    passage = document.passages.get()
    assert passage.heading == "Lighthouses"
    assert "Fresnel lenses focus the beam" in passage.text


def test_a_pdf_becomes_passages_of_its_text(alice_client, conversation):
    document = attach(alice_client, conversation, "keepers.pdf", pdf_with_text("Fresnel lenses focus the beam."))

    assert document.kind == "pdf"
    assert "Fresnel lenses focus the beam." in document.passages.get().text


def test_the_chat_page_lists_the_conversations_documents(alice_client, conversation):
    attach(alice_client, conversation)

    page = alice_client.get(conversation.get_absolute_url())

    assert "notes.md" in page.text
    assert "Attach a file" in page.text
    assert "Remove notes.md" in page.text


def test_without_javascript_an_upload_returns_to_the_conversation(alice_client, conversation):
    url = reverse("documents:upload", args=[conversation.id])
    response = alice_client.post(url, {"file": SimpleUploadedFile("notes.txt", b"Plain words here.")})

    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    assert Document.objects.filter(conversation=conversation, kind="text").exists()


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("empty.txt", b"", "empty.txt is empty."),
        ("blank.md", b"  \n\n\t ", "blank.md has no text to search."),
        ("latin1.txt", "café crème".encode("latin-1"), "latin1.txt is not UTF-8 text."),
        ("binary.txt", b"ELF\x00\x01\x02 words", "binary.txt is not a text file."),
        ("report.docx", b"PK\x03\x04 a zip", "report.docx is not a text, Markdown or PDF file"),
        ("no-extension", b"words", "no-extension is not a text, Markdown or PDF file"),
        ("fake.pdf", b"Just text pretending.", "fake.pdf is not a PDF file."),
        ("broken.pdf", pdf_with_text("Cut short")[:150], "broken.pdf is not a PDF that can be read"),
        ("garbled.pdf", b"%PDF-1.7\n" + bytes(range(256)) * 8, "garbled.pdf is not a PDF that can be read"),
        ("scanned.pdf", pdf_with_text(), "scanned.pdf has no text to search (a scanned PDF?)."),
        ("locked.pdf", encrypted_pdf("Secret words"), "locked.pdf is encrypted; attach a copy without a password."),
    ],
)
def test_an_unusable_file_is_refused_with_a_clear_message_and_nothing_saved(
    alice_client, conversation, name, data, words
):
    response = upload(alice_client, conversation, name, data)

    assert response.status_code == 422
    assert words in response.text
    assert 'role="alert"' in response.text
    assert not Document.objects.exists()
    assert not Passage.objects.exists()


def test_a_refused_file_loses_nothing_already_attached(alice_client, conversation):
    attach(alice_client, conversation)

    response = upload(alice_client, conversation, "broken.pdf", b"%PDF-1.4 not really")

    assert response.status_code == 422
    assert "notes.md" in response.text
    assert "Documents (1)" in response.text
    assert Document.objects.get().passages.count() == 1


def test_a_file_over_the_plans_size_is_refused(alice, alice_client, conversation):
    plan = account_for(alice).plan
    plan.max_document_bytes = 100
    plan.save()

    response = upload(alice_client, conversation, "big.txt", b"word " * 21)

    assert response.status_code == 422
    assert "big.txt is 105\xa0bytes; your plan allows 100\xa0bytes a file." in response.text
    assert not Document.objects.exists()


def test_the_size_limit_never_exceeds_the_request_body_limit(alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 50_000
    plan = account_for(alice).plan
    plan.max_document_bytes = 10_000_000
    plan.save()

    assert document_limits(alice).max_bytes == 50_000


def test_a_conversation_holds_at_most_the_plans_number_of_documents(alice, alice_client, conversation):
    plan = account_for(alice).plan
    plan.max_documents_per_conversation = 2
    plan.save()
    attach(alice_client, conversation, "one.txt", b"first file")
    full = attach(alice_client, conversation, "two.txt", b"second file")

    response = upload(alice_client, conversation, "three.txt", b"third file")

    assert response.status_code == 422
    assert "already has 2 documents, the most your plan allows" in response.text
    assert list(Document.objects.values_list("name", flat=True)) == ["one.txt", "two.txt"]
    assert full.passages.exists()


def test_an_upload_without_a_file_says_to_choose_one(alice_client, conversation):
    url = reverse("documents:upload", args=[conversation.id])

    missing = alice_client.post(url, {"other": "field"}, **HTMX)
    not_multipart = alice_client.post(url, b'{"file": "notes.txt"}', content_type="application/json", **HTMX)

    assert missing.status_code == 422
    assert "Choose a file to attach." in missing.text
    assert not_multipart.status_code == 422
    assert "Choose a file to attach." in not_multipart.text
    assert not Document.objects.exists()


def test_a_file_name_over_255_characters_is_shortened_keeping_its_extension(alice_client, conversation):
    response = upload(alice_client, conversation, "n" * 300 + ".txt", b"words")

    assert response.status_code == 200
    name = Document.objects.get().name
    assert len(name) == 255
    assert name.endswith("n.txt")


def test_without_javascript_a_refusal_is_a_page_that_says_why(alice_client, conversation):
    url = reverse("documents:upload", args=[conversation.id])
    response = alice_client.post(url, {"file": SimpleUploadedFile("empty.txt", b"")})

    assert response.status_code == 400
    assert "empty.txt is empty." in response.text


def test_owner_removes_a_document_and_its_passages(alice_client, conversation):
    document = attach(alice_client, conversation)

    response = alice_client.post(reverse("documents:delete", args=[document.pk]), **HTMX)

    assert response.status_code == 200
    assert "Documents (0)" in response.text
    assert not Document.objects.exists()
    assert not Passage.objects.exists()


def test_a_cited_passage_opens_for_its_owner(alice_client, conversation):
    passage = attach(alice_client, conversation).passages.get()

    page = alice_client.get(passage.get_absolute_url())

    assert page.status_code == 200
    assert "notes.md" in page.text
    assert "Fresnel lenses focus the beam" in page.text


def test_others_cannot_attach_to_remove_or_read_alices_documents(alice_client, bob_client, conversation):
    document = attach(alice_client, conversation)
    passage = document.passages.get()

    assert upload(bob_client, conversation, "bobs.txt", b"words").status_code == 404
    assert bob_client.post(reverse("documents:delete", args=[document.pk]), **HTMX).status_code == 404
    assert bob_client.get(passage.get_absolute_url()).status_code == 404
    assert list(Document.objects.values_list("name", flat=True)) == ["notes.md"]


def test_logged_out_requests_go_to_the_log_in_page(client, conversation):
    response = upload(client, conversation, "notes.txt", b"words")

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
    assert client.get(reverse("documents:passage", args=[1])).status_code == 302
    assert not Document.objects.exists()


def test_unknown_ids_and_wrong_methods_are_refused(alice_client, conversation):
    unknown = "00000000-0000-0000-0000-000000000000"

    assert alice_client.post(reverse("documents:upload", args=[unknown]), **HTMX).status_code == 404
    assert alice_client.post(reverse("documents:delete", args=[2**62]), **HTMX).status_code == 404
    assert alice_client.get(reverse("documents:passage", args=[2**62])).status_code == 404
    assert alice_client.get(reverse("documents:upload", args=[conversation.id])).status_code == 405
    assert alice_client.get(reverse("documents:delete", args=[1])).status_code == 405
