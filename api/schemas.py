"""Request bodies of the OpenAI-compatible API, validated with pydantic."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from inference.generators import GenerationParams

MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 100
MAX_MESSAGES = 1000
MAX_TOOLS = 128
# Seeds are 64-bit signed integers (torch's generators take no more); token counts fit a
# 32-bit column. Values beyond are refused here, naming the field, and never reach the model.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_TOKENS_MAX = 2**31 - 1
# OpenAI's defaults, for fields sent as null or not at all.
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0


class Strict(BaseModel):
    # Unknown fields are refused, as OpenAI does, so a typo is an error and not ignored.
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class ToolFunctionCall(Strict):
    name: str
    arguments: str


class ToolCall(Strict):
    id: str
    type: Literal["function"]
    function: ToolFunctionCall


class ChatMessage(Strict):
    # The rule of _content_given, in the document: content, or an assistant's tool_calls.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
                {
                    "required": ["role", "tool_calls"],
                    "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}},
                },
            ]
        }
    )

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A tool round trip: the assistant's calls, and a tool message answering one of them.
    # Before content, whose check reads them.
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    content: Annotated[
        str | list[TextPart] | None,
        Field(validate_default=True, description="Required, except in an assistant message with tool_calls."),
    ] = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _content_given(cls, value: object, info: ValidationInfo) -> object:
        # As OpenAI: only an assistant's message that calls tools may leave its content out.
        role = info.data.get("role")
        if value is None and not (role == "assistant" and info.data.get("tool_calls")):
            needing = "an assistant message without tool_calls" if role == "assistant" else f"a {role} message"
            raise PydanticCustomError("missing", "Field required in {needing}", {"needing": needing})
        return value

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text for part in self.content)

    def as_prompt(self) -> dict[str, Any]:
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ResponseFormat(BaseModel):
    # The JSON schema itself is the model server's to check.
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text", "json_object", "json_schema"]


class Only:
    """Take a field OpenAI documents only at its neutral values (null aside): no model here
    honours the others, which are refused, naming the field, rather than silently ignored.

    An annotation, as annotated-types' Gt or Le are: `Annotated[int, Only(1, because=...)]`.
    The OpenAPI document lists the values taken and says why the others are not.
    """

    def __init__(self, *neutral: object, because: str) -> None:
        self.neutral = neutral
        supported = " or ".join(json.dumps(value) for value in neutral) or "null"
        self.message = f"{because}; only {supported} is supported"

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        if not self.neutral:
            return {"type": "null", "description": f"{self.message}."}
        return {**handler(schema), "enum": list(self.neutral), "description": f"{self.message}."}

    def _check(self, value: object) -> object:
        if value not in self.neutral:
            raise PydanticCustomError("unsupported_value", self.message)
        return value


def ignored() -> Any:
    """A field OpenAI documents that changes nothing in an answer here: accepted, not used."""
    return Field(None, description="Accepted and not used: it changes nothing in the answer.")


class StreamOptions(Strict):
    include_usage: bool = False
    # Padding against length side channels.
    include_obfuscation: Annotated[bool, Only(False, because="chatsite does not pad its chunks")] = False
    # Not OpenAI's: keep generating when the client disconnects, to resume with /v1/streams/<id>.
    resumable: bool = False


def _integral(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# JSON Schema, and so the document, counts 8.0 as an integer; strict mode alone refuses it.
# After an int's bounds, so that the document keeps them as minimum and maximum.
INTEGRAL = BeforeValidator(_integral)
Temperature = Annotated[float, Field(ge=0, le=2, description=f"0 is greedy; default {DEFAULT_TEMPERATURE:g}.")]
TopP = Annotated[float, Field(gt=0, le=1, description=f"Default {DEFAULT_TOP_P:g}.")]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_MAX), INTEGRAL]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX), INTEGRAL]
_STOP_SEQUENCE = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}
# Checked by CompletionOptions._stop, with one message for both forms; the document states the bounds.
Stop = Annotated[
    str | list[str] | None,
    WithJsonSchema(
        {
            "anyOf": [
                _STOP_SEQUENCE,
                {"type": "array", "items": _STOP_SEQUENCE, "maxItems": MAX_STOP_SEQUENCES},
                {"type": "null"},
            ]
        }
    ),
]
OneChoice = Annotated[int, Field(ge=1, le=128), INTEGRAL, Only(1, because="chatsite generates one choice per request")]
# What models on model servers honour and the in-process models refuse (generation_admit).
SERVER_ONLY = "Models on model servers take it; the in-process models only {neutral} (else a 400 naming the field)."
Penalty = Annotated[float, Field(ge=-2, le=2, description=SERVER_ONLY.format(neutral="0"))]
LogitBias = Annotated[
    dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")], Annotated[int, Field(ge=-100, le=100), INTEGRAL]],
    # Token ids only: a key the pattern refuses is refused.
    Field(description=SERVER_ONLY.format(neutral="{}"), json_schema_extra={"additionalProperties": False}),
]
# OpenAI's platform: stored completions and their tags, processing tiers, output kinds.
NoStore = Annotated[bool, Only(False, because="chatsite does not store completions")]
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16, description="Accepted and not used: completions are not stored."),
]
ServiceTier = Annotated[
    Literal["auto", "default", "flex", "scale", "priority", "fast"],
    Only("auto", "default", because="chatsite has one service tier"),
]
TextOnly = Annotated[list[Literal["text", "audio"]], Only(["text"], because="chatsite answers in text only")]
# Legacy text completions.
OneCompletion = Annotated[
    int, Field(ge=1, le=20), INTEGRAL, Only(1, because="chatsite generates one completion per request")
]
NoEcho = Annotated[bool, Only(False, because="chatsite does not echo the prompt")]
NoSuffix = Annotated[str, Only(because="chatsite does not insert text after a completion")]
NoTextLogprobs = Annotated[
    int, Field(ge=0, le=5), INTEGRAL, Only(because="chatsite's text completions carry no logprobs")
]


class CompletionOptions(Strict):
    """What chat and legacy completions share."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None
    stop: Stop = None
    n: OneChoice | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    user: str | None = ignored()

    @field_validator("temperature", "top_p", "frequency_penalty", "presence_penalty", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        # Strict mode refuses ints for floats; JSON has no such distinction.
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(not s or len(s) > MAX_STOP_LENGTH for s in stops):
            raise ValueError(f"stop sequences must be 1 to {MAX_STOP_LENGTH} characters")
        return value

    def stop_sequences(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def generation_params(self) -> GenerationParams:
        return GenerationParams(
            # Unset: as long as the plan, the context and the day's budget allow (generation_admit).
            max_tokens=self.requested_max_tokens() or MAX_TOKENS_MAX,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
            seed=self.seed,
            stop=self.stop_sequences(),
            extra=self.passthrough(),
        )

    def passthrough(self) -> dict[str, Any]:
        """The fields for models on model servers, less those at values that ask for nothing.

        The in-process models refuse every field given here (generation_admit)."""
        fields = self._passed_on()
        return {name: value for name, value in fields.items() if value is not None}

    def _passed_on(self) -> dict[str, Any]:
        return {
            "frequency_penalty": self.frequency_penalty or None,
            "presence_penalty": self.presence_penalty or None,
            "logit_bias": self.logit_bias or None,
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def resumable(self) -> bool:
        return bool(self.stream_options and self.stream_options.resumable)


class ChatCompletionRequest(CompletionOptions):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: MaxTokens | None = None
    # Passed on to models served by model servers; the in-process models take them only at
    # their neutral values (no tools, text, no logprobs).
    tools: Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20), INTEGRAL] | None = None
    store: NoStore | None = None
    metadata: Metadata | None = None
    service_tier: ServiceTier | None = None
    modalities: TextOnly | None = None
    prompt_cache_key: str | None = ignored()
    safety_identifier: str | None = ignored()

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat(self) -> list[dict[str, Any]]:
        return [message.as_prompt() for message in self.messages]

    def _passed_on(self) -> dict[str, Any]:
        fields = {
            **super()._passed_on(),
            "tools": self.tools or None,
            "tool_choice": None if self.tool_choice == "none" else self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls if self.tools else None,
            "response_format": None
            if self.response_format is None or self.response_format.type == "text"
            else self.response_format.model_dump(),
            "logprobs": self.logprobs or None,
            "top_logprobs": self.top_logprobs or None,
        }
        if any(message.role == "tool" or message.tool_calls for message in self.messages):
            fields["tools"] = fields["tools"] or []  # a tool round trip needs a model that takes tools
        return fields


class CompletionRequest(CompletionOptions):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]
    best_of: OneCompletion | None = None
    echo: NoEcho | None = None
    suffix: NoSuffix | None = None
    logprobs: NoTextLogprobs | None = None

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# /tokenize and /detokenize, in vLLM's shapes. They generate nothing: the caps only bound one
# request's work, at about 100,000 tokens either way.
MAX_TOKENIZE_CHARS = 400_000
MAX_DETOKENIZE_TOKENS = 100_000
# Beyond any vocabulary; the model's own range is checked against its tokenizer.
TOKEN_ID_MAX = 2**31 - 1
TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX), INTEGRAL]
ReturnTokenStrs = Annotated[bool | None, Field(description="Also answer each token's string, as token_strs.")]


class TokenizeCompletionRequest(Strict):
    model: str
    prompt: Annotated[str, Field(max_length=MAX_TOKENIZE_CHARS)]
    add_special_tokens: Annotated[bool, Field(description="Add the tokenizer's special tokens (a BOS).")] = True
    return_token_strs: ReturnTokenStrs = False


class TokenizeChatRequest(Strict):
    # The rule of _one_ending, in the document.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["continue_final_message", "add_generation_prompt"],
                "properties": {"continue_final_message": {"const": True}, "add_generation_prompt": {"const": True}},
            }
        }
    )

    model: str
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    add_generation_prompt: Annotated[
        bool | None,
        Field(description="End with the assistant's turn opening. Default: true, unless continue_final_message."),
    ] = None
    continue_final_message: Annotated[
        bool, Field(description="Leave the last message open, to be continued; not with add_generation_prompt.")
    ] = False
    add_special_tokens: Annotated[
        bool, Field(description="Add the tokenizer's special tokens on top of the chat template's.")
    ] = False
    return_token_strs: ReturnTokenStrs = False

    @field_validator("messages")
    @classmethod
    def _bounded(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        if sum(len(message.text()) for message in messages) > MAX_TOKENIZE_CHARS:
            raise PydanticCustomError(
                "too_long", "The messages are at most {limit} characters in all", {"limit": MAX_TOKENIZE_CHARS}
            )
        return messages

    @model_validator(mode="after")
    def _one_ending(self) -> TokenizeChatRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise PydanticCustomError(
                "conflict", "continue_final_message and add_generation_prompt cannot both be true"
            )
        return self

    def chat(self) -> list[dict[str, Any]]:
        return [message.as_prompt() for message in self.messages]

    def generation_prompt(self) -> bool:
        return not self.continue_final_message if self.add_generation_prompt is None else self.add_generation_prompt


class DetokenizeRequest(Strict):
    model: str
    tokens: Annotated[list[TokenId], Field(max_length=MAX_DETOKENIZE_TOKENS)]


# The Responses API (POST /v1/responses): input as text or message items, no tools.
MAX_RESPONSE_ID = 100


class ResponseContentPart(Strict):
    # input_text in the caller's messages; output_text in an earlier answer's, sent back as input.
    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = ignored()
    logprobs: list[Any] | None = ignored()


class ResponseInputMessage(Strict):
    """A message item: OpenAI's easy input message, or an output message sent back as input."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[ResponseContentPart], Field(max_length=MAX_MESSAGES)]
    id: str | None = ignored()
    status: Literal["in_progress", "completed", "incomplete"] | None = ignored()
    phase: Literal["commentary", "final_answer"] | None = ignored()

    def as_prompt(self) -> dict[str, Any]:
        text = self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


def _text_as_message(value: object) -> object:
    # A text input is one user message: one form to check, and errors that name input.0.…
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


ResponseInput = Annotated[
    list[ResponseInputMessage],
    Field(min_length=1, max_length=MAX_MESSAGES, description="A text (one user message), or message items."),
    BeforeValidator(
        _text_as_message,
        json_schema_input_type=str
        | Annotated[list[ResponseInputMessage], Field(min_length=1, max_length=MAX_MESSAGES)],
    ),
]


class ResponseStreamOptions(Strict):
    include_obfuscation: Annotated[bool, Only(False, because="chatsite does not pad its events")] = False
    # Not OpenAI's: keep generating when the client disconnects, as `background` does.
    resumable: bool = False


class ResponseTextFormat(Strict):
    type: Annotated[Literal["text", "json_object", "json_schema"], Only("text", because="chatsite answers in text")]


class ResponseTextConfig(Strict):
    format: ResponseTextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = ignored()


NoTools = Annotated[list[dict[str, Any]], Only([], because="chatsite's Responses API calls no tools")]
NoIncludes = Annotated[list[str], Only([], because="chatsite's responses have nothing more to include")]
NoTruncation = Annotated[
    Literal["auto", "disabled"], Only("disabled", because="chatsite refuses an input beyond the context")
]


class ResponseCreateRequest(Strict):
    # The rule of responses_create, in the document: running on without the client needs store.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "not": {
                        "required": ["store", "background"],
                        "properties": {"store": {"const": False}, "background": {"const": True}},
                    }
                },
                {
                    "not": {
                        "required": ["store", "stream_options"],
                        "properties": {
                            "store": {"const": False},
                            "stream_options": {
                                "type": "object",
                                "required": ["resumable"],
                                "properties": {"resumable": {"const": True}},
                            },
                        },
                    }
                },
            ]
        }
    )

    model: str
    input: ResponseInput
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(max_length=MAX_RESPONSE_ID)] | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    store: Annotated[bool | None, Field(description="Keep the response, to read back or continue; default true.")] = (
        None
    )
    background: Annotated[
        bool | None,
        Field(description="Run on without the client: answered at once (status in_progress), or streamed resumably."),
    ] = None
    metadata: Metadata | None = None
    text: ResponseTextConfig | None = None
    tools: NoTools | None = None
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = ignored()
    include: NoIncludes | None = None
    truncation: NoTruncation | None = None
    service_tier: ServiceTier | None = None
    user: str | None = ignored()
    safety_identifier: str | None = ignored()
    prompt_cache_key: str | None = ignored()

    @field_validator("temperature", "top_p", mode="before")
    @classmethod
    def _number(cls, value: object) -> object:
        return float(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @property
    def stored(self) -> bool:
        return self.store is not False

    @property
    def resumable(self) -> bool:
        return bool(self.background or (self.stream_options and self.stream_options.resumable))

    def input_messages(self) -> list[dict[str, Any]]:
        return [message.as_prompt() for message in self.input]

    def generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_tokens=self.max_output_tokens or MAX_TOKENS_MAX,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=DEFAULT_TOP_P if self.top_p is None else self.top_p,
        )


MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on one request's inputs
_EMBEDDING_TEXT = {"type": "string", "minLength": 1}


def _embedding_input(value: object) -> object:
    """A text or a list of texts, none empty, each refusal saying what is wrong with it."""
    texts = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise PydanticCustomError("empty", "Send at least one text")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise PydanticCustomError("too_many", "At most {limit} texts a request", {"limit": MAX_EMBEDDING_INPUTS})
    if all(isinstance(text, int | list) and not isinstance(text, bool) for text in texts) and isinstance(value, list):
        # OpenAI's token ids are its tokenizer's; this model's differ, so they cannot be read.
        raise PydanticCustomError(
            "token_ids", "Token ids are not taken here (they are another tokenizer's): send the text"
        )
    if not all(isinstance(text, str) for text in texts):
        raise PydanticCustomError("not_text", "Send a string or a list of strings")
    if not all(texts):
        raise PydanticCustomError("empty_text", "An input is empty: every text needs at least one character")
    return value


class EmbeddingRequest(Strict):
    model: str
    input: Annotated[
        str | list[str],
        BeforeValidator(_embedding_input),
        WithJsonSchema(
            {
                "anyOf": [
                    _EMBEDDING_TEXT,
                    {"type": "array", "items": _EMBEDDING_TEXT, "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS},
                ],
                "description": "A text, or a list of texts, none empty. Token ids are not taken: send the text.",
            }
        ),
    ]
    encoding_format: Annotated[
        Literal["float", "base64"],
        Field(description="float: arrays of numbers; base64: each vector's float32 little-endian bytes, base64."),
    ] = "float"
    dimensions: Annotated[
        int | None,
        Field(ge=1, le=MAX_TOKENS_MAX, description="The vectors' length: the model's own only (384)."),
        INTEGRAL,
    ] = None
    user: Annotated[str | None, Field(description="Accepted and not used.")] = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
