"""Request bodies of the OpenAI-compatible API, validated with pydantic."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 100
MAX_MESSAGES = 1000
MAX_TOOLS = 128
# Seeds are 64-bit signed integers (torch's generators take no more); token counts fit a
# 32-bit column. Values beyond are refused here, naming the field, and never reach the model.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_TOKENS_MAX = 2**31 - 1


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
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # A tool round trip: the assistant's calls, and a tool message answering one of them.
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

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


class StreamOptions(Strict):
    include_usage: bool = False
    # Not OpenAI's: keep generating when the client disconnects, to resume with /v1/streams/<id>.
    resumable: bool = False


Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_MAX)]
Seed = Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)]


class CompletionOptions(Strict):
    """What chat and legacy completions share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    seed: Seed | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    user: Annotated[str, Field(max_length=256)] | None = None

    @field_validator("temperature", "top_p", mode="before")
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
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat(self) -> list[dict[str, Any]]:
        return [message.as_prompt() for message in self.messages]

    def passthrough(self) -> dict[str, Any]:
        """The fields to pass on, less those at values that ask for nothing."""
        fields = {
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
        return {name: value for name, value in fields.items() if value is not None}


class CompletionRequest(CompletionOptions):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
