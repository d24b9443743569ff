"""Forgot your password? in a real Chromium: the live site sends the reset e-mail to a
real SMTP server, and the link in it, followed in the browser, sets a new password."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.support import PASSWORD
from tests.support.smtp import smtp_server

NEW_PASSWORD = "another-long-passphrase-7"


@pytest.fixture(scope="module")
def mail_site(live_sites):
    with smtp_server() as (inbox, port):
        env = {"EMAIL_HOST": "127.0.0.1", "EMAIL_PORT": str(port), "EMAIL_USE_TLS": "0"}
        yield live_sites.own(env), inbox


def test_a_reset_link_by_email_sets_a_new_password(browser, mail_site):
    site, inbox = mail_site
    with site:
        context = browser.new_context(base_url=site.base_url)
        page = context.new_page()
        page.goto("/accounts/signup/")
        page.fill("[name=username]", "forgetful")
        page.fill("[name=email]", "forgetful@example.com")
        page.fill("[name=password1]", PASSWORD)
        page.fill("[name=password2]", PASSWORD)
        page.get_by_role("button", name="Sign up").click()
        expect(page).to_have_url(re.compile(r"/chat/$"))
        page.get_by_role("button", name="Log out").click()

        page.goto("/accounts/login/")
        page.get_by_role("link", name="Forgot your password?").click()
        page.get_by_label("Email").fill("forgetful@example.com")
        page.get_by_role("button", name="Send reset link").click()
        expect(page.get_by_role("heading", name="Check your e-mail")).to_be_visible()

        message = inbox.wait_for(1)[0]
        assert message["To"] == "forgetful@example.com"
        link = re.search(r"http://\S+/accounts/password/reset/\S+/", message.get_content()).group(0)
        page.goto(link)
        page.fill("[name=new_password1]", NEW_PASSWORD)
        page.fill("[name=new_password2]", NEW_PASSWORD)
        page.get_by_role("button", name="Set new password").click()
        expect(page.get_by_role("heading", name="Password changed")).to_be_visible()

        page.goto("/accounts/login/")
        page.fill("[name=username]", "forgetful")
        page.fill("[name=password]", NEW_PASSWORD)
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(re.compile(r"/chat/$"))
        context.close()
