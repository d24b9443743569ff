"""Prometheus metrics of the engines, in the text exposition format."""

from __future__ import annotations

from generation import runtime

METRICS = (
    ("chatsite_active_generations", "gauge", "Generations running now.", lambda e: e.active),
    ("chatsite_queued_generations", "gauge", "Generations waiting for a worker.", lambda e: e.queued),
    (
        "chatsite_generated_tokens_total",
        "counter",
        "Tokens generated since the process started.",
        lambda e: e.generated_tokens,
    ),
)


def render_metrics() -> str:
    engines = runtime.engines()
    lines: list[str] = []
    for name, kind, help_text, read in METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        if not engines:
            lines.append(f"{name} 0")
        for model, engine in engines.items():
            lines.append(f'{name}{{model="{model}"}} {read(engine)}')
    return "\n".join(lines) + "\n"
