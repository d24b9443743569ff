"""Living with conversations: rename, delete, settings, Regenerate, Edit, the quota meter, password change."""

from __future__ import annotations

import re

import pytest
from django.conf import settings
from django.test import Client, RequestFactory
from django.urls import reverse

from accounts.models import Account
from accounts.services import account_for
from generation import services
from generation.models import Conversation, Message
from inference.generators import SyntheticGenerator
from tests.support import PASSWORD
from tests.support.chat import HTMX, answered, fast_engine, newest_answer, seen, settle
from tests.support.engines import install_engine, wait_for_terminal, wait_until

__all__ = ["fast_engine", "seen"]  # fixtures, used by name

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slow_engine(stream_store):
    engine = install_engine(stream_store, SyntheticGenerator(tokens_per_s=20, answer_words=64))
    yield engine
    engine.stop(timeout=10)


def shown_articles(page: str) -> list[str]:
    return re.findall(r'data-role="(user|assistant)"', page)


# Rename


def test_rename_by_htmx_swaps_the_title_and_the_sidebar_entry(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m", title="Old name")

    response = alice_client.post(
        reverse("generation:conversation_rename", args=[conversation.id]), {"title": "  Trip to Lisbon  "}, **HTMX
    )

    assert response.status_code == 200
    page = response.content.decode()
    assert '<h1 id="conversation-title">Trip to Lisbon</h1>' in page
    assert f'<li id="conversation-{conversation.id}" hx-swap-oob="true">' in page
    assert "<title>Trip to Lisbon · chatsite</title>" in page
    conversation.refresh_from_db()
    assert conversation.title == "Trip to Lisbon"


def test_rename_without_javascript_redirects_back_to_the_conversation(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m", title="Old name")

    response = alice_client.post(reverse("generation:conversation_rename", args=[conversation.id]), {"title": "New"})

    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    sidebar = page[page.index('id="conversations"') :].split("</ul>")[0]
    assert ">New</a>" in sidebar
    assert "Old name" not in page


@pytest.mark.parametrize(
    ("title", "error"),
    [("", "Give the conversation a title."), ("   ", "Give the conversation a title."), ("x" * 201, "at most 200")],
)
def test_rename_refuses_an_empty_or_too_long_title_next_to_the_field(alice, alice_client, title, error):
    conversation = Conversation.objects.create(user=alice, model="m", title="Kept")
    url = reverse("generation:conversation_rename", args=[conversation.id])

    by_htmx = alice_client.post(url, {"title": title}, **HTMX)
    without_js = alice_client.post(url, {"title": title})

    assert by_htmx.status_code == 422
    assert without_js.status_code == 400
    for response in (by_htmx, without_js):
        page = response.content.decode()
        assert error in page
        assert 'role="alert"' in page
        assert '<details class="disclosure" open>' in page  # the rename form stays open
    conversation.refresh_from_db()
    assert conversation.title == "Kept"


def test_a_title_of_exactly_200_characters_is_accepted(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m")
    alice_client.post(reverse("generation:conversation_rename", args=[conversation.id]), {"title": "x" * 200}, **HTMX)
    conversation.refresh_from_db()
    assert conversation.title == "x" * 200


# Delete


def test_delete_by_htmx_removes_the_conversation_with_its_messages_and_redirects_to_chat(
    alice, alice_client, fast_engine
):
    conversation, _ = answered(alice, "Forget me")

    response = alice_client.post(reverse("generation:conversation_delete", args=[conversation.id]), **HTMX)

    assert response.status_code == 200
    assert response["HX-Redirect"] == reverse("generation:chat")
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Message.objects.filter(conversation_id=conversation.pk).exists()
    page = alice_client.get(reverse("generation:chat")).content.decode()
    assert "Forget me" not in page
    assert "Your conversations will appear here." in page


def test_delete_without_javascript_redirects_to_chat(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m", title="Gone")
    response = alice_client.post(reverse("generation:conversation_delete", args=[conversation.id]))
    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


def test_delete_asks_for_confirmation_with_and_without_javascript(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m", title="Careful")
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    disclosure = page[page.index("<summary>Delete…</summary>") :].split("</details>")[0]
    assert "hx-confirm=" in disclosure
    assert ">Delete conversation</button>" in disclosure
    assert reverse("generation:conversation_delete", args=[conversation.id]) in disclosure


def test_deleting_a_conversation_stops_its_streaming_answer(alice, alice_client, slow_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Tell me everything")
    wait_until(lambda: len(slow_engine.store.events(answer.stream_id)) >= 2)

    alice_client.post(reverse("generation:conversation_delete", args=[conversation.id]), **HTMX)

    events = wait_for_terminal(slow_engine.store, answer.stream_id, timeout=10)
    assert len([e for e in events if e.type == "token"]) < 64
    assert not Message.objects.filter(pk=answer.pk).exists()


# Settings


def settings_data(**changes) -> dict[str, object]:
    return {"model": settings.CHAT_MODEL, "system_prompt": "", "temperature": 0.2, "max_tokens": 512, **changes}


def test_settings_are_saved_and_the_next_answer_uses_them(alice, alice_client, seen):
    conversation, _ = answered(alice, "Hello")
    data = settings_data(system_prompt="Answer like a pirate.", temperature=0.7, max_tokens=5)

    response = alice_client.post(reverse("generation:conversation_settings", args=[conversation.id]), data, **HTMX)

    assert response.status_code == 200
    assert "Saved. The next answer uses these settings." in response.content.decode()
    conversation.refresh_from_db()
    assert (conversation.system_prompt, conversation.temperature, conversation.max_tokens) == (
        "Answer like a pirate.",
        0.7,
        5,
    )
    alice_client.post(conversation.get_absolute_url(), {"prompt": "And now?"}, **HTMX)
    answer = settle(newest_answer(conversation))
    assert answer.completion_tokens == 5
    messages, params = seen[-1]
    assert messages[0] == {"role": "system", "content": "Answer like a pirate."}
    assert params.temperature == 0.7
    assert params.max_tokens == 5


def test_settings_without_javascript_redirect_back_to_the_conversation(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model=settings.CHAT_MODEL)
    response = alice_client.post(
        reverse("generation:conversation_settings", args=[conversation.id]), settings_data(max_tokens=64)
    )
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    conversation.refresh_from_db()
    assert conversation.max_tokens == 64


@pytest.mark.parametrize(
    ("change", "field", "error"),
    [
        ({"temperature": 3}, "temperature", "Temperature is between 0 and 2."),
        ({"temperature": -0.1}, "temperature", "Temperature is between 0 and 2."),
        ({"temperature": "hot"}, "temperature", "Enter a number."),
        ({"max_tokens": 0}, "max_tokens", "An answer needs at least 1 token."),
        ({"max_tokens": 1025}, "max_tokens", "Your plan allows at most 1024 tokens per answer."),
        ({"model": "gpt-9"}, "model", "Select a valid choice. gpt-9 is not one of the available choices."),
        ({"system_prompt": "x" * 4001}, "system_prompt", "The system prompt is at most 4000 characters."),
    ],
)
def test_bad_settings_are_refused_with_the_error_next_to_the_field(alice, alice_client, change, field, error):
    conversation = Conversation.objects.create(user=alice, model=settings.CHAT_MODEL)
    url = reverse("generation:conversation_settings", args=[conversation.id])

    by_htmx = alice_client.post(url, settings_data(**change), **HTMX)
    without_js = alice_client.post(url, settings_data(**change))

    assert by_htmx.status_code == 422
    assert without_js.status_code == 400
    for response in (by_htmx, without_js):
        page = response.content.decode()
        assert '<details id="settings" class="settings disclosure" open>' in page
        # Django puts a field's errors right before it, pointed to by aria-describedby.
        errors = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', page, re.S)
        assert errors
        assert error in errors.group(1)
        assert re.search(rf'aria-describedby="[^"]*id_{field}_error"[^>]*id="id_{field}"', page)
    fresh = Conversation.objects.get(pk=conversation.pk)
    assert (fresh.model, fresh.temperature, fresh.max_tokens, fresh.system_prompt) == (
        settings.CHAT_MODEL,
        0.2,
        512,
        "",
    )


def test_the_max_tokens_limit_follows_the_users_plan(alice, alice_client):
    account = account_for(alice)
    Account.objects.filter(pk=account.pk).update(max_tokens_per_request=64)
    conversation = Conversation.objects.create(user=alice, model=settings.CHAT_MODEL, max_tokens=32)
    url = reverse("generation:conversation_settings", args=[conversation.id])

    assert alice_client.post(url, settings_data(max_tokens=65), **HTMX).status_code == 422
    assert alice_client.post(url, settings_data(max_tokens=64), **HTMX).status_code == 200
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert 'max="64"' in page
    assert "1 to 64 on your plan." in page


def test_settings_are_shown_on_a_conversation_and_on_a_new_chat(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model=settings.CHAT_MODEL, max_tokens=99)
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert "<summary>Settings</summary>" in page
    assert 'value="99"' in page
    new_chat = alice_client.get(reverse("generation:chat")).content.decode()
    # Its fields belong to the composer, so the first prompt carries them.
    for field in ("model", "system_prompt", "temperature", "max_tokens"):
        assert re.search(
            rf'<(select|textarea|input)[^>]*name="{field}"[^>]*form="composer"|'
            rf'<(select|textarea|input)[^>]*form="composer"[^>]*name="{field}"',
            new_chat,
        )
    assert 'value="512"' in new_chat
    assert 'value="0.2"' in new_chat


def test_a_plan_below_the_default_max_tokens_starts_new_chats_at_its_limit(alice, alice_client, fast_engine):
    Account.objects.filter(pk=account_for(alice).pk).update(max_tokens_per_request=64)

    assert 'value="64"' in alice_client.get(reverse("generation:chat")).content.decode()
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hello"}, **HTMX)

    assert response.status_code == 200
    assert Conversation.objects.get(user=alice).max_tokens == 64


def test_settings_chosen_on_a_new_chat_apply_to_its_first_answer(alice, alice_client, seen):
    data = settings_data(system_prompt="Answer like a pirate.", temperature=0.9, max_tokens=6)

    response = alice_client.post(reverse("generation:chat"), {"prompt": "Ahoy?", **data}, **HTMX)

    assert response.status_code == 200
    conversation = Conversation.objects.get(user=alice)
    assert (conversation.system_prompt, conversation.temperature, conversation.max_tokens) == (
        "Answer like a pirate.",
        0.9,
        6,
    )
    answer = settle(newest_answer(conversation))
    assert answer.completion_tokens == 6
    messages, params = seen[-1]
    assert messages == [
        {"role": "system", "content": "Answer like a pirate."},
        {"role": "user", "content": "Ahoy?"},
    ]
    assert params.temperature == 0.9
    assert params.max_tokens == 6
    assert 'value="6"' in response.content.decode()  # the conversation's own settings panel


@pytest.mark.parametrize(
    ("change", "field", "error"),
    [
        ({"temperature": 3}, "temperature", "Temperature is between 0 and 2."),
        ({"temperature": "hot"}, "temperature", "Enter a number."),
        ({"max_tokens": 1025}, "max_tokens", "Your plan allows at most 1024 tokens per answer."),
        ({"model": "gpt-9"}, "model", "Select a valid choice. gpt-9 is not one of the available choices."),
        ({"system_prompt": "x" * 4001}, "system_prompt", "The system prompt is at most 4000 characters."),
    ],
)
def test_bad_settings_on_a_new_chat_are_refused_and_nothing_is_started(alice, alice_client, seen, change, field, error):
    data = {"prompt": "Keep this prompt", **settings_data(**change)}

    by_htmx = alice_client.post(reverse("generation:chat"), data, **HTMX)
    without_js = alice_client.post(reverse("generation:chat"), data)

    assert by_htmx.status_code == 422
    assert without_js.status_code == 422
    for response in (by_htmx, without_js):
        page = response.content.decode()
        assert '<details id="settings" class="settings disclosure" open>' in page
        errors = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', page, re.S)
        assert errors
        assert error in errors.group(1)
        assert "Keep this prompt</textarea>" in page
    assert '<div id="conversation-top" hx-swap-oob="true">' in by_htmx.content.decode()
    assert not Conversation.objects.filter(user=alice).exists()
    assert seen == []


def test_new_conversations_keep_the_default_settings(alice, alice_client, fast_engine):
    first, _ = answered(alice, "One")
    alice_client.post(
        reverse("generation:conversation_settings", args=[first.id]),
        settings_data(temperature=1.5, max_tokens=7, system_prompt="Be brief."),
        **HTMX,
    )

    alice_client.post(reverse("generation:chat"), {"prompt": "A fresh start"}, **HTMX)

    fresh = Conversation.objects.exclude(pk=first.pk).get(user=alice)
    assert (fresh.temperature, fresh.max_tokens, fresh.system_prompt) == (0.2, 512, "")


def test_first_send_by_htmx_brings_the_title_and_settings_of_the_new_conversation(alice, alice_client, fast_engine):
    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hi there"}, **HTMX)
    page = response.content.decode()
    assert '<div id="conversation-top" hx-swap-oob="true">' in page
    assert '<h1 id="conversation-title">Hi there</h1>' in page
    assert "<summary>Settings</summary>" in page


# Regenerate


def test_regenerate_starts_a_new_answer_and_keeps_the_earlier_one(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Tell me a joke")

    response = alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)

    assert response.status_code == 200
    second = newest_answer(conversation)
    assert second.pk != first.pk
    page = response.content.decode()
    assert f'id="message-{second.pk}"' in page
    assert 'data-status="streaming"' in page
    assert f'sse-connect="/chat/streams/{second.stream_id}/"' in page
    assert '<p id="quota" class="quota-meter" hx-swap-oob="true">' in page
    settle(second)
    assert second.status == "complete"
    assert second.content
    assert Message.objects.filter(pk=first.pk, status="complete").exists()  # kept
    assert conversation.messages.count() == 3


def test_the_page_shows_only_the_newest_answer_with_one_regenerate_button(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Tell me a joke")
    Message.objects.filter(pk=first.pk).update(content="THE FIRST ANSWER")
    alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)
    second = settle(newest_answer(conversation))

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    assert shown_articles(page) == ["user", "assistant"]
    assert "THE FIRST ANSWER" not in page
    assert f'id="message-{second.pk}"' in page
    assert page.count(">Regenerate</button>") == 1
    assert page.count("<summary>Edit</summary>") == 1


def test_regenerate_without_javascript_redirects_to_the_conversation(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Hello")
    response = alice_client.post(reverse("generation:message_regenerate", args=[first.pk]))
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    settle(newest_answer(conversation))
    assert conversation.messages.filter(role="assistant").count() == 2


def test_the_model_sees_only_the_newest_answer_of_each_prompt(alice, alice_client, seen):
    conversation, [first] = answered(alice, "First")
    Message.objects.filter(pk=first.pk).update(content="an answer that was regenerated away")

    alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)
    regenerated = settle(newest_answer(conversation))
    assert seen[-1][0] == [{"role": "user", "content": "First"}]  # the old answer is not in the context

    alice_client.post(conversation.get_absolute_url(), {"prompt": "Second"}, **HTMX)
    settle(newest_answer(conversation))

    assert seen[-1][0] == [
        {"role": "user", "content": "First"},
        {"role": "assistant", "content": regenerated.content},
        {"role": "user", "content": "Second"},
    ]


def test_regenerate_after_a_follow_up_carries_the_earlier_exchanges(alice, alice_client, seen):
    conversation, [first, second] = answered(alice, "One", "Two")

    alice_client.post(reverse("generation:message_regenerate", args=[second.pk]), **HTMX)
    settle(newest_answer(conversation))

    assert seen[-1][0] == [
        {"role": "user", "content": "One"},
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": "Two"},
    ]


def test_an_answer_still_streaming_cannot_be_regenerated(alice, alice_client, slow_engine):
    conversation = services.conversation_create(user=alice)
    _, answer = services.message_send(conversation=conversation, prompt="Tell me everything")

    response = alice_client.post(reverse("generation:message_regenerate", args=[answer.pk]), **HTMX)

    assert response.status_code == 422
    assert "still being written" in response.content.decode()
    assert conversation.messages.count() == 2
    services.message_stop(message=answer)
    wait_for_terminal(slow_engine.store, answer.stream_id)


def test_a_regenerate_refused_by_the_quota_says_why_and_starts_nothing(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Hello")
    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=0)

    response = alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)

    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    page = response.content.decode()
    assert "used today" in page
    assert "Try again in" in page
    assert f'id="message-{first.pk}"' in page
    assert conversation.messages.count() == 2


# Edit


def test_editing_the_last_prompt_asks_it_anew_and_keeps_the_old_one_as_a_version(alice, alice_client, seen):
    conversation, [first] = answered(alice, "Waht is 2+2?")
    prompt = conversation.messages.get(role="user")

    response = alice_client.post(
        reverse("generation:message_edit", args=[prompt.pk]), {"prompt": "What is 2+2?"}, **HTMX
    )

    assert response.status_code == 200
    page = response.content.decode()
    second = newest_answer(conversation)
    assert second.pk != first.pk
    assert f'id="message-{second.pk}"' in page
    assert 'data-status="streaming"' in page
    assert f'id="message-{first.pk}"' not in page
    assert "Waht" not in page
    assert "What is 2+2?" in page
    assert '<span class="versions-position">2/2</span>' in page
    prompt.refresh_from_db()
    assert prompt.content == "Waht is 2+2?"  # kept, as the other version
    settle(second)
    assert seen[-1][0] == [{"role": "user", "content": "What is 2+2?"}]
    assert Message.objects.filter(pk=first.pk).exists()
    shown = alice_client.get(conversation.get_absolute_url()).content.decode()
    thread = shown[shown.index('id="messages"') :]
    assert shown_articles(thread) == ["user", "assistant"]
    assert "Waht" not in thread


def test_edit_without_javascript_redirects_to_the_conversation(alice, alice_client, fast_engine):
    conversation, _ = answered(alice, "Helo")
    prompt = conversation.messages.get(role="user")
    response = alice_client.post(reverse("generation:message_edit", args=[prompt.pk]), {"prompt": "Hello"})
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()
    settle(newest_answer(conversation))


@pytest.mark.parametrize("text", ["", "   "])
def test_an_empty_edit_is_refused_and_the_prompt_is_kept(alice, alice_client, fast_engine, text):
    conversation, _ = answered(alice, "Keep me")
    prompt = conversation.messages.get(role="user")

    response = alice_client.post(reverse("generation:message_edit", args=[prompt.pk]), {"prompt": text}, **HTMX)

    assert response.status_code == 422
    page = response.content.decode()
    assert "Type a message first." in page
    assert '<details class="message-controls message-edit" open>' in page
    prompt.refresh_from_db()
    assert prompt.content == "Keep me"
    assert conversation.messages.count() == 2


def test_an_edit_refused_by_the_quota_keeps_the_prompt_and_the_edited_text(alice, alice_client, fast_engine):
    conversation, _ = answered(alice, "Original")
    prompt = conversation.messages.get(role="user")
    Account.objects.filter(pk=account_for(alice).pk).update(tokens_per_day=0)

    response = alice_client.post(reverse("generation:message_edit", args=[prompt.pk]), {"prompt": "Edited"}, **HTMX)

    assert response.status_code == 429
    page = response.content.decode()
    assert "used today" in page
    assert ">Edited</textarea>" in page
    prompt.refresh_from_db()
    assert prompt.content == "Original"
    assert conversation.messages.count() == 2


# Quota meter


def test_the_quota_meter_shows_whats_left_and_the_send_response_refreshes_it(alice, alice_client, fast_engine):
    Account.objects.filter(pk=account_for(alice).pk).update(
        requests_per_minute=5, tokens_per_day=1000, max_tokens_per_request=100
    )
    page = alice_client.get(reverse("generation:chat")).content.decode()
    assert "5 requests left this minute · 1000 tokens left today" in page

    response = alice_client.post(reverse("generation:chat"), {"prompt": "Hello there"}, **HTMX)

    # The streaming answer holds its prompt (2 tokens) and its whole grant (100) until it finishes.
    assert (
        '<p id="quota" class="quota-meter" hx-swap-oob="true">4 requests left this minute · 898 tokens left today</p>'
        in response.content.decode()
    )
    answer = settle(Message.objects.get(role="assistant", conversation__user=alice))
    used = answer.prompt_tokens + answer.completion_tokens
    page = alice_client.get(answer.conversation.get_absolute_url()).content.decode()
    assert f"4 requests left this minute · {1000 - used} tokens left today" in page


def test_the_quota_meter_says_one_request_in_the_singular(alice, alice_client):
    Account.objects.filter(pk=account_for(alice).pk).update(requests_per_minute=1, tokens_per_day=1)
    page = alice_client.get(reverse("generation:chat")).content.decode()
    assert "1 request left this minute · 1 token left today" in page


# Who may do what


def alices_things(alice) -> dict[str, str]:
    conversation = Conversation.objects.create(user=alice, model=settings.CHAT_MODEL, title="Alice's plans")
    prompt = conversation.messages.create(role="user", content="secret")
    answer = conversation.messages.create(role="assistant", content="answer")
    return {
        "rename": reverse("generation:conversation_rename", args=[conversation.id]),
        "delete": reverse("generation:conversation_delete", args=[conversation.id]),
        "settings": reverse("generation:conversation_settings", args=[conversation.id]),
        "regenerate": reverse("generation:message_regenerate", args=[answer.pk]),
        "edit": reverse("generation:message_edit", args=[prompt.pk]),
        "choose": reverse("generation:message_choose", args=[answer.pk]),
    }


@pytest.mark.parametrize("action", ["rename", "delete", "settings", "regenerate", "edit", "choose"])
def test_bob_gets_404_for_every_change_to_alices_things(alice, bob_client, fast_engine, action):
    url = alices_things(alice)[action]
    data = {"title": "mine", "prompt": "mine", **settings_data(max_tokens=1)}

    assert bob_client.post(url, data, **HTMX).status_code == 404
    assert bob_client.post(url, data).status_code == 404

    conversation = Conversation.objects.get(user=alice)
    assert conversation.title == "Alice's plans"
    assert conversation.max_tokens == 512
    assert conversation.current_leaf_id is None  # no version chosen for her
    assert list(conversation.messages.values_list("content", flat=True)) == ["secret", "answer"]


@pytest.mark.parametrize("action", ["rename", "delete", "settings", "regenerate", "edit", "choose"])
def test_get_on_a_post_only_view_is_405(alice, alice_client, action):
    url = alices_things(alice)[action]
    assert alice_client.get(url).status_code == 405
    assert Conversation.objects.filter(user=alice).exists()


@pytest.mark.parametrize("action", ["rename", "delete", "settings", "regenerate", "edit", "choose"])
def test_every_new_view_requires_login(alice, client, action):
    response = client.post(alices_things(alice)[action], {"title": "x", "prompt": "x"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))


# Password change


def test_password_change_works_and_the_old_password_stops_working(alice, alice_client):
    page = alice_client.get(reverse("generation:chat")).content.decode()
    assert f'href="{reverse("accounts:password_change")}"' in page

    response = alice_client.post(
        reverse("accounts:password_change"),
        {"old_password": PASSWORD, "new_password1": "a-brand-new-secret-42", "new_password2": "a-brand-new-secret-42"},
    )

    assert response.status_code == 302
    assert response["Location"] == reverse("accounts:password_change_done")
    assert "Your password was changed." in alice_client.get(response["Location"]).content.decode()
    assert alice_client.get(reverse("generation:chat")).status_code == 200  # still logged in here
    assert not Client().login(request=RequestFactory().post("/accounts/login/"), username="alice", password=PASSWORD)
    assert Client().login(
        request=RequestFactory().post("/accounts/login/"), username="alice", password="a-brand-new-secret-42"
    )


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (
            {"old_password": "wrong", "new_password1": "new-secret-42x", "new_password2": "new-secret-42x"},
            "incorrectly",
        ),
        ({"old_password": PASSWORD, "new_password1": "new-secret-42x", "new_password2": "other-secret-4"}, "match"),
        ({"old_password": PASSWORD, "new_password1": "short", "new_password2": "short"}, "too short"),
    ],
)
def test_a_refused_password_change_shows_the_error_and_keeps_the_old_password(alice, alice_client, data, error):
    response = alice_client.post(reverse("accounts:password_change"), data)

    page = response.content.decode()
    assert error in page
    assert 'class="errorlist' in page
    assert "Your password was not changed" in page
    assert Client().login(request=RequestFactory().post("/accounts/login/"), username="alice", password=PASSWORD)


def test_password_change_requires_login(client):
    response = client.get(reverse("accounts:password_change"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
