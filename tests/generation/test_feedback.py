"""👍 / 👎 on finished answers: rating, changing it, who may, what is refused, export and import,
the admin's rated answers and satisfaction figure, and the /metrics counter."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from prometheus_client import REGISTRY

from accounts.models import Plan
from accounts.services import account_for
from generation import transfer
from generation.feedback import CannotRate, feedback_set, satisfaction_by_model
from generation.models import Conversation, Feedback, Message

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def chat(user, *, model: str = settings.CHAT_MODEL, status: str = "complete") -> tuple[Conversation, Message]:
    """A conversation of `user`: a prompt and its answer."""
    conversation = Conversation.objects.create(user=user, model=model, title="Tea")
    prompt = conversation.messages.create(role="user", content="How do I brew tea?")
    answer = conversation.messages.create(
        role="assistant", parent=prompt, content="Steep it for three minutes.", model=model, status=status
    )
    return conversation, answer


def rate(client, message: Message, **data: str):
    return client.post(reverse("generation:message_feedback", args=[message.pk]), data, **HTMX)


def pressed(page: str) -> list[str]:
    """The rating buttons pressed on a page, by name."""
    return re.findall(r'aria-label="(Good answer|Bad answer)" title="[^"]*" aria-pressed="true"', page)


def counted(rating: str, model: str = settings.CHAT_MODEL) -> float:
    return REGISTRY.get_sample_value("chatsite_answer_feedback_total", {"rating": rating, "model": model}) or 0.0


# Rating


def test_a_finished_answer_has_good_and_bad_buttons_and_a_prompt_has_none(alice, alice_client):
    conversation, answer = chat(alice)

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    assert page.count('aria-label="Good answer"') == page.count('aria-label="Bad answer"') == 1
    assert f'id="feedback-{answer.pk}"' in page
    assert pressed(page) == []


@pytest.mark.parametrize("status", ["stopped", "interrupted", "error"])
def test_stopped_and_failed_answers_can_be_rated_too(alice, alice_client, status):
    conversation, answer = chat(alice, status=status)

    assert 'aria-label="Good answer"' in alice_client.get(conversation.get_absolute_url()).content.decode()
    assert rate(alice_client, answer, rating="bad").status_code == 200


def test_a_streaming_answer_has_no_rating_buttons(alice, alice_client):
    conversation, _answer = chat(alice, status="streaming")

    page = alice_client.get(conversation.get_absolute_url()).content.decode()

    assert "Good answer" not in page
    assert "Bad answer" not in page


def test_alices_rating_survives_a_reload(alice, alice_client):
    conversation, answer = chat(alice)

    response = rate(alice_client, answer, rating="good")

    assert response.status_code == 200
    assert pressed(response.content.decode()) == ["Good answer"]
    assert "Thanks: your rating is saved." in response.content.decode()
    assert pressed(alice_client.get(conversation.get_absolute_url()).content.decode()) == ["Good answer"]
    assert Feedback.objects.get(message=answer).rating == "good"


def test_a_rating_can_be_changed_and_keeps_its_reason_and_comment(alice, alice_client):
    conversation, answer = chat(alice)
    rate(alice_client, answer, rating="bad", reason="incomplete", comment="It forgot the water.")

    response = rate(alice_client, answer, rating="good", reason="incomplete", comment="It forgot the water.")

    assert pressed(response.content.decode()) == ["Good answer"]
    rated = Feedback.objects.get(message=answer)
    assert (rated.rating, rated.reason, rated.comment) == ("good", "incomplete", "It forgot the water.")
    assert Feedback.objects.count() == 1
    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    assert pressed(page) == ["Good answer"]
    assert "It forgot the water.</textarea>" in page
    assert '<option value="incomplete" selected>' in page


def test_the_reason_and_comment_are_offered_once_the_answer_is_rated(alice, alice_client):
    _conversation, answer = chat(alice)
    before = alice_client.get(_conversation.get_absolute_url()).content.decode()

    after = rate(alice_client, answer, rating="bad").content.decode()

    assert "Add a reason or comment" not in before
    assert "Add a reason or comment" in after
    assert f'<label for="feedback-{answer.pk}-comment">Comment:</label>' in after
    assert f'<select name="reason" id="feedback-{answer.pk}-reason">' in after


def test_a_plain_form_post_goes_back_to_the_answer(alice, alice_client):
    conversation, answer = chat(alice)

    response = alice_client.post(reverse("generation:message_feedback", args=[answer.pk]), {"rating": "bad"})

    assert response.status_code == 302
    assert response["Location"] == f"{conversation.get_absolute_url()}#message-{answer.pk}"
    assert Feedback.objects.get(message=answer).rating == "bad"


def test_a_comment_of_exactly_the_limit_is_kept(alice, alice_client):
    _conversation, answer = chat(alice)

    assert rate(alice_client, answer, rating="bad", comment="x" * 2000).status_code == 200
    assert len(Feedback.objects.get(message=answer).comment) == 2000


# Refused


def test_bob_cannot_rate_alices_answer(alice, bob_client):
    _conversation, answer = chat(alice)

    htmx = rate(bob_client, answer, rating="bad")
    plain = bob_client.post(reverse("generation:message_feedback", args=[answer.pk]), {"rating": "bad"})

    assert htmx.status_code == plain.status_code == 404
    assert not Feedback.objects.exists()


def test_bob_cannot_change_alices_rating(alice, alice_client, bob_client):
    _conversation, answer = chat(alice)
    rate(alice_client, answer, rating="good", comment="Lovely.")

    assert rate(bob_client, answer, rating="bad", comment="Awful.").status_code == 404
    assert (Feedback.objects.get().rating, Feedback.objects.get().comment) == ("good", "Lovely.")


def test_anonymous_visitors_cannot_rate(alice, client):
    _conversation, answer = chat(alice)

    response = rate(client, answer, rating="good")

    assert response.status_code == 403
    assert response.content.decode() == "Log in to rate answers.\n"
    assert not Feedback.objects.exists()


def test_a_prompt_is_not_an_answer_to_rate(alice, alice_client):
    conversation, _answer = chat(alice)
    prompt = conversation.messages.get(role="user")

    assert rate(alice_client, prompt, rating="good").status_code == 404
    assert not Feedback.objects.exists()


def test_a_streaming_answer_cannot_be_rated_until_it_has_finished(alice, alice_client):
    _conversation, answer = chat(alice, status="streaming")

    response = rate(alice_client, answer, rating="good")

    assert response.status_code == 409
    assert "still being written" in response.content.decode()
    assert not Feedback.objects.exists()


def test_an_unknown_message_is_not_found(alice_client):
    assert (
        alice_client.post(reverse("generation:message_feedback", args=[987654]), {"rating": "good"}).status_code == 404
    )


def test_rating_needs_a_post(alice, alice_client):
    _conversation, answer = chat(alice)
    assert alice_client.get(reverse("generation:message_feedback", args=[answer.pk])).status_code == 405


BAD_INPUT = [
    ({}, "Choose Good answer or Bad answer."),
    ({"rating": ""}, "Choose Good answer or Bad answer."),
    ({"rating": "excellent"}, "A rating is good or bad."),
    ({"rating": "GOOD"}, "A rating is good or bad."),
    ({"rating": "good", "reason": "rude"}, "Choose one of the reasons listed."),
    ({"rating": "bad", "comment": "x" * 2001}, "A comment is at most 2000 characters (this one has 2001)."),
    ({"rating": "bad", "comment": "a\x00b"}, "Null characters are not allowed."),
]


@pytest.mark.parametrize(("data", "error"), BAD_INPUT)
def test_bad_input_is_refused_beside_the_buttons(alice, alice_client, data, error):
    _conversation, answer = chat(alice)

    response = rate(alice_client, answer, **data)

    assert response.status_code == 422
    page = response.content.decode()
    assert '<p class="errors" role="alert">' in page
    assert error in page
    assert 'aria-label="Good answer"' in page
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(("data", "error"), BAD_INPUT)
def test_bad_input_without_htmx_is_a_400_that_says_why(alice, alice_client, data, error):
    _conversation, answer = chat(alice)

    response = alice_client.post(reverse("generation:message_feedback", args=[answer.pk]), data)

    assert response.status_code == 400
    assert response.content.decode() == error + "\n"
    assert not Feedback.objects.exists()


def test_bad_input_leaves_the_saved_rating_as_it_was(alice, alice_client):
    _conversation, answer = chat(alice)
    rate(alice_client, answer, rating="good", comment="Spot on.")

    response = rate(alice_client, answer, rating="bad", comment="x" * 5000)

    assert response.status_code == 422
    assert pressed(response.content.decode()) == ["Good answer"]  # what is saved
    assert " open>" in response.content.decode()  # the comment box stays open, with the text
    assert (Feedback.objects.get().rating, Feedback.objects.get().comment) == ("good", "Spot on.")


def test_the_service_refuses_prompts_and_streaming_answers(alice):
    conversation, answer = chat(alice, status="streaming")
    prompt = conversation.messages.get(role="user")

    with pytest.raises(CannotRate, match="Only answers"):
        feedback_set(message=prompt, rating="good")
    with pytest.raises(CannotRate, match="still being written"):
        feedback_set(message=answer, rating="good")


def test_the_page_reads_every_answers_rating_in_the_same_query(alice, alice_client):
    many, answer = chat(alice)
    for _ in range(4):
        prompt = many.messages.create(role="user", parent=answer, content="More?")
        answer = many.messages.create(role="assistant", parent=prompt, content="Yes.", model=settings.CHAT_MODEL)
        feedback_set(message=answer, rating="bad", comment="No.")

    with CaptureQueriesContext(connection) as captured:
        page = alice_client.get(many.get_absolute_url())

    assert page.content.decode().count('aria-pressed="true"') == 4
    # Read with the messages (a join), not once per answer. (Counting all of the page's
    # queries proved flaky: the account is read a varying number of times.)
    assert not [query for query in captured if 'FROM "generation_feedback"' in query["sql"]]
    assert len([query for query in captured if 'LEFT OUTER JOIN "generation_feedback"' in query["sql"]]) == 1


# /metrics


def test_metrics_count_ratings_given_and_changed_but_not_resaved(
    alice, alice_client, django_capture_on_commit_callbacks
):
    _conversation, answer = chat(alice)
    good, bad = counted("good"), counted("bad")

    with django_capture_on_commit_callbacks(execute=True):
        rate(alice_client, answer, rating="bad")
        rate(alice_client, answer, rating="bad", reason="inaccurate", comment="Wrong.")  # the same rating
        rate(alice_client, answer, rating="good")
        rate(alice_client, answer, rating="x")  # refused

    assert (counted("good") - good, counted("bad") - bad) == (1, 1)


def test_metrics_export_the_feedback_counter(alice, client, django_capture_on_commit_callbacks):
    _conversation, answer = chat(alice)
    with django_capture_on_commit_callbacks(execute=True):
        feedback_set(message=answer, rating="good")

    text = client.get("/metrics").content.decode()

    assert re.search(rf'chatsite_answer_feedback_total{{model="{settings.CHAT_MODEL}",rating="good"}} [1-9]', text)


# Export and import


def upload(data: object) -> dict[str, SimpleUploadedFile]:
    raw = json.dumps(data).encode()
    return {"file": SimpleUploadedFile("chat.json", raw, content_type="application/json")}


def rated_chat(user) -> Conversation:
    conversation, answer = chat(user)
    feedback_set(message=answer, rating="bad", reason="incomplete", comment="Which tea?")
    prompt = conversation.messages.create(role="user", parent=answer, content="Green tea.")
    conversation.messages.create(role="assistant", parent=prompt, content="Two minutes.", model=settings.CHAT_MODEL)
    return conversation


def test_the_json_export_carries_each_answers_rating(alice, alice_client):
    conversation = rated_chat(alice)

    document = json.loads(
        alice_client.get(reverse("generation:conversation_export_json", args=[conversation.id])).content
    )

    messages = document["messages"]
    assert "feedback" not in messages[0]  # a prompt
    assert {key: messages[1]["feedback"][key] for key in ("rating", "reason", "comment")} == {
        "rating": "bad",
        "reason": "incomplete",
        "comment": "Which tea?",
    }
    assert dt.datetime.fromisoformat(messages[1]["feedback"]["rated_at"])
    assert messages[3]["feedback"] is None  # an answer not rated


def test_ratings_survive_export_and_import(alice, bob, alice_client, bob_client, django_capture_on_commit_callbacks):
    exported = alice_client.get(reverse("generation:conversation_export_json", args=[rated_chat(alice).id])).content
    bad = counted("bad")

    with django_capture_on_commit_callbacks(execute=True):
        response = bob_client.post(reverse("generation:your_data"), upload(json.loads(exported)))

    assert response.status_code == 302
    copy = Conversation.objects.get(user=bob)
    rated = Feedback.objects.get(message__conversation=copy)
    assert (rated.message.content, rated.rating, rated.reason, rated.comment) == (
        "Steep it for three minutes.",
        "bad",
        "incomplete",
        "Which tea?",
    )
    assert Feedback.objects.filter(message__conversation__user=alice).count() == 1  # hers untouched
    assert pressed(bob_client.get(copy.get_absolute_url()).content.decode()) == ["Bad answer"]
    assert counted("bad") == bad  # carried over, not given now


def test_an_export_from_before_ratings_is_imported(alice, alice_client):
    document = transfer.conversation_document(chat(alice)[0])
    for message in document["messages"]:
        message.pop("feedback", None)

    assert alice_client.post(reverse("generation:your_data"), upload(document)).status_code == 302
    assert Conversation.objects.filter(user=alice).count() == 2


def good_document() -> dict:
    return {
        "format": "chatsite.conversation",
        "version": 1,
        "messages": [
            {"id": 0, "parent": None, "role": "user", "content": "Hi"},
            {"id": 1, "parent": 0, "role": "assistant", "content": "Hello", "feedback": {"rating": "good"}},
        ],
    }


def with_feedback(index: int, feedback: object) -> dict:
    document = good_document()
    document["messages"][index]["feedback"] = feedback
    return document


@pytest.mark.parametrize(
    ("document", "error"),
    [
        (with_feedback(1, {"rating": "great"}), "messages.1.feedback.rating: Value error, is not one of good, bad"),
        (with_feedback(1, {"rating": "bad", "reason": "rude"}), "messages.1.feedback.reason: Value error"),
        (
            with_feedback(1, {"rating": "bad", "comment": "x" * 2001}),
            "messages.1.feedback.comment: String should have at most 2000 characters",
        ),
        (with_feedback(1, {"rating": "bad", "comment": "a\x00b"}), "contains a NUL character"),
        (with_feedback(1, {"reason": "other"}), "messages.1.feedback.rating: Field required"),
        (with_feedback(1, {"rating": "good", "stars": 5}), "messages.1.feedback.stars: Extra inputs are not permitted"),
        (with_feedback(1, "good"), "messages.1.feedback: Input should be an object"),
        (with_feedback(1, {"rating": 1}), "messages.1.feedback.rating: Input should be a valid string"),
        (with_feedback(0, {"rating": "good"}), "Message 0 is a prompt with a rating; only answers are rated."),
    ],
)
def test_a_bad_rating_in_an_imported_file_is_refused_and_nothing_is_made(alice, alice_client, document, error):
    response = alice_client.post(reverse("generation:your_data"), upload(document))

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not Conversation.objects.filter(user=alice).exists()
    assert not Feedback.objects.exists()


def test_a_rated_answer_that_was_streaming_is_imported_interrupted_with_its_rating(alice, alice_client):
    document = with_feedback(1, {"rating": "bad", "reason": "incomplete"})
    document["messages"][1]["status"] = "streaming"

    alice_client.post(reverse("generation:your_data"), upload(document))

    rated = Feedback.objects.get(message__conversation__user=alice)
    assert (rated.message.status, rated.rating, rated.reason) == ("interrupted", "bad", "incomplete")


# Admin


def test_rated_answers_list_filters_by_rating_model_and_plan(admin_client, alice, bob):
    gold = Plan.objects.create(name="gold")
    account = account_for(bob)
    account.plan = gold
    account.save()
    _c, alices = chat(alice, model="model-a")
    _c, bobs = chat(bob, model="model-b")
    feedback_set(message=alices, rating="good", comment="Nice and short.")
    feedback_set(message=bobs, rating="bad", reason="inaccurate", comment="Quite wrong.")
    url = reverse("admin:generation_feedback_changelist")

    everything = admin_client.get(url).content.decode()
    by_rating = admin_client.get(url, {"rating__exact": "bad"}).content.decode()
    by_model = admin_client.get(url, {"message__model": "model-a"}).content.decode()
    by_plan = admin_client.get(url, {"message__conversation__user__account__plan__id__exact": gold.pk}).content
    dated = admin_client.get(url, {"updated_at__year": timezone.now().year})

    assert "Nice and short." in everything and "Quite wrong." in everything
    assert "Nice and short." not in by_rating and "Quite wrong." in by_rating
    assert "Nice and short." in by_model and "Quite wrong." not in by_model
    assert b"Quite wrong." in by_plan and b"Nice and short." not in by_plan
    assert dated.status_code == 200


def test_a_rated_answer_links_to_its_conversation_read_only(admin_client, alice):
    conversation = rated_chat(alice)
    rated = Feedback.objects.get()
    link = reverse("admin:generation_feedback_conversation", args=[rated.pk])

    listing = admin_client.get(reverse("admin:generation_feedback_changelist")).content.decode()
    page = admin_client.get(link).content.decode()

    assert f'<a href="{link}#message-{rated.message_id}">Tea</a>' in listing
    assert f'id="message-{rated.message_id}" data-role="assistant" data-rated="true"' in page
    assert "How do I brew tea?" in page and "Two minutes." in page
    assert "Which tea?" in page and "Incomplete" in page
    assert "<form" not in page.split('id="content-main"')[1]  # nothing to change there
    assert conversation.title in page


def test_rated_answers_cannot_be_added_changed_or_deleted_in_admin(admin_client, alice):
    _c, answer = chat(alice)
    rated = feedback_set(message=answer, rating="good", comment="Kind words.")

    assert admin_client.get(reverse("admin:generation_feedback_add")).status_code == 403
    change = admin_client.post(
        reverse("admin:generation_feedback_change", args=[rated.pk]), {"rating": "bad", "comment": "Changed."}
    )
    assert change.status_code == 403
    assert admin_client.get(reverse("admin:generation_feedback_delete", args=[rated.pk])).status_code == 403
    assert Feedback.objects.get().comment == "Kind words."


def test_non_staff_users_cannot_read_rated_answers_in_admin(alice, alice_client):
    _c, answer = chat(alice)
    rated = feedback_set(message=answer, rating="good")
    for url in (
        reverse("admin:generation_feedback_changelist"),
        reverse("admin:generation_feedback_conversation", args=[rated.pk]),
    ):
        response = alice_client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_the_usage_chart_has_the_share_of_good_ratings_per_model_beside_it(admin_client, alice):
    for rating in ("good", "good", "good", "bad"):
        feedback_set(message=chat(alice, model="model-a")[1], rating=rating)
    feedback_set(message=chat(alice, model="model-b")[1], rating="bad")

    page = admin_client.get(reverse("admin:accounts_usagerecord_changelist")).content.decode()

    figures = page.split('<div class="usage-figures">')[1]
    assert 'data-role="usage-chart"' in figures and 'data-role="satisfaction"' in figures
    assert re.search(
        r'data-model="model-a">.*?<td>3</td>\s*<td>1</td>\s*<td data-role="good-share">75%</td>', figures, re.S
    )
    assert re.search(
        r'data-model="model-b">.*?<td>0</td>\s*<td>1</td>\s*<td data-role="good-share">0%</td>', figures, re.S
    )


def test_satisfaction_counts_answers_last_rated_in_the_window(alice):
    _c, old = chat(alice, model="model-a")
    _c, recent = chat(alice, model="model-a")
    feedback_set(message=old, rating="bad")
    feedback_set(message=recent, rating="good")
    Feedback.objects.filter(message=old).update(updated_at=timezone.now() - dt.timedelta(days=31))

    [row] = satisfaction_by_model()

    assert (row.model, row.good, row.bad, row.rated, row.good_percent) == ("model-a", 1, 0, 1, 100)
    assert satisfaction_by_model(now=timezone.now() + dt.timedelta(days=60)) == []
