"""The API's version, CHANGELOG.md and the OpenAPI document kept in docs/openapi.json."""

from __future__ import annotations

import copy
import json

import pytest

from api.changelog import (
    API_VERSION,
    CHANGELOG,
    SNAPSHOT,
    ChangelogMissing,
    released_versions,
    snapshot_check,
    snapshot_text,
)
from api.openapi import openapi_document


def test_the_documents_version_is_the_newest_in_the_changelog():
    assert openapi_document()["info"]["version"] == API_VERSION
    assert released_versions(CHANGELOG.read_text())[0] == API_VERSION


def test_the_kept_document_is_the_codes(client):
    """Fails on any change of the API's document: run `make openapi`, which asks for a
    changelog entry where paths or schemas changed."""
    assert SNAPSHOT.read_text() == snapshot_text(openapi_document()), "the API changed: run `make openapi`"


def changed(document: dict, *, version: str | None = None) -> dict:
    new = copy.deepcopy(document)
    new["paths"]["/embeddings"] = {"post": {"summary": "new"}}
    if version:
        new["info"]["version"] = version
    return new


def changelog_with(version: str) -> str:
    return (
        f"# Changelog\n\n## [Unreleased]\n\n## [{version}] - 2026-12-31\n\n### Added\n- x\n\n" + CHANGELOG.read_text()
    )


def test_a_new_path_without_a_new_version_is_refused():
    kept = json.loads(SNAPSHOT.read_text())

    with pytest.raises(ChangelogMissing, match="paths or schemas changed but its version is still"):
        snapshot_check(changed(kept), kept, CHANGELOG.read_text())


def test_a_new_version_not_in_the_changelog_is_refused():
    kept = json.loads(SNAPSHOT.read_text())

    with pytest.raises(ChangelogMissing, match=r"CHANGELOG\.md's newest version is"):
        snapshot_check(changed(kept, version="9.0.0"), kept, CHANGELOG.read_text())


def test_a_new_path_with_a_new_version_in_the_changelog_is_taken():
    kept = json.loads(SNAPSHOT.read_text())

    snapshot_check(changed(kept, version="9.0.0"), kept, changelog_with("9.0.0"))


def test_a_reworded_description_needs_no_new_version():
    kept = json.loads(SNAPSHOT.read_text())
    reworded = copy.deepcopy(kept)
    reworded["info"]["description"] += " Reworded."

    snapshot_check(reworded, kept, CHANGELOG.read_text())


def test_released_versions_are_read_newest_first():
    assert released_versions(changelog_with("9.0.0"))[:2] == ["9.0.0", API_VERSION]
