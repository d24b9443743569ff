"""The header deadline in daphne's HTTP channel, on Twisted's test clock and transport."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web import http

from chatsite.daphne_limits import REQUEST_TIMEOUT, HeaderDeadlineChannel

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nUser-Agent: test\r\n\r\n"


class Hello(http.Request):
    """A request answered at once, as daphne's would be by the application."""

    def process(self) -> None:
        self.setHeader(b"content-length", b"2")
        self.write(b"hi")
        self.finish()


@pytest.fixture
def connection(settings):
    settings.CHAT_HEADER_TIMEOUT_S = 10.0
    clock = Clock()
    channel = HeaderDeadlineChannel()
    channel.requestFactory = Hello
    channel.callLater = clock.callLater
    transport = StringTransport()
    channel.makeConnection(transport)
    return clock, channel, transport


def trickle(clock: Clock, channel: HeaderDeadlineChannel, data: bytes, every_s: float) -> None:
    for byte in data:
        channel.dataReceived(bytes([byte]))
        clock.advance(every_s)


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_deadline_with_a_408(connection):
    clock, channel, transport = connection

    trickle(clock, channel, b"GET /healthz HTTP/1.1\r\nHost: local", every_s=0.3)  # 10.5 s: each byte in time

    assert transport.value() == REQUEST_TIMEOUT
    assert transport.disconnecting


def test_headers_complete_within_the_deadline_are_answered_and_the_connection_kept(connection):
    clock, channel, transport = connection

    trickle(clock, channel, REQUEST, every_s=0.1)  # 5.6 s
    clock.advance(30)

    assert transport.value().startswith(b"HTTP/1.1 200 OK")
    assert transport.value().endswith(b"hi")
    assert not transport.disconnecting


def test_a_kept_alive_connection_may_idle_but_its_next_requests_headers_have_the_deadline(connection):
    clock, channel, transport = connection
    channel.dataReceived(REQUEST)
    clock.advance(30)  # idle between requests: Twisted's idle timeout's business, not this one's
    answered = transport.value()
    transport.clear()

    trickle(clock, channel, REQUEST[:40], every_s=0.3)  # the next request's first byte starts the clock

    assert answered.endswith(b"hi")
    assert not transport.value().startswith(b"HTTP/1.1 200")
    assert transport.value() == REQUEST_TIMEOUT
    assert transport.disconnecting


def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(connection):
    clock, _, transport = connection

    clock.advance(10)

    assert transport.value() == REQUEST_TIMEOUT
    assert transport.disconnecting
