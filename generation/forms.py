from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator

from generation.models import Conversation, Feedback, Message
from generation.search import MAX_QUERY_CHARS as MAX_SEARCH_CHARS
from generation.search import search_terms

MAX_PROMPT_CHARS = 32_000
MAX_SYSTEM_PROMPT_CHARS = 4_000
CONVERSATIONS_PER_PAGE = 100
# Past 10,000 pages (a million conversations) a request is a mistake, not a reader.
MAX_CONVERSATION_PAGES = 10_000
MAX_FEEDBACK_COMMENT_CHARS = 2_000  # as Feedback.comment


def validate_unicode(text: str) -> None:
    """Refuse text that is not Unicode (a lone surrogate, which JSON's \\ud800 can carry):
    no database, tokenizer or UTF-8 stream can hold it."""
    try:
        text.encode()
    except UnicodeEncodeError:
        raise ValidationError("The text contains characters that are not valid Unicode.", code="invalid") from None


class PromptForm(forms.Form):
    prompt = forms.CharField(
        label="Message",
        max_length=MAX_PROMPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Ask anything", "autofocus": True}),
        error_messages={"required": "Type a message first."},
        validators=[validate_unicode],
    )


class ConversationImportForm(forms.Form):
    """A conversation file to import; its content is checked by transfer.conversation_document_parse."""

    file = forms.FileField(
        label="Conversation file (JSON)",
        widget=forms.ClearableFileInput(attrs={"accept": "application/json,.json"}),
        error_messages={"required": "Choose a file to import.", "empty": "The file is empty."},
    )


class ConversationRenameForm(forms.ModelForm):
    title = forms.CharField(
        label="Title",
        max_length=200,
        error_messages={
            "required": "Give the conversation a title.",
            "max_length": "A title is at most %(limit_value)d characters (it has %(show_value)d).",
        },
    )

    class Meta:
        model = Conversation
        fields = ["title"]


class ConversationSettingsForm(forms.ModelForm):
    """The model and sampling settings of one conversation; max_tokens is capped by the plan."""

    model = forms.ChoiceField(label="Model")
    system_prompt = forms.CharField(
        label="System prompt",
        required=False,
        max_length=MAX_SYSTEM_PROMPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "How the assistant should behave (optional)"}),
        error_messages={"max_length": "The system prompt is at most %(limit_value)d characters."},
    )
    temperature = forms.FloatField(
        label="Temperature",
        min_value=0,
        max_value=2,
        widget=forms.NumberInput(attrs={"step": "0.1"}),
        help_text="0 is focused and repeatable, 2 is very random.",
        error_messages={
            "min_value": "Temperature is between 0 and 2.",
            "max_value": "Temperature is between 0 and 2.",
        },
    )
    max_tokens = forms.IntegerField(
        label="Max tokens",
        min_value=1,
        error_messages={"min_value": "An answer needs at least 1 token."},
    )

    class Meta:
        model = Conversation
        fields = ["model", "system_prompt", "temperature", "max_tokens"]

    def __init__(self, *args: Any, max_tokens_limit: int, models: list[str], **kwargs: Any) -> None:
        """`models`: those the user may choose (generation.services.models_to_choose)."""
        super().__init__(*args, **kwargs)
        model_field = self.fields["model"]
        assert isinstance(model_field, forms.ChoiceField)
        model_field.choices = [(name, name) for name in models]
        max_tokens = self.fields["max_tokens"]
        assert isinstance(max_tokens, forms.IntegerField)
        max_tokens.validators.append(
            MaxValueValidator(
                max_tokens_limit, message=f"Your plan allows at most {max_tokens_limit} tokens per answer."
            )
        )
        max_tokens.widget.attrs["max"] = max_tokens_limit
        max_tokens.help_text = f"1 to {max_tokens_limit} on your plan."


class SearchForm(forms.Form):
    """A search of one's own conversations: a few words, no search syntax."""

    q = forms.CharField(
        label="Search conversations",
        required=False,
        strip=True,
        max_length=MAX_SEARCH_CHARS,
        validators=[validate_unicode],
        error_messages={"max_length": "Search for at most %(limit_value)d characters (this is %(show_value)d)."},
    )
    archived = forms.BooleanField(label="Include archived", required=False)

    def clean_q(self) -> str:
        query: str = self.cleaned_data["q"]
        if query and not search_terms(query):
            raise ValidationError("Search for a word or a number.", code="no_words")
        return query


class ConversationPageForm(forms.Form):
    """A page of the sidebar's conversation list beyond the first (CONVERSATIONS_PER_PAGE each)."""

    page = forms.IntegerField(
        min_value=2,
        max_value=MAX_CONVERSATION_PAGES,
        error_messages={
            "required": "Say which page of conversations.",
            "invalid": "A page is a whole number.",
            "min_value": "Pages of conversations start at 2 here; the chat page shows the first.",
            "max_value": f"There are at most {MAX_CONVERSATION_PAGES} pages of conversations.",
        },
    )


def _yes_or_no(value: str) -> bool:
    return value == "true"


class ConversationPinForm(forms.Form):
    """Pin (`pinned=true`) or unpin (`false`): the state wanted, so that sending it twice,
    say from a second device's stale page, does what it says."""

    pinned = forms.TypedChoiceField(
        choices=[("true", "Pin"), ("false", "Unpin")],
        coerce=_yes_or_no,
        error_messages={
            "required": "Say whether to pin the conversation (pinned=true or false).",
            "invalid_choice": "pinned is true or false.",
        },
    )


class ConversationArchiveForm(forms.Form):
    """Archive (`archived=true`) or restore (`false`); `return_to` names the page to show after."""

    archived = forms.TypedChoiceField(
        choices=[("true", "Archive"), ("false", "Unarchive")],
        coerce=_yes_or_no,
        error_messages={
            "required": "Say whether to archive the conversation (archived=true or false).",
            "invalid_choice": "archived is true or false.",
        },
    )
    return_to = forms.ChoiceField(
        choices=[("conversation", "The conversation"), ("archived", "The archived conversations")],
        required=False,
        error_messages={"invalid_choice": "return_to is conversation or archived."},
    )


class ArchivedPageForm(forms.Form):
    """A page of the archived conversations (CONVERSATIONS_PER_PAGE each); the first if none is given."""

    page = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=MAX_CONVERSATION_PAGES,
        error_messages={
            "invalid": "A page is a whole number.",
            "min_value": "Pages of archived conversations start at 1.",
            "max_value": f"There are at most {MAX_CONVERSATION_PAGES} pages of conversations.",
        },
    )


class FeedbackForm(forms.Form):
    """A rating of one answer: the button pressed (👍 or 👎), and optionally why.

    Its fields are named for that answer (`feedback-<id>-comment`): a page shows many."""

    rating = forms.ChoiceField(
        choices=Feedback.Rating.choices,
        error_messages={
            "required": "Choose Good answer or Bad answer.",
            "invalid_choice": "A rating is good or bad.",
        },
    )
    reason = forms.ChoiceField(
        label="Reason",
        choices=Feedback.Reason.choices,
        required=False,
        error_messages={"invalid_choice": "Choose one of the reasons listed."},
    )
    comment = forms.CharField(
        label="Comment",
        required=False,
        max_length=MAX_FEEDBACK_COMMENT_CHARS,
        widget=forms.Textarea(attrs={"rows": 2, "placeholder": "What was good or bad about it? (optional)"}),
        validators=[validate_unicode],
        error_messages={
            "max_length": "A comment is at most %(limit_value)d characters (this one has %(show_value)d).",
        },
    )

    def __init__(self, *args: Any, answer: Message, **kwargs: Any) -> None:
        rated = getattr(answer, "feedback", None)  # no rating yet: RelatedObjectDoesNotExist, an AttributeError
        if rated is not None:
            kwargs.setdefault("initial", {"rating": rated.rating, "reason": rated.reason, "comment": rated.comment})
        kwargs["auto_id"] = f"feedback-{answer.pk}-%s"
        super().__init__(*args, **kwargs)
