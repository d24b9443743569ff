"""The audit trail: each audited action writes one record, never a secret or a user's text;
records are read-only in the admin and append-only in the model; old ones are purged."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.forms.models import model_to_dict
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.models import Plan
from accounts.services import account_for, api_key_create, api_key_revoke
from audit.models import AppendOnlyError, AuditRecord
from audit.services import audit_purge, audit_record
from chatsite.settings import env_int
from generation.models import Conversation, Message, UpstreamEndpoint
from infrastructure import logs
from infrastructure.database import on_the_callers_thread
from tests.support import PASSWORD
from tests.support.usage import usage

pytestmark = pytest.mark.django_db

LIMIT = 5  # CHAT_LOGIN_FAILURE_LIMIT's default
NEW_PASSWORD = "another-long-passphrase-77"
PROMPT = "my secret recipe for plum jam"


@dataclass
class World:
    """The cast and clients of an audited action, and what must never reach the trail."""

    alice: User
    alice_client: Client
    admin_user: User
    admin_client: Client
    settings: Any
    stream_store: Any
    secrets: list[str] = field(default_factory=lambda: [PASSWORD, NEW_PASSWORD, PROMPT])
    last: int = 0

    def setup_done(self) -> None:
        """The action proper starts here: records written before are its setup's."""
        self.last = AuditRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


@dataclass
class Expected:
    action: str
    actor: str
    target: str
    changes: dict[str, list[Any]] = field(default_factory=dict)


def log_in(world: World) -> Expected:
    Client().post(reverse("accounts:login"), {"username": "alice", "password": PASSWORD})
    return Expected("login", "alice", f"auth.user:{world.alice.pk} alice")


def wrong_password(world: World) -> Expected:
    Client().post(reverse("accounts:login"), {"username": "alice", "password": "not-" + PASSWORD})
    return Expected("login_failed", "", "username:alice")


def sign_up(world: World) -> Expected:
    world.settings.CHAT_SIGNUP = "approval"  # open sign-up logs the new user in too (a log-in record)
    form = {"username": "carol", "password1": PASSWORD, "password2": PASSWORD}
    Client().post(reverse("accounts:signup"), form)
    carol = User.objects.get(username="carol")
    return Expected("signup", "carol", f"auth.user:{carol.pk} carol")


def approve_in_admin(world: World) -> Expected:
    dave = User.objects.create_user("dave", password=PASSWORD, is_active=False)
    action = {"action": "approve", ACTION_CHECKBOX_NAME: [dave.pk]}
    world.admin_client.post(reverse("admin:auth_user_changelist"), action)
    return Expected("user_approved", "admin", f"auth.user:{dave.pk} dave")


def change_password(world: World) -> Expected:
    form = {"old_password": PASSWORD, "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD}
    response = world.alice_client.post(reverse("accounts:password_change"), form)
    assert response.status_code == 302
    return Expected("password_changed", "alice", f"auth.user:{world.alice.pk} alice")


def set_password_in_admin(world: World) -> Expected:
    url = reverse("admin:auth_user_password_change", args=[world.alice.pk])
    response = world.admin_client.post(url, {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD})
    assert response.status_code == 302
    return Expected("password_changed", "admin", f"auth.user:{world.alice.pk} alice")


def create_key(world: World) -> Expected:
    page = world.alice_client.post(reverse("accounts:keys"), {"name": "laptop"}).content.decode()
    key = world.alice.api_keys.get()
    world.secrets.append(page.split('data-role="new-api-key"')[1].split(key.prefix)[1][:20])
    return Expected("key_created", "alice", f"accounts.apikey:{key.pk} {key.prefix}…")


def revoke_key(world: World) -> Expected:
    key, plain = api_key_create(user=world.alice, name="laptop")
    world.secrets.append(plain)
    world.setup_done()
    world.alice_client.post(reverse("accounts:key_revoke", args=[key.pk]))
    return Expected("key_revoked", "alice", f"accounts.apikey:{key.pk} {key.prefix}…")


def use_a_revoked_key(world: World) -> Expected:
    key, plain = api_key_create(user=world.alice, name="laptop")
    world.secrets.append(plain)
    with on_the_callers_thread():
        assert Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 200  # remembered
        api_key_revoke(key=key)
        world.setup_done()
        response = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}")
    assert response.status_code == 401
    return Expected("revoked_key_used", "", f"accounts.apikey:{key.pk} {key.prefix}…")


def edit_a_plan_in_admin(world: World) -> Expected:
    plan = Plan.objects.create(name="pro", tokens_per_day=1000)
    url = reverse("admin:accounts_plan_change", args=[plan.pk])
    data = {name: value for name, value in model_to_dict(plan).items() if value is not None and name != "id"}
    data |= {"tokens_per_day": 5000, "allowed_models": "synthetic\nsmollm2-135m-instruct"}
    response = world.admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    changes = {"tokens_per_day": [1000, 5000], "allowed_models": [[], ["synthetic", "smollm2-135m-instruct"]]}
    return Expected("admin_change", "admin", f"accounts.plan:{plan.pk}", changes)


def edit_a_users_limits_in_admin(world: World) -> Expected:
    # What the form below sends back as it was: whole seconds, no log-in yet.
    world.alice.date_joined = world.alice.date_joined.replace(microsecond=0)
    world.alice.last_login = None
    world.alice.save()
    account = account_for(world.alice)
    url = reverse("admin:auth_user_change", args=[world.alice.pk])
    form = world.admin_client.get(url).context["adminform"].form
    skipped = {"password", "date_joined", "last_login", "groups", "user_permissions"}
    data = {name: value for name, value in form.initial.items() if value is not None and name not in skipped}
    data |= {
        "date_joined_0": world.alice.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": world.alice.date_joined.strftime("%H:%M:%S"),
        "account-TOTAL_FORMS": "1",
        "account-INITIAL_FORMS": "1",
        "account-MIN_NUM_FORMS": "0",
        "account-MAX_NUM_FORMS": "1",
        "account-0-id": account.pk,
        "account-0-user": world.alice.pk,
        "account-0-plan": account.plan_id,
        "account-0-tokens_per_day": "5",
    }
    response = world.admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    return Expected("admin_change", "admin", f"accounts.account:{account.pk}", {"tokens_per_day": [None, 5]})


def replace_an_endpoints_key_in_admin(world: World) -> Expected:
    endpoint = UpstreamEndpoint.objects.create(
        model="remote", base_url="http://127.0.0.1:9/v1", upstream_model="m", api_key="sk-old-upstream-secret"
    )
    world.secrets += ["sk-old-upstream-secret", "sk-new-upstream-secret"]
    url = reverse("admin:generation_upstreamendpoint_change", args=[endpoint.pk])
    data = {"model": "remote", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "m", "enabled": "on"}
    data |= {"max_concurrent": 16, "weight": 1, "connect_timeout_s": 5, "first_token_timeout_s": 60}
    data |= {"read_timeout_s": 60, "api_key": "sk-new-upstream-secret"}
    assert world.admin_client.post(url, data).status_code == 302
    return Expected("admin_change", "admin", f"generation.upstreamendpoint:{endpoint.pk}", {"api_key": ["***", "***"]})


def force_stop(world: World) -> Expected:
    record = usage(world.alice, status="streaming", stream_id="live-stream-9")
    world.stream_store.create(record.stream_id)
    world.admin_client.post(reverse("admin:generation_message_force_stop"), {"stream_id": record.stream_id})
    assert world.stream_store.is_cancelled(record.stream_id)
    return Expected("generation_force_stopped", "admin", "stream:live-stream-9")


def export_a_conversation(world: World) -> Expected:
    conversation = Conversation.objects.create(user=world.alice, model="synthetic", title=PROMPT)
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content=PROMPT)
    url = reverse("generation:conversation_export_json", args=[conversation.id])
    assert PROMPT in world.alice_client.get(url).content.decode()
    return Expected("export", "alice", f"generation.conversation:{conversation.id} as json")


def export_usage_as_csv(world: World) -> Expected:
    record = usage(world.alice)
    action = {"action": "export_csv", ACTION_CHECKBOX_NAME: [record.pk]}
    assert world.admin_client.post(reverse("admin:accounts_usagerecord_changelist"), action).status_code == 200
    return Expected("export", "admin", "accounts.usagerecord, 1 records")


ACTIONS: list[Callable[[World], Expected]] = [
    log_in,
    wrong_password,
    sign_up,
    approve_in_admin,
    change_password,
    set_password_in_admin,
    create_key,
    revoke_key,
    use_a_revoked_key,
    edit_a_plan_in_admin,
    edit_a_users_limits_in_admin,
    replace_an_endpoints_key_in_admin,
    force_stop,
    export_a_conversation,
    export_usage_as_csv,
]


@pytest.fixture
def world(alice, alice_client, admin_user, admin_client, settings, stream_store) -> World:
    return World(alice, alice_client, admin_user, admin_client, settings, stream_store)


def as_text(record: AuditRecord) -> str:
    return json.dumps(
        [record.actor_name, record.action, record.target, record.changes, record.request_id], ensure_ascii=False
    )


@pytest.mark.parametrize("act", ACTIONS, ids=[act.__name__ for act in ACTIONS])
def test_each_audited_action_writes_exactly_one_record(world, act):
    start = timezone.now()
    world.setup_done()

    expected = act(world)

    written = list(AuditRecord.objects.filter(pk__gt=world.last).order_by("pk"))
    assert [(r.action, r.actor_name, r.target, r.changes) for r in written] == [
        (expected.action, expected.actor, expected.target, expected.changes)
    ]
    record = written[0]
    assert record.client_address == "127.0.0.1"
    assert record.created_at >= start
    assert (record.actor.get_username() if record.actor else "") == expected.actor
    for secret in world.secrets:
        assert secret not in as_text(record)


def counted_actions() -> dict[str, int]:
    actions = list(AuditRecord.objects.values_list("action", flat=True))
    return {action: actions.count(action) for action in set(actions)}


def test_the_failure_that_reaches_the_limit_writes_one_lock_out_record(client, alice):
    def fail() -> None:
        client.post(reverse("accounts:login"), {"username": "alice", "password": "wrong-password"})

    for _ in range(LIMIT - 1):
        fail()
    assert counted_actions() == {"login_failed": LIMIT - 1}
    fail()
    assert counted_actions() == {"login_failed": LIMIT, "locked_out": 1}
    fail()  # refused while locked, unchecked: a failure, not another lock-out
    fail()
    assert counted_actions() == {"login_failed": LIMIT + 2, "locked_out": 1}
    locked = AuditRecord.objects.get(action="locked_out")
    assert (locked.target, locked.client_address, locked.actor) == ("username:alice", "127.0.0.1", None)
    assert not any("wrong-password" in as_text(record) for record in AuditRecord.objects.all())


def test_open_sign_up_records_the_sign_up_and_the_log_in_that_follows(client, settings):
    settings.CHAT_SIGNUP = "open"
    client.post(reverse("accounts:signup"), {"username": "carol", "password1": PASSWORD, "password2": PASSWORD})

    assert list(AuditRecord.objects.order_by("pk").values_list("action", "actor_name")) == [
        ("signup", "carol"),
        ("login", "carol"),
    ]


def test_revoking_a_revoked_key_again_records_nothing(alice):
    key, _ = api_key_create(user=alice, name="laptop")
    api_key_revoke(key=key)
    api_key_revoke(key=key)

    assert AuditRecord.objects.filter(action="key_revoked").count() == 1


def test_an_unknown_key_is_not_recorded(alice):
    with on_the_callers_thread():
        assert Client().get("/v1/models", HTTP_AUTHORIZATION="Bearer cs-not-a-key").status_code == 401

    assert not AuditRecord.objects.filter(action="revoked_key_used").exists()


def test_an_admin_save_that_changes_nothing_is_not_recorded(admin_client):
    plan = Plan.objects.create(name="pro")
    data = {name: value for name, value in model_to_dict(plan).items() if value is not None and name != "id"}
    data["allowed_models"] = ""
    before = AuditRecord.objects.count()

    admin_client.post(reverse("admin:accounts_plan_change", args=[plan.pk]), data)

    assert AuditRecord.objects.count() == before


def test_admin_additions_and_deletions_are_recorded(admin_client):
    endpoint = {"model": "remote", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "m", "enabled": "on"}
    endpoint |= {"max_concurrent": 16, "weight": 1, "connect_timeout_s": 5, "first_token_timeout_s": 60}
    endpoint |= {"read_timeout_s": 60, "api_key": "sk-first-upstream-secret"}
    assert admin_client.post(reverse("admin:generation_upstreamendpoint_add"), endpoint).status_code == 302
    added = UpstreamEndpoint.objects.get()
    delete = reverse("admin:generation_upstreamendpoint_delete", args=[added.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302

    records = list(AuditRecord.objects.filter(target=f"generation.upstreamendpoint:{added.pk}").order_by("pk"))
    assert [record.action for record in records] == ["admin_change", "admin_delete"]
    assert records[0].changes["api_key"] == [None, "***"]
    assert records[0].changes["model"] == [None, "remote"]
    assert "sk-first-upstream-secret" not in as_text(records[0])


def test_the_request_id_and_address_are_the_requests(rf, alice):
    request = rf.get("/", REMOTE_ADDR="203.0.113.7")
    request.user = alice
    with logs.request_context({"request_id": "req-42"}):
        record = audit_record(action=AuditRecord.Action.EXPORT, target="t", request=request)

    assert (record.request_id, record.client_address, record.actor_name) == ("req-42", "203.0.113.7", "alice")


# Read-only in the admin


@pytest.fixture
def a_record(alice) -> AuditRecord:
    return audit_record(action=AuditRecord.Action.LOGIN, actor=alice, target="=HYPERLINK(1)")


def test_the_changelist_lists_filters_and_searches_records(admin_client, a_record):
    changelist = reverse("admin:audit_auditrecord_changelist")

    page = admin_client.get(changelist, {"action__exact": "login", "q": "HYPERLINK"})

    assert page.status_code == 200
    assert page.context["cl"].result_count == 1
    assert admin_client.get(changelist, {"action__exact": "export"}).context["cl"].result_count == 0


def test_a_superuser_cannot_add_change_or_delete_records(admin_client, a_record):
    change = reverse("admin:audit_auditrecord_change", args=[a_record.pk])

    page = admin_client.get(change)  # shown read-only
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert admin_client.post(change, {"action": "export", "target": "edited"}).status_code == 403
    assert admin_client.get(reverse("admin:audit_auditrecord_add")).status_code == 403
    delete = reverse("admin:audit_auditrecord_delete", args=[a_record.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    bulk = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [a_record.pk], "post": "yes"}
    admin_client.post(reverse("admin:audit_auditrecord_changelist"), bulk)
    a_record.refresh_from_db()
    assert a_record.target == "=HYPERLINK(1)"


def test_csv_export_writes_the_selected_records_with_formulas_quoted(admin_client, a_record):
    action = {"action": "export_csv", ACTION_CHECKBOX_NAME: [a_record.pk]}

    response = admin_client.post(reverse("admin:audit_auditrecord_changelist"), action)

    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["id", "created_at", "actor", "action", "target", "changes", "client_address", "request_id"]
    assert rows[1][:5] == [str(a_record.pk), a_record.created_at.isoformat(), "alice", "login", "'=HYPERLINK(1)"]
    assert AuditRecord.objects.filter(action="export", target="audit.auditrecord, 1 records").count() == 1


# Append-only


def test_a_record_cannot_be_changed_or_deleted(a_record):
    a_record.target = "edited"
    with pytest.raises(AppendOnlyError):
        a_record.save()
    with pytest.raises(AppendOnlyError):
        a_record.delete()
    with pytest.raises(AppendOnlyError):
        AuditRecord.objects.all().delete()
    with pytest.raises(AppendOnlyError):
        AuditRecord.objects.update(target="edited")

    assert AuditRecord.objects.get().target == "=HYPERLINK(1)"


def test_deleting_the_actor_keeps_the_record_and_the_name(alice, a_record):
    alice.delete()

    a_record.refresh_from_db()
    assert (a_record.actor, a_record.actor_name) == (None, "alice")


# Retention


def test_the_purge_deletes_only_records_past_the_retention(settings, alice):
    settings.CHAT_AUDIT_RETENTION_DAYS = 30
    now = timezone.now()
    old = AuditRecord.objects.create(action="login", created_at=now - dt.timedelta(days=31))
    kept = AuditRecord.objects.create(action="login", created_at=now - dt.timedelta(days=29))

    assert audit_purge(now=now) == 1

    assert list(AuditRecord.objects.values_list("pk", flat=True)) == [kept.pk]
    assert not AuditRecord.objects.filter(pk=old.pk).exists()


def test_a_retention_of_zero_keeps_records_for_ever(settings):
    settings.CHAT_AUDIT_RETENTION_DAYS = 0
    AuditRecord.objects.create(action="login", created_at=timezone.now() - dt.timedelta(days=10_000))

    assert audit_purge() == 0
    assert AuditRecord.objects.count() == 1


def test_beat_purges_the_trail_hourly(settings):
    assert settings.CELERY_BEAT_SCHEDULE["purge-audit-records"]["task"] == "audit.purge"


def test_a_bad_retention_fails_naming_the_variable(monkeypatch):
    monkeypatch.setenv("CHAT_AUDIT_RETENTION_DAYS", "a year")
    with pytest.raises(ImproperlyConfigured, match="CHAT_AUDIT_RETENTION_DAYS"):
        env_int("CHAT_AUDIT_RETENTION_DAYS", 365)
