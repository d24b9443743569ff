"""A real OpenID Connect provider in a process of its own (oidc-provider-mock), for the
browser's single sign-on tests: any client id and secret, users and their claims set by PUT."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.support.livesite import STARTED, free_port, stop_process


@contextmanager
def oidc_provider(timeout_s: float = 60) -> Iterator[str]:
    """`with oidc_provider() as issuer:` a provider on a free loopback port; its issuer URL."""
    port = free_port()
    issuer = f"http://127.0.0.1:{port}"
    STARTED["oidc-provider-mock"] += 1
    with tempfile.TemporaryDirectory(prefix="oidc-provider-") as folder:
        log = Path(folder) / "provider.log"
        with log.open("wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "oidc_provider_mock", "--port", str(port)], stdout=output, stderr=output
            )
            try:
                _wait_ready(issuer, process, log, timeout_s)
                yield issuer
            finally:
                stop_process(process)


def set_user(issuer: str, sub: str, claims: dict[str, Any]) -> None:
    """The claims the provider gives `sub` from now on (its ID tokens and user info)."""
    httpx.put(f"{issuer}/users/{sub}", json=claims, timeout=10).raise_for_status()


def _wait_ready(issuer: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"oidc-provider-mock exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"oidc-provider-mock not ready after {timeout_s} s:\n{log.read_text()}")
