"""Request bodies of the OpenAI-compatible API, validated with pydantic."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_SEQUENCES = 4
MAX_STOP_LENGTH = 100
MAX_MESSAGES = 1000
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


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


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

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat(self) -> list[dict[str, str]]:
        # Chat templates know "system"; OpenAI's newer "developer" role means the same.
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class CompletionRequest(CompletionOptions):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)]

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]
