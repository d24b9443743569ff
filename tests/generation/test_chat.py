from __future__ import annotations

import pytest
from django.urls import reverse

from accounts.models import UsageRecord
from generation import services
from generation.forms import MAX_PROMPT_CHARS
from generation.models import Conversation, Message
from inference.engine import EngineOverloaded
from tests.support import PASSWORD
from tests.support.chat import eager_engine, fast_engine_run_eagerly
from tests.support.engines import wait_for_terminal

__all__ = ["eager_engine", "fast_engine_run_eagerly"]  # fixtures, used by name

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.mark.django_db(transaction=True)  # the real model's engine saves on its own threads
def test_sign_up_chat_stream_and_the_answer_is_saved(client, real_engine, monkeypatch):
    monkeypatch.setattr(Conversation._meta.get_field("max_tokens"), "default", 16)
    response = client.post(
        reverse("accounts:signup"), {"username": "carol", "password1": PASSWORD, "password2": PASSWORD}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    page = client.get(reverse("generation:chat"))
    assert b"<textarea" in page.content
    assert b">Send</button>" in page.content

    response = client.post(reverse("generation:chat"), {"prompt": "What is the capital of France?"}, **HTMX)

    assert response.status_code == 200
    conversation = Conversation.objects.get(user__username="carol")
    assert response["HX-Push-Url"] == f"/chat/{conversation.id}/"
    answer = conversation.messages.get(role="assistant")
    assert f'sse-connect="/chat/streams/{answer.stream_id}/"' in response.content.decode()
    assert 'data-status="streaming"' in response.content.decode()
    events = wait_for_terminal(real_engine.store, answer.stream_id)
    streamed = "".join(e.data["delta"] for e in events if e.type == "token")

    answer.refresh_from_db()
    assert answer.status == "complete"
    assert answer.content == streamed
    assert streamed.strip()
    assert answer.completion_tokens
    assert answer.prompt_tokens
    assert answer.ttft_ms is not None
    reloaded = client.get(conversation.get_absolute_url()).content.decode()
    assert "What is the capital of France?" in reloaded
    assert 'data-role="assistant" data-status="complete"' in reloaded


def test_follow_up_prompt_carries_the_conversation_history(alice, alice_client, fast_engine, monkeypatch):
    seen: list[list[dict]] = []
    original = fast_engine.submit
    monkeypatch.setattr(fast_engine, "submit", lambda job: seen.append(job.prompt) or original(job))
    alice_client.post(reverse("generation:chat"), {"prompt": "First"}, **HTMX)
    conversation = Conversation.objects.get(user=alice)
    wait_for_terminal(fast_engine.store, conversation.messages.last().stream_id)

    response = alice_client.post(conversation.get_absolute_url(), {"prompt": "Second"}, **HTMX)

    assert "HX-Push-Url" not in response
    wait_for_terminal(fast_engine.store, conversation.messages.last().stream_id)
    assert [m["role"] for m in seen[-1]] == ["user", "assistant", "user"]
    assert seen[-1][0]["content"] == "First"
    assert seen[-1][2]["content"] == "Second"
    assert conversation.messages.count() == 4


def test_plain_form_post_without_javascript_redirects_to_the_conversation(alice, alice_client, fast_engine):
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hi"})
    conversation = Conversation.objects.get(user=alice)
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()


@pytest.mark.parametrize("prompt", ["", "   ", "x" * (MAX_PROMPT_CHARS + 1)])
def test_empty_or_oversized_prompt_is_refused_with_the_form_error(alice, alice_client, fast_engine, prompt):
    response = alice_client.post(reverse("generation:chat"), {"prompt": prompt}, **HTMX)
    assert response.status_code == 422
    assert response["HX-Retarget"] == "#composer"
    assert 'role="alert"' in response.content.decode()
    assert not Conversation.objects.filter(user=alice).exists()


def test_full_queue_is_a_503_that_keeps_the_prompt_in_the_box(alice, alice_client, fast_engine, monkeypatch):
    def refuse(job):
        raise EngineOverloaded("full")

    monkeypatch.setattr(fast_engine, "submit", refuse)
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Are you there?"}, **HTMX)

    assert response.status_code == 503
    assert response["Retry-After"]
    page = response.content.decode()
    assert "busy" in page
    assert ">\nAre you there?</textarea>" in page
    assert not Message.objects.filter(conversation__user=alice).exists()
    assert not Conversation.objects.filter(user=alice).exists()
    assert not UsageRecord.objects.filter(user=alice).exists()


def test_chat_requires_login(client):
    response = client.get(reverse("generation:chat"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
    assert client.post(reverse("generation:chat"), {"prompt": "hi"}).status_code == 302


def test_bob_gets_404_for_alices_conversation(alice, bob_client, fast_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="secret plans")
    wait_for_terminal(fast_engine.store, answer.stream_id)

    assert bob_client.get(conversation.get_absolute_url()).status_code == 404
    assert bob_client.post(conversation.get_absolute_url(), {"prompt": "mine now"}, **HTMX).status_code == 404
    assert conversation.messages.count() == 2
    assert "secret plans" not in bob_client.get(reverse("generation:chat")).content.decode()


def test_sidebar_lists_only_my_conversations_newest_first(alice, bob, alice_client):
    older = Conversation.objects.create(user=alice, model="m", title="Older")
    newer = Conversation.objects.create(user=alice, model="m", title="Newer")
    Conversation.objects.create(user=bob, model="m", title="Bob's")
    page = alice_client.get(older.get_absolute_url()).content.decode()
    sidebar = page[page.index('id="conversations"') :].split("</ul>")[0]
    assert sidebar.index("Newer") < sidebar.index("Older")
    assert "Bob" not in page
    assert f'href="{newer.get_absolute_url()}"' in page


def test_model_output_is_escaped_in_the_page(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m")
    conversation.messages.create(role="assistant", content="<script>alert(1)</script>")
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)" in page


def test_unsupported_method_is_405(alice_client):
    assert alice_client.put(reverse("generation:chat")).status_code == 405


def test_quota_refusal_is_shown_in_words_and_starts_nothing(alice, alice_client, fast_engine):
    from accounts.models import Account
    from accounts.services import account_for

    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=0)
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hello?"}, **HTMX)

    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "used today" in response.content.decode()
    assert "Try again in" in response.content.decode()
    assert not Message.objects.filter(conversation__user=alice).exists()


def test_browser_generations_are_recorded_in_the_one_ledger(alice, alice_client, fast_engine):
    alice_client.post(reverse("generation:chat"), {"prompt": "Count me"}, **HTMX)
    answer = Message.objects.get(role="assistant", conversation__user=alice)
    wait_for_terminal(fast_engine.store, answer.stream_id)
    record = UsageRecord.objects.get(stream_id=answer.stream_id)
    assert record.channel == "ui"
    assert record.user == alice
    assert record.completion_tokens == 12
