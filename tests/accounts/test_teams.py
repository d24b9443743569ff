"""Teams: budgets and limits that cap all their members and keys together, service-account
keys, and usage and spend reported per team."""

from __future__ import annotations

import csv
import datetime as dt
import io
from decimal import Decimal

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import transaction
from django.urls import reverse

from accounts.models import Account, Budget, Team, UsageRecord, charged_tokens_sum
from accounts.services import QuotaExceeded, api_key_create, team_spend, usage_budgets, usage_request_count
from tests.accounts.budget_helpers import admit, budget, price, roomy, use
from tests.accounts.test_group_commit import at_once
from tests.support.api_client import get

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def team(alice, bob) -> Team:
    """alice and bob, sharing 100 tokens a day."""
    team = Team.objects.create(name="research")
    for user in (alice, bob):
        Account.objects.filter(pk=roomy(user).pk).update(team=team)
        user.refresh_from_db()  # forgets the account it came with
    budget(team=team, amount=100)
    return team


def test_a_team_budget_is_shared_by_its_two_members(alice, bob, team):
    use(alice, 60)

    _, granted = admit(bob, prompt_tokens=10, max_tokens=100)

    assert granted == 30
    with pytest.raises(QuotaExceeded, match="your team's tokens"):
        admit(alice, prompt_tokens=1)


@pytest.mark.parametrize("each_alone", [False, True], ids=["grouped", "each-in-its-own-transaction"])
def test_a_team_budget_holds_for_two_members_on_two_channels_at_once(alice, bob, team, each_alone):
    """Each in a transaction of its own, admissions skip the group commit and race as those
    of separate processes do: only the team's row lock keeps the two members apart."""
    Budget.objects.filter(team=team).update(amount=40)  # room for two: raced for by all at the start

    def member_admits(index: int) -> object:
        user, channel = (alice, "api") if index % 2 else (bob, "ui")
        if not each_alone:
            return admit(user, channel=channel, max_tokens=10)
        with transaction.atomic():
            return admit(user, channel=channel, max_tokens=10)

    outcomes = at_once(40, member_admits)

    admitted = [outcome for outcome in outcomes if isinstance(outcome, tuple)]
    assert len(admitted) == 2
    assert all(isinstance(outcome, QuotaExceeded) for outcome in outcomes if outcome not in admitted)
    assert UsageRecord.objects.filter(team=team).aggregate(tokens=charged_tokens_sum())["tokens"] == 40


def test_a_service_key_of_the_team_spends_the_teams_budget_whoever_made_it(alice, team, django_user_model):
    carol = django_user_model.objects.create_user("carol")
    roomy(carol)
    service, _ = api_key_create(user=carol, name="service")
    service.team = team
    service.save()

    use(carol, 100, api_key=service)

    with pytest.raises(QuotaExceeded, match="your team's"):
        admit(alice, prompt_tokens=1)
    admit(carol, prompt_tokens=1)  # carol's own requests are not the team's
    assert UsageRecord.objects.filter(team=team).count() == 1


def test_a_team_caps_its_members_streams_together(alice, bob, team):
    Team.objects.filter(pk=team.pk).update(max_concurrent_streams=2)
    Budget.objects.filter(team=team).delete()
    admit(alice)
    admit(bob)

    with pytest.raises(QuotaExceeded) as refused:
        admit(alice)

    assert refused.value.code == "too_many_concurrent_streams"
    assert "your team" in refused.value.message


def test_a_team_caps_its_members_requests_per_minute_together(alice, bob, team):
    Team.objects.filter(pk=team.pk).update(requests_per_minute=2)
    for user in (alice, bob):
        usage_request_count(user=user, limits=Account.objects.get(user=user).limits, requested_max_tokens=None)

    with pytest.raises(QuotaExceeded, match="your team's 2 requests per minute"):
        usage_request_count(user=alice, limits=Account.objects.get(user=alice).limits, requested_max_tokens=None)


def test_a_member_who_leaves_takes_none_of_the_teams_history(alice, bob, team):
    use(alice, 60)
    Account.objects.filter(user=alice).update(team=None)

    _, granted = admit(bob, prompt_tokens=10, max_tokens=100)

    assert granted == 30


def test_team_usage_and_spend_are_reported(alice, bob, team):
    price("2", valid_from=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    use(alice, 30)
    use(bob, 20)

    tokens, spend = team_spend(team=team, start=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    report = usage_budgets(account=Account.objects.get(user=bob))

    assert tokens == 50
    assert spend == {"USD": Decimal("0.0001")}
    assert report.team == "research"
    assert [(each["scope"], each["used"], each["remaining"]) for each in report.budgets] == [("team", 50, 50)]


def test_usage_of_someone_outside_the_team_reports_no_team(django_user_model, team):
    dave = django_user_model.objects.create_user("dave")
    _, plain = api_key_create(user=dave, name="test")

    answer = get("/v1/usage", plain).json()

    assert answer["team"] is None
    assert answer["budgets"] == []


def test_the_admin_lists_teams_with_their_months_usage(admin_client, alice, team):
    use(alice, 30)

    page = admin_client.get(reverse("admin:accounts_team_changelist")).content.decode()

    assert "research" in page
    assert "30 tokens" in page


def test_the_admin_exports_spend_per_day_user_team_key_and_model(admin_client, alice, bob, team):
    price("1", valid_from=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    key, _ = api_key_create(user=alice, name="laptop")
    records = [use(alice, 10, api_key=key), use(alice, 20, api_key=key), use(bob, 40)]

    response = admin_client.post(
        reverse("admin:accounts_usagerecord_changelist"),
        {"action": "export_spend_csv", ACTION_CHECKBOX_NAME: [record.pk for record in records]},
    )

    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    shown = {(row["user"], row["team"], row["api_key"], row["requests"], row["tokens"], row["spend"]) for row in rows}
    assert shown == {
        ("alice", "research", key.prefix, "2", "30", "0.0000300000"),
        ("bob", "research", "", "1", "40", "0.0000400000"),
    }
    assert {row["currency"] for row in rows} == {"USD"}


@pytest.mark.parametrize(
    "url_name",
    [
        "admin:accounts_team_changelist",
        "admin:accounts_team_add",
        "admin:accounts_budget_changelist",
        "admin:accounts_budget_add",
        "admin:accounts_budgetalert_changelist",
    ],
)
def test_the_team_and_budget_admin_pages_load(admin_client, team, url_name):
    assert admin_client.get(reverse(url_name)).status_code == 200


def test_an_admin_puts_a_user_in_a_team_on_their_page(admin_client, alice, team):
    page = admin_client.get(reverse("admin:auth_user_change", args=[alice.pk])).content.decode()

    assert 'name="account-0-team"' in page
    assert f'<option value="{team.pk}" selected>research</option>' in page
