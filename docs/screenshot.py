"""Remake docs/screenshot.png: the chat page mid-answer, after a regenerated answer (its
"◀ 2/2 ▶" control shows the kept version), in Debian's Chromium.

.venv/bin/python docs/screenshot.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import sync_playwright

from tests.support.livesite import LiveSite

OUTPUT = Path(__file__).parent / "screenshot.png"
PASSWORD = "correct-horse-battery-staple"


def main() -> None:
    with LiveSite() as site, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(base_url=site.base_url, viewport={"width": 1100, "height": 640})
        page.goto("/accounts/signup/")
        page.fill("[name=username]", "ada")
        page.fill("[name=password1]", PASSWORD)
        page.fill("[name=password2]", PASSWORD)
        page.get_by_role("button", name="Sign up").click()
        # Settings chosen before the first message: short, varied answers.
        page.locator("summary", has_text="Settings").click()
        page.get_by_label("Temperature").fill("0.7")
        page.get_by_label("Max tokens").fill("64")
        page.get_by_label("Message").fill("What is the tallest mountain in the world?")
        page.get_by_role("button", name="Send").click()
        page.locator("article[data-status]").last.wait_for()
        page.wait_for_selector("article[data-status=complete]", timeout=300_000)
        page.get_by_role("button", name="Regenerate").click()
        page.wait_for_selector("article[data-role=assistant] .versions", timeout=30_000)
        page.wait_for_selector("article[data-status=complete]", timeout=300_000)
        page.get_by_label("Message").fill("Give me three tips for a first climb.")
        page.get_by_role("button", name="Send").click()
        page.locator("article[data-role=assistant]").nth(1).wait_for()
        answer = page.locator("article[data-role=assistant]").nth(1)
        while len(answer.inner_text()) < 120 and answer.get_attribute("data-status") == "streaming":
            time.sleep(0.05)
        page.screenshot(path=OUTPUT)
        browser.close()
    print(f"wrote {OUTPUT}")


if __name__ == "__main__":
    main()
