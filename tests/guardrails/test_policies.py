"""Content policies at work: prompts refused or masked at the door, answers masked before
any reader, the response cache or the saved message sees them, the review queue."""

from __future__ import annotations

import json
import re
import uuid

import httpx
import openai
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from accounts.models import Account, Plan, UsageRecord
from accounts.services import account_for, api_key_create
from api.models import StoredResponse
from generation import services as chat
from generation.models import Conversation, Message
from generation.sharing import shared_link_publish
from guardrails import rule_cache
from guardrails.models import PolicyEvent, PolicyRule
from inference.generators import SYNTHETIC_TEXT, SyntheticGenerator
from tests.support.api_client import MODEL, assert_error, get, post, sse
from tests.support.engines import install_engine, wait_for_terminal, wait_until
from tests.support.streams import get_stream, parse_sse, session_headers

pytestmark = pytest.mark.django_db(transaction=True)

HTMX = {"HTTP_HX_REQUEST": "true"}
WORDS = SYNTHETIC_TEXT.split()
# The synthetic model's first twelve words: "Streaming tokens one at a time lets people read
# the answer while it".
ANSWER = " ".join(WORDS[:12])
MASKED = ANSWER.replace("people", "[who]")


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


@pytest.fixture
def bob_key(bob) -> str:
    return api_key_create(user=bob, name="test")[1]


def rule(**fields) -> PolicyRule:
    defaults = {"name": "rule", "matcher": "words", "stage": "both", "action": "mask"}
    return PolicyRule.objects.create(**(defaults | fields))


@pytest.fixture
def people_masked() -> PolicyRule:
    return rule(name="no people", pattern="people", stage="answer", message="[who]")


def chat_body(content: str = "Hello", **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def streamed_text(response) -> tuple[str, list[dict]]:
    events = sse(response)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(data) for _, data in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, chunks


# -- prompts -------------------------------------------------------------------------------


async def test_the_openai_client_gets_a_400_with_the_policys_code_for_a_blocked_prompt(alice, alice_key, fast_engine):
    await sync_to_async(rule)(
        name="no launch codes", pattern="launch codes", stage="prompt", action="block", message="Not that."
    )
    transport = httpx.ASGITransport(app=get_asgi_application())
    client = openai.AsyncOpenAI(
        base_url="http://testserver/v1", api_key=alice_key, http_client=httpx.AsyncClient(transport=transport)
    )

    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me the LAUNCH CODES."}], max_tokens=5
        )

    assert refused.value.status_code == 400
    assert refused.value.code == "content_policy_violation"
    assert refused.value.body["message"] == "Not that."
    assert not await UsageRecord.objects.filter(user=alice).aexists()  # no tokens, no request counted
    event = await PolicyEvent.objects.aget()
    assert (event.rule_name, event.action, event.stage, event.channel) == ("no launch codes", "block", "prompt", "api")
    assert event.user_id == alice.pk
    assert event.excerpt == "LAUNCH CODES"


def test_a_blocked_chat_prompt_is_refused_in_words_and_stays_in_the_box(alice, alice_client, fast_engine):
    rule(name="no launch codes", pattern="launch codes", stage="prompt", action="block", message="Not that, sorry.")

    response = alice_client.post(reverse("generation:chat"), {"prompt": "What are the launch codes?"}, **HTMX)

    page = response.content.decode()
    assert response.status_code == 422
    assert "Not that, sorry." in page
    assert "What are the launch codes?" in page  # the typed text is kept in the box
    assert not Conversation.objects.exists()
    assert not UsageRecord.objects.exists()
    assert PolicyEvent.objects.get().user == alice


def test_a_masked_prompt_reaches_the_model_masked(alice, alice_key, stream_store):
    seen: list = []

    class Listening(SyntheticGenerator):
        def generate(self, prompt, params, on_token, should_stop):
            seen.append(prompt)
            return super().generate(prompt, params, on_token, should_stop)

    engine = install_engine(stream_store, Listening(tokens_per_s=500, answer_words=3), scheduler="sequential")
    try:
        rule(name="personal data", matcher="pii", pattern="email", stage="prompt")
        response = post("/v1/chat/completions", chat_body("Write to alice@example.com now."), alice_key)
    finally:
        engine.stop(5)

    assert response.status_code == 200, response.content
    assert seen[0][-1]["content"] == "Write to [email] now."
    assert not PolicyEvent.objects.exists()  # a mask is counted, not queued for review


def test_a_rule_scoped_to_other_models_channels_or_plans_does_not_apply(alice, alice_key, fast_engine):
    rule(name="elsewhere", pattern="hello", stage="prompt", action="block", model_names=["other-model"])
    rule(name="chat only", pattern="hello", stage="prompt", action="block", channels=["ui"])

    assert post("/v1/chat/completions", chat_body("hello", max_tokens=2), alice_key).status_code == 200


def test_a_rule_scoped_to_a_plan_applies_to_its_users_alone(alice, bob, alice_key, bob_key, fast_engine):
    guests = Plan.objects.create(name="guests")
    Account.objects.filter(pk=account_for(bob).pk).update(plan=guests)
    rule(name="guests only", pattern="hello", stage="prompt", action="block").plans.add(guests)

    assert post("/v1/chat/completions", chat_body("hello", max_tokens=2), alice_key).status_code == 200
    assert_error(
        post("/v1/chat/completions", chat_body("hello", max_tokens=2), bob_key), 400, "content_policy_violation"
    )


# -- answers -------------------------------------------------------------------------------


def test_a_masked_answer_streams_is_saved_and_resumes_masked(alice, alice_key, fast_engine, people_masked):
    body = chat_body(stream=True, stream_options={"resumable": True})

    text, chunks = streamed_text(post("/v1/chat/completions", body, alice_key))
    record = UsageRecord.objects.get(user=alice)
    events = wait_for_terminal(fast_engine.store, record.stream_id)
    completion_id = chunks[0]["id"]
    resumed, _ = streamed_text(get(f"/v1/streams/{completion_id}", alice_key, HTTP_LAST_EVENT_ID="2"))
    replayed, _ = streamed_text(get(f"/v1/streams/{completion_id}?after=0", alice_key))

    assert text == MASKED
    assert "people" not in json.dumps([event.data for event in events])  # nothing unmasked in the store
    assert resumed and MASKED.endswith(resumed)
    assert replayed == MASKED


def test_bob_cannot_read_alices_masked_stream(alice_key, bob_key, fast_engine, people_masked):
    chunks = streamed_text(post("/v1/chat/completions", chat_body(stream=True), alice_key))[1]
    assert get(f"/v1/streams/{chunks[0]['id']}", bob_key).status_code == 404


def test_a_chat_answer_is_saved_masked_and_reloads_masked(alice, alice_client, fast_engine, people_masked):
    conversation = chat.conversation_create(user=alice)
    _, answer = chat.message_send(conversation=conversation, prompt="Hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    answer.refresh_from_db()

    assert answer.content == MASKED
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "[who]" in page
    assert "people" not in page
    exported = alice_client.get(reverse("generation:conversation_export_json", args=[conversation.id]))
    assert "people" not in exported.content.decode()


def test_the_response_cache_keeps_and_replays_only_the_masked_answer(alice, alice_key, fast_engine, settings):
    settings.CHAT_RESPONSE_CACHE = "user"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid.uuid4().hex}
    }
    rule(name="no people", pattern="people", stage="answer", message="[who]")
    body = chat_body(stream=True, temperature=0)

    first = post("/v1/chat/completions", body, alice_key)
    first_text, _ = streamed_text(first)
    again = post("/v1/chat/completions", body, alice_key)
    again_text, _ = streamed_text(again)

    assert (first["x-chatsite-cache"], again["x-chatsite-cache"]) == ("miss", "hit")
    assert first_text == again_text == MASKED


def test_a_changed_rule_is_not_bypassed_by_an_answer_cached_before_it(alice, alice_key, fast_engine, settings):
    settings.CHAT_RESPONSE_CACHE = "user"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid.uuid4().hex}
    }
    body = chat_body(stream=True, temperature=0)
    assert streamed_text(post("/v1/chat/completions", body, alice_key))[0] == ANSWER
    rule(name="no people", pattern="people", stage="answer", message="[who]")

    later = post("/v1/chat/completions", body, alice_key)

    assert later["x-chatsite-cache"] == "miss"
    assert streamed_text(later)[0] == MASKED


def test_a_blocked_answer_ends_with_the_policys_message(alice, alice_key, fast_engine):
    rule(
        name="no reading",
        matcher="regex",
        pattern=r"read the answer",
        stage="answer",
        action="block",
        message="Stopped.",
    )

    response = post("/v1/chat/completions", chat_body(), alice_key)

    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == "Streaming tokens one at a time lets people \n\nStopped."
    assert choice["finish_reason"] == "content_filter"
    event = PolicyEvent.objects.get()
    assert (event.action, event.stage, event.excerpt, event.user) == ("block", "answer", "read the answer", alice)


def test_a_flagged_answer_goes_to_the_review_queue_and_redaction_changes_the_saved_text(
    alice, admin_client, fast_engine, settings
):
    settings.CHAT_SHARING = "users"
    rule(name="people watch", pattern="people", stage="answer", action="flag")
    conversation = chat.conversation_create(user=alice)
    _, answer = chat.message_send(conversation=conversation, prompt="Hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    link = shared_link_publish(conversation=conversation)
    event = PolicyEvent.objects.get()
    answer.refresh_from_db()
    assert answer.content == ANSWER  # a flag changes nothing
    assert (event.message_id, event.excerpt, event.review, event.user) == (answer.pk, "people", "open", alice)

    queue = admin_client.get(reverse("admin:guardrails_policyevent_changelist") + "?review=open")
    assert "people watch" in queue.content.decode()
    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"),
        {"action": "redact", "_selected_action": [event.pk]},
    )

    answer.refresh_from_db()
    event.refresh_from_db()
    assert answer.content == ANSWER.replace("people", "[redacted]")
    assert (event.review, event.excerpt) == ("redacted", "[redacted]")
    link.refresh_from_db()
    assert [shown["content"] for shown in link.messages] == ["Hello", ANSWER.replace("people", "[redacted]")]


def test_the_review_queues_delete_removes_the_messages_text(alice, admin_client, fast_engine):
    rule(name="people watch", pattern="people", stage="answer", action="flag")
    _, answer = chat.message_send(conversation=chat.conversation_create(user=alice), prompt="Hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)

    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"),
        {"action": "delete_text", "_selected_action": [PolicyEvent.objects.get().pk]},
    )

    assert Message.objects.get(pk=answer.pk).content == "[removed by a moderator]"


def test_the_review_queue_is_for_staff_only(bob_client):
    response = bob_client.get(reverse("admin:guardrails_policyevent_changelist"))
    assert response.status_code == 302


def test_metrics_count_matches_by_rule_and_action(alice, alice_key, client, fast_engine, people_masked):
    post("/v1/chat/completions", chat_body(), alice_key)

    text = client.get("/metrics").content.decode()

    assert re.search(r'chatsite_policy_matches_total\{action="mask",rule="no people",stage="answer"\} [1-9]', text)


async def test_a_reloaded_chat_stream_resumed_with_last_event_id_is_masked(alice, alice_client, fast_engine):
    await sync_to_async(rule)(name="no people", pattern="people", stage="answer", message="[who]")
    conversation = await sync_to_async(chat.conversation_create)(user=alice)
    _, answer = await sync_to_async(chat.message_send)(conversation=conversation, prompt="Hello")
    await sync_to_async(wait_for_terminal)(fast_engine.store, answer.stream_id)
    headers = await sync_to_async(session_headers)(alice_client)

    whole = parse_sse((await get_stream(answer.get_stream_url(), headers))["body"])
    resumed = parse_sse((await get_stream(answer.get_stream_url(), [*headers, (b"last-event-id", b"3")]))["body"])

    assert "".join(json.loads(e["data"])["delta"] for e in whole if e["event"] == "token") == MASKED
    resumed_text = "".join(json.loads(e["data"])["delta"] for e in resumed if e["event"] == "token")
    assert resumed_text and MASKED.endswith(resumed_text)
    assert "people" not in json.dumps(whole + resumed)


def test_stop_saves_exactly_the_masked_text_its_readers_got(alice, stream_store):
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=40))
    try:
        rule(name="no people", pattern="people", stage="answer", message="[who]")
        _, answer = chat.message_send(conversation=chat.conversation_create(user=alice), prompt="Hello")
        # Stopped near the masked word: it is being generated, or is held back, or just went out.
        wait_until(lambda: "lets" in "".join(e.data.get("delta", "") for e in stream_store.events(answer.stream_id)))
        chat.message_stop(message=answer)
        events = wait_for_terminal(stream_store, answer.stream_id)
    finally:
        engine.stop(5)
    answer.refresh_from_db()

    streamed = "".join(e.data["delta"] for e in events if e.type == "token")
    assert answer.status == "stopped"
    assert answer.content == streamed  # what was held back went out, masked, before the end
    assert SYNTHETIC_TEXT.replace("people", "[who]").startswith(streamed)
    assert "people" not in streamed


def test_a_flagged_chat_prompt_is_queued_and_redacted_in_the_saved_prompt(alice, admin_client, fast_engine):
    rule(name="secrets watch", pattern="secret", stage="prompt", action="flag")
    prompt, answer = chat.message_send(conversation=chat.conversation_create(user=alice), prompt="A secret, hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    event = PolicyEvent.objects.get()
    assert (event.stage, event.channel, event.stream_id, event.excerpt) == ("prompt", "ui", answer.stream_id, "secret")

    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"), {"action": "redact", "_selected_action": [event.pk]}
    )

    prompt.refresh_from_db()
    assert prompt.content == "A [redacted], hello"


# -- the response cache after a redaction --------------------------------------------------


@pytest.fixture
def response_cache(settings) -> None:
    settings.CHAT_RESPONSE_CACHE = "user"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": uuid.uuid4().hex}
    }


@pytest.mark.parametrize("action", ["redact", "delete_text"])
def test_a_redaction_evicts_the_cached_answer_so_it_is_not_replayed(
    alice_key, admin_client, fast_engine, response_cache, action
):
    rule(name="people watch", pattern="people", stage="answer", action="flag")
    body = chat_body(stream=True, temperature=0)
    first = post("/v1/chat/completions", body, alice_key)
    streamed_text(first)
    again = post("/v1/chat/completions", body, alice_key)
    assert (first["x-chatsite-cache"], streamed_text(again)[0], again["x-chatsite-cache"]) == ("miss", ANSWER, "hit")

    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"),
        {"action": action, "_selected_action": [PolicyEvent.objects.get().pk]},
    )
    later = post("/v1/chat/completions", body, alice_key)

    assert later["x-chatsite-cache"] == "miss"  # generated again, not replayed from the cache
    streamed_text(later)


def test_a_redacted_prompts_answer_is_evicted_even_when_it_was_served_from_the_cache(
    alice_key, admin_client, fast_engine, response_cache
):
    body = chat_body("A secret, hello", stream=True, temperature=0)
    streamed_text(post("/v1/chat/completions", body, alice_key))
    rule(name="secrets watch", pattern="secret", stage="prompt", action="flag")
    served = post("/v1/chat/completions", body, alice_key)  # the rule joins no key: a prompt rule
    streamed_text(served)
    assert served["x-chatsite-cache"] == "hit"

    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"),
        {"action": "redact", "_selected_action": [PolicyEvent.objects.get().pk]},
    )

    assert post("/v1/chat/completions", body, alice_key)["x-chatsite-cache"] == "miss"


# -- a masked prompt is stored masked ------------------------------------------------------


@pytest.fixture
def emails_masked() -> PolicyRule:
    return rule(name="personal data", matcher="pii", pattern="email", stage="prompt")


@pytest.fixture
def listening(stream_store):
    """An engine that keeps the prompts its model was given."""
    seen: list = []

    class Listening(SyntheticGenerator):
        def generate(self, prompt, params, on_token, should_stop):
            seen.append(prompt)
            return super().generate(prompt, params, on_token, should_stop)

    engine = install_engine(stream_store, Listening(tokens_per_s=500, answer_words=3), scheduler="sequential")
    yield seen
    engine.stop(5)


def test_a_masked_chat_prompt_is_saved_as_the_model_read_it(alice, listening, emails_masked, stream_store):
    conversation = chat.conversation_create(user=alice)

    prompt, answer = chat.message_send(conversation=conversation, prompt="Write to alice@example.com now.")
    wait_for_terminal(stream_store, answer.stream_id)
    conversation.refresh_from_db()

    assert prompt.content == listening[0][-1]["content"] == "Write to [email] now."
    assert Message.objects.get(pk=prompt.pk).content == "Write to [email] now."
    assert "alice@" not in conversation.title


def test_an_edited_prompt_is_saved_masked(alice, listening, emails_masked, stream_store):
    conversation = chat.conversation_create(user=alice)
    prompt, answer = chat.message_send(conversation=conversation, prompt="Hello")
    wait_for_terminal(stream_store, answer.stream_id)

    edited, answer = chat.message_edit(prompt=prompt, content="Mail bob@example.com instead")
    wait_for_terminal(stream_store, answer.stream_id)

    assert Message.objects.get(pk=edited.pk).content == listening[-1][-1]["content"] == "Mail [email] instead"


def test_a_prompt_posted_in_the_chat_page_shows_masked(alice, alice_client, listening, emails_masked):
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Write to alice@example.com now."}, **HTMX)

    assert response.status_code == 200, response.content.decode()[:2000]
    assert Message.objects.get(role="user").content == "Write to [email] now."
    assert "alice@example.com" not in response.content.decode()


def test_a_stored_response_keeps_its_instructions_and_input_masked(alice_key, listening, emails_masked):
    body = {
        "model": MODEL,
        "instructions": "Sign as bob@example.com.",
        "input": "Write to alice@example.com now.",
        "max_output_tokens": 3,
    }

    response = post("/v1/responses", body, alice_key)

    assert response.status_code == 200, response.content
    assert response.json()["instructions"] == "Sign as [email]."
    stored = StoredResponse.objects.get()
    assert stored.instructions == "Sign as [email]."
    assert stored.input == [{"role": "user", "content": "Write to [email] now."}]
    assert listening[0] == [
        {"role": "system", "content": "Sign as [email]."},
        {"role": "user", "content": "Write to [email] now."},
    ]
    retrieved = get(f"/v1/responses/{response.json()['id']}", alice_key).json()
    assert "bob@example.com" not in str(retrieved) and "alice@example.com" not in str(retrieved)


# -- rules read once per process -----------------------------------------------------------


def test_an_admission_reads_no_rules_from_the_database_once_they_are_remembered(alice_key, fast_engine):
    rule(name="no people", pattern="people", stage="answer", message="[who]")
    rule(name="no codes", pattern="launch codes", stage="prompt", action="block")
    assert post("/v1/chat/completions", chat_body(max_tokens=2), alice_key).status_code == 200  # reads them

    with CaptureQueriesContext(connection) as admission:
        response = post("/v1/chat/completions", chat_body(max_tokens=2), alice_key)

    assert response.status_code == 200
    assert not [query["sql"] for query in admission.captured_queries if "guardrails_policyrule" in query["sql"]]


def test_a_rule_changed_in_another_process_applies_at_the_next_request(alice_key, fast_engine):
    rule(name="no hello", pattern="hello", stage="prompt", action="block", enabled=False)
    assert post("/v1/chat/completions", chat_body(max_tokens=2), alice_key).status_code == 200

    PolicyRule.objects.update(enabled=True)  # behind the model's back: nobody was told
    cache.set(rule_cache.VERSION_KEY, "another process saved a rule")  # as its save tells every process

    assert_error(post("/v1/chat/completions", chat_body(max_tokens=2), alice_key), 400, "content_policy_violation")


def admin_form(**fields) -> dict:
    return {
        "name": "no hello",
        "position": "0",
        "enabled": "on",
        "matcher": "words",
        "pattern": "hello",
        "stage": "prompt",
        "action": "block",
        "message": "",
        "channels": "",
        "model_names": "",
        "moderation_timeout_s": "2",
        "moderation_fail_open": "on",
        **fields,
    }


def hello(key: str):
    return post("/v1/chat/completions", chat_body("hello", max_tokens=2), key)


def test_a_rule_added_in_the_admin_applies_to_the_next_request(alice_key, admin_client, fast_engine):
    assert hello(alice_key).status_code == 200  # the rules (none) are remembered

    added = admin_client.post(reverse("admin:guardrails_policyrule_add"), admin_form())

    assert added.status_code == 302
    assert_error(hello(alice_key), 400, "content_policy_violation")


def test_a_plan_given_to_a_rule_in_the_admin_narrows_it_at_once(alice_key, admin_client, fast_engine):
    blocking = rule(name="no hello", pattern="hello", stage="prompt", action="block")
    assert hello(alice_key).status_code == 400
    guests = Plan.objects.create(name="guests")

    changed = admin_client.post(
        reverse("admin:guardrails_policyrule_change", args=[blocking.pk]), admin_form(plans=[guests.pk])
    )

    assert changed.status_code == 302
    assert hello(alice_key).status_code == 200  # alice's plan is not the rule's any more


def test_rules_deleted_together_in_the_admin_stop_applying_at_once(alice_key, admin_client, fast_engine):
    blocking = rule(name="no hello", pattern="hello", stage="prompt", action="block")
    assert hello(alice_key).status_code == 400

    admin_client.post(
        reverse("admin:guardrails_policyrule_changelist"),
        {"action": "delete_selected", "_selected_action": [blocking.pk], "post": "yes"},
    )

    assert not PolicyRule.objects.exists()
    assert hello(alice_key).status_code == 200
