from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm, UsernameField
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.utils import timezone

from accounts.budgets import PERIOD_ADJECTIVES, key_budget_cap
from accounts.models import KEY_LIMIT_FIELDS, Account, ApiKey, Budget, Limits

# The longest a key may be made to last: its expiry at most this many days ahead.
MAX_KEY_DAYS = 3650


class KeyLimitsForm(forms.Form):
    """The limits a key may have of its own (KEY_LIMIT_FIELDS), each capped by its owner's:
    blank, the owner's alone."""

    requests_per_minute = forms.IntegerField(label="Requests per minute", required=False, min_value=1)
    tokens_per_day = forms.IntegerField(label="Tokens per day", required=False, min_value=1)
    max_concurrent_streams = forms.IntegerField(label="Answers streaming at once", required=False, min_value=1)

    def __init__(self, *args: Any, limits: Limits | None = None, **kwargs: Any) -> None:
        """`limits`: the owner's, which a key's own may not pass."""
        # The labels read exactly "Name", "Requests per minute"… (no colon): browser tests find fields by them.
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        for name in KEY_LIMIT_FIELDS:
            field = self.fields[name]
            assert isinstance(field, forms.IntegerField)
            if limits is not None:
                most = getattr(limits, name)
                field.max_value = most
                field.validators.append(MaxValueValidator(most, message=f"Your plan allows at most {most}."))
                field.widget.attrs["max"] = most
            field.help_text = "Blank: your plan's."


class ApiKeyCreateForm(KeyLimitsForm):
    name = forms.CharField(
        label="Name",
        max_length=ApiKey._meta.get_field("name").max_length,
        strip=True,
        widget=forms.TextInput(attrs={"placeholder": "e.g. laptop, CI", "autocomplete": "off"}),
        error_messages={"required": "Give the key a name, so you can tell it apart later."},
    )

    expires_in_days = forms.IntegerField(
        label="Expires after (days)",
        required=False,
        min_value=1,
        max_value=MAX_KEY_DAYS,
        help_text="Blank: never.",
    )

    field_order = ["name", "expires_in_days", *KEY_LIMIT_FIELDS]


# The settings of a key its owner may change, besides its budget (KeyBudgetForm).
KEY_SETTINGS_FIELDS = (*KEY_LIMIT_FIELDS, "expires_at", "allowed_models")


class KeySettingsForm(KeyLimitsForm):
    """A key's limits, expiry and models, as its owner changes them: each limit within the
    owner's, an expiry to come (or none), models among those the owner may use.

    A value sent back as it was shown stays as it is: an expiry kept to the second (the
    page shows minutes), a list of models kept in its order, an expiry already past kept
    past (an expired key is given a new one, or none, like any other)."""

    expires_at = forms.DateTimeField(
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Blank: never.",
        error_messages={"invalid": "A date and time, such as 2030-01-31 18:00."},
    )
    allowed_models = forms.MultipleChoiceField(
        label="Models it may use",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: all of yours.",
    )

    def __init__(self, *args: Any, key: ApiKey, limits: Limits, models: list[str], **kwargs: Any) -> None:
        """`models`: those the owner may use (accounts.model_access), which the key's may narrow."""
        kwargs.setdefault("initial", {name: getattr(key, name) for name in KEY_SETTINGS_FIELDS})
        super().__init__(*args, limits=limits, **kwargs)
        self.key = key
        self.fields["expires_at"].label = f"Expires at ({timezone.get_current_timezone_name()})"
        # Names the key has that its owner may not use now stay offered, ticked: saving
        # other settings keeps them (they allow nothing while the owner's list lacks them).
        kept = [name for name in key.allowed_models or [] if name not in models]
        self.offered = [*models, *kept]
        field = self.fields["allowed_models"]
        assert isinstance(field, forms.MultipleChoiceField)
        field.choices = [(name, name) for name in models] + [(name, f"{name} (not yours to use now)") for name in kept]

    def clean_expires_at(self) -> dt.datetime | None:
        value: dt.datetime | None = self.cleaned_data.get("expires_at")
        current = self.key.expires_at
        if value is not None and current is not None and value == current.replace(second=0, microsecond=0):
            return current  # sent back as shown, to the minute: unchanged, past or not
        if value is None:
            return None
        now = timezone.now()
        if value <= now:
            raise ValidationError("Give a time to come, or leave it blank for never. To stop the key now, revoke it.")
        if value > now + dt.timedelta(days=MAX_KEY_DAYS):
            raise ValidationError(f"At most {MAX_KEY_DAYS} days from now.")
        return value

    def clean_allowed_models(self) -> list[str]:
        chosen = set(self.cleaned_data.get("allowed_models") or [])
        current = list(self.key.allowed_models or [])
        if chosen == set(current):
            return current  # as it was, in its order
        return [name for name in self.offered if name in chosen]


class KeyBudgetForm(forms.Form):
    """A key's budget of its own, within its owner's (key_budget_cap); no amount: none."""

    period = forms.ChoiceField(label="Period", choices=Budget.Period.choices, initial=Budget.Period.MONTH)
    unit = forms.ChoiceField(label="In", choices=Budget.Unit.choices, initial=Budget.Unit.MONEY)
    amount = forms.DecimalField(
        label="Amount",
        required=False,
        min_value=Decimal(0),
        max_digits=Budget._meta.get_field("amount").max_digits,  # type: ignore[union-attr]
        decimal_places=Budget._meta.get_field("amount").decimal_places,  # type: ignore[union-attr]
        help_text="Tokens, or money in the currency (0: the key may spend nothing). Blank: no budget of its own.",
    )
    currency = forms.RegexField(
        label="Currency",
        regex=r"^[A-Z]{3}$",
        initial="USD",
        required=False,
        error_messages={"invalid": "A three-letter code in capitals, such as USD."},
    )

    def __init__(self, *args: Any, account: Account, **kwargs: Any) -> None:
        kwargs.setdefault("label_suffix", "")
        super().__init__(*args, **kwargs)
        self.account = account

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        amount, unit, period = data.get("amount"), data.get("unit"), data.get("period")
        if amount is None or unit is None or period is None:
            return data
        money = unit == Budget.Unit.MONEY
        currency = data.get("currency") or "USD"
        data["currency"] = currency
        if not money and amount != amount.to_integral():
            self.add_error("amount", "A budget in tokens is a whole number.")
            return data
        cap = key_budget_cap(account=self.account, period=period, unit=unit, currency=currency)
        if cap is not None and amount > cap:
            most = f"{cap:f}".rstrip("0").rstrip(".") if money else f"{int(cap)}"
            what = f"{most} {currency}" if money else f"{most} tokens"
            self.add_error("amount", f"Your plan allows at most {what} in a {PERIOD_ADJECTIVES[period]} budget.")
        return data


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


class ModelNamesField(forms.JSONField):
    """A list of model names (a JSONField's value) edited as plain text, one name per line:
    an admin writes `gpt-4o-mini`, not `["gpt-4o-mini"]`. Names are kept as written, even
    of models not served now (a model server may add them later)."""

    MAX_NAMES = 100
    MAX_NAME_LENGTH = 200

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3, "cols": 40}))
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> Any:  # a list of names
        if isinstance(value, list):
            return value
        names = list(dict.fromkeys(line.strip() for line in str(value or "").splitlines() if line.strip()))
        if len(names) > self.MAX_NAMES:
            raise ValidationError(f"At most {self.MAX_NAMES} models.")
        if too_long := next((name for name in names if len(name) > self.MAX_NAME_LENGTH), None):
            raise ValidationError(f"A model name has at most {self.MAX_NAME_LENGTH} characters: {too_long[:40]}…")
        return names

    def bound_data(self, data: Any, initial: Any) -> Any:
        return data

    def prepare_value(self, value: Any) -> str:
        return "\n".join(value) if isinstance(value, list) else str(value or "")


class SignupForm(UserCreationForm):  # type: ignore[type-arg]
    """Django's sign-up form (username, password1, password2) and an optional e-mail
    address, where a password reset is sent."""

    email = forms.EmailField(
        label="E-mail (optional)",
        required=False,
        help_text="Only to reset a forgotten password.",
        widget=forms.EmailInput(attrs={"autocomplete": "email"}),
    )

    class Meta:  # UserCreationForm's, with the e-mail address
        model = User
        fields = ("username", "email")
        field_classes = {"username": UsernameField}


class EmailForm(forms.ModelForm):  # type: ignore[type-arg]
    """The address a password reset is sent to; blank: none."""

    class Meta:
        model = User
        fields = ("email",)
        labels = {"email": "E-mail"}
        help_texts = {"email": "Where a link to reset a forgotten password is sent. Blank: none."}
