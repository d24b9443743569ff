"""A moderation service (OpenAI's /v1/moderations shape) as a rule, on prompts and on answers:
a real local HTTP server (tests/guardrails/conftest.py) that flags, answers slowly, or is
not there at all."""

from __future__ import annotations

import json
import time

import pytest
from django.urls import reverse

from accounts.models import UsageRecord
from accounts.services import api_key_create
from generation import services as chat
from guardrails.models import PolicyEvent, PolicyRule
from tests.guardrails.moderation_server import SLOW_S, ModerationHandler
from tests.support.api_client import MODEL, assert_error, post
from tests.support.engines import wait_for_terminal

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alice_key(alice) -> str:
    return api_key_create(user=alice, name="test")[1]


def moderated(url: str, **fields) -> PolicyRule:
    defaults = {"name": "moderation", "matcher": "moderation", "pattern": url, "stage": "prompt", "action": "block"}
    return PolicyRule.objects.create(**(defaults | fields))


def ask(key: str, content: str):
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    started = time.monotonic()
    response = post("/v1/chat/completions", body, key)
    return response, time.monotonic() - started


def test_a_prompt_the_service_flags_is_refused_and_one_it_passes_runs(alice, alice_key, fast_engine, moderation):
    moderated(f"{moderation}/v1/moderations", message="The moderation service refused this.", moderation_token="t0k")

    refused, _ = ask(alice_key, "something forbidden")
    allowed, _ = ask(alice_key, "something fine")

    error = assert_error(refused, 400, "content_policy_violation")
    assert error["message"] == "The moderation service refused this."
    assert allowed.status_code == 200
    assert [seen["body"]["input"] for seen in ModerationHandler.seen] == ["something forbidden", "something fine"]
    assert ModerationHandler.seen[0]["authorization"] == "Bearer t0k"
    assert UsageRecord.objects.filter(user=alice).count() == 1
    assert PolicyEvent.objects.get().excerpt == "something forbidden"


def test_a_flag_from_the_service_lets_the_prompt_run_and_queues_it(alice, alice_key, fast_engine, moderation):
    moderated(f"{moderation}/v1/moderations", action="flag")

    response, _ = ask(alice_key, "forbidden but allowed")

    assert response.status_code == 200
    event = PolicyEvent.objects.get()
    assert (event.action, event.review, event.user) == ("flag", "open", alice)


def test_a_slow_service_that_fails_open_costs_only_its_timeout(alice_key, fast_engine, moderation):
    moderated(f"{moderation}/slow/v1/moderations", moderation_timeout_s=0.3, moderation_fail_open=True)

    response, took = ask(alice_key, "forbidden, but the service is too slow to say")

    assert response.status_code == 200
    assert took < SLOW_S


def test_a_slow_service_that_fails_closed_refuses_within_its_timeout(alice_key, fast_engine, moderation):
    moderated(f"{moderation}/slow/v1/moderations", moderation_timeout_s=0.3, moderation_fail_open=False)

    response, took = ask(alice_key, "harmless")

    assert_error(response, 400, "content_policy_violation")
    assert took < SLOW_S


@pytest.mark.parametrize(("fail_open", "status"), [(True, 200), (False, 400)])
def test_a_service_that_is_down_allows_or_refuses_as_its_rule_says(alice_key, fast_engine, down_url, fail_open, status):
    moderated(down_url, moderation_fail_open=fail_open)

    response, _ = ask(alice_key, "anything")

    assert response.status_code == status, response.content


# -- answers -------------------------------------------------------------------------------

# The synthetic model's answer (12 words, no sentence end): one piece, judged as it ends.
ANSWER = "Streaming tokens one at a time lets people read the answer while"


def answer_of(key: str, **fields) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], **fields}
    response = post("/v1/chat/completions", body, key)
    assert response.status_code == 200, response.content
    return response.json()["choices"][0]


@pytest.mark.parametrize("stage", ["answer", "both"])
def test_an_answer_the_service_flags_ends_with_the_policys_message(alice, alice_key, fast_engine, moderation, stage):
    ModerationHandler.flag_word = "people"
    moderated(f"{moderation}/v1/moderations", stage=stage, message="Not shown.", moderation_token="t0k")

    choice = answer_of(alice_key)

    assert (choice["message"]["content"], choice["finish_reason"]) == ("Not shown.", "content_filter")
    record = UsageRecord.objects.get(user=alice)
    events = fast_engine.store.events(record.stream_id)
    assert "people" not in json.dumps([event.data for event in events])  # not even in the stream store
    event = PolicyEvent.objects.get()
    assert (event.stage, event.action, event.excerpt, event.user) == ("answer", "block", ANSWER, alice)
    inputs = [seen["body"]["input"] for seen in ModerationHandler.seen]
    assert inputs[-1] == ANSWER and ModerationHandler.seen[-1]["authorization"] == "Bearer t0k"


def test_a_prompt_only_service_does_not_judge_answers(alice_key, fast_engine, moderation):
    ModerationHandler.flag_word = "people"
    moderated(f"{moderation}/v1/moderations", stage="prompt")

    assert answer_of(alice_key)["message"]["content"] == ANSWER
    assert [seen["body"]["input"] for seen in ModerationHandler.seen] == ["Hello"]


def test_a_flagged_chat_answer_is_queued_whole_and_its_redaction_replaces_it(
    alice, admin_client, fast_engine, moderation
):
    ModerationHandler.flag_word = "people"
    moderated(f"{moderation}/v1/moderations", stage="answer", action="flag")
    _, answer = chat.message_send(conversation=chat.conversation_create(user=alice), prompt="Hello")
    wait_for_terminal(fast_engine.store, answer.stream_id)
    answer.refresh_from_db()
    event = PolicyEvent.objects.get()
    assert answer.content == ANSWER  # a flag lets it out
    assert (event.message_id, event.excerpt, event.action) == (answer.pk, ANSWER, "flag")

    admin_client.post(
        reverse("admin:guardrails_policyevent_changelist"), {"action": "redact", "_selected_action": [event.pk]}
    )

    answer.refresh_from_db()
    assert answer.content == "[redacted]"


@pytest.mark.parametrize(("fail_open", "content"), [(True, ANSWER), (False, "Stopped by moderation.")])
def test_an_answer_whose_service_is_down_streams_or_stops_as_its_rule_says(
    alice_key, fast_engine, down_url, fail_open, content
):
    moderated(down_url, stage="answer", moderation_fail_open=fail_open, message="Stopped by moderation.")

    assert answer_of(alice_key)["message"]["content"] == content


def test_a_slow_service_holds_an_answer_back_no_longer_than_its_timeout(alice_key, fast_engine, moderation):
    moderated(f"{moderation}/slow/v1/moderations", stage="answer", moderation_timeout_s=0.3)

    started = time.monotonic()
    content = answer_of(alice_key)["message"]["content"]

    assert content == ANSWER  # it fails open
    assert time.monotonic() - started < SLOW_S
