"""The accounts app's management commands, run in-process."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from accounts.models import ApiKey
from accounts.services import api_key_authenticate

pytestmark = pytest.mark.django_db


def test_create_api_key_prints_a_key_that_authenticates_as_the_user(alice):
    out = StringIO()
    call_command("create_api_key", alice.username, "--name", "deploy", stdout=out)

    key = api_key_authenticate(out.getvalue().strip())
    assert key is not None
    assert key.user == alice
    assert key.name == "deploy"


def test_create_api_key_for_an_unknown_user_says_so_and_makes_nothing():
    with pytest.raises(CommandError, match="No user 'nobody'"):
        call_command("create_api_key", "nobody")
    assert not ApiKey.objects.exists()
