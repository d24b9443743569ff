"""The API's version, and the rule that ties its OpenAPI document to CHANGELOG.md.

`API_VERSION` is the document's `info.version` and the newest version CHANGELOG.md
describes (tests/api/test_changelog.py checks both). The document is kept as
docs/openapi.json: a test fails when the code's document differs from it, and
`make openapi` writes it again, but only once the version is raised where its paths or
schemas changed, so an API change cannot land without a changelog entry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

API_VERSION = "1.3.0"

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
SNAPSHOT = ROOT / "docs" / "openapi.json"
# The parts of the document whose change is a change of the API (not of its wording).
CONTRACT_PARTS = ("paths", "components", "servers", "security")

_RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.MULTILINE)


class ChangelogMissing(ValueError):
    """The API changed without a new version in CHANGELOG.md."""


def released_versions(text: str) -> list[str]:
    """The versions CHANGELOG.md describes, newest first (the Unreleased section aside)."""
    return [match.group(1) for match in _RELEASE.finditer(text)]


def contract(document: dict[str, Any]) -> dict[str, Any]:
    return {part: document.get(part) for part in CONTRACT_PARTS}


def snapshot_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def snapshot_check(document: dict[str, Any], kept: dict[str, Any] | None, changelog: str) -> None:
    """Raise ChangelogMissing where `document` may not replace the `kept` snapshot: its
    paths or schemas changed but its version did not, or CHANGELOG.md does not describe
    its version as the newest."""
    version = document["info"]["version"]
    newest = released_versions(changelog)[:1]
    if newest != [version]:
        raise ChangelogMissing(
            f"CHANGELOG.md's newest version is {newest[0] if newest else 'none'}, the API's {version}: "
            "describe the change under a new version there, and set api/changelog.py's API_VERSION to it."
        )
    if kept is not None and contract(kept) != contract(document) and kept["info"]["version"] == version:
        raise ChangelogMissing(
            f"The API's paths or schemas changed but its version is still {version}: add a new version "
            "to CHANGELOG.md that says what changed, and set api/changelog.py's API_VERSION to it."
        )
