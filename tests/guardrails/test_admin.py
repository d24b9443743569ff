"""The policy rules in the admin: listed, added, and refused when they cannot run."""

from __future__ import annotations

import pytest
from django.urls import reverse

from guardrails.models import PolicyRule

pytestmark = pytest.mark.django_db

ADD = reverse("admin:guardrails_policyrule_add")


def form(**fields) -> dict:
    return {
        "name": "rule",
        "position": "0",
        "enabled": "on",
        "matcher": "words",
        "pattern": "banana",
        "stage": "both",
        "action": "mask",
        "message": "",
        "channels": "",
        "model_names": "",
        "moderation_timeout_s": "2",
        "moderation_fail_open": "on",
        **fields,
    }


@pytest.mark.parametrize("name", ["admin:guardrails_policyrule_changelist", "admin:guardrails_policyevent_changelist"])
def test_the_policy_pages_load_for_staff(admin_client, name):
    assert admin_client.get(reverse(name)).status_code == 200


def test_a_rule_is_added_with_its_scope_one_name_per_line(admin_client):
    response = admin_client.post(ADD, form(channels="api\nui", model_names="synthetic"))

    assert response.status_code == 302, response.content.decode()[:2000]
    rule = PolicyRule.objects.get()
    assert (rule.channels, rule.model_names) == (["api", "ui"], ["synthetic"])


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"matcher": "regex", "pattern": "(unclosed"}, "not a regular expression"),
        ({"matcher": "pii", "pattern": "passport"}, "unknown PII kinds: passport"),
        ({"matcher": "moderation", "pattern": "not-a-url", "action": "block"}, "URL"),
        ({"matcher": "moderation", "pattern": "http://m/v1/moderations", "action": "mask"}, "block or flag"),
        ({"channels": "fax"}, "Unknown channels: fax"),
    ],
)
def test_a_rule_that_cannot_run_is_refused_naming_why(admin_client, fields, says):
    response = admin_client.post(ADD, form(**fields))

    assert response.status_code == 200
    assert says in response.content.decode()
    assert not PolicyRule.objects.exists()


def test_bob_cannot_open_the_rules(bob_client):
    assert bob_client.get(reverse("admin:guardrails_policyrule_changelist")).status_code == 302
