"""Conversations out and in: Markdown to read, JSON (every branch) to keep and import again.

The JSON document ("chatsite.conversation", version 1) lists the messages in order, each
with `id` (its position) and `parent` (an earlier message's id, or null for a first prompt),
and names the branch shown in `current`. An import is checked whole before anything is
saved, and saved in one transaction: a file that is not exactly such a document is refused
with the reason, and leaves nothing behind.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from generation import untrusted_json
from generation.forms import MAX_FEEDBACK_COMMENT_CHARS, MAX_PROMPT_CHARS, MAX_SYSTEM_PROMPT_CHARS
from generation.models import Conversation, Feedback, Message
from generation.selectors import MessageTree
from tools.services import tool_calls_by_message, tool_calls_restore

FORMAT = "chatsite.conversation"
ALL_DATA_FORMAT = "chatsite.export"
VERSION = 1
IMPORT_MAX_BYTES = 5 * 1024 * 1024
IMPORT_MAX_MESSAGES = 5_000
MAX_ANSWER_CHARS = 200_000


NOT_JSON = "The file is not JSON: export a conversation as JSON and import that file."


class ImportRefused(ValueError):
    """The file is not a conversation this site can import; the message says why."""


def _storable(text: str) -> str:
    # A lone surrogate (JSON's "\ud800") or a NUL fits no database column or UTF-8 page.
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValueError("contains characters that are not valid Unicode") from None
    if "\x00" in text:
        raise ValueError("contains a NUL character")
    return text


def _generation_status(status: str) -> str:
    if status not in Message.Status.values:
        raise ValueError(f"is not one of {', '.join(Message.Status.values)}")
    return status


def _feedback_rating(rating: str) -> str:
    if rating not in Feedback.Rating.values:
        raise ValueError(f"is not one of {', '.join(Feedback.Rating.values)}")
    return rating


def _feedback_reason(reason: str) -> str:
    if reason not in Feedback.Reason.values:
        raise ValueError(f"is not empty or one of {', '.join(value for value in Feedback.Reason.values if value)}")
    return reason


Name = Annotated[str, Field(max_length=200), AfterValidator(_storable)]
SystemPrompt = Annotated[str, Field(max_length=MAX_SYSTEM_PROMPT_CHARS), AfterValidator(_storable)]
MessageText = Annotated[str, Field(max_length=MAX_ANSWER_CHARS), AfterValidator(_storable)]
FinishReason = Annotated[str, Field(max_length=20), AfterValidator(_storable)]
ErrorText = Annotated[str, Field(max_length=10_000), AfterValidator(_storable)]


class _Strict(BaseModel):
    # Unknown fields are refused: a misspelt field is an error, never silently dropped.
    model_config = ConfigDict(extra="forbid", strict=True)


class SourceDocument(_Strict):
    """A source under an answer. Its link (`url`, `passage`) points into the exporter's
    documents: exported to show where it came from, never followed after an import."""

    number: int = Field(ge=1, le=10_000)
    document: Name
    excerpt: Annotated[str, Field(max_length=2_000), AfterValidator(_storable)] = ""
    passage: int | None = None
    url: Annotated[str, Field(max_length=500)] = ""


class FeedbackDocument(_Strict):
    """The owner's rating of an answer (generation/feedback.py); `rated_at` goes out and is
    not restored, like the messages' times."""

    rating: Annotated[str, AfterValidator(_feedback_rating)]
    reason: Annotated[str, AfterValidator(_feedback_reason)] = ""
    comment: Annotated[str, Field(max_length=MAX_FEEDBACK_COMMENT_CHARS), AfterValidator(_storable)] = ""
    rated_at: datetime | None = None


class ToolCallDocument(_Strict):
    """A tool call an answer made (tools/), as its block shows it."""

    id: Name
    name: Name
    server: Name = ""
    round: int = Field(default=1, ge=1, le=1000)
    arguments: MessageText = ""
    status: Literal["ok", "error"]
    result: MessageText = ""
    duration_ms: int = Field(default=0, ge=0, le=2**31 - 1)


class MessageDocument(_Strict):
    id: int = Field(ge=0)
    parent: int | None = Field(default=None, ge=0)
    role: Literal["user", "assistant"]
    content: MessageText
    status: Annotated[str, AfterValidator(_generation_status)] = Message.Status.COMPLETE.value
    model: Name = ""
    prompt_tokens: int | None = Field(default=None, ge=0, le=2**31 - 1)
    completion_tokens: int | None = Field(default=None, ge=0, le=2**31 - 1)
    ttft_ms: int | None = Field(default=None, ge=0, le=2**31 - 1)
    duration_ms: int | None = Field(default=None, ge=0, le=2**31 - 1)
    finish_reason: FinishReason = ""
    error: ErrorText = ""
    sources: list[SourceDocument] = Field(default_factory=list, max_length=100)
    tool_calls: list[ToolCallDocument] = Field(default_factory=list, max_length=1000)
    from_cache: bool = False
    feedback: FeedbackDocument | None = None
    created_at: datetime | None = None


class ConversationDocument(_Strict):
    format: Literal["chatsite.conversation"]
    version: Literal[1]
    title: Name = ""
    model: Name = ""
    system_prompt: SystemPrompt = ""
    temperature: float = Field(default=0.2, ge=0, le=2)
    max_tokens: int = Field(default=512, ge=1, le=2**31 - 1)
    created_at: datetime | None = None
    # Kept on import (no later than now; an archived one is not pinned), so a backup
    # comes back organised as it was.
    pinned_at: AwareDatetime | None = None
    archived_at: AwareDatetime | None = None
    current: int | None = Field(default=None, ge=0)
    messages: list[MessageDocument] = Field(max_length=IMPORT_MAX_MESSAGES)


# Export


# A message's fields that travel as they are, out and back in (status and the tree's links
# are translated; timestamps go out and are not restored).
MESSAGE_FIELDS = (
    "role",
    "content",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "duration_ms",
    "finish_reason",
    "error",
    "from_cache",
)


def conversation_document(conversation: Conversation) -> dict[str, Any]:
    """The conversation with every branch, as the JSON document described above."""
    tree = MessageTree(conversation)
    ids = {message.pk: index for index, message in enumerate(tree.messages)}
    leaf = tree.leaf()
    tool_calls = tool_calls_by_message(message_ids=list(ids))
    return {
        "format": FORMAT,
        "version": VERSION,
        "title": conversation.title,
        "model": conversation.model,
        "system_prompt": conversation.system_prompt,
        "temperature": conversation.temperature,
        "max_tokens": conversation.max_tokens,
        "created_at": conversation.created_at.isoformat(),
        "pinned_at": conversation.pinned_at.isoformat() if conversation.pinned_at else None,
        "archived_at": conversation.archived_at.isoformat() if conversation.archived_at else None,
        "current": ids[leaf.pk] if leaf is not None else None,
        "messages": [
            {
                "id": ids[message.pk],
                "parent": ids.get(message.parent_id) if message.parent_id is not None else None,
                "status": message.status,
                **{name: getattr(message, name) for name in MESSAGE_FIELDS},
                "sources": message.sources,
                **({"tool_calls": tool_calls[message.pk]} if message.pk in tool_calls else {}),
                **({"feedback": _feedback_document(message)} if message.role == Message.Role.ASSISTANT else {}),
                "created_at": message.created_at.isoformat(),
            }
            for message in tree.messages
        ],
    }


def _feedback_document(answer: Message) -> dict[str, Any] | None:
    rated = getattr(answer, "feedback", None)  # none: RelatedObjectDoesNotExist, an AttributeError
    if rated is None:
        return None
    return {
        "rating": rated.rating,
        "reason": rated.reason,
        "comment": rated.comment,
        "rated_at": rated.updated_at.isoformat(),
    }


def user_document(user: User) -> dict[str, Any]:
    """Everything of `user`'s chats: the account's name and every conversation, every branch."""
    conversations = Conversation.objects.filter(user=user).order_by("created_at")
    return {
        "format": ALL_DATA_FORMAT,
        "version": VERSION,
        "exported_at": timezone.now().isoformat(),
        "user": {"username": user.get_username(), "email": user.email, "date_joined": user.date_joined.isoformat()},
        "conversations": [conversation_document(conversation) for conversation in conversations],
    }


def conversation_markdown(conversation: Conversation) -> str:
    """The branch shown, to read: each prompt and answer under a heading; the other
    versions are in the JSON export."""
    tree = MessageTree(conversation)
    lines = [f"# {conversation}", "", f"Model: {conversation.model} · temperature {conversation.temperature}"]
    if conversation.system_prompt:
        lines += ["", "System prompt:", "", _quoted(conversation.system_prompt)]
    thread = tree.thread()
    tool_calls = tool_calls_by_message(message_ids=[message.pk for message in thread])
    for message in thread:
        versions = tree.versions(message)
        heading = "You" if message.role == Message.Role.USER else "Assistant"
        if versions.count > 1:
            heading += f" (version {versions.position} of {versions.count})"
        lines += ["", f"## {heading}"]
        if message.pk in tool_calls:
            lines += ["", "Tool calls:", ""]
            lines += [
                f"- {call['name']} `{_one_line(call['arguments'])}` → {call['status']}: {_one_line(call['result'])}"
                for call in tool_calls[message.pk]
            ]
        lines += ["", message.content.strip() or f"*({message.status}, no text)*"]
        if message.sources:
            lines += ["", "Sources:", ""]
            lines += [
                f"{source['number']}. {source['document']}: {_one_line(source['excerpt'])}"
                for source in message.sources
            ]
        if message.from_cache:
            lines += ["", "*(from the response cache)*"]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}".rstrip() for line in text.splitlines())


def download_name(conversation: Conversation, extension: str) -> str:
    """A file name from the title: letters, digits and dashes only (safe in any header)."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(conversation)).strip("-").lower()[:60] or "conversation"
    return f"{slug}.{extension}"


# Import


def conversation_document_parse(raw: bytes) -> ConversationDocument:
    """Check an uploaded file whole; raises ImportRefused with the reason."""
    if len(raw) > IMPORT_MAX_BYTES:
        raise ImportRefused(f"The file is larger than {IMPORT_MAX_BYTES // (1024 * 1024)} MB.")
    try:
        # An export saved again by an editor may start with a byte-order mark.
        text = raw.decode("utf-8-sig")
        data = untrusted_json.parse(text)
    except ValueError:  # UnicodeDecodeError is one
        raise ImportRefused(NOT_JSON) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportRefused(f'The file is not a chatsite conversation (its "format" should be "{FORMAT}").')
    if data.get("version") != VERSION:
        raise ImportRefused(f"The file is version {data.get('version')!r}; this site reads version {VERSION}.")
    try:
        # Strict, from the JSON itself: "0.2" is no temperature, "3" no id.
        document = ConversationDocument.model_validate_json(text)
    except ValidationError as error:
        first = error.errors()[0]
        if first["type"] == "json_invalid":  # nested deeper than pydantic's parser goes
            raise ImportRefused(NOT_JSON) from None
        where = ".".join(str(part) for part in first["loc"])
        raise ImportRefused(f"The file has a bad value at {where}: {first['msg']}.") from None
    _check_tree(document)
    return document


def _check_tree(document: ConversationDocument) -> None:
    """Ids are positions; each parent comes earlier (so there is no loop), a prompt follows
    an answer or nothing, an answer follows a prompt."""
    if not document.messages:
        raise ImportRefused("The conversation has no messages.")
    for position, message in enumerate(document.messages):
        if message.id != position:
            raise ImportRefused(f"Message {position} has the id {message.id}; ids count from 0 in order.")
        if message.role == "user" and len(message.content) > MAX_PROMPT_CHARS:
            raise ImportRefused(f"Message {position} is a prompt longer than {MAX_PROMPT_CHARS} characters.")
        if message.role == "user" and message.feedback is not None:
            raise ImportRefused(f"Message {position} is a prompt with a rating; only answers are rated.")
        if message.parent is None:
            if message.role != "user":
                raise ImportRefused(f"Message {position} is an answer to no prompt.")
            continue
        if message.parent >= position:
            raise ImportRefused(f"Message {position} follows message {message.parent}, which comes later.")
        parent_role = document.messages[message.parent].role
        if parent_role == message.role:
            raise ImportRefused(f"Message {position} follows a message of the same role ({message.role}).")
    if document.current is not None and document.current >= len(document.messages):
        raise ImportRefused(f"current names message {document.current}, which does not exist.")


def _no_later_than_now(moment: datetime | None) -> datetime | None:
    # A pin from the future would head the sidebar until then.
    return min(moment, timezone.now()) if moment is not None else None


@transaction.atomic
def conversation_import(
    *, user: User, document: ConversationDocument, models: list[str], max_tokens: int
) -> Conversation:
    """A new conversation of `user` from a checked document, with every branch.

    A model this site does not serve becomes its default (`models[0]`); max_tokens is
    capped by the user's plan. Nothing streams in an imported conversation: an answer
    that was streaming when exported is saved as interrupted.
    """
    conversation = Conversation.objects.create(
        user=user,
        title=document.title,
        model=document.model if document.model in models else models[0],
        system_prompt=document.system_prompt,
        temperature=document.temperature,
        max_tokens=min(document.max_tokens, max_tokens),
        pinned_at=None if document.archived_at else _no_later_than_now(document.pinned_at),
        archived_at=_no_later_than_now(document.archived_at),
    )
    saved: list[Message] = []
    for item in document.messages:
        status = Message.Status.INTERRUPTED if item.status == Message.Status.STREAMING else item.status
        message = Message(
            conversation=conversation,
            parent=saved[item.parent] if item.parent is not None else None,
            status=status,
            # Each source's text, not its link: the passages are the exporter's.
            sources=[source.model_dump(include={"number", "document", "excerpt"}) for source in item.sources],
            **{name: getattr(item, name) for name in MESSAGE_FIELDS},
        )
        message.save(root=True)  # parents as the file says, first prompts included
        if item.tool_calls:
            tool_calls_restore(message_id=message.pk, calls=[call.model_dump() for call in item.tool_calls])
        if item.feedback is not None:
            # Not feedback_set: a rating carried over is not one given now (/metrics counts those).
            Feedback.objects.create(
                message=message,
                rating=item.feedback.rating,
                reason=item.feedback.reason,
                comment=item.feedback.comment,
            )
        saved.append(message)
    current = saved[document.current] if document.current is not None else saved[-1]
    Conversation.objects.filter(pk=conversation.pk).update(current_leaf=MessageTree(conversation).newest_leaf(current))
    conversation.refresh_from_db()
    return conversation
