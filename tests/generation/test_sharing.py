"""Share links: a snapshot of a conversation's branch at /s/<token>/, who may open it
(CHAT_SHARING), Update link, revoking, and Continue this chat."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from generation import sharing
from generation.models import Conversation, Message, SharedLink

pytestmark = pytest.mark.django_db

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def chat(user, *, title: str = "Tea", answer: str = "Green **tea** is best.") -> Conversation:
    conversation = Conversation.objects.create(user=user, model=settings.CHAT_MODEL, title=title)
    prompt = conversation.messages.create(role="user", content="Which tea?")
    conversation.messages.create(
        role="assistant",
        parent=prompt,
        content=answer,
        sources=[{"number": 1, "document": "teas.txt", "excerpt": "Green tea is steamed.", "passage": 3, "url": "/x"}],
    )
    return conversation


def share(client: Client, conversation: Conversation, **data: str):
    return client.post(reverse("generation:conversation_share", args=[conversation.id]), data)


def shared_page(client: Client, conversation: Conversation):
    return client.get(SharedLink.objects.get(conversation=conversation).get_absolute_url())


def test_share_makes_an_unguessable_link_to_a_read_only_snapshot(alice, alice_client, bob_client):
    conversation = chat(alice)

    response = share(alice_client, conversation)

    assert response.status_code == 302
    link = SharedLink.objects.get(conversation=conversation)
    assert sharing.TOKEN_PATTERN.fullmatch(link.token)
    page = shared_page(bob_client, conversation)
    assert page.status_code == 200
    html = page.content.decode()
    assert "Which tea?" in html
    assert "<strong>tea</strong>" in html  # the answer as Markdown, as in the chat
    assert "teas.txt" in html
    assert "Green tea is steamed." in html
    assert 'href="/x"' not in html  # the sources' names and excerpts, not links into the files
    assert page["X-Robots-Tag"] == "noindex, nofollow"
    assert '<meta name="robots" content="noindex, nofollow">' in html
    assert page["Referrer-Policy"] == "same-origin"


def test_share_shows_the_link_on_the_conversation(alice, alice_client):
    conversation = chat(alice)

    response = share(alice_client, conversation)
    fragment = alice_client.post(
        reverse("generation:conversation_share", args=[conversation.id]), headers={"HX-Request": "true"}
    )

    assert response.status_code == 302
    link = SharedLink.objects.get(conversation=conversation)
    assert fragment.status_code == 200
    assert f"http://testserver/s/{link.token}/" in fragment.content.decode()
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert f"/s/{link.token}/" in page
    assert ">Share</button>" in page
    assert ">Update link</button>" in page


def test_sharing_again_keeps_the_link_and_its_snapshot(alice, alice_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    first = SharedLink.objects.get(conversation=conversation)
    conversation.messages.create(role="user", content="And coffee?")

    share(alice_client, conversation)

    again = SharedLink.objects.get(conversation=conversation)
    assert again.token == first.token
    assert [item["content"] for item in again.messages] == [item["content"] for item in first.messages]


def test_later_edits_leave_the_snapshot_as_it_was(alice, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    answer = conversation.messages.get(role="assistant")
    answer.content = "Coffee, actually."
    answer.save()
    Conversation.objects.filter(pk=conversation.pk).update(title="Renamed")

    html = shared_page(bob_client, conversation).content.decode()

    assert "Green <strong>tea</strong> is best." in html
    assert "Coffee, actually." not in html
    assert "<h1>Tea</h1>" in html


def test_update_link_takes_a_new_snapshot_under_the_same_token(alice, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    token = SharedLink.objects.get(conversation=conversation).token
    conversation.messages.create(role="user", content="And coffee?")

    response = share(alice_client, conversation, update="1")

    assert response.status_code == 302
    assert SharedLink.objects.get(conversation=conversation).token == token
    assert "And coffee?" in shared_page(bob_client, conversation).content.decode()


def test_the_snapshot_is_the_branch_shown_without_answers_still_streaming(alice, alice_client):
    conversation = chat(alice)
    prompt = conversation.messages.get(role="user")
    conversation.messages.create(role="assistant", parent=prompt, content="Other version")
    conversation.messages.create(role="user", content="More?")
    conversation.messages.create(role="assistant", content="Half an ans", status=Message.Status.STREAMING)

    share(alice_client, conversation)

    snapshot = SharedLink.objects.get(conversation=conversation).messages
    assert [item["content"] for item in snapshot] == ["Which tea?", "Other version", "More?"]


def test_script_in_titles_and_answers_is_inert_on_the_shared_page(alice, alice_client, bob_client):
    conversation = chat(alice, title=XSS, answer=f"Look: {XSS}")
    conversation.messages.create(role="user", content=XSS)
    share(alice_client, conversation)

    html = shared_page(bob_client, conversation).content.decode()

    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "onerror=alert" not in html.replace("&lt;img src=x onerror=alert", "")
    assert "&lt;script&gt;alert" in html


def test_revoked_link_answers_404(alice, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    link = SharedLink.objects.get(conversation=conversation)

    response = alice_client.post(reverse("generation:shared_link_revoke", args=[link.pk]))

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:your_data")
    assert bob_client.get(f"/s/{link.token}/").status_code == 404
    assert alice_client.get(f"/s/{link.token}/").status_code == 404


def test_your_data_lists_links_and_revokes_them(alice, alice_client):
    conversation = chat(alice, title="Tea talk")
    share(alice_client, conversation)
    link = SharedLink.objects.get(conversation=conversation)

    html = alice_client.get(reverse("generation:your_data")).content.decode()

    assert "Tea talk" in html
    assert f"/s/{link.token}/" in html
    assert reverse("generation:shared_link_revoke", args=[link.pk]) in html


def test_stop_sharing_from_the_conversation_shows_share_again(alice, alice_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    link = SharedLink.objects.get(conversation=conversation)

    response = alice_client.post(
        reverse("generation:shared_link_revoke", args=[link.pk]),
        {"from": "conversation"},
        headers={"HX-Request": "true"},
    )

    assert response.status_code == 200
    assert ">Share</button>" in response.content.decode()
    assert link.token not in response.content.decode()
    assert not SharedLink.objects.exists()


def test_deleting_the_conversation_deletes_its_link(alice, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    token = SharedLink.objects.get(conversation=conversation).token

    alice_client.post(reverse("generation:conversation_delete", args=[conversation.id]))

    assert bob_client.get(f"/s/{token}/").status_code == 404


@pytest.mark.parametrize("token", ["x" * 32, "short", "a" * 31 + "!", "%00" * 11, "a" * 200])
def test_guessed_or_malformed_tokens_answer_404(alice, alice_client, bob_client, token):
    share(alice_client, chat(alice))

    assert bob_client.get(f"/s/{token}/").status_code == 404


def test_bob_cannot_share_or_revoke_alices_conversation(alice, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    link = SharedLink.objects.get(conversation=conversation)

    assert share(bob_client, conversation).status_code == 404
    assert bob_client.post(reverse("generation:shared_link_revoke", args=[link.pk])).status_code == 404
    assert SharedLink.objects.filter(pk=link.pk).exists()


def test_share_and_revoke_need_log_in_and_post(alice, alice_client, client):
    conversation = chat(alice)
    url = reverse("generation:conversation_share", args=[conversation.id])

    assert client.post(url).status_code == 302  # to log in
    assert alice_client.get(url).status_code == 405
    assert not SharedLink.objects.exists()
    share(alice_client, conversation)
    revoke = reverse("generation:shared_link_revoke", args=[SharedLink.objects.get().pk])
    assert client.post(revoke).status_code == 302
    assert alice_client.get(revoke).status_code == 405
    assert SharedLink.objects.exists()


def test_with_sharing_for_users_a_visitor_logs_in_first(alice, alice_client, client):
    conversation = chat(alice)
    share(alice_client, conversation)

    response = shared_page(client, conversation)

    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login") + "?next=/s/")


def test_with_public_sharing_anyone_with_the_link_reads_it(alice, alice_client, client, settings):
    settings.CHAT_SHARING = "public"
    conversation = chat(alice)
    share(alice_client, conversation)

    response = shared_page(client, conversation)

    assert response.status_code == 200
    assert "Which tea?" in response.content.decode()
    assert "Log in to continue this chat" in response.content.decode()


def test_with_sharing_off_there_is_no_share_button_and_links_answer_404(alice, alice_client, bob_client, settings):
    conversation = chat(alice)
    share(alice_client, conversation)
    token = SharedLink.objects.get().token
    settings.CHAT_SHARING = "off"

    assert bob_client.get(f"/s/{token}/").status_code == 404
    assert share(alice_client, chat(alice)).status_code == 403
    assert ">Share</button>" not in alice_client.get(conversation.get_absolute_url()).content.decode()


def test_continue_this_chat_copies_the_snapshot_into_the_viewers_account(alice, bob, alice_client, bob_client):
    conversation = chat(alice)
    share(alice_client, conversation)
    link = SharedLink.objects.get()

    response = bob_client.post(reverse("shared_continue", args=[link.token]))

    copy = Conversation.objects.get(user=bob)
    assert response.status_code == 302
    assert response["Location"] == copy.get_absolute_url()
    assert copy.title == "Tea"
    assert copy.model == settings.CHAT_MODEL
    assert [(m.role, m.content) for m in copy.messages.all()] == [
        ("user", "Which tea?"),
        ("assistant", "Green **tea** is best."),
    ]
    assert copy.current_leaf == copy.messages.last()
    assert Conversation.objects.filter(user=alice).count() == 1


def test_continue_uses_the_default_model_when_the_original_is_not_served(alice, bob, alice_client, bob_client):
    conversation = chat(alice)
    Conversation.objects.filter(pk=conversation.pk).update(model="a-model-gone-since")
    share(alice_client, conversation)

    bob_client.post(reverse("shared_continue", args=[SharedLink.objects.get().token]))

    assert Conversation.objects.get(user=bob).model == settings.CHAT_MODEL


def test_continue_needs_log_in_and_a_valid_link(alice, alice_client, bob_client, client, settings):
    settings.CHAT_SHARING = "public"
    share(alice_client, chat(alice))
    token = SharedLink.objects.get().token

    assert client.post(reverse("shared_continue", args=[token])).status_code == 302  # to log in
    assert bob_client.post(reverse("shared_continue", args=["y" * 32])).status_code == 404
    assert bob_client.get(reverse("shared_continue", args=[token])).status_code == 405
    assert Conversation.objects.count() == 1


def test_with_public_sharing_a_revoked_link_is_404_for_visitors_too(alice, alice_client, client, settings):
    settings.CHAT_SHARING = "public"
    share(alice_client, chat(alice))
    link = SharedLink.objects.get()
    alice_client.post(reverse("generation:shared_link_revoke", args=[link.pk]))

    assert client.get(f"/s/{link.token}/").status_code == 404


def test_with_sharing_for_users_a_malformed_token_is_404_without_log_in(client):
    assert client.get("/s/not-a-token/").status_code == 404


def test_admins_see_links_read_only_and_take_them_down(alice, alice_client, admin_client, bob_client):
    conversation = chat(alice, title="Tea talk")
    share(alice_client, conversation)
    link = SharedLink.objects.get()

    listing = admin_client.get(reverse("admin:generation_sharedlink_changelist"))
    page = admin_client.get(reverse("admin:generation_sharedlink_change", args=[link.pk]))
    deleted = admin_client.post(reverse("admin:generation_sharedlink_delete", args=[link.pk]), {"post": "yes"})

    assert listing.status_code == 200
    assert "Tea talk" in listing.content.decode()
    assert page.status_code == 200
    assert 'name="title"' not in page.content.decode()  # shown, not editable
    assert deleted.status_code == 302
    assert bob_client.get(f"/s/{link.token}/").status_code == 404
