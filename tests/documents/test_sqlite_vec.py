"""sqlite-vec, the embedded default's vector search, under a Python that loads SQLite extensions.

The virtualenv's Python may be built without extension loading (pyenv's is, on the
development machines and CI), and the rest of the suite then searches vectors exactly,
in this process. Debian's Python, the Docker image's, loads them: here it runs
test_vectors.py's agreement test over the virtualenv's own packages, required to use
sqlite-vec, so that the image's search path is tested wherever such a Python is.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.livesite import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

EXTENSION_PYTHON = Path("/usr/bin/python3")
AGREEMENT = "tests/documents/test_vectors.py::test_the_exact_search_and_the_databases_own_agree"


def loads_extensions(python: Path) -> bool:
    if not python.exists():
        return False
    check = "import sqlite3, sys; sys.exit(not hasattr(sqlite3.Connection, 'enable_load_extension'))"
    same_minor = f"import sys; sys.exit(sys.version_info[:2] != {tuple(sys.version_info[:2])})"
    return all(subprocess.run([python, "-c", code]).returncode == 0 for code in (check, same_minor))


@pytest.mark.skipif(
    hasattr(sqlite3.Connection, "enable_load_extension"), reason="this Python loads sqlite-vec: test_vectors.py runs it"
)
def test_sqlite_vec_ranks_as_the_exact_search_under_a_python_that_loads_extensions(tmp_path):
    if not loads_extensions(EXTENSION_PYTHON):
        pytest.skip(f"no {EXTENSION_PYTHON} of this Python's minor version that loads extensions")
    # What an older patch release needs beside the lock's packages (async-timeout below
    # 3.11.3, for redis), installed from the lock for that Python, with its hashes.
    extras = tmp_path / "extras"
    requirement = tmp_path / "extras.txt"
    lock = (ROOT / "requirements-dev.lock").read_text().splitlines()
    start = next(n for n, line in enumerate(lock) if line.startswith("async-timeout=="))
    requirement.write_text("\n".join(lock[start : start + 3]) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(EXTENSION_PYTHON), "install", "--quiet", "--no-deps"]
    subprocess.run([*pip, "--require-hashes", "--target", str(extras), "-r", str(requirement)], check=True)

    packages = sysconfig.get_paths()["purelib"]
    # On the embedded default, SQLite, whatever database the rest of this run uses.
    env = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "REDIS_URL")}
    env.update(PYTHONPATH=os.pathsep.join([packages, str(extras)]), CHATSITE_REQUIRE_SQLITE_VEC="1")
    run = subprocess.run(
        [EXTENSION_PYTHON, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", AGREEMENT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout
