"""Two-factor log-in in a real Chromium: set it up from the page's secret, then log in with a code."""

from __future__ import annotations

import re
from base64 import b32decode

import pytest
from django_otp.oath import totp
from playwright.sync_api import expect

from tests.support import PASSWORD
from tests.support.browser import REPORT_VIOLATIONS, sign_up

SYNTHETIC_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "100"}


@pytest.fixture
def page(browser, live_sites):
    site = live_sites.site(SYNTHETIC_ENV)
    context = browser.new_context(base_url=site.base_url)
    violations: list[str] = []
    context.expose_function("reportViolation", lambda violation: violations.append(violation))
    context.add_init_script(REPORT_VIOLATIONS)
    page = context.new_page()
    yield page
    context.close()
    assert violations == []  # the QR code and the pages keep to the Content-Security-Policy


def code_from(secret: str, *, steps: int = 0) -> str:
    return f"{totp(b32decode(secret.replace(' ', '')), drift=steps):06d}"


def test_set_up_two_factor_then_log_in_with_the_password_and_a_code(page):
    sign_up(page, "two-factor-tester")
    page.get_by_role("link", name="Two-factor", exact=True).click()
    page.get_by_role("link", name="Set up two-factor log-in").click()
    expect(page.locator(".qr-code svg")).to_be_visible()
    secret = page.locator("[data-role=two-factor-secret]").inner_text()

    page.get_by_label("Code", exact=True).fill(code_from(secret))
    page.get_by_role("button", name="Turn on two-factor").click()

    expect(page.locator("[data-role=recovery-codes] li")).to_have_count(10)
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/accounts/login/"))

    page.fill("[name=username]", "two-factor-tester")
    page.fill("[name=password]", PASSWORD)
    page.get_by_role("button", name="Log in", exact=True).click()
    expect(page.get_by_role("heading", name="Two-factor code")).to_be_visible()
    # The next step's code (an app a little fast): this step's was used to set it up, and
    # the server takes each step's code once.
    page.get_by_label("Code", exact=True).fill(code_from(secret, steps=1))
    page.get_by_role("button", name="Verify").click()

    expect(page).to_have_url(re.compile(r"/chat/$"))
    expect(page.get_by_label("Message")).to_be_visible()
