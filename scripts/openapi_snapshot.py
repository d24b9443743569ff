"""Write the API's OpenAPI document to docs/openapi.json (`make openapi`), refusing where
its paths or schemas changed without a new version in CHANGELOG.md (api/changelog.py)."""

from __future__ import annotations

import json
import os
import sys

import django


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    django.setup()
    # After setup: the API's modules read the settings as they are imported.
    from api.changelog import CHANGELOG, SNAPSHOT, ChangelogMissing, snapshot_check, snapshot_text
    from api.openapi import openapi_document

    document = openapi_document()
    kept = json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else None
    try:
        snapshot_check(document, kept, CHANGELOG.read_text())
    except ChangelogMissing as missing:
        print(f"make openapi: {missing}", file=sys.stderr)
        return 1
    SNAPSHOT.write_text(snapshot_text(document))
    print(f"make openapi: wrote {SNAPSHOT.relative_to(SNAPSHOT.parent.parent)} (version {document['info']['version']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
