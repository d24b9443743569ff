"""Retrieval over the test corpus, on the database in use (SQLite FTS5, or PostgreSQL's
tsvector when DATABASE_URL says so)."""

from __future__ import annotations

import pytest

from documents import services
from documents.models import Document, Passage
from documents.search import passages_search, query_terms
from documents.vectors import passage_embedder
from generation.models import Conversation
from tests.documents.corpus import DOCUMENTS, PARAPHRASES, QUESTIONS

pytestmark = pytest.mark.django_db


def attach(user, conversation, name: str, text: str) -> Document:
    kind = "markdown" if name.endswith(".md") else "text"
    return services.document_add(
        user=user, conversation_id=conversation.id, name=name, kind=kind, size=len(text.encode()), text=text
    )


@pytest.fixture
def alice_conversation(alice):
    return Conversation.objects.create(user=alice, model="smollm2-135m-instruct")


@pytest.fixture
def corpus(settings, alice, alice_conversation):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = None
    plan = services.account_for(alice).plan
    plan.max_documents_per_conversation = len(DOCUMENTS)
    plan.save()
    if embedder := passage_embedder():  # loaded, as a site's is once warm: hybrid at once
        embedder.load()
    for name, text in DOCUMENTS.items():
        attach(alice, alice_conversation, name, text)
    return alice_conversation


def top_documents(user, conversation, question: str) -> list[str]:
    retrieval = services.retrieval_for(user=user, conversation_id=conversation.id, question=question)
    assert retrieval is not None
    return [source["document"] for source in retrieval.sources[:3]]


def test_the_right_document_is_among_the_top_three_passages_for_all_20_questions(alice, corpus):
    misses = [
        (question, expected, found)
        for question, expected in QUESTIONS
        if expected not in (found := top_documents(alice, corpus, question))
    ]
    assert len(QUESTIONS) == 20
    assert misses == []  # as by words alone: the vectors lose none of them (hybrid retrieval, #35)


def test_the_right_document_is_among_the_top_three_for_at_least_16_of_20_paraphrases(alice, corpus):
    """Questions in words their document does not use: found by meaning (hybrid retrieval).
    bench/retrieval.py reports the figure (18 of 20 when measured; words alone: 0)."""
    misses = [
        (question, expected, found)
        for question, expected in PARAPHRASES
        if expected not in (found := top_documents(alice, corpus, question))
    ]
    assert len(PARAPHRASES) == 20
    assert len(misses) <= 4, misses


def test_the_paraphrases_share_no_searchable_word_with_their_document(alice, corpus):
    documents = dict(Document.objects.filter(conversation=corpus).values_list("name", "id"))
    for question, expected in PARAPHRASES:
        assert passages_search([documents[expected]], query_terms(question), 5) == [], question


def test_the_prompt_numbers_the_passages_as_the_sources_and_asks_for_citations(alice, corpus):
    retrieval = services.retrieval_for(user=alice, conversation_id=corpus.id, question="When do spring tides happen?")

    assert retrieval is not None
    assert retrieval.sources
    assert "[1], [2]" not in retrieval.prompt  # the instruction's example is "[1] or [2]"
    assert "like [1] or [2]" in retrieval.prompt
    for source in retrieval.sources:
        passage = Passage.objects.get(pk=source["passage"])
        assert f"[{source['number']}] From {source['document']}" in retrieval.prompt
        assert passage.text in retrieval.prompt
        assert passage.text.startswith(source["excerpt"].rstrip("…"))
        assert source["url"] == f"/documents/passages/{passage.pk}/"
    assert retrieval.prompt.endswith("Question: When do spring tides happen?")


def test_another_users_documents_are_never_retrieved(alice, bob, corpus):
    bobs = Conversation.objects.create(user=bob, model="smollm2-135m-instruct")
    decoy = "Spring tides happen at new and full moon. Spring tides, spring tides, tides of spring."
    attach(bob, bobs, "bobs-tides.txt", decoy)

    alices_sources = services.retrieval_for(user=alice, conversation_id=corpus.id, question="spring tides moon")
    bobs_sources = services.retrieval_for(user=bob, conversation_id=bobs.id, question="sourdough starter bread")
    # A conversation id of alice's asked for on bob's behalf finds nothing of hers.
    crossed = services.retrieval_for(user=bob, conversation_id=corpus.id, question="spring tides moon")

    assert alices_sources is not None
    assert bobs_sources is not None
    assert "bobs-tides.txt" not in {s["document"] for s in alices_sources.sources}
    assert {s["document"] for s in bobs_sources.sources} <= {"bobs-tides.txt"}
    assert crossed is None


def test_a_conversation_without_documents_has_no_retrieval_stage(alice, alice_conversation):
    assert services.retrieval_for(user=alice, conversation_id=alice_conversation.id, question="tides") is None


def test_a_question_that_matches_nothing_gets_no_sources_and_goes_to_the_model_as_asked(alice, corpus):
    retrieval = services.retrieval_for(user=alice, conversation_id=corpus.id, question="zyzzyva quokka?")

    assert retrieval is not None
    assert retrieval.sources == []
    assert retrieval.prompt == "zyzzyva quokka?"


def test_a_removed_documents_passages_leave_the_index(alice, corpus):
    document = Document.objects.get(name="tides.txt")
    passage_ids = list(document.passages.values_list("id", flat=True))

    services.document_delete(document=document)

    remaining = list(Document.objects.filter(conversation=corpus).values_list("id", flat=True))
    assert not set(passages_search(remaining, ["tides", "moon"], 50)) & set(passage_ids)
    assert "tides.txt" not in top_documents(alice, corpus, "When do spring tides happen?")


def test_query_terms_are_words_without_common_ones_or_search_syntax():
    assert query_terms('What is "NEAR(a b)" OR c* - the tides?') == ["near", "b", "c", "tides"]
    assert query_terms("") == []
    assert len(query_terms(" ".join(f"w{i}" for i in range(100)))) == 12
