"""Content policies in a real Chromium: a blocked prompt stays in the box; a masked answer
shows the mask while it streams and after a reload, never the masked word."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from playwright.sync_api import expect

from tests.support.browser import sign_up, text_of

# A site of this module's own (its own token rate makes its own key): its rules apply to
# every user of the site.
POLICY_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "40"}
RULES = """
from guardrails.models import PolicyRule
PolicyRule.objects.create(name="no launch codes", matcher="words", pattern="launch codes", stage="prompt",
                          action="block", message="Not that, sorry.")
PolicyRule.objects.create(name="no people", matcher="words", pattern="people", stage="answer",
                          action="mask", message="[who]")
"""


@pytest.fixture(scope="module")
def policy_site(live_sites):
    site = live_sites.site(POLICY_ENV)
    subprocess.run([sys.executable, "manage.py", "shell", "-c", RULES], cwd=site.root, env=site.env, check=True)
    return site


@pytest.fixture
def page(browser, policy_site):
    context = browser.new_context(base_url=policy_site.base_url)
    page = context.new_page()
    yield page
    context.close()


def test_a_blocked_prompt_is_refused_in_words_and_stays_in_the_box(page):
    sign_up(page, "policy-blocked")
    page.get_by_label("Message").fill("What are the launch codes?")
    page.get_by_role("button", name="Send").click()

    expect(page.get_by_text("Not that, sorry.")).to_be_visible()
    expect(page.get_by_label("Message")).to_have_value("What are the launch codes?")
    expect(page).to_have_url(re.compile(r"/chat/$"))  # no conversation was made
    expect(page.locator("article[data-role=assistant]")).to_have_count(0)


def test_a_masked_answer_shows_the_mask_live_and_after_a_reload(page):
    sign_up(page, "policy-masked")
    page.get_by_label("Message").fill("Tell me about streaming")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    answer = page.locator("article[data-role=assistant]").last

    expect(answer.locator(".message-body")).to_contain_text("[who]", timeout=20_000)
    expect(answer).to_have_attribute("data-status", "streaming")  # live, not the saved answer
    assert "people" not in text_of(answer)

    page.reload()
    answer = page.locator("article[data-role=assistant]").last
    expect(answer.locator(".message-body")).to_contain_text("[who]")
    assert "people" not in text_of(answer)
    page.get_by_role("button", name="Stop").click()
    expect(answer).to_have_attribute("data-status", "stopped", timeout=10_000)
    assert "people" not in text_of(answer)
    assert "[who]" in text_of(answer)
