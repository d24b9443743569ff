from __future__ import annotations

from typing import Any

from django import forms

from accounts.models import ApiKey


class ApiKeyCreateForm(forms.Form):
    name = forms.CharField(
        label="Name",
        max_length=ApiKey._meta.get_field("name").max_length,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "e.g. laptop, CI", "autocomplete": "off"}),
        error_messages={"required": "Give the key a name, so you can tell it apart later."},
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The label reads exactly "Name" (no colon): browser tests find the field by it.
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
