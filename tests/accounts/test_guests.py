"""The guest sandbox (CHAT_GUEST): try the chat without an account, within limits per address."""

from __future__ import annotations

import datetime as dt
import uuid
from importlib import import_module

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth import login
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from accounts.guests import GuestLoginMiddleware
from accounts.models import DEFAULT_PLAN, GUEST_PLAN, Account, ApiKey, Plan, UsageRecord
from accounts.services import (
    QuotaExceeded,
    api_key_create,
    guest_adopt,
    guest_create,
    guest_plan,
    guest_purge,
    usage_admit,
)
from accounts.tasks import guest_purge_task
from audit.models import AuditRecord
from generation.models import Conversation, Feedback, Message
from tests.sso.conftest import provider, signing_key
from tests.support import PASSWORD
from tests.support.api_client import CHAT, assert_error
from tests.support.chat import HTMX, eager_engine, fast_engine_run_eagerly
from tests.twofactor.conftest import authenticator_for

__all__ = ["eager_engine", "fast_engine_run_eagerly", "provider", "signing_key"]  # fixtures, used by name

pytestmark = pytest.mark.django_db

ADDRESS = "198.51.100.7"
OTHER_ADDRESS = "203.0.113.9"
TRY_IT = "Try it without an account"
KEEP = {"username": "dave", "password1": PASSWORD, "password2": PASSWORD}


@pytest.fixture
def guests_on(settings):
    settings.CHAT_GUEST = True
    settings.CHAT_SIGNUPS_PER_MINUTE = 100  # the tests of shared limits make many guests


def start_guest(address: str = ADDRESS) -> tuple[Client, User]:
    """A fresh cookie jar that pressed "Try it without an account"."""
    client = Client(REMOTE_ADDR=address)
    response = client.post(reverse("accounts:guest_start"))
    assert response.status_code == 302, response.content
    assert response["Location"] == reverse("generation:chat")
    return client, User.objects.get(pk=client.session["_auth_user_id"])


def send(client: Client, prompt: str = "Hello there", conversation: Conversation | None = None):
    url = conversation.get_absolute_url() if conversation else reverse("generation:chat")
    return client.post(url, {"prompt": prompt}, **HTMX)


def test_the_migration_makes_a_guest_plan_with_low_limits():
    # Run again here: a test with `transaction=True` before this one empties every table.
    Plan.objects.filter(name=GUEST_PLAN).delete()
    import_module("accounts.migrations.0010_guests").create_guest_plan(apps, None)
    plan = Plan.objects.get(name=GUEST_PLAN)

    assert plan.requests_per_minute == 5
    assert plan.tokens_per_day == 5_000
    assert plan.max_concurrent_streams == 1
    assert plan.max_tokens_per_request == 256
    assert plan.max_documents_per_conversation == 0
    assert plan.max_conversations == 1
    assert plan.priority < Plan.objects.get(name=DEFAULT_PLAN).priority
    assert guest_plan() == plan


def test_by_default_there_is_no_guest_button_and_the_guest_url_is_404(client):
    page = client.get(reverse("accounts:login")).content.decode()

    assert TRY_IT not in page
    assert client.post(reverse("accounts:guest_start")).status_code == 404
    assert client.get(reverse("accounts:guest_start")).status_code == 404
    assert not Account.objects.filter(is_guest=True).exists()


def test_with_guests_on_the_login_page_has_the_try_it_button_posting_with_csrf(client, guests_on):
    page = client.get(reverse("accounts:login")).content.decode()

    assert f'<button type="submit" class="secondary">{TRY_IT}</button>' in page
    form = page[page.index(f'action="{reverse("accounts:guest_start")}"') :]
    assert 'name="csrfmiddlewaretoken"' in form[: form.index(TRY_IT)]


def test_try_it_logs_in_a_guest_on_the_guest_plan_without_a_password(guests_on):
    client, guest = start_guest()

    account = Account.objects.get(user=guest)
    assert account.is_guest
    assert account.plan.name == GUEST_PLAN
    assert account.guest_address == ADDRESS
    assert not guest.has_usable_password()
    page = client.get(reverse("generation:chat")).content.decode()
    assert "Sign up to keep this chat" in page
    assert reverse("accounts:keys") not in page


def test_a_logged_in_member_pressing_try_it_stays_themselves(alice_client, guests_on):
    response = alice_client.post(reverse("accounts:guest_start"))

    assert response.status_code == 302
    assert not Account.objects.filter(is_guest=True).exists()


def test_one_address_makes_guests_only_at_the_sign_up_rate(guests_on, settings):
    settings.CHAT_SIGNUPS_PER_MINUTE = 3
    responses = [Client(REMOTE_ADDR=ADDRESS).post(reverse("accounts:guest_start")) for _ in range(20)]

    assert [response.status_code for response in responses].count(302) == 3
    assert responses[-1].status_code == 429
    assert 0 < int(responses[-1]["Retry-After"]) <= 60
    assert Account.objects.filter(is_guest=True).count() == 3
    assert Client(REMOTE_ADDR=OTHER_ADDRESS).post(reverse("accounts:guest_start")).status_code == 302


def test_the_per_address_request_limit_holds_across_20_fresh_cookie_jars(guests_on, eager_engine):
    statuses = [send(start_guest()[0]).status_code for _ in range(20)]

    assert statuses.count(200) == guest_plan().requests_per_minute == 5
    assert statuses.count(429) == 15
    assert UsageRecord.objects.filter(user__account__guest_address=ADDRESS).count() == 5
    # Another address has limits of its own.
    assert send(start_guest(OTHER_ADDRESS)[0]).status_code == 200


def test_the_days_tokens_are_shared_by_every_guest_of_an_address(guests_on, eager_engine):
    Plan.objects.filter(name=GUEST_PLAN).update(requests_per_minute=100)
    first, _ = start_guest()
    assert send(first).status_code == 200
    per_answer = UsageRecord.objects.get().charged_tokens
    Plan.objects.filter(name=GUEST_PLAN).update(tokens_per_day=per_answer * 3)

    statuses = [send(start_guest()[0]).status_code for _ in range(20)]

    assert statuses[:2] == [200, 200]
    assert set(statuses[2:]) == {429}
    refused = send(start_guest()[0])
    assert "tokens" in refused.content.decode()
    assert send(start_guest(OTHER_ADDRESS)[0]).status_code == 200


def test_guests_behind_a_proxy_are_counted_by_the_configured_client_ip_header(guests_on, eager_engine, settings):
    settings.CHAT_CLIENT_IP_HEADER = "HTTP_X_REAL_IP"
    jars = [Client(REMOTE_ADDR="10.0.0.2", HTTP_X_REAL_IP=ADDRESS) for _ in range(6)]
    for jar in jars:
        jar.post(reverse("accounts:guest_start"))

    statuses = [send(jar).status_code for jar in jars]

    assert statuses == [200] * 5 + [429]
    assert set(Account.objects.filter(is_guest=True).values_list("guest_address", flat=True)) == {ADDRESS}


def test_a_guest_keeps_one_conversation_and_is_told_so(guests_on, eager_engine):
    client, guest = start_guest()
    assert send(client).status_code == 200

    refused = send(client, "A second chat")

    assert refused.status_code == 422
    assert "Sign up to keep this chat" in refused.content.decode()
    assert Conversation.objects.filter(user=guest).count() == 1
    conversation = Conversation.objects.get(user=guest)
    assert send(client, "More in the same chat", conversation).status_code == 200


def test_members_have_no_conversation_limit_by_default(alice_client, eager_engine):
    statuses = [send(alice_client, f"Chat {n}").status_code for n in range(3)]

    assert statuses == [200, 200, 200]


def test_signing_up_keeps_the_conversation_and_removes_the_guest(guests_on, eager_engine):
    client, guest = start_guest()
    send(client, "Remember the lighthouse")
    conversation = Conversation.objects.get(user=guest)
    page = client.get(reverse("accounts:guest_keep")).content.decode()
    assert "Sign up to keep this chat" in page
    assert guest.username not in page  # the generated name is not offered as theirs

    response = client.post(reverse("accounts:guest_keep"), KEEP)

    assert response.status_code == 302
    dave = User.objects.get(username="dave")
    assert dave.pk == guest.pk
    assert dave.check_password(PASSWORD)
    assert not Account.objects.filter(is_guest=True).exists()
    assert Account.objects.get(user=dave).plan.name == DEFAULT_PLAN
    assert Account.objects.get(user=dave).guest_address is None
    assert not User.objects.filter(username=guest.username).exists()
    kept = Conversation.objects.get(pk=conversation.pk)
    assert kept.user == dave
    assert list(kept.messages.filter(role=Message.Role.USER).values_list("content", flat=True)) == [
        "Remember the lighthouse"
    ]
    # Still logged in, as the member, who may now make keys and more chats.
    page = client.get(kept.get_absolute_url())
    assert page.status_code == 200
    assert "Remember the lighthouse" in page.content.decode()
    assert client.get(reverse("accounts:keys")).status_code == 200
    assert send(client, "A second chat").status_code == 200
    assert Client().post(reverse("accounts:login"), {"username": "dave", "password": PASSWORD}).status_code == 302


def test_signing_up_from_a_guest_checks_the_form_like_sign_up(guests_on, alice):
    client, guest = start_guest()

    taken = client.post(reverse("accounts:guest_keep"), {**KEEP, "username": "alice"})
    mismatch = client.post(reverse("accounts:guest_keep"), {**KEEP, "password2": "something-else-1"})

    assert taken.status_code == mismatch.status_code == 400
    assert Account.objects.get(user=guest).is_guest
    assert User.objects.get(pk=guest.pk).username == guest.username


def test_with_signup_closed_a_guest_cannot_convert_but_is_offered_the_log_in(guests_on, settings):
    settings.CHAT_SIGNUP = "closed"
    client, guest = start_guest()

    assert client.post(reverse("accounts:guest_keep"), KEEP).status_code == 403
    assert Account.objects.get(user=guest).is_guest
    page = client.get(reverse("accounts:guest_keep")).content.decode()
    assert "Log in to keep this chat" in page
    assert 'name="password1"' not in page
    assert f'href="{reverse("accounts:login")}?next=' in page


def test_with_signup_by_approval_a_converted_guest_waits_for_an_admin(guests_on, settings):
    settings.CHAT_SIGNUP = "approval"
    client, guest = start_guest()

    response = client.post(reverse("accounts:guest_keep"), KEEP)

    assert response["Location"] == reverse("accounts:signup_pending")
    dave = User.objects.get(pk=guest.pk)
    assert dave.username == "dave"
    assert not dave.is_active
    assert "_auth_user_id" not in client.session


def test_the_keep_page_sends_members_back_to_the_chat(alice_client):
    response = alice_client.get(reverse("accounts:guest_keep"))

    assert response.status_code == 302
    assert response["Location"] == reverse("generation:chat")


def test_guests_are_refused_the_key_pages(guests_on, alice):
    client, guest = start_guest()
    alices_key, _ = api_key_create(user=alice, name="laptop")

    page = client.get(reverse("accounts:keys"))
    made = client.post(reverse("accounts:keys"), {"name": "mine"})
    revoked = client.post(reverse("accounts:key_revoke", args=[alices_key.pk]))

    assert page.status_code == made.status_code == revoked.status_code == 403
    assert "Sign up to keep this chat" in page.content.decode()
    assert not ApiKey.objects.filter(user=guest).exists()
    assert ApiKey.objects.get(pk=alices_key.pk).active


def test_guests_are_refused_documents(guests_on, eager_engine):
    client, guest = start_guest()
    send(client)
    conversation = Conversation.objects.get(user=guest)
    upload = SimpleUploadedFile("notes.md", b"# Notes\n\nSome text.\n")

    response = client.post(reverse("documents:upload", args=[conversation.id]), {"file": upload}, **HTMX)

    assert response.status_code == 403
    assert not guest.documents.exists()
    page = client.get(conversation.get_absolute_url()).content.decode()
    assert "Documents are not part of your plan" in page
    assert 'name="file"' not in page


def test_guests_are_refused_importing_conversations(guests_on):
    client, _ = start_guest()

    assert client.get(reverse("generation:your_data")).status_code == 403


def test_a_guests_session_cookie_is_401_on_the_api(guests_on):
    client, _ = start_guest()

    assert_error(client.get("/v1/models"), 401, "invalid_api_key")
    assert_error(client.post("/v1/chat/completions", CHAT, content_type="application/json"), 401, "invalid_api_key")
    assert_error(client.get("/v1/usage"), 401, "invalid_api_key")


def test_a_key_an_admin_made_for_a_guest_is_401_on_the_api(guests_on):
    _, guest = start_guest()
    _, plain = api_key_create(user=guest, name="made in the admin")

    response = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {plain}")

    assert_error(response, 401, "invalid_api_key")


def idle_since(user: User, days: int) -> None:
    moment = timezone.now() - dt.timedelta(days=days)
    User.objects.filter(pk=user.pk).update(date_joined=moment, last_login=moment)


def test_the_purge_removes_guests_idle_past_the_ttl_with_their_conversations(settings, alice):
    settings.CHAT_GUEST_TTL_DAYS = 7
    idle, recent, chatting = (guest_create(address=ADDRESS) for _ in range(3))
    for user in (idle, recent, chatting, alice):
        Conversation.objects.create(user=user, model="smollm2-135m-instruct")
    idle_since(idle, 8)
    idle_since(recent, 6)
    idle_since(chatting, 30)
    idle_since(alice, 30)  # a member is never purged
    UsageRecord.objects.create(user=chatting, channel="ui", model="m", stream_id=uuid.uuid4().hex)

    assert guest_purge() == 1

    assert not User.objects.filter(pk=idle.pk).exists()
    assert not Conversation.objects.filter(user_id=idle.pk).exists()
    assert set(User.objects.values_list("pk", flat=True)) == {recent.pk, chatting.pk, alice.pk}


def test_the_purge_task_runs_on_beats_schedule(settings):
    guest = guest_create(address=ADDRESS)
    idle_since(guest, settings.CHAT_GUEST_TTL_DAYS + 1)

    assert guest_purge_task.apply().get() == 1
    assert guest_purge_task.name == "accounts.guest_purge"
    assert "accounts.guest_purge" in {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert not User.objects.filter(pk=guest.pk).exists()


def admit(user: User) -> None:
    usage_admit(
        user=user,
        limits=Account.objects.get(user=user).limits,
        requests=1,
        channel="ui",
        model="m",
        stream_id=uuid.uuid4().hex,
        producer="test",
        prompt_tokens=10,
        max_tokens=100,
    )


def test_an_address_streams_one_answer_at_a_time_whichever_of_its_guests_asks():
    first, second, elsewhere = (guest_create(address=address) for address in (ADDRESS, ADDRESS, OTHER_ADDRESS))
    admit(first)

    with pytest.raises(QuotaExceeded) as refused:
        admit(second)

    assert refused.value.code == "too_many_concurrent_streams"
    admit(elsewhere)


# A guest who logs in to an account they have keeps the chat (accounts.guests).


def guest_with_chat(eager_engine, prompt: str = "Remember the lighthouse", address: str = ADDRESS):
    client, guest = start_guest(address)
    assert send(client, prompt).status_code == 200
    return client, guest, Conversation.objects.get(user=guest)


def log_in(client: Client, username: str, password: str = PASSWORD):
    return client.post(reverse("accounts:login"), {"username": username, "password": password})


def adopted_records() -> list[AuditRecord]:
    return list(AuditRecord.objects.filter(action=AuditRecord.Action.GUEST_ADOPTED))


def test_a_guest_sees_the_log_in_page_and_a_member_is_sent_on(guests_on, alice_client):
    client, _ = start_guest()

    assert client.get(reverse("accounts:login")).status_code == 200
    assert alice_client.get(reverse("accounts:login")).status_code == 302


def test_a_guest_who_logs_in_with_a_password_keeps_the_chat_in_that_account(guests_on, eager_engine, alice):
    client, guest, conversation = guest_with_chat(eager_engine)
    answer = conversation.messages.get(role=Message.Role.ASSISTANT)
    Feedback.objects.create(message=answer, rating=Feedback.Rating.GOOD)

    response = log_in(client, "alice")

    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(alice.pk)
    kept = Conversation.objects.get(pk=conversation.pk)
    assert kept.user == alice
    assert list(kept.messages.values_list("role", flat=True).order_by("pk")) == ["user", "assistant"]
    assert Feedback.objects.get(message=answer).rating == Feedback.Rating.GOOD
    assert not User.objects.filter(pk=guest.pk).exists()
    assert not Account.objects.filter(is_guest=True).exists()
    page = client.get(kept.get_absolute_url())
    assert page.status_code == 200
    assert "Remember the lighthouse" in page.content.decode()
    [record] = adopted_records()
    assert record.actor == alice
    assert record.target == f"auth.user:{guest.pk} {guest.username}"
    assert record.changes == {"owner": [guest.username, "alice"]}


def test_a_guest_who_logs_in_with_single_sign_on_keeps_the_chat(guests_on, eager_engine, provider, settings):
    settings.CHAT_PASSWORD_LOGIN = False
    ada_claims = {"sub": "sub-ada", "preferred_username": "ada", "email": "ada@example.com"}
    assert provider.log_in(Client(), **ada_claims).status_code == 302  # ada's account, made before
    ada = User.objects.get(sso_identities__subject="sub-ada")
    client, guest, conversation = guest_with_chat(eager_engine)

    response = provider.log_in(client, **ada_claims)

    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(ada.pk)
    assert Conversation.objects.get(pk=conversation.pk).user == ada
    assert not User.objects.filter(pk=guest.pk).exists()
    assert len(adopted_records()) == 1


def test_with_password_log_in_off_the_keep_page_offers_single_sign_on_and_no_sign_up(
    guests_on, eager_engine, provider, settings
):
    settings.CHAT_PASSWORD_LOGIN = False
    client, guest, _ = guest_with_chat(eager_engine)

    page = client.get(reverse("accounts:guest_keep"))
    posted = client.post(reverse("accounts:guest_keep"), KEEP)

    text = page.content.decode()
    assert page.status_code == 200
    assert "Log in with Example SSO" in text
    assert f'href="{reverse("sso:start")}?next=' in text
    assert "Sign up" not in text
    assert 'name="password1"' not in text
    assert posted.status_code == 403
    assert User.objects.get(pk=guest.pk).username == guest.username
    assert not User.objects.get(pk=guest.pk).has_usable_password()
    chat = client.get(reverse("generation:chat")).content.decode()
    assert "Log in to keep this chat" in chat
    assert "Sign up to keep this chat" not in chat


def test_a_guest_who_logs_in_with_two_factor_keeps_the_chat_once_the_code_is_in(guests_on, eager_engine, alice):
    _, recovery_codes = authenticator_for(alice)
    client, guest, conversation = guest_with_chat(eager_engine)

    assert log_in(client, "alice")["Location"] == reverse("twofactor:verify")
    assert Conversation.objects.get(pk=conversation.pk).user == guest  # the password alone logs no one in
    assert client.post(reverse("twofactor:verify"), {"code": recovery_codes[0]}).status_code == 302

    assert client.session["_auth_user_id"] == str(alice.pk)
    assert Conversation.objects.get(pk=conversation.pk).user == alice
    assert not User.objects.filter(pk=guest.pk).exists()


def login_through_django(client: Client, user: User) -> None:
    """Log `user` in to this client's session as a single sign-on view would: the site's
    middleware, then django.contrib.auth.login(), whose user_logged_in moves a guest's chat."""
    request = RequestFactory().get("/")
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(client.session.session_key)
    GuestLoginMiddleware(lambda request: HttpResponse()).process_view(request, None, (), {})
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")


def test_a_login_by_djangos_login_moves_the_sessions_guests_chat(guests_on, eager_engine, alice):
    client, guest, conversation = guest_with_chat(eager_engine)

    login_through_django(client, alice)

    assert Conversation.objects.get(pk=conversation.pk).user == alice
    assert not User.objects.filter(pk=guest.pk).exists()


def test_another_guests_chat_never_moves(guests_on, eager_engine, alice):
    client, guest, conversation = guest_with_chat(eager_engine)
    _, other, others = guest_with_chat(eager_engine, "Someone else's secret", OTHER_ADDRESS)

    log_in(client, "alice")

    assert Conversation.objects.get(pk=conversation.pk).user == alice
    assert Conversation.objects.get(pk=others.pk).user == other
    assert Account.objects.get(user=other).is_guest
    assert [record.target for record in adopted_records()] == [f"auth.user:{guest.pk} {guest.username}"]


def test_a_guest_who_logged_out_first_leaves_the_chat_behind(guests_on, eager_engine, alice):
    client, guest, conversation = guest_with_chat(eager_engine)
    client.post(reverse("accounts:logout"))

    assert log_in(client, "alice").status_code == 302

    assert Conversation.objects.get(pk=conversation.pk).user == guest
    assert not adopted_records()


def test_a_member_who_logs_in_is_unaffected(guests_on, alice, bob):
    alices = Conversation.objects.create(user=alice, model="smollm2-135m-instruct")
    bobs = Conversation.objects.create(user=bob, model="smollm2-135m-instruct")
    client = Client()
    client.force_login(alice)

    login_through_django(client, bob)  # one member after another in the same session
    assert log_in(Client(), "alice").status_code == 302

    assert Conversation.objects.get(pk=alices.pk).user == alice
    assert Conversation.objects.get(pk=bobs.pk).user == bob
    assert not adopted_records()


def test_an_account_at_its_conversation_limit_still_logs_in_and_gets_the_chat(guests_on, eager_engine, alice):
    Plan.objects.filter(name=DEFAULT_PLAN).update(max_conversations=1)
    own = Conversation.objects.create(user=alice, model="smollm2-135m-instruct")
    client, _, conversation = guest_with_chat(eager_engine)

    assert log_in(client, "alice").status_code == 302

    assert set(alice.conversations.values_list("pk", flat=True)) == {own.pk, conversation.pk}
    refused = send(client, "A third chat")
    assert refused.status_code == 422
    assert "Delete one to start another" in refused.content.decode()


def test_adopting_into_a_guest_or_oneself_moves_nothing(guests_on, eager_engine):
    _, guest, conversation = guest_with_chat(eager_engine)
    other = guest_create(address=OTHER_ADDRESS)

    assert guest_adopt(guest_id=guest.pk, user=other) == 0
    assert guest_adopt(guest_id=guest.pk, user=guest) == 0

    assert Conversation.objects.get(pk=conversation.pk).user == guest
