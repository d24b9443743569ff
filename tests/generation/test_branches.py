"""Branches: Regenerate and Edit keep every version; ◀ ▶ picks the branch shown and continued."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from generation import services
from generation.models import Conversation, Message
from generation.selectors import MessageTree, thread
from tests.support.chat import HTMX, answered, eager_engine, fast_engine_run_eagerly, newest_answer, seen, settle

__all__ = ["eager_engine", "fast_engine_run_eagerly", "seen"]  # fixtures, used by name

# The engine thread saves answers on its own connection: no test-wide transaction.
pytestmark = pytest.mark.django_db


def contents(conversation: Conversation) -> list[str]:
    conversation.refresh_from_db()
    return [message.content for message in thread(conversation)]


def positions(page: str) -> list[str]:
    return re.findall(r'<span class="versions-position">(\d+/\d+)</span>', page)


def test_regenerate_keeps_the_old_answer_as_a_version_and_choose_switches_back(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Tell me a joke")
    Message.objects.filter(pk=first.pk).update(content="THE FIRST ANSWER")
    response = alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)
    second = settle(newest_answer(conversation))
    assert positions(response.content.decode()) == ["2/2"]

    response = alice_client.post(reverse("generation:message_choose", args=[first.pk]), **HTMX)

    assert response.status_code == 200
    page = response.content.decode()
    assert "THE FIRST ANSWER" in page
    assert f'id="message-{second.pk}"' not in page
    assert positions(page) == ["1/2"]
    assert 'aria-label="Previous version" disabled' in page
    assert '<p id="quota" class="quota-meter" hx-swap-oob="true">' in page
    assert contents(conversation) == ["Tell me a joke", "THE FIRST ANSWER"]
    reloaded = alice_client.get(conversation.get_absolute_url()).content.decode()  # the choice is kept
    assert "THE FIRST ANSWER" in reloaded
    assert positions(reloaded) == ["1/2"]


def test_the_next_prompt_continues_the_chosen_branch_and_the_model_sees_only_it(alice, alice_client, seen):
    conversation, [first] = answered(alice, "Name a colour")
    Message.objects.filter(pk=first.pk).update(content="Red")
    alice_client.post(reverse("generation:message_regenerate", args=[first.pk]), **HTMX)
    settle(newest_answer(conversation))
    alice_client.post(reverse("generation:message_choose", args=[first.pk]), **HTMX)

    alice_client.post(conversation.get_absolute_url(), {"prompt": "And another?"}, **HTMX)
    follow_up = settle(newest_answer(conversation))

    assert seen[-1][0] == [
        {"role": "user", "content": "Name a colour"},
        {"role": "assistant", "content": "Red"},
        {"role": "user", "content": "And another?"},
    ]
    assert contents(conversation) == ["Name a colour", "Red", "And another?", follow_up.content]


def test_editing_an_earlier_prompt_starts_a_branch_and_keeps_what_followed_the_old_one(alice, alice_client, seen):
    conversation, [first, second] = answered(alice, "One", "Two")
    one = conversation.messages.get(content="One")

    response = alice_client.post(reverse("generation:message_edit", args=[one.pk]), {"prompt": "Uno"}, **HTMX)

    assert response.status_code == 200
    edited_answer = settle(newest_answer(conversation))
    assert seen[-1][0] == [{"role": "user", "content": "Uno"}]  # nothing of the old branch
    page = response.content.decode()
    assert positions(page) == ["2/2"]
    assert "Two" not in page
    assert contents(conversation) == ["Uno", edited_answer.content]
    assert conversation.messages.count() == 6  # the old branch is all there

    # Back to the first version of the prompt: the old branch, down to its last answer.
    uno = conversation.messages.get(content="Uno")
    alice_client.post(reverse("generation:message_choose", args=[one.pk]), **HTMX)
    assert contents(conversation) == ["One", first.content, "Two", second.content]
    alice_client.post(reverse("generation:message_choose", args=[uno.pk]), **HTMX)
    assert contents(conversation) == ["Uno", edited_answer.content]


def test_choosing_a_version_shows_its_newest_branch(alice, fast_engine):
    conversation, [first, _] = answered(alice, "One", "Two")
    services.message_regenerate(answer=first)
    regenerated = settle(newest_answer(conversation))
    assert contents(conversation) == ["One", regenerated.content]

    services.message_choose(message=first)

    assert contents(conversation)[:3] == ["One", first.content, "Two"]
    tree = MessageTree(conversation)
    assert [tree.versions(message).count for message in tree.thread()] == [1, 2, 1, 1]


def test_a_regenerate_refused_by_a_full_queue_leaves_the_branch_as_it_was(alice, fast_engine, monkeypatch):
    conversation, [_, second] = answered(alice, "One", "Two")
    before = contents(conversation)

    def full(*args, **kwargs):
        raise services.EngineOverloaded("full")

    monkeypatch.setattr(services, "generation_submit", full)
    with pytest.raises(services.EngineOverloaded):
        services.message_regenerate(answer=second)

    assert contents(conversation) == before
    assert conversation.messages.count() == 4


def test_choose_without_javascript_redirects_to_the_conversation(alice, alice_client, fast_engine):
    conversation, [first] = answered(alice, "Hello")
    response = alice_client.post(reverse("generation:message_choose", args=[first.pk]))
    assert response.status_code == 302
    assert response["Location"] == conversation.get_absolute_url()


def test_choose_of_an_unknown_message_is_404(alice_client):
    assert alice_client.post(reverse("generation:message_choose", args=[999_999]), **HTMX).status_code == 404


def test_an_answer_without_a_prompt_cannot_be_regenerated_and_says_so(alice, alice_client):
    conversation = Conversation.objects.create(user=alice, model="m")
    orphan = conversation.messages.create(role="assistant", content="alone")

    response = alice_client.post(reverse("generation:message_regenerate", args=[orphan.pk]), **HTMX)

    assert response.status_code == 422
    assert "Only an answer to a prompt" in response.content.decode()
    assert conversation.messages.count() == 1


def test_messages_written_without_a_parent_continue_the_branch_shown(alice):
    conversation = Conversation.objects.create(user=alice, model="m")
    for role, text in [("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", "A2")]:
        conversation.messages.create(role=role, content=text)
    assert contents(conversation) == ["Q1", "A1", "Q2", "A2"]

    services.message_choose(message=conversation.messages.get(content="A1"))
    conversation.refresh_from_db()
    conversation.messages.create(role="user", content="Q3")

    assert contents(conversation) == ["Q1", "A1", "Q2", "A2", "Q3"]


@pytest.mark.django_db(transaction=True)  # migrations cannot run inside the test's transaction
def test_the_migration_keeps_existing_conversations_linear_with_regenerated_answers_as_versions(django_user_model):
    before = [("generation", "0005_message_sources_from_cache")]  # the migration before the branches
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old_apps = executor.loader.project_state(before).apps
    user = django_user_model.objects.create_user("carol")
    OldConversation = old_apps.get_model("generation", "Conversation")
    OldMessage = old_apps.get_model("generation", "Message")
    conversation = OldConversation.objects.create(user_id=user.pk, model="m")
    for role, content in [("user", "Q1"), ("assistant", "A1 old"), ("assistant", "A1 new"), ("user", "Q2")]:
        OldMessage.objects.create(conversation=conversation, role=role, content=content)
    OldMessage.objects.create(conversation=conversation, role="assistant", content="A2")
    if connection.vendor == "postgresql":
        # The test's transaction holds the rows' deferred foreign-key checks, and PostgreSQL
        # alters no table with checks pending: run them now, as a commit would.
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    migrated = Conversation.objects.get(pk=conversation.pk)
    assert contents(migrated) == ["Q1", "A1 new", "Q2", "A2"]
    tree = MessageTree(migrated)
    assert [tree.versions(message).position for message in tree.thread()] == [1, 2, 1, 1]
