"""Who may use which model: a plan's allowed models, an account's own list in its place,
and an API key's narrowing. To a caller, a model they may not use does not exist: it is
absent from every list and refused as `404 model_not_found`, on every channel."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from accounts.forms import ModelNamesField
from accounts.key_cache import api_access_changed
from accounts.models import Account, ApiKey, Plan
from accounts.services import account_for, api_key_create
from generation import services
from generation.backends import runtime
from generation.models import Conversation, SharedLink
from inference.generators import SyntheticGenerator
from tests.support.api_client import assert_error, get, post, sse
from tests.support.engines import install_engine
from tests.support.sockets import ORIGIN, socket
from tests.support.streams import session_headers

pytestmark = pytest.mark.django_db(transaction=True)

DEFAULT = "smollm2-135m-instruct"
OTHER = "synthetic"


@pytest.fixture
def two_models(settings, stream_store):
    """The chat model and the synthetic model, both quick synthetic engines."""
    settings.CHAT_ENABLE_SYNTHETIC = True
    other = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000, answer_words=4))
    runtime.current().engines[OTHER] = other  # install_engine files it under CHAT_MODEL
    default = install_engine(stream_store, SyntheticGenerator(tokens_per_s=1000, answer_words=4))
    yield
    for engine in (default, other):
        engine.stop(timeout=10)


def only(user, *models: str) -> Account:
    """Give the user's plan exactly these models."""
    account = account_for(user)
    Plan.objects.filter(pk=account.plan_id).update(allowed_models=list(models))
    account.plan.refresh_from_db()  # the account is remembered on the user
    return account


def test_an_empty_list_allows_every_model(alice, two_models):
    assert services.models_for(user=alice) == [DEFAULT, OTHER]


def test_a_plan_allows_only_its_models(alice, two_models):
    only(alice, OTHER)

    assert services.models_for(user=alice) == [OTHER]
    assert services.default_model_for(alice) == OTHER


def test_an_accounts_own_list_replaces_its_plans(alice, bob, two_models):
    only(alice, OTHER).allowed_models = [DEFAULT, OTHER]
    account_for(alice).save()

    assert services.models_for(user=alice) == [DEFAULT, OTHER]
    assert services.models_for(user=bob) == [OTHER]  # the same plan, no list of his own


def test_a_key_narrows_its_owners_models_and_never_widens_them(alice, two_models):
    key, _ = api_key_create(user=alice, name="narrow")
    key.allowed_models = [OTHER]

    assert services.models_for(user=alice, api_key=key) == [OTHER]
    only(alice, DEFAULT)
    assert services.models_for(user=alice, api_key=key) == []


def test_models_list_shows_only_the_callers_models(alice, two_models):
    only(alice, OTHER)
    _, plain = api_key_create(user=alice, name="k")

    response = get("/v1/models", plain)

    assert response.status_code == 200
    assert [model["id"] for model in response.json()["data"]] == [OTHER]


def test_models_list_through_a_narrowed_key(alice, two_models):
    key, plain = api_key_create(user=alice, name="k")
    ApiKey.objects.filter(pk=key.pk).update(allowed_models=[OTHER])

    assert [model["id"] for model in get("/v1/models", plain).json()["data"]] == [OTHER]


def test_a_disallowed_model_is_refused_exactly_as_one_that_does_not_exist(alice, two_models):
    only(alice, OTHER)
    _, plain = api_key_create(user=alice, name="k")
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}

    disallowed = post("/v1/chat/completions", {**body, "model": DEFAULT}, plain)
    missing = post("/v1/chat/completions", {**body, "model": "no-such-model"}, plain)
    allowed = post("/v1/chat/completions", {**body, "model": OTHER}, plain)

    assert_error(disallowed, 404, "model_not_found")
    assert_error(missing, 404, "model_not_found")
    assert disallowed.json()["error"]["message"] == missing.json()["error"]["message"].replace("no-such-model", DEFAULT)
    assert allowed.status_code == 200


def test_a_narrowed_key_is_refused_the_owners_other_model(alice, two_models):
    key, plain = api_key_create(user=alice, name="k")
    ApiKey.objects.filter(pk=key.pk).update(allowed_models=[OTHER])

    response = post("/v1/completions", {"model": DEFAULT, "prompt": "Hi", "max_tokens": 2}, plain)

    assert_error(response, 404, "model_not_found")


def test_the_settings_form_offers_and_takes_only_allowed_models(alice, alice_client, two_models):
    only(alice, OTHER)
    conversation = Conversation.objects.create(user=alice, model=OTHER)
    url = reverse("generation:conversation_settings", args=[conversation.id])

    page = alice_client.get(conversation.get_absolute_url()).content.decode()
    refused = alice_client.post(url, {"model": DEFAULT, "temperature": "0.2", "max_tokens": "64"})

    assert f'<option value="{OTHER}"' in page
    assert f'<option value="{DEFAULT}"' not in page
    assert refused.status_code == 400
    conversation.refresh_from_db()
    assert conversation.model == OTHER


def test_a_new_chat_starts_on_the_first_allowed_model(alice, alice_client, two_models):
    only(alice, OTHER)

    page = alice_client.get(reverse("generation:chat")).content.decode()

    assert f'<option value="{OTHER}" selected>' in page
    assert f'<option value="{DEFAULT}"' not in page


def test_a_chat_whose_model_was_since_disallowed_refuses_the_next_prompt(alice, alice_client, two_models):
    conversation = Conversation.objects.create(user=alice, model=DEFAULT)
    only(alice, OTHER)

    response = alice_client.post(conversation.get_absolute_url(), {"prompt": "Hello"})

    assert response.status_code == 404
    assert f"The model &#x27;{DEFAULT}&#x27; does not exist." in response.content.decode()
    assert not conversation.messages.exists()


async def test_the_websocket_refuses_a_disallowed_model(alice, alice_client, two_models):
    conversation = await Conversation.objects.acreate(user=alice, model=DEFAULT)
    await database_sync_to_async(only)(alice, OTHER)
    communicator: WebsocketCommunicator = socket(conversation.id, [*session_headers(alice_client), ORIGIN])
    connected, _ = await communicator.connect()
    assert connected

    await communicator.send_json_to({"type": "generate", "prompt": "Hello"})
    refused = await communicator.receive_json_from(timeout=5)
    await communicator.disconnect()

    assert refused["type"] == "error"
    assert refused["code"] == "model_not_found"
    assert not await conversation.messages.aexists()


def test_an_import_naming_a_disallowed_model_falls_back_to_an_allowed_one(alice, alice_client, two_models):
    only(alice, OTHER)
    document = {"format": "chatsite.conversation", "version": 1, "model": DEFAULT, "messages": []}
    document["messages"] = [{"id": 0, "role": "user", "content": "Hi"}]
    upload = SimpleUploadedFile("c.json", json.dumps(document).encode(), content_type="application/json")
    response = alice_client.post(reverse("generation:your_data"), {"file": upload})

    assert response.status_code == 302
    assert Conversation.objects.get(user=alice).model == OTHER


def test_continue_this_chat_falls_back_to_an_allowed_model(alice, bob, alice_client, bob_client, two_models):
    conversation = Conversation.objects.create(user=alice, model=DEFAULT, title="Tea")
    conversation.messages.create(role="user", content="Which tea?")
    alice_client.post(reverse("generation:conversation_share", args=[conversation.id]))
    only(bob, OTHER)  # alice and bob share the default plan: give alice her own list
    Account.objects.filter(user=alice).update(allowed_models=[DEFAULT])

    bob_client.post(reverse("shared_continue", args=[SharedLink.objects.get().token]))

    assert Conversation.objects.get(user=bob).model == OTHER


@pytest.mark.parametrize(
    ("text", "names"),
    [("", []), ("a\nb\n", ["a", "b"]), ("  a  \r\n\n a\n", ["a"]), ("gpt-4o\nsynthetic", ["gpt-4o", "synthetic"])],
)
def test_the_admin_edits_model_lists_one_name_per_line(text, names):
    assert ModelNamesField(required=False).clean(text) == names


def test_the_admin_refuses_an_unreasonable_model_list():
    field = ModelNamesField()

    with pytest.raises(Exception, match="At most 100 models"):
        field.clean("\n".join(f"m{number}" for number in range(101)))
    with pytest.raises(Exception, match="at most 200 characters"):
        field.clean("x" * 201)
    assert field.prepare_value(["a", "b"]) == "a\nb"


def test_a_plan_edited_in_the_admin_takes_the_list(admin_client, two_models):
    plan = Plan.objects.get(name="default")
    url = reverse("admin:accounts_plan_change", args=[plan.pk])
    form = admin_client.get(url).context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}

    response = admin_client.post(url, {**data, "allowed_models": f"{OTHER}\n"})

    assert response.status_code == 302, response.content.decode()[:2000]
    plan.refresh_from_db()
    assert plan.allowed_models == [OTHER]
    assert settings.CHAT_MODEL == DEFAULT


def test_a_stream_resumes_to_its_end_after_its_model_is_disallowed_and_the_next_request_is_refused(alice, two_models):
    _, plain = api_key_create(user=alice, name="k")
    body = {
        "model": DEFAULT,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"resumable": True},
    }
    completion_id = json.loads(sse(post("/v1/chat/completions", body, plain))[0][1])["id"]
    only(alice, OTHER)
    api_access_changed()  # as the admin's save of the plan does

    resumed = sse(get(f"/v1/streams/{completion_id}?after=1", plain))
    refused = post("/v1/chat/completions", {**body, "stream": False}, plain)

    assert resumed[-1] == (None, "[DONE]")
    assert any("content" in json.loads(data)["choices"][0]["delta"] for _, data in resumed[:-1])
    assert_error(refused, 404, "model_not_found")
