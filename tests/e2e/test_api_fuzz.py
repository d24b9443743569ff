"""Fuzzing the API: schemathesis generates requests from /v1/openapi.json and sends them to a
real daphne serving the synthetic model; every answer must be one the document describes.

No 5xx ever, every error in OpenAI's error object, every body and content type as documented,
with a valid key, without one and with a wrong one. Derandomized: CI sends the same requests
each run, about 900 of them, in under a minute.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS

from api.errors import API_ROOT_PATHS
from api.openapi import openapi_document
from inference.upstream import PASSTHROUGH_FIELDS
from tests.support.livesite import unlimited_api_key

pytestmark = pytest.mark.slow  # hundreds of generated requests

FUZZ_ENV = {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_SYNTHETIC_TOKENS_PER_S": "20000"}
EXAMPLES_PER_OPERATION = 100  # at most; a small operation runs out of new requests sooner
MIN_REQUESTS = 500
MAX_TOKENS = 16  # the fuzzer's generations, streamed or not, end at once
REQUEST_TIMEOUT_S = 15
ERROR_FIELDS = {"message", "type", "param", "code"}
# What the model or the plan refuses in a request the document allows, as it says it may (400):
# a prompt with no tokens, one over the context, a feature (tools, logprobs…) the model lacks,
# more tokens than the plan gives, a tokenizer the model lacks (the synthetic model's /tokenize).
# No schema can tell these; any other 400 to a schema-valid request is a mismatch.
MODEL_REFUSALS = re.compile(
    r"^The prompt is empty|^The model '[^']+' (does not support |has no tokenizer|makes vectors of )"
    r"|^max_tokens is at most "
)

# Every tenth request has no key, and the next a wrong one; the others the valid key.
_turns = itertools.count()
statuses: Counter[int] = Counter()


@pytest.fixture(scope="module")
def fuzz_site(live_sites):
    return live_sites.site(FUZZ_ENV)


@pytest.fixture(scope="module")
def api_key(fuzz_site) -> str:
    # Short answers, the default included: a request asking for more is refused (400), as the document says.
    return unlimited_api_key(fuzz_site, max_tokens_per_request=MAX_TOKENS)


def fuzz_document() -> dict:
    """The API's document, asking for the model served and for short answers, without what only
    model servers take (the synthetic model refuses it, as test_api_edges checks); the rest as served."""
    document = copy.deepcopy(openapi_document())
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        properties = schemas[name]["properties"]
        properties["model"] = {"enum": ["synthetic"]}
        properties["max_tokens"]["anyOf"][0]["maximum"] = MAX_TOKENS
        properties.pop("max_completion_tokens", None)
        for field in PASSTHROUGH_FIELDS:
            properties.pop(field, None)
    for name in ("TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest"):
        schemas[name]["properties"]["model"] = {"enum": ["synthetic"]}
    schemas["EmbeddingRequest"]["properties"]["model"] = {"enum": ["all-minilm-l6-v2"]}
    # Prompts with words in them, and no tool round trips, which need tools.
    words = {"type": "string", "pattern": r"\S"}
    schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"][0] = words
    message = schemas["ChatMessage"]["properties"]
    message["content"]["anyOf"][0] = words
    message["role"]["enum"].remove("tool")
    del message["tool_calls"], message["tool_call_id"]
    schemas["ChatMessage"]["anyOf"] = schemas["ChatMessage"]["anyOf"][:1]  # content, then: no tool_calls
    # Responses: the model served, short answers, words in the input, and no previous response
    # (a made-up id is refused, 400, as the document says: GET /responses/{id} is fuzzed with them).
    responses = schemas["ResponseCreateRequest"]["properties"]
    responses["model"] = {"enum": ["synthetic"]}
    responses["max_output_tokens"]["anyOf"][0]["maximum"] = MAX_TOKENS
    responses["input"]["anyOf"][0] = words
    responses.pop("previous_response_id")
    schemas["ResponseInputMessage"]["properties"]["content"]["anyOf"][0] = words
    return document


schema = schemathesis.openapi.from_dict(fuzz_document())
schema.config.update(request_timeout=REQUEST_TIMEOUT_S)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    no_shrink=True,
    with_security_parameters=False,
)


def _auth(api_key: str) -> dict[str, str]:
    turn = next(_turns) % 10
    if turn == 0:
        return {}
    return {"Authorization": f"Bearer {'cs-not-a-key' if turn == 1 else api_key}"}


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@pytest.mark.timeout(240)
def test_fuzzed_requests_get_no_5xx_and_only_documented_answers(case, fuzz_site, api_key):
    # /tokenize and /detokenize are at the site's root (their operations' servers), as on vLLM.
    root = case.operation.path in API_ROOT_PATHS
    response = case.call(base_url=fuzz_site.base_url if root else f"{fuzz_site.base_url}/v1", headers=_auth(api_key))
    statuses[response.status_code] += 1

    assert response.status_code < 500, case.as_curl_command()
    if response.status_code >= 400:
        assert response.headers.get("content-type") == ["application/json"], case.as_curl_command()
        error = response.json()["error"]
        assert set(response.json()) == {"error"} and set(error) == ERROR_FIELDS, response.text
        if case.meta.generation.mode is GenerationMode.POSITIVE and response.status_code == 400:
            assert error["code"] == "context_length_exceeded" or MODEL_REFUSALS.match(error["message"]), error
    # Its own checks (status, content type, headers and body as documented, invalid data
    # refused…) but for valid data accepted, which the refusals above stand in for.
    case.validate_response(response, excluded_checks=CHECKS.get_by_names(["positive_data_acceptance"]))


def test_the_site_serves_the_document_the_fuzzer_started_from(fuzz_site):
    served = httpx.get(f"{fuzz_site.base_url}/v1/openapi.json").json()
    assert served == openapi_document()
    schemathesis.openapi.from_dict(served)  # a valid OpenAPI 3.1 document, or this raises


def test_the_fuzzer_sent_enough_requests():
    """Runs after the fuzzing above (pytest keeps a module's order)."""
    assert sum(statuses.values()) >= MIN_REQUESTS, statuses
    assert {200, 400, 401, 404} <= set(statuses), statuses
