"""A key's settings page in a real Chromium: its owner lowers a limit, narrows its models
and gives it a budget, saves, and the keys page shows them, under the site's
Content-Security-Policy."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.e2e.test_browser_ui import SYNTHETIC_ENV
from tests.support.browser import REPORT_VIOLATIONS, sign_up


@pytest.fixture(scope="module")
def synthetic_site(live_sites):
    return live_sites.site(SYNTHETIC_ENV)


def test_the_owner_changes_a_keys_limit_models_and_budget_and_sees_them_on_the_keys_page(browser, synthetic_site):
    context = browser.new_context(base_url=synthetic_site.base_url)
    violations: list[str] = []
    try:
        page = context.new_page()
        page.expose_function("reportViolation", lambda violation: violations.append(violation))
        page.add_init_script(REPORT_VIOLATIONS)
        sign_up(page, "key-tuner")
        page.goto("/accounts/keys/")
        page.get_by_label("Name", exact=True).fill("nightly job")
        page.get_by_role("button", name="Create key").click()
        row = page.locator("tr", has_text="nightly job")
        expect(row).to_contain_text("your plan's")

        row.get_by_role("link", name="Settings of nightly job").click()
        expect(page).to_have_url(re.compile(r"/accounts/keys/\d+/$"))
        expect(page.get_by_role("heading", name="Key settings: “nightly job”")).to_be_visible()
        page.get_by_label("Requests per minute").fill("7")
        page.get_by_label("synthetic", exact=True).check()
        page.get_by_label("Period").select_option("day")
        page.get_by_label("Amount").fill("3.5")
        page.get_by_label("Currency").fill("EUR")
        page.get_by_role("button", name="Save settings").click()

        expect(page).to_have_url(re.compile(r"/accounts/keys/$"))
        expect(page.get_by_role("status")).to_contain_text("Saved the settings of the key “nightly job”")
        row = page.locator("tr", has_text="nightly job")
        expect(row).to_contain_text("7 requests/min")
        expect(row).to_contain_text("models: synthetic")
        expect(row).to_contain_text("budget: 3.5 EUR per day")

        # Back on its page, the form shows what was saved.
        row.get_by_role("link", name="Settings of nightly job").click()
        expect(page.get_by_label("Requests per minute")).to_have_value("7")
        expect(page.get_by_label("synthetic", exact=True)).to_be_checked()
        expect(page.get_by_label("Amount")).to_have_value(re.compile(r"^3\.50*$"))
        assert violations == []
    finally:
        context.close()
