"""Model-server endpoints: their configuration, circuit and health, and how a request to
one fails (`UpstreamFailed`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from inference.engine import EngineOverloaded


@dataclass(frozen=True)
class Endpoint:
    """One model server serving one public model name."""

    name: str  # unique: shown in the admin and metrics
    model: str  # the public model name clients ask for
    base_url: str  # ends with /v1
    upstream_model: str  # the name the server knows it by
    api_key: str = field(default="", repr=False)
    max_concurrent: int = 16
    weight: float = 1.0
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 60.0
    read_timeout_s: float = 60.0  # the longest silence between two chunks
    context_length: int | None = None  # None: unknown, the server refuses what doesn't fit
    # A tokenizer like the server's (a registry name, a local directory or a hub id): counts
    # the prompt at admission, and the answer when the server reports no usage.
    tokenizer: str | None = None
    # The proxy, and its credentials, that the environment names for the server: read once
    # here (off the loop) by aiohttp's own rules (HTTP(S)_PROXY, NO_PROXY, ~/.netrc), as
    # its trust_env would on two threads for each request.
    proxy: URL | None = field(init=False, repr=False, compare=False)
    proxy_auth: aiohttp.BasicAuth | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            proxy, proxy_auth = get_env_proxy_for_url(URL(self.base_url))
        except LookupError:  # none, or the server is in NO_PROXY
            proxy, proxy_auth = None, None
        object.__setattr__(self, "proxy", proxy)
        object.__setattr__(self, "proxy_auth", proxy_auth)

    @property
    def headers(self) -> dict[str, str]:
        """What every request to the server carries: its API key, when it has one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url(self, path: str) -> str:
        """The address of one of the server's API paths (`chat/completions`, `models`)."""
        return f"{self.base_url.rstrip('/')}/{path}"


def endpoint_from_json(data: Any, name: str) -> Endpoint:
    """An Endpoint from a JSON object (CHAT_UPSTREAMS); ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("each upstream is a JSON object")
    required = {"model", "base_url", "upstream_model"}
    known = required | {f.name for f in fields(Endpoint) if f.init and f.name != "name"}
    if missing := required - data.keys():
        raise ValueError(f"an upstream needs {', '.join(sorted(missing))}")
    if unknown := data.keys() - known:
        raise ValueError(f"unknown upstream fields: {', '.join(sorted(unknown))}")
    if not str(data["base_url"]).startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, not {data['base_url']!r}")
    endpoint = Endpoint(name=name, **data)
    if endpoint.max_concurrent < 1 or endpoint.weight <= 0:
        raise ValueError("max_concurrent must be at least 1 and weight above 0")
    return endpoint


class NoEndpointAvailable(EngineOverloaded):
    """No endpoint of the model can take a request now (down, circuit open, or none)."""


class UpstreamFailed(Exception):
    """An endpoint failed a request; `before_first_token`: another one may take it."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str = "upstream_error",
        retry: bool = True,
        detail: str | None = None,
        opens_circuit: bool = True,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.retry = status, code, retry
        # Whether it says the endpoint is unwell, so that failures in a row open its circuit.
        self.opens_circuit = opens_circuit
        # The server's own words, for the log: a failing server's message can carry its
        # traceback or its device's state, which clients are not shown.
        self.detail = detail or message


class Circuit:
    """Closed until `threshold` consecutive failures; then open for `open_s`; then one probe."""

    def __init__(self, threshold: int, open_s: float) -> None:
        self.threshold, self.open_s = threshold, open_s
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.probing or time.monotonic() >= self.opened_at + self.open_s else "open"

    def allows(self) -> bool:
        if self.opened_at is None:
            return True
        return not self.probing and time.monotonic() >= self.opened_at + self.open_s

    def taken(self) -> None:
        """A request goes to this endpoint; past an open circuit's wait, it is the one probe."""
        if self.opened_at is not None:
            self.probing = True

    def succeeded(self) -> None:
        self.failures, self.opened_at, self.probing = 0, None, False

    def failed(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at, self.probing = time.monotonic(), False


@dataclass
class EndpointState:
    endpoint: Endpoint
    circuit: Circuit
    outstanding: int = 0
    healthy: bool = True
    requests: int = 0
    errors: int = 0
    ttft_s: float | None = None  # moving average of the time to first token

    @property
    def state(self) -> str:
        if self.circuit.state != "closed":
            return f"circuit {self.circuit.state}"
        return "up" if self.healthy else "down"

    def available(self) -> bool:
        return self.healthy and self.circuit.allows()

    def snapshot(self) -> dict[str, Any]:
        return {
            "name": self.endpoint.name,
            "model": self.endpoint.model,
            "base_url": self.endpoint.base_url,
            "state": self.state,
            "in_flight": self.outstanding,
            "max_concurrent": self.endpoint.max_concurrent,
            "requests": self.requests,
            "errors": self.errors,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 1),
        }
