"""What the browser tests do on a page: sign up, start an answer, watch it grow, Stop it."""

from __future__ import annotations

import itertools
import re
import time

from playwright.sync_api import expect

from inference.generators import SYNTHETIC_TEXT
from tests.support import PASSWORD

# The synthetic model's whole answer at the default max_tokens (512).
FULL_ANSWER = " ".join(itertools.islice(itertools.cycle(SYNTHETIC_TEXT.split()), 512))

# Installed with page.add_init_script: each Content-Security-Policy violation is reported
# to the test through window.reportViolation (exposed by the test's page fixture).
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  const where = `${event.sourceFile}:${event.lineNumber}`;
  window.reportViolation(`${event.effectiveDirective} blocked ${event.blockedURI || "inline"} at ${where}`);
}, true);
"""


def start_answer(page, username: str):
    """Sign up as `username`, send a prompt, and return the answer's article as it streams."""
    sign_up(page, username)
    page.get_by_label("Message").fill("Stream something long")
    page.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/chat/[0-9a-f-]{36}/$"))
    return page.locator("article[data-role=assistant]").last


def text_of(answer) -> str:
    return answer.locator(".message-body").text_content() or ""


def wait_for_words(answer, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(text_of(answer).split()) < count:
        assert time.monotonic() < deadline, "the answer did not grow"
        time.sleep(0.05)


def stop(page) -> None:
    """Press Stop and wait until the answer says it stopped."""
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("article[data-role=assistant]").last).to_have_attribute("data-status", "stopped")


def sign_up(page, username: str) -> None:
    """Sign up through the real page, as a person would; it lands on /chat/."""
    page.goto("/accounts/signup/")
    page.fill("[name=username]", username)
    page.fill("[name=password1]", PASSWORD)
    page.fill("[name=password2]", PASSWORD)
    page.get_by_role("button", name="Sign up").click()
    expect(page).to_have_url(re.compile(r"/chat/$"))
