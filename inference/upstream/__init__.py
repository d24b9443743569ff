"""Generations on OpenAI-compatible model servers (vLLM, TGI, Ollama, llama.cpp, another
chatsite), by concern: `endpoints` (configuration, circuit, health state), `wire` (the
request fields passed through, token estimates, reading an event stream), `pool` (the
waiting line, routing, failover, streaming into the store, health checks, Stop).
"""

from inference.upstream.endpoints import (
    Circuit,
    Endpoint,
    EndpointState,
    NoEndpointAvailable,
    UpstreamFailed,
    endpoint_from_json,
)
from inference.upstream.pool import UpstreamPool
from inference.upstream.wire import (
    MAX_LINE_BYTES,
    PASSTHROUGH_FIELDS,
    estimate_prompt_tokens,
    estimate_tokens,
    openai_tool_call_deltas,
)

__all__ = [
    "MAX_LINE_BYTES",
    "PASSTHROUGH_FIELDS",
    "Circuit",
    "Endpoint",
    "EndpointState",
    "NoEndpointAvailable",
    "UpstreamFailed",
    "UpstreamPool",
    "endpoint_from_json",
    "estimate_prompt_tokens",
    "estimate_tokens",
    "openai_tool_call_deltas",
]
