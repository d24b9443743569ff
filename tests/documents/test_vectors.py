"""Passage vectors: written as documents are added (in the background for big ones, with
progress in the panel), back-filled by `manage.py embed_passages`, searched on the database
in use (the exact search where neither sqlite-vec nor pgvector is there)."""

from __future__ import annotations

import io
import os

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from documents import services, vectors
from documents.models import Document, Passage, PassageVector
from generation.models import Conversation
from inference.embedding import EmbeddingFailed, available_embedding_models
from tests.documents.corpus import DOCUMENTS

pytestmark = pytest.mark.skipif(
    "all-minilm-l6-v2" not in available_embedding_models(), reason="the embedding model's package is not installed"
)

HTMX = {"HTTP_HX_REQUEST": "true"}
# 40 paragraphs of ~50 words pack into 10+ passages.
BIG = "\n\n".join(
    f"Paragraph {n} is about lighthouses, their keepers and the lenses that focus the beam far out to sea. " * 3
    for n in range(40)
)


@pytest.fixture
def conversation(alice):
    return Conversation.objects.create(user=alice, model="smollm2-135m-instruct")


def add(user, conversation, name: str, text: str) -> Document:
    return services.document_add(
        user=user, conversation_id=conversation.id, name=name, kind="text", size=len(text), text=text
    )


def unembedded(document: Document) -> int:
    return document.passages.filter(vector__isnull=True).count()


@pytest.mark.django_db
def test_a_small_documents_passages_get_their_vectors_as_it_is_added(alice, conversation):
    vectors.passage_embedder().load()
    document = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])

    rows = PassageVector.objects.filter(passage__document=document)
    assert rows.count() == document.passages.count() > 0
    assert {row.model for row in rows} == {"all-minilm-l6-v2"}
    assert {len(bytes(row.vector)) for row in rows} == {384 * 4}


@pytest.mark.django_db(transaction=True)
def test_an_upload_never_waits_for_the_embedding_models_first_load(alice, conversation, monkeypatch):
    """The model's first load takes seconds: a small document is then embedded in the
    background too, and the upload answers at once."""
    monkeypatch.setattr(vectors.passage_embedder(), "_model", None)  # as in a process that has not loaded it
    started: list[int] = []
    monkeypatch.setattr(services, "document_embed_later", started.append)

    document = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])

    assert started == [document.pk]
    assert unembedded(document) == document.passages.count() > 0


@pytest.mark.django_db
def test_a_question_asked_before_the_model_is_loaded_is_answered_by_its_words(alice, conversation, monkeypatch):
    add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])
    embedder = vectors.passage_embedder()
    monkeypatch.setattr(embedder, "_model", None)
    loads: list[str] = []
    monkeypatch.setattr(embedder, "load_in_background", lambda: loads.append("begun"))

    retrieval = services.retrieval_for(user=alice, conversation_id=conversation.id, question="spring tides moon")

    assert retrieval is not None and retrieval.sources[0]["document"] == "tides.txt"
    assert loads == ["begun"]


@pytest.mark.django_db(transaction=True)
def test_a_big_document_is_embedded_in_the_background_and_the_panel_shows_how_far(
    alice, alice_client, conversation, monkeypatch
):
    monkeypatch.setattr(services, "INLINE_PASSAGES", 2)
    started: list[int] = []
    monkeypatch.setattr(services, "document_embed_later", started.append)  # held back, to look at first

    document = add(alice, conversation, "lighthouses.txt", BIG)
    total = document.passages.count()
    panel = alice_client.get(reverse("documents:panel", args=[conversation.id]), **HTMX)

    assert started == [document.pk]
    assert total > 2 and unembedded(document) == total
    assert f"indexing 0/{total}" in panel.text
    assert 'hx-trigger="every 2s"' in panel.text  # it asks again until done

    vectors.document_embed_later(document.pk).join(timeout=120)
    panel = alice_client.get(reverse("documents:panel", args=[conversation.id]), **HTMX)

    assert unembedded(document) == 0
    assert "indexing" not in panel.text
    assert "every 2s" not in panel.text


@pytest.mark.django_db
def test_the_documents_panel_of_another_users_conversation_is_not_found(bob, conversation, client):
    client.force_login(bob)
    assert client.get(reverse("documents:panel", args=[conversation.id]), **HTMX).status_code == 404


@pytest.mark.django_db
def test_embed_passages_back_fills_the_passages_without_vectors(alice, conversation):
    first = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])
    second = add(alice, conversation, "honeybees.md", DOCUMENTS["honeybees.md"])
    PassageVector.objects.all().delete()  # as documents added before hybrid retrieval

    output = io.StringIO()
    call_command("embed_passages", "--document", str(first.pk), stdout=output)
    assert (unembedded(first), unembedded(second)) == (0, second.passages.count())

    call_command("embed_passages", stdout=output)
    assert unembedded(second) == 0
    assert f"{Passage.objects.count()} passages embedded" not in output.getvalue()  # never one twice
    assert PassageVector.objects.count() == Passage.objects.count()


@pytest.mark.django_db
def test_a_removed_documents_vectors_go_with_it(alice, conversation):
    document = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])

    services.document_delete(document=document)

    assert not PassageVector.objects.exists()


@pytest.mark.django_db
def test_the_vector_search_finds_the_passage_by_meaning_within_the_documents_given(alice, bob, conversation):
    tides = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])
    bees = add(alice, conversation, "honeybees.md", DOCUMENTS["honeybees.md"])
    bobs = add(bob, Conversation.objects.create(user=bob, model="m"), "tides-copy.txt", DOCUMENTS["tides.txt"])
    embedder = vectors.passage_embedder()
    assert embedder is not None
    query = embedder.embed(["What makes the sea rise and fall twice daily?"]).vectors[0]

    found = vectors.vector_search().ranked([tides.pk, bees.pk], embedder.name, query, 5)

    assert found and Passage.objects.get(pk=found[0]).document == tides
    assert not set(found) & set(bobs.passages.values_list("pk", flat=True))
    nothing = embedder.embed(["zyzzyva quokka"]).vectors[0]
    assert vectors.vector_search().ranked([tides.pk, bees.pk], embedder.name, nothing, 5) == []


@pytest.mark.django_db
def test_the_exact_search_and_the_databases_own_agree(alice, conversation):
    """Where sqlite-vec or pgvector searches, its ranking is the exact search's."""
    for name in ("tides.txt", "honeybees.md", "volcanoes.txt", "sourdough.md"):
        add(alice, conversation, name, DOCUMENTS[name])
    ids = list(Document.objects.values_list("pk", flat=True))
    embedder = vectors.passage_embedder()
    assert embedder is not None
    query = embedder.embed(["Which insects make honey?"]).vectors[0]
    own = vectors.vector_search()
    if isinstance(own, vectors.ExactVectorSearch):
        # tests/documents/test_sqlite_vec.py runs this under a Python that must use sqlite-vec.
        assert os.environ.get("CHATSITE_REQUIRE_SQLITE_VEC") != "1", "sqlite-vec is not what searches here"
        pytest.skip(f"{connection.vendor} here has neither sqlite-vec loadable nor pgvector: the exact search is used")

    assert own.ranked(ids, embedder.name, query, 5) == vectors.ExactVectorSearch().ranked(ids, embedder.name, query, 5)


@pytest.mark.django_db
def test_without_an_embedding_model_documents_are_found_by_their_words(alice, conversation, monkeypatch):
    monkeypatch.setattr(vectors, "passage_embedder", lambda: None)
    monkeypatch.setattr(services, "passage_embedder", lambda: None)

    add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])
    retrieval = services.retrieval_for(user=alice, conversation_id=conversation.id, question="spring tides moon")

    assert not PassageVector.objects.exists()
    assert retrieval is not None and retrieval.sources[0]["document"] == "tides.txt"


class BrokenEmbedder:
    name = "all-minilm-l6-v2"
    loaded = True  # loaded, and failing as it runs

    def token_ids(self, texts, *, truncate):
        raise EmbeddingFailed("its files are damaged")

    embed = submit = token_ids


@pytest.mark.django_db
def test_a_model_that_fails_leaves_documents_found_by_their_words(alice, conversation, monkeypatch):
    monkeypatch.setattr(vectors, "passage_embedder", BrokenEmbedder)
    monkeypatch.setattr(services, "passage_embedder", BrokenEmbedder)

    document = add(alice, conversation, "tides.txt", DOCUMENTS["tides.txt"])
    retrieval = services.retrieval_for(user=alice, conversation_id=conversation.id, question="spring tides moon")

    assert unembedded(document) == document.passages.count()
    assert retrieval is not None and retrieval.sources[0]["document"] == "tides.txt"
