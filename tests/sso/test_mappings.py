"""What a claim mapping matches: a claim equal to its value, or a list claim holding it."""

from __future__ import annotations

import pytest

from sso.models import ClaimMapping


@pytest.mark.parametrize(
    ("claims", "matches"),
    [
        ({"groups": ["/staff", "/interns"]}, True),
        ({"groups": ["/staff"]}, False),
        ({"groups": "/interns"}, True),
        ({"groups": "/interns/sub"}, False),
        ({"groups": []}, False),
        ({}, False),
        ({"roles": ["/interns"]}, False),
    ],
)
def test_a_mapping_matches_its_value_or_a_list_holding_it(claims, matches):
    assert ClaimMapping(claim="groups", value="/interns").matches(claims) is matches


def test_a_boolean_claim_matches_true_or_false():
    mapping = ClaimMapping(claim="chat_admin", value="true")
    assert mapping.matches({"chat_admin": True})
    assert not mapping.matches({"chat_admin": False})
