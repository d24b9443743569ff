"""Prometheus metrics of the engines, in the text exposition format."""

from __future__ import annotations

from generation.backends import backend

METRICS = (
    ("chatsite_active_generations", "gauge", "Generations running now.", lambda load: load.active),
    ("chatsite_queued_generations", "gauge", "Generations waiting for a worker.", lambda load: load.queued),
    (
        "chatsite_generated_tokens_total",
        "counter",
        "Tokens generated since the process started.",
        lambda load: load.generated_tokens,
    ),
)


# Model servers, per endpoint, as this process sees them.
UPSTREAM_METRICS = (
    ("chatsite_upstream_up", "gauge", "1 while the endpoint takes requests (up, circuit closed).", "up"),
    ("chatsite_upstream_in_flight", "gauge", "Requests the endpoint is serving now.", "in_flight"),
    ("chatsite_upstream_requests_total", "counter", "Requests sent to the endpoint.", "requests"),
    ("chatsite_upstream_errors_total", "counter", "Failed requests and timeouts of the endpoint.", "errors"),
    ("chatsite_upstream_ttft_seconds", "gauge", "Moving average of its time to first token.", "ttft_s"),
)


def render_metrics() -> str:
    generations = backend()
    loads = generations.loads()
    lines: list[str] = []
    for name, kind, help_text, read in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        if not loads:
            lines.append(f"{name} 0")
        for load in loads:
            lines.append(f'{name}{{model="{load.model}"}} {read(load)}')
    endpoints = generations.upstream.pool.snapshots()
    for name, kind, help_text, field in UPSTREAM_METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for endpoint in endpoints:
            values = {**endpoint, "up": int(endpoint["state"] == "up"), "ttft_s": (endpoint["ttft_ms"] or 0) / 1000}
            labels = f'endpoint="{endpoint["name"]}",model="{endpoint["model"]}"'
            lines.append(f"{name}{{{labels}}} {values[field]}")
    return "\n".join(lines) + "\n"
