from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from twofactor.services import AUTHENTICATOR_NAME, recovery_codes_regenerate


def code_for(device: TOTPDevice, *, steps: int = 0) -> str:
    """The code the authenticator app shows, `steps` time steps (30 s each) ahead of the clock."""
    return f"{totp(device.bin_key, step=device.step, digits=device.digits, drift=steps):06d}"


def authenticator_for(user: User) -> tuple[TOTPDevice, list[str]]:
    """A confirmed authenticator for `user`, and their recovery codes."""
    device = TOTPDevice.objects.create(user=user, name=AUTHENTICATOR_NAME, confirmed=True)
    return device, recovery_codes_regenerate(user=user)


@pytest.fixture
def steady_clock(monkeypatch) -> float:
    """The clock django-otp checks codes by, stopped mid-step: a code made for a step ahead or
    behind can't cross a step boundary between being made and being checked."""
    now = time.time()
    now -= now % 30 - 15
    monkeypatch.setattr("django_otp.oath.time", lambda: now)
    monkeypatch.setattr("django_otp.plugins.otp_totp.models.time", SimpleNamespace(time=lambda: now))
    return now


@pytest.fixture
def alice_2fa(alice) -> SimpleNamespace:
    """Alice with two-factor on: `.device` her authenticator, `.codes` her recovery codes."""
    device, codes = authenticator_for(alice)
    return SimpleNamespace(device=device, codes=codes)


def wrong_code_for(device: TOTPDevice) -> str:
    """Six digits the authenticator does not show now, nor a step before or after."""
    shown = {code_for(device, steps=steps) for steps in (-1, 0, 1)}
    return next(code for code in ("000000", "111111", "222222", "333333") if code not in shown)
