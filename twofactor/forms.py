from __future__ import annotations

import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from twofactor.services import AUTHENTICATOR_CODE, RECOVERY_CODE

# Room for a recovery code written with spaces or dashes; anything longer is no code.
MAX_TYPED = 20
SEPARATORS = re.compile(r"[\s-]")


class CodeForm(forms.Form):
    """A code from the authenticator app, or one of the recovery codes."""

    code = forms.CharField(
        label="Code",
        max_length=MAX_TYPED,
        strip=True,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "autocapitalize": "none", "spellcheck": "false"}
        ),
        error_messages={
            "required": "Enter the code.",
            "max_length": "That is too long for a code.",
        },
    )
    malformed = "Enter the 6 digits your authenticator app shows, or one of your recovery codes."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)

    def clean_code(self) -> str:
        code = SEPARATORS.sub("", self.cleaned_data["code"]).lower()
        if not self.accepts(code):
            raise ValidationError(self.malformed, code="malformed")
        return code

    def accepts(self, code: str) -> bool:
        return bool(AUTHENTICATOR_CODE.fullmatch(code) or RECOVERY_CODE.fullmatch(code))


class AuthenticatorCodeForm(CodeForm):
    """A code from the authenticator app alone: to confirm one being set up."""

    malformed = "Enter the 6 digits your authenticator app shows."

    def accepts(self, code: str) -> bool:
        return bool(AUTHENTICATOR_CODE.fullmatch(code))
