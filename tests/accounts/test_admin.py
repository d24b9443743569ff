from __future__ import annotations

import csv
import datetime as dt
import io
import re

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.urls import reverse

from accounts.models import Plan
from accounts.services import account_for, api_key_create, usage_rollup
from generation.models import Conversation, Message
from generation.services import generation_admit
from inference.generators import GenerationParams
from tests.support.usage import usage

pytestmark = pytest.mark.django_db


def roll_up_march_2025() -> None:
    """The per-day view reads the rolled-up totals: roll up the days these tests use."""
    usage_rollup(days=2, now=dt.datetime(2025, 3, 2, 23, tzinfo=dt.UTC))


def daily_rows(page: str) -> dict[str, list[int]]:
    rows = re.findall(r'<tr data-day="([^"]+)">(.*?)</tr>', page, re.S)
    return {day: [int(cell) for cell in re.findall(r"<td>(\d+)</td>", cells)] for day, cells in rows}


@pytest.mark.parametrize(
    "url_name",
    [
        "admin:accounts_plan_changelist",
        "admin:auth_user_changelist",
        "admin:accounts_apikey_changelist",
        "admin:accounts_usagerecord_changelist",
        "admin:generation_message_changelist",
        "admin:generation_conversation_changelist",
    ],
)
def test_admin_changelists_load(admin_client, alice, url_name):
    key, _ = api_key_create(user=alice, name="laptop")
    usage(alice, api_key=key)
    conversation = Conversation.objects.create(user=alice, model="synthetic", title="Hello")
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content="hi")
    response = admin_client.get(reverse(url_name))
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1


def test_plan_limits_are_editable_in_the_list(admin_client):
    plan = Plan.objects.get(name="default")
    page = admin_client.get(reverse("admin:accounts_plan_changelist")).content.decode()
    for field in (
        "requests_per_minute",
        "tokens_per_day",
        "max_concurrent_streams",
        "max_tokens_per_request",
        "max_documents_per_conversation",
        "max_document_bytes",
    ):
        assert f'name="form-0-{field}"' in page
    response = admin_client.post(
        reverse("admin:accounts_plan_change", args=[plan.pk]),
        {
            "name": "default",
            "requests_per_minute": 7,
            "tokens_per_day": 1000,
            "max_concurrent_streams": 1,
            "max_tokens_per_request": 64,
            "priority": 0,
            "max_documents_per_conversation": 3,
            "max_document_bytes": 500_000,
        },
    )
    assert response.status_code == 302
    plan.refresh_from_db()
    assert plan.requests_per_minute == 7
    assert plan.max_tokens_per_request == 64
    assert plan.max_documents_per_conversation == 3
    assert plan.max_document_bytes == 500_000


PLAN_FORM = {
    "name": "gold",
    "requests_per_minute": 20,
    "tokens_per_day": 1000,
    "max_concurrent_streams": 2,
    "max_tokens_per_request": 64,
    "max_documents_per_conversation": 20,
    "max_document_bytes": 2_000_000,
}


def test_plan_priority_is_set_in_admin_and_reaches_the_users_generations(admin_client, alice, settings, fast_engine):
    assert Plan.objects.get(name="default").priority == 0  # as before: everyone waits alike
    page = admin_client.get(reverse("admin:accounts_plan_changelist")).content.decode()
    assert 'name="form-0-priority"' in page
    response = admin_client.post(reverse("admin:accounts_plan_add"), {**PLAN_FORM, "priority": 10})
    assert response.status_code == 302
    gold = Plan.objects.get(name="gold")
    assert gold.priority == 10
    account = account_for(alice)
    account.plan = gold
    account.save()

    admitted = generation_admit(
        user=alice,
        channel="api",
        model=settings.CHAT_MODEL,
        prompt="Hi",
        params=GenerationParams(),
        requested_max_tokens=None,
    )

    assert admitted.task.priority == 10
    assert admitted.task.owner == str(alice.pk)


@pytest.mark.parametrize("priority", ["high", "", "40000", "-40000", "1.5"])
def test_plan_priority_that_is_not_a_small_whole_number_is_refused(admin_client, priority):
    response = admin_client.post(reverse("admin:accounts_plan_add"), {**PLAN_FORM, "priority": priority})
    assert response.status_code == 200
    assert "priority" in response.context["adminform"].form.errors
    assert not Plan.objects.filter(name="gold").exists()


def test_user_change_page_has_the_account_inline(admin_client, alice):
    account_for(alice)
    page = admin_client.get(reverse("admin:auth_user_change", args=[alice.pk])).content.decode()
    assert "plan and limits" in page.lower()
    assert 'name="account-0-plan"' in page
    assert 'name="account-0-tokens_per_day"' in page


def test_user_list_shows_the_plan(admin_client, alice):
    account_for(alice)
    page = admin_client.get(reverse("admin:auth_user_changelist")).content.decode()
    assert '<td class="field-plan">default</td>' in page


def test_admin_can_override_a_users_limits(admin_client, alice):
    account = account_for(alice)
    change = reverse("admin:auth_user_change", args=[alice.pk])
    form = admin_client.get(change).context["adminform"].form
    data = {name: value for name, value in form.initial.items() if value is not None and name != "password"}
    data.update(
        {
            "date_joined_0": alice.date_joined.strftime("%Y-%m-%d"),
            "date_joined_1": alice.date_joined.strftime("%H:%M:%S"),
            "account-TOTAL_FORMS": "1",
            "account-INITIAL_FORMS": "1",
            "account-MIN_NUM_FORMS": "0",
            "account-MAX_NUM_FORMS": "1",
            "account-0-id": account.pk,
            "account-0-user": alice.pk,
            "account-0-plan": account.plan_id,
            "account-0-tokens_per_day": "5",
        }
    )
    data.pop("date_joined", None)
    data.pop("last_login", None)
    data.pop("groups", None)
    data.pop("user_permissions", None)
    response = admin_client.post(change, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    account.refresh_from_db()
    assert account.tokens_per_day == 5
    assert account.limits.tokens_per_day == 5


def test_api_key_change_page_never_shows_the_hash(admin_client, alice):
    key, plain = api_key_create(user=alice, name="laptop")
    page = admin_client.get(reverse("admin:accounts_apikey_change", args=[key.pk])).content.decode()
    assert "laptop" in page
    assert f"{key.prefix}…" in page
    assert key.hashed not in page
    assert plain not in page
    assert 'name="hashed"' not in page


def test_api_key_changelist_hides_the_hash_and_can_search(admin_client, alice, bob):
    key, _ = api_key_create(user=alice, name="laptop")
    api_key_create(user=bob, name="server")
    response = admin_client.get(reverse("admin:accounts_apikey_changelist"), {"q": "alice"})
    assert [found.pk for found in response.context["cl"].result_list] == [key.pk]
    assert key.hashed not in response.content.decode()


def test_api_keys_cannot_be_added_in_admin(admin_client):
    assert admin_client.get(reverse("admin:accounts_apikey_add")).status_code == 403


def test_revoke_action_revokes_the_selected_keys(admin_client, alice):
    chosen, _ = api_key_create(user=alice, name="leaked")
    other, _ = api_key_create(user=alice, name="fine")
    response = admin_client.post(
        reverse("admin:accounts_apikey_changelist"), {"action": "revoke", ACTION_CHECKBOX_NAME: [chosen.pk]}
    )
    assert response.status_code == 302
    chosen.refresh_from_db()
    other.refresh_from_db()
    assert chosen.revoked_at is not None
    assert other.revoked_at is None


def test_usage_records_are_read_only(admin_client, alice):
    record = usage(alice)
    assert admin_client.get(reverse("admin:accounts_usagerecord_add")).status_code == 403
    page = admin_client.get(reverse("admin:accounts_usagerecord_change", args=[record.pk])).content.decode()
    assert 'name="prompt_tokens"' not in page


def test_csv_export_has_a_header_and_one_row_per_record(admin_client, alice, bob):
    records = [usage(alice, prompt=3, completion=5), usage(bob, prompt=1, completion=2), usage(alice)]
    response = admin_client.post(
        reverse("admin:accounts_usagerecord_changelist"),
        {"action": "export_csv", ACTION_CHECKBOX_NAME: [records[0].pk, records[1].pk]},
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment;")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 2
    assert {(row["user"], row["prompt_tokens"], row["completion_tokens"]) for row in rows} == {
        ("alice", "3", "5"),
        ("bob", "1", "2"),
    }


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_csv_export_quotes_text_a_spreadsheet_would_run_as_a_formula(admin_client, alice, start):
    alice.username = f"{start}HYPERLINK(1)"
    alice.save()
    record = usage(alice, prompt=3, model=f"{start}cmd|' /C calc'!A0")
    response = admin_client.post(
        reverse("admin:accounts_usagerecord_changelist"), {"action": "export_csv", ACTION_CHECKBOX_NAME: [record.pk]}
    )

    (row,) = csv.DictReader(io.StringIO(response.content.decode()))
    assert row["user"] == f"'{start}HYPERLINK(1)"
    assert row["model"] == f"'{start}cmd|' /C calc'!A0"
    assert (row["id"], row["prompt_tokens"], row["channel"]) == (str(record.pk), "3", "api")  # the rest as they are


def test_usage_changelist_links_to_per_day_totals(admin_client):
    page = admin_client.get(reverse("admin:accounts_usagerecord_changelist"), {"channel__exact": "api"})
    assert f'{reverse("admin:accounts_usagerecord_daily")}?channel__exact=api">Per-day totals' in page.content.decode()


def test_per_day_totals_sum_each_day(admin_client, alice, bob):
    usage(alice, day=dt.date(2025, 3, 1), prompt=10, completion=20)
    usage(bob, day=dt.date(2025, 3, 1), prompt=1, completion=2)
    usage(alice, day=dt.date(2025, 3, 2), prompt=100, completion=200)
    roll_up_march_2025()
    response = admin_client.get(reverse("admin:accounts_usagerecord_daily"))
    assert response.status_code == 200
    assert daily_rows(response.content.decode()) == {
        "2025-03-02": [1, 100, 200, 300],
        "2025-03-01": [2, 11, 22, 33],
        "total": [3, 111, 222, 333],
    }


def test_per_day_totals_can_be_filtered_by_user(admin_client, alice, bob):
    usage(alice, day=dt.date(2025, 3, 1), prompt=10, completion=20)
    usage(bob, day=dt.date(2025, 3, 1), prompt=1, completion=2)
    usage(alice, day=dt.date(2025, 3, 2), prompt=100, completion=200)
    roll_up_march_2025()
    page = admin_client.get(reverse("admin:accounts_usagerecord_daily"), {"user": bob.pk}).content.decode()
    assert daily_rows(page) == {"2025-03-01": [1, 1, 2, 3], "total": [1, 1, 2, 3]}


def test_per_day_totals_honour_changelist_filters(admin_client, alice):
    usage(alice, day=dt.date(2025, 3, 1), prompt=10, completion=20, channel="ui")
    usage(alice, day=dt.date(2025, 3, 1), prompt=1, completion=2, channel="api")
    roll_up_march_2025()
    page = admin_client.get(reverse("admin:accounts_usagerecord_daily"), {"channel__exact": "ui", "p": 3})
    assert daily_rows(page.content.decode()) == {"2025-03-01": [1, 10, 20, 30], "total": [1, 10, 20, 30]}


def test_per_day_totals_with_a_bad_filter_go_back_to_the_changelist(admin_client):
    response = admin_client.get(reverse("admin:accounts_usagerecord_daily"), {"user": "not-a-number"})
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:accounts_usagerecord_changelist") + "?e=1"


def test_message_changelist_links_to_live_generations(admin_client):
    page = admin_client.get(reverse("admin:generation_message_changelist")).content.decode()
    assert f'<a href="{reverse("admin:generation_message_live")}">Live generations</a>' in page


def test_live_generations_lists_streaming_records_and_engines(admin_client, alice, stream_store, fast_engine):
    streaming = usage(alice, status="streaming", stream_id="live-stream-1", reserved_tokens=256)
    usage(alice, status="complete", stream_id="finished-stream")
    response = admin_client.get(reverse("admin:generation_message_live"))
    assert response.status_code == 200
    page = response.content.decode()
    assert f'data-stream-id="{streaming.stream_id}"' in page
    assert "<td>256</td>" in page
    assert 'data-stream-id="finished-stream"' not in page
    assert '<td data-role="active">0</td>' in page
    assert '<td data-role="queued">0</td>' in page
    assert "Force stop" in page


def test_force_stop_sets_the_cancel_flag(admin_client, alice, stream_store):
    record = usage(alice, status="streaming", stream_id="live-stream-2")
    stream_store.create(record.stream_id)
    response = admin_client.post(reverse("admin:generation_message_force_stop"), {"stream_id": record.stream_id})
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:generation_message_live")
    assert stream_store.is_cancelled(record.stream_id)


def test_force_stop_of_an_unknown_stream_says_so(admin_client, stream_store):
    response = admin_client.post(
        reverse("admin:generation_message_force_stop"), {"stream_id": "gone-stream"}, follow=True
    )
    assert "is not in the stream store" in response.content.decode()


def test_force_stop_needs_post(admin_client, stream_store):
    assert admin_client.get(reverse("admin:generation_message_force_stop")).status_code == 405


def test_force_stop_action_cancels_selected_streaming_messages(admin_client, alice, stream_store):
    conversation = Conversation.objects.create(user=alice, model="synthetic")
    streaming = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING, stream_id="m-1"
    )
    done = Message.objects.create(
        conversation=conversation, role=Message.Role.ASSISTANT, status=Message.Status.COMPLETE, stream_id="m-2"
    )
    for message in (streaming, done):
        stream_store.create(message.stream_id)
    response = admin_client.post(
        reverse("admin:generation_message_changelist"),
        {"action": "force_stop", ACTION_CHECKBOX_NAME: [streaming.pk, done.pk]},
    )
    assert response.status_code == 302
    assert stream_store.is_cancelled("m-1")
    assert not stream_store.is_cancelled("m-2")


@pytest.mark.parametrize(
    "url_name",
    [
        "admin:accounts_usagerecord_daily",
        "admin:generation_message_live",
        "admin:accounts_apikey_changelist",
        "admin:accounts_plan_changelist",
    ],
)
def test_non_staff_users_are_sent_to_the_admin_login(alice_client, url_name):
    response = alice_client.get(reverse(url_name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_non_staff_users_cannot_force_stop(alice_client, alice, stream_store):
    stream_store.create("alice-stream")
    response = alice_client.post(reverse("admin:generation_message_force_stop"), {"stream_id": "alice-stream"})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
    assert not stream_store.is_cancelled("alice-stream")
