"""The locks install on every Python 3.11 patch release: pins that pip-compile leaves out
for the Python it ran on come back with their markers (scripts/lock_extras.py markers)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.lock_extras import _put_entry

ROOT = Path(__file__).resolve().parents[2]
ASYNC_TIMEOUT = 'async-timeout==5.0.1 ; python_full_version < "3.11.3"'


@pytest.mark.parametrize(
    "lock", ["requirements.lock", "requirements-dev.lock", "bench/requirements.lock", "requirements-cuda.lock"]
)
def test_every_lock_of_the_runtime_carries_async_timeout_for_python_below_3_11_3(lock):
    text = (ROOT / lock).read_text()

    entry = re.search(rf"^{re.escape(ASYNC_TIMEOUT)} \\\n((?:    --hash=sha256:\w{{64}}(?: \\)?\n)+)", text, re.M)

    assert entry is not None
    assert len(entry.group(1).splitlines()) == 2  # the wheel and the sdist


def test_an_entry_goes_in_its_alphabetical_place_once(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text(
        "# header\n#\n"
        "asgiref==3.13.0 \\\n    --hash=sha256:aa\n    # via django\n"
        "attrs==26.1.0 \\\n    --hash=sha256:bb\n    # via aiohttp\n"
        "\n# The following packages are considered to be unsafe in a requirements file:\n"
        "pip==26.3 \\\n    --hash=sha256:cc\n"
    )
    block = f"{ASYNC_TIMEOUT} \\\n    --hash=sha256:dd\n    # via -r requirements.txt\n"

    _put_entry(str(lock), "async-timeout", block)
    _put_entry(str(lock), "async_timeout", block)  # again, under another spelling

    text = lock.read_text()
    assert text.count("async-timeout==") == 1
    assert text.index("asgiref==") < text.index("async-timeout==") < text.index("attrs==")
    assert text.split("pip==")[0].endswith(
        "# via aiohttp\n\n# The following packages are considered to be unsafe in a requirements file:\n"
    )
