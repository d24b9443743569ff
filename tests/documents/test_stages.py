"""An answer from documents runs in stages: retrieving, generating with its sources, then
tokens; the browser's SSE stream, the WebSocket and the page after a reload show the same."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from documents import services as document_services
from generation import routing, services
from generation.models import Conversation, Message
from inference.engine import EngineOverloaded
from inference.generators import SyntheticGenerator
from tests.documents.corpus import DOCUMENTS
from tests.support.engines import install_engine, wait_for_terminal
from tests.support.streams import get_stream, parse_sse, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "When do spring tides happen?"


def attach_corpus(user, conversation, names=("tides.txt", "sourdough.md", "honeybees.md")) -> None:
    for name in names:
        text = DOCUMENTS[name]
        document_services.document_add(
            user=user, conversation_id=conversation.id, name=name, kind="text", size=len(text), text=text
        )


@pytest.fixture
def conversation(alice):
    conversation = Conversation.objects.create(user=alice, model="smollm2-135m-instruct")
    attach_corpus(alice, conversation)
    return conversation


def test_the_stream_says_retrieving_then_generating_with_sources_then_streams_tokens(conversation, fast_engine):
    _, answer = services.message_send(conversation=conversation, prompt=QUESTION)
    events = wait_for_terminal(fast_engine.store, answer.stream_id)

    retrieving, generating, *tokens, done = events
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert (retrieving.type, retrieving.data) == ("status", {"state": "retrieving"})
    assert generating.type == "status"
    assert generating.data["state"] == "generating"
    sources = generating.data["sources"]
    assert sources[0]["document"] == "tides.txt"
    assert sources[0]["number"] == 1
    assert {"number", "document", "passage", "excerpt", "url"} == set(sources[0])
    assert tokens
    assert {e.type for e in tokens} == {"token"}
    assert done.type == "done"
    answer.refresh_from_db()
    assert answer.status == "complete"
    assert answer.sources == sources


def test_the_prompt_carries_the_numbered_passages_and_asks_for_citations(conversation, fast_engine, monkeypatch):
    submitted = []
    real_submit = fast_engine.submit
    monkeypatch.setattr(fast_engine, "submit", lambda job: (submitted.append(job), real_submit(job)))

    _, answer = services.message_send(conversation=conversation, prompt=QUESTION)
    wait_for_terminal(fast_engine.store, answer.stream_id)

    last_turn = submitted[0].prompt[-1]
    assert last_turn["role"] == "user"
    assert "[1] From tides.txt" in last_turn["content"]
    assert "like [1] or [2]" in last_turn["content"]
    assert last_turn["content"].endswith(f"Question: {QUESTION}")
    prompt = Message.objects.get(conversation=conversation, role="user")
    assert prompt.content == QUESTION  # the conversation shows the question as asked


def test_regenerate_retrieves_again(conversation, fast_engine):
    _, first = services.message_send(conversation=conversation, prompt=QUESTION)
    wait_for_terminal(fast_engine.store, first.stream_id)

    second = services.message_regenerate(answer=Message.objects.get(pk=first.pk))
    events = wait_for_terminal(fast_engine.store, second.stream_id)

    assert [e.data.get("state") for e in events[:2]] == ["retrieving", "generating"]
    assert Message.objects.get(pk=second.pk).sources == events[1].data["sources"]


def test_a_conversation_without_documents_has_no_stages(alice, fast_engine):
    conversation = Conversation.objects.create(user=alice, model="smollm2-135m-instruct")

    _, answer = services.message_send(conversation=conversation, prompt=QUESTION)
    events = wait_for_terminal(fast_engine.store, answer.stream_id)

    assert "status" not in {e.type for e in events}
    assert Message.objects.get(pk=answer.pk).sources == []


async def test_the_browsers_stream_and_the_reloaded_page_show_the_same_sources(alice_client, conversation, fast_engine):
    _, answer = await sync_to_async(services.message_send)(conversation=conversation, prompt=QUESTION)

    response = await get_stream(answer.get_stream_url(), session_headers(alice_client))
    events = parse_sse(response["body"])

    assert [e["event"] for e in events[:2]] == ["status", "status"]
    assert json.loads(events[0]["data"]) == {"state": "retrieving"}
    generating = json.loads(events[1]["data"])
    assert generating["state"] == "generating"
    assert {e["event"] for e in events[2:-1]} == {"token"}
    assert events[-1]["event"] == "done"
    for source in generating["sources"]:
        link = f'<a href="{source["url"]}">[{source["number"]}] {source["document"]}</a>'
        assert link in events[-1]["data"]  # the saved answer the page swaps in
        page = await sync_to_async(alice_client.get)(conversation.get_absolute_url())
        assert link in page.text  # and the page after a reload


async def test_the_websocket_relays_the_same_stages(alice_client, conversation, fast_engine):
    communicator = WebsocketCommunicator(
        routing.websocket_application,
        f"/ws/chat/{conversation.id}/",
        headers=[*session_headers(alice_client), (b"origin", b"http://localhost")],
    )
    assert (await communicator.connect())[0]

    await communicator.send_json_to({"type": "generate", "prompt": QUESTION})
    started = await communicator.receive_json_from(timeout=5)
    received = []
    while not received or received[-1]["type"] not in ("done", "error"):
        received.append(await communicator.receive_json_from(timeout=10))
    await communicator.disconnect()

    assert started["type"] == "started"
    assert received[0] == {"type": "status", "seq": 1, "state": "retrieving"}
    assert received[1]["state"] == "generating"
    assert received[1]["sources"][0]["document"] == "tides.txt"
    assert {m["type"] for m in received[2:-1]} == {"token"}
    assert received[-1]["type"] == "done"
    saved = await Message.objects.aget(pk=started["message_id"])
    assert saved.sources == received[1]["sources"]


def test_an_answer_the_queue_refuses_leaves_no_answer_and_its_stream_ends(conversation, stream_store):
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20), max_concurrent=1, max_queue=0)
    try:
        _, running = services.message_send(conversation=conversation, prompt=QUESTION)
        with pytest.raises(EngineOverloaded):
            services.message_send(conversation=conversation, prompt="Why are pyroclastic flows dangerous?")

        assert list(Message.objects.filter(role="assistant").values_list("pk", flat=True)) == [running.pk]
        refused = [sid for sid in stream_store._streams if sid != running.stream_id]
        assert len(refused) == 1
        events = stream_store.events(refused[0])
        assert [e.data.get("state") for e in events[:2]] == ["retrieving", "generating"]
        assert events[-1].terminal
        assert events[-1].type == "error"
    finally:
        stream_store.cancel(running.stream_id)
        engine.stop(10)
