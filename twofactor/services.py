"""Two-factor log-in: an authenticator app (TOTP) and recovery codes, on django-otp's devices.

Each user has at most one confirmed authenticator (a TOTPDevice) and, with it, one set of
recovery codes (a StaticDevice whose tokens are used up one by one). A code is checked
under a row lock, so one code never logs in twice, and every device throttles its wrong
codes (OTP_TOTP_THROTTLE_FACTOR: the next try waits 1, 2, 4... seconds).
"""

from __future__ import annotations

import math
import re
from base64 import b32encode
from typing import TypeVar

import segno
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from accounts.services import account_for
from audit.models import AuditRecord
from audit.services import audit_record, target_of

RECOVERY_CODE_COUNT = 10
AUTHENTICATOR_NAME = "authenticator app"
RECOVERY_NAME = "recovery codes"
# What each kind of code looks like once spaces and dashes are gone (twofactor.forms).
AUTHENTICATOR_CODE = re.compile(r"[0-9]{6}")
RECOVERY_CODE = re.compile(r"[a-z2-7]{8}")

WRONG_CODE = "That code is not right, or it was used already."

AnyDevice = TypeVar("AnyDevice", TOTPDevice, StaticDevice)


class CodeRefused(Exception):
    """A code that was wrong, used before, or tried too soon after a wrong one."""

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    @property
    def throttled(self) -> bool:
        return self.retry_after is not None


class TwoFactorRequired(Exception):
    """Two-factor log-in may not be turned off: the user's plan or staff status requires it."""


def two_factor_enabled(user: User) -> bool:
    """Has the user a confirmed authenticator?"""
    return TOTPDevice.objects.filter(user=user, confirmed=True).exists()


def two_factor_required(user: User) -> bool:
    """Must the user log in with a second factor, set up or not? Per plan, and for staff with
    CHAT_2FA_STAFF=1; never for a guest, who has no password to add a factor to."""
    account = account_for(user)
    if account.is_guest:
        return False
    return (user.is_staff and settings.CHAT_2FA_STAFF) or account.plan.require_two_factor


def session_verified(request: HttpRequest) -> bool:
    """Has this session's user passed a second factor? (django-otp's OTPMiddleware says.)"""
    is_verified = getattr(request.user, "is_verified", None)
    return bool(is_verified is not None and is_verified())


def two_factor_owed(user: User) -> bool:
    """Does logging in as this user take a code, or setting up an authenticator first?"""
    return two_factor_enabled(user) or two_factor_required(user)


def authenticator_setup_device(*, user: User) -> TOTPDevice:
    """The authenticator being set up: a secret of its own, unconfirmed until a code from it
    comes back. The same one until then, so that reloading the page keeps the QR code."""
    device = TOTPDevice.objects.filter(user=user, confirmed=False).order_by("pk").first()
    return device or TOTPDevice.objects.create(user=user, name=AUTHENTICATOR_NAME, confirmed=False)


def authenticator_secret(device: TOTPDevice) -> str:
    """The secret as authenticator apps take it typed in: base32, in groups of four."""
    secret = b32encode(device.bin_key).decode()
    return " ".join(secret[start : start + 4] for start in range(0, len(secret), 4))


def authenticator_qr_svg(device: TOTPDevice) -> str:
    """The otpauth:// URL as a QR code, SVG markup to put in the page as it is: an image
    from a data: URL would need `img-src data:` in the Content-Security-Policy."""
    return str(segno.make(device.config_url, error="m").svg_inline(scale=4, dark="#000", light="#fff", omitsize=True))


def two_factor_enable(*, user: User, device: TOTPDevice, code: str, request: HttpRequest | None = None) -> list[str]:
    """Confirm the authenticator being set up with a code from it; returns new recovery codes,
    for the user to see once. Any earlier authenticator of the user's goes."""
    with transaction.atomic():
        checked = _checked(TOTPDevice.objects.filter(pk=device.pk, user=user, confirmed=False), code)
        if not isinstance(checked, CodeRefused):
            TOTPDevice.objects.filter(user=user).exclude(pk=checked.pk).delete()
            checked.confirmed = True
            checked.save(update_fields=["confirmed"])
            codes = _recovery_codes_replace(user)
    if isinstance(checked, CodeRefused):
        raise checked
    device.refresh_from_db()
    _recorded(AuditRecord.Action.TWO_FACTOR_ENABLED, user, request)
    return codes


def code_check(*, user: User, code: str) -> TOTPDevice | StaticDevice:
    """The device that takes `code`: the authenticator for six digits, else the recovery codes
    (a recovery code is used up). Raises CodeRefused."""
    checked: TOTPDevice | StaticDevice | CodeRefused
    with transaction.atomic():
        if AUTHENTICATOR_CODE.fullmatch(code):
            checked = _checked(TOTPDevice.objects.filter(user=user, confirmed=True), code)
        else:
            checked = _checked(StaticDevice.objects.filter(user=user, confirmed=True), code)
    if isinstance(checked, CodeRefused):
        raise checked
    return checked


def recovery_codes_left(user: User) -> int:
    return StaticToken.objects.filter(device__user=user, device__confirmed=True).count()


def recovery_codes_regenerate(*, user: User, request: HttpRequest | None = None) -> list[str]:
    """New recovery codes in place of the old ones, which stop working."""
    with transaction.atomic():
        codes = _recovery_codes_replace(user)
    _recorded(AuditRecord.Action.RECOVERY_CODES_REGENERATED, user, request)
    return codes


def two_factor_disable(*, user: User, code: str, request: HttpRequest | None = None) -> None:
    """Turn two-factor log-in off, given a current code. Raises TwoFactorRequired or CodeRefused."""
    if two_factor_required(user):
        raise TwoFactorRequired
    code_check(user=user, code=code)
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user).delete()
        StaticDevice.objects.filter(user=user).delete()
    _recorded(AuditRecord.Action.TWO_FACTOR_DISABLED, user, request)


def _checked(devices: QuerySet[AnyDevice], code: str) -> AnyDevice | CodeRefused:
    """The device if it takes the code, else why not. Inside a transaction: the row stays
    locked till its end, so that two requests can't both use one code. The refusal is
    returned, not raised, so that the wrong code's throttling is saved with the transaction."""
    device = devices.select_for_update().first()
    if device is None:
        return CodeRefused(WRONG_CODE)
    allowed, details = device.verify_is_allowed()
    if not allowed:
        locked_until = (details or {}).get("locked_until") or timezone.now()
        wait_s = max(1, math.ceil((locked_until - timezone.now()).total_seconds()))
        return CodeRefused(f"Too many wrong codes: wait {wait_s} seconds, then try again.", retry_after=wait_s)
    return device if device.verify_token(code) else CodeRefused(WRONG_CODE)


def _recovery_codes_replace(user: User) -> list[str]:
    StaticDevice.objects.filter(user=user).delete()
    device = StaticDevice.objects.create(user=user, name=RECOVERY_NAME, confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODE_COUNT)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


def _recorded(action: str, user: User, request: HttpRequest | None) -> None:
    audit_record(action=action, actor=user, target=target_of(user, user.get_username()), request=request)
