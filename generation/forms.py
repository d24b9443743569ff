from __future__ import annotations

from django import forms

MAX_PROMPT_CHARS = 32_000


class PromptForm(forms.Form):
    prompt = forms.CharField(
        label="Message",
        max_length=MAX_PROMPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "Ask anything", "autofocus": True}),
        error_messages={"required": "Type a message first."},
    )
