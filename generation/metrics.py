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


def render_metrics() -> str:
    loads = backend().loads()
    lines: list[str] = []
    for name, kind, help_text, read in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        if not loads:
            lines.append(f"{name} 0")
        for load in loads:
            lines.append(f'{name}{{model="{load.model}"}} {read(load)}')
    return "\n".join(lines) + "\n"
