"""A real SMTP server for tests (aiosmtpd), on 127.0.0.1: a live site sends it mail,
and the test reads what arrived."""

from __future__ import annotations

import email
import email.policy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller

from tests.support.livesite import free_port


class Inbox:
    """aiosmtpd's handler: keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        self.messages.append(message)
        return "250 Message accepted for delivery"

    def wait_for(self, count: int, timeout: float = 30) -> list[EmailMessage]:
        deadline = time.monotonic() + timeout
        while len(self.messages) < count:
            assert time.monotonic() < deadline, f"{len(self.messages)} of {count} messages arrived"
            time.sleep(0.05)
        return self.messages


@contextmanager
def smtp_server() -> Iterator[tuple[Inbox, int]]:
    """`with smtp_server() as (inbox, port):` a server on 127.0.0.1:port while inside."""
    inbox, port = Inbox(), free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()
