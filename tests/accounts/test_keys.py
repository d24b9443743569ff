from __future__ import annotations

import re

import pytest
from django.urls import reverse

from accounts.models import ApiKey, hash_key
from accounts.services import api_key_create

pytestmark = pytest.mark.django_db

NEW_KEY = re.compile(r'<code data-role="new-api-key">([^<]+)</code>')


def create_key(client, name: str = "laptop"):
    return client.post(reverse("accounts:keys"), {"name": name})


def test_keys_page_requires_login(client):
    response = client.get(reverse("accounts:keys"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))


def test_keys_page_has_the_create_form(alice_client):
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert 'name="name"' in page
    assert '<label for="id_name">Name</label>' in page
    assert '<button type="submit">Create key</button>' in page
    assert "You have no API keys yet." in page
    assert 'data-role="new-api-key"' not in page


def test_user_menu_links_to_the_keys_page(alice_client):
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert f'<a href="{reverse("accounts:keys")}">API keys</a>' in page


def test_creating_a_key_shows_the_plain_key_once(alice_client, alice):
    response = create_key(alice_client)
    assert response.status_code == 201
    page = response.content.decode()
    plain = NEW_KEY.search(page).group(1)
    assert plain.startswith("cs-")
    assert len(plain) >= 40
    assert "will not be shown again" in page
    assert "no-store" in response["Cache-Control"]

    key = ApiKey.objects.get(user=alice)
    assert key.name == "laptop"
    assert key.hashed == hash_key(plain)
    assert key.hashed != plain
    assert plain.startswith(key.prefix)
    assert len(key.prefix) < len(plain)

    reloaded = alice_client.get(reverse("accounts:keys")).content.decode()
    assert plain not in reloaded
    assert 'data-role="new-api-key"' not in reloaded


def test_plain_key_is_stored_nowhere(alice_client, alice):
    plain = NEW_KEY.search(create_key(alice_client).content.decode()).group(1)
    key = ApiKey.objects.get(user=alice)
    assert plain not in {key.name, key.prefix, key.hashed}


def test_keys_list_shows_name_prefix_and_never_used(alice_client, alice):
    key, _ = api_key_create(user=alice, name="ci runner")
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert "ci runner" in page
    assert f"<code>{key.prefix}…</code>" in page
    assert key.prefix.startswith("cs-")
    assert "<td>never</td>" in page
    assert "<td>active</td>" in page
    assert key.hashed not in page


def test_keys_are_listed_newest_first(alice_client, alice):
    api_key_create(user=alice, name="first key")
    api_key_create(user=alice, name="second key")
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert page.index("second key") < page.index("first key")


@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_bad_names_are_refused_with_the_error(alice_client, alice, name):
    response = create_key(alice_client, name)
    assert response.status_code == 400
    assert 'class="errorlist' in response.content.decode()
    assert 'data-role="new-api-key"' not in response.content.decode()
    assert not ApiKey.objects.filter(user=alice).exists()


def test_keys_page_shows_plan_and_quota(alice_client):
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert "<dt>Plan</dt><dd>default</dd>" in page
    assert "<dt>Requests per minute</dt>" in page
    assert "<dt>Tokens left today</dt>" in page


def test_revoke_revokes_the_key(alice_client, alice):
    key, _ = api_key_create(user=alice, name="old")
    response = alice_client.post(reverse("accounts:key_revoke", args=[key.pk]))
    assert response.status_code == 302
    assert response["Location"] == reverse("accounts:keys")
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert not key.active
    page = alice_client.get(reverse("accounts:keys")).content.decode()
    assert "<td>revoked</td>" in page
    assert "Revoked the key" in page


def test_revoke_needs_post(alice_client, alice):
    key, _ = api_key_create(user=alice, name="old")
    assert alice_client.get(reverse("accounts:key_revoke", args=[key.pk])).status_code == 405
    key.refresh_from_db()
    assert key.revoked_at is None


def test_revoke_requires_login(client, alice):
    key, _ = api_key_create(user=alice, name="old")
    response = client.post(reverse("accounts:key_revoke", args=[key.pk]))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("accounts:login"))
    key.refresh_from_db()
    assert key.revoked_at is None


def test_revoking_an_unknown_key_is_404(alice_client):
    assert alice_client.post(reverse("accounts:key_revoke", args=[999_999])).status_code == 404


def test_bob_cannot_revoke_alices_key(bob_client, alice):
    key, _ = api_key_create(user=alice, name="alice's key")
    assert bob_client.post(reverse("accounts:key_revoke", args=[key.pk])).status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None


def test_bob_never_sees_alices_keys(bob_client, alice):
    key, _ = api_key_create(user=alice, name="alice's key")
    page = bob_client.get(reverse("accounts:keys")).content.decode()
    assert "alice&#x27;s key" not in page
    assert "alice's key" not in page
    assert key.prefix not in page
    assert "You have no API keys yet." in page


def test_a_created_key_belongs_to_its_creator_only(alice_client, bob, alice):
    create_key(alice_client, "mine")
    assert ApiKey.objects.filter(user=alice).count() == 1
    assert not ApiKey.objects.filter(user=bob).exists()
