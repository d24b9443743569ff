from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError

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


class LoginForm(AuthenticationForm):
    """Django's log-in form, which also tells the owner of an inactive account why they can't log in.

    Django's backend turns inactive users away as it does wrong passwords, so Django's own
    "inactive" message never shows. Here it does, once the password is right: no one else
    learns that the account exists. Not while log-ins are locked out (django-axes): then
    no password is checked at all.
    """

    error_messages = {
        **AuthenticationForm.error_messages,
        "inactive": "This account is not active yet: new accounts wait for an admin's approval.",
    }

    def clean(self) -> dict[str, Any]:
        try:
            return super().clean()
        except ValidationError:
            if self._inactive_with_right_password():
                raise ValidationError(self.error_messages["inactive"], code="inactive") from None
            raise

    def _inactive_with_right_password(self) -> bool:
        if self.request is None or getattr(self.request, "axes_locked_out", False):
            return False
        username, password = self.cleaned_data.get("username"), self.cleaned_data.get("password")
        user = User.objects.filter(username=username, is_active=False).first()
        return user is not None and password is not None and user.check_password(password)
