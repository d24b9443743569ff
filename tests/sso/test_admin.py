"""Claim mappings are edited in the admin, and each edit is in the audit trail."""

from __future__ import annotations

import pytest
from django.urls import reverse

from accounts.models import Plan
from audit.models import AuditRecord
from sso.models import ClaimMapping

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("name", ["admin:sso_claimmapping_changelist", "admin:sso_identity_changelist"])
def test_the_changelists_load(admin_client, name):
    assert admin_client.get(reverse(name)).status_code == 200


def test_a_mapping_added_in_the_admin_is_recorded_in_the_audit_trail(admin_client):
    interns = Plan.objects.create(name="interns")
    response = admin_client.post(
        reverse("admin:sso_claimmapping_add"),
        {"claim": "groups", "value": "/interns", "plan": interns.pk, "order": 10},
    )
    assert response.status_code == 302
    mapping = ClaimMapping.objects.get()
    assert (mapping.value, mapping.plan, mapping.is_staff) == ("/interns", interns, False)
    record = AuditRecord.objects.get(target__startswith=f"sso.claimmapping:{mapping.pk}")
    assert record.changes["value"] == [None, "/interns"]


def test_the_same_claim_value_cannot_be_mapped_twice(admin_client):
    ClaimMapping.objects.create(claim="groups", value="/interns")
    response = admin_client.post(
        reverse("admin:sso_claimmapping_add"), {"claim": "groups", "value": "/interns", "order": 0}
    )
    assert response.status_code == 200
    assert ClaimMapping.objects.count() == 1
