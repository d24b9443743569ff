"""At most one live site per distinct configuration per pytest run.

A site costs a migrate, a collectstatic and a daphne start (model load included): 10-17 s
on 2 cores. Tests ask `live_sites.site(env)` (the session fixture in tests/conftest.py)
for a site with a configuration; the first ask starts it, the later ones share it, and
all stop at the end of the run. The database is migrated once into a template file that
each site copies, and static files are collected once. A test that must stop, kill or
restart its daphne starts a LiveSite of its own instead.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from tests.support.livesite import ROOT, LiveSite, manage


class LiveSites:
    """Live sites by configuration (the environment variables they add to LiveSite's)."""

    def __init__(self) -> None:
        self._sites: dict[tuple[tuple[str, str], ...], LiveSite] = {}
        self._open = ExitStack()
        self._folder: Path | None = None

    def site(self, env: Mapping[str, str] | None = None) -> LiveSite:
        key = tuple(sorted((env or {}).items()))
        if key not in self._sites:
            self._sites[key] = self._open.enter_context(
                LiveSite(dict(key), database_template=self._template(), static_root=self._static_root())
            )
        return self._sites[key]

    def own(self, env: Mapping[str, str] | None = None) -> LiveSite:
        """A site for one test to stop, kill or restart (`with live_sites.own(env) as site:`):
        not shared, but started from the same template."""
        return LiveSite(dict(env or {}), database_template=self._template(), static_root=self._static_root())

    def _template(self) -> Path:
        """An SQLite database migrated once, and static files collected once, for every site."""
        if self._folder is None:
            self._folder = Path(self._open.enter_context(tempfile.TemporaryDirectory(prefix="chatsite-template-")))
            env = {
                **os.environ,
                "DATABASE_URL": f"sqlite:///{self._folder}/db.sqlite3",
                "STATIC_ROOT": str(self._folder / "static"),
            }
            manage(ROOT, env, "migrate", "--noinput")
            manage(ROOT, env, "collectstatic", "--noinput", "--verbosity", "0")
        return self._folder / "db.sqlite3"

    def _static_root(self) -> Path:
        """This worker's own static files, collected with the template: another worker's
        sites (or a test's own LiveSite) may be collecting into theirs while these start."""
        return self._template().parent / "static"

    def close(self) -> None:
        self._open.close()
