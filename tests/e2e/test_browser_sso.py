"""Single sign-on in a real Chromium against a real OpenID Connect provider process
(oidc-provider-mock): the whole log-in, claims to plan and staff status, the downgrade after
a group is removed, a replayed callback refused, and the break-glass superuser at the admin."""

from __future__ import annotations

import re
import sqlite3

import pytest
from playwright.sync_api import Page, expect

from tests.support import PASSWORD
from tests.support.livesite import ROOT, LiveSite, manage
from tests.support.oidc_provider import oidc_provider, set_user

ADA = {"preferred_username": "ada", "email": "ada@example.com", "email_verified": True}
MAPPINGS = """
from accounts.models import Plan
from sso.models import ClaimMapping
interns = Plan.objects.create(name="interns")
ClaimMapping.objects.create(claim="groups", value="/chat-admins", is_staff=True, order=0)
ClaimMapping.objects.create(claim="groups", value="/interns", plan=interns, order=10)
"""


@pytest.fixture(scope="module")
def issuer():
    with oidc_provider() as issuer:
        yield issuer


@pytest.fixture(scope="module")
def sso_site(live_sites, issuer):
    env = {
        "CHAT_ENABLE_SYNTHETIC": "1",
        "CHAT_MODEL": "synthetic",
        "CHAT_OIDC_ISSUER": issuer,
        "CHAT_OIDC_CLIENT_ID": "chatsite",
        "CHAT_OIDC_CLIENT_SECRET": "not-so-secret",
        "CHAT_OIDC_NAME": "Mock SSO",
        "CHAT_PASSWORD_LOGIN": "0",
    }
    site = live_sites.site(env)
    manage(ROOT, site.env, "shell", "-c", MAPPINGS)
    superuser = {**site.env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD}
    manage(ROOT, superuser, "createsuperuser", "--noinput", "--username", "root", "--email", "root@example.com")
    return site


@pytest.fixture
def page(browser, sso_site):
    context = browser.new_context(base_url=sso_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def plan_and_staff(site: LiveSite, username: str) -> tuple[str, bool]:
    with sqlite3.connect(site.env["DATABASE_URL"].removeprefix("sqlite:///")) as database:
        row = database.execute(
            "SELECT plan.name, user.is_staff FROM auth_user user"
            " JOIN accounts_account account ON account.user_id = user.id"
            " JOIN accounts_plan plan ON plan.id = account.plan_id WHERE user.username = ?",
            (username,),
        ).fetchone()
    return row[0], bool(row[1])


def log_in_at_the_provider(page: Page, sub: str) -> None:
    page.goto("/accounts/login/")
    expect(page.locator("[name=password]")).to_have_count(0)
    page.get_by_role("link", name="Log in with Mock SSO", exact=True).click()
    expect(page.get_by_role("heading", name="Authorize Client")).to_be_visible()
    page.locator("input[name=sub]").fill(sub)
    page.get_by_role("button", name="Authorize", exact=True).click()


def test_the_provider_logs_a_person_in_and_their_groups_set_plan_and_staff_at_every_log_in(page, sso_site, issuer):
    set_user(issuer, "ada", {**ADA, "groups": ["/chat-admins", "/interns"]})
    callbacks: list[str] = []
    page.on(
        "request", lambda request: callbacks.append(request.url) if "/accounts/oidc/callback/" in request.url else None
    )

    log_in_at_the_provider(page, "ada")
    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.get_by_role("navigation", name="Account")).to_contain_text("ada")
    assert plan_and_staff(sso_site, "ada") == ("interns", True)

    page.get_by_role("button", name="Log out").click()
    set_user(issuer, "ada", {**ADA, "groups": []})  # taken out of both groups at the provider
    log_in_at_the_provider(page, "ada")
    expect(page).to_have_url(re.compile(r"/chat/$"))
    assert plan_and_staff(sso_site, "ada") == ("default", False)

    page.get_by_role("button", name="Log out").click()
    page.goto(callbacks[-1])  # the provider's redirect, replayed: its state and nonce were used
    expect(page.get_by_role("heading", name="Log-in refused")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("used already")
    page.goto("/chat/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))


def test_a_log_in_denied_at_the_provider_is_refused_with_a_page(page):
    page.goto("/accounts/login/")
    page.get_by_role("link", name="Log in with Mock SSO", exact=True).click()
    page.get_by_role("button", name="Deny", exact=True).click()
    expect(page.get_by_role("heading", name="Log-in refused")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("access_denied")


def test_the_break_glass_superuser_logs_in_with_a_password_at_the_admin(page):
    page.goto("/admin/login/")
    page.fill("[name=username]", "root")
    page.fill("[name=password]", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(re.compile(r"/admin/$"))
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()
