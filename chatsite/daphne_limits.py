"""Limits in daphne's own connection handling, below the application, where it has none,
and a response's bytes sent as soon as they are written (`send_now`).

- A deadline for a request's headers (CHAT_HEADER_TIMEOUT_S). Twisted's HTTPChannel has
  one timeout, for silence: every byte received resets it (`dataReceived` calls
  `resetTimeout`), so a client sending a header byte every few seconds holds its
  connection for ever. `HeaderDeadlineChannel` adds a second clock, which no byte resets:
  from the connection's opening, or from the first byte of a kept-alive connection's next
  request, to that request's complete headers (`allHeadersReceived`). Past it the client
  gets a 408 and the connection is closed (Twisted's own `timeoutConnection`: closed once
  the 408 is written, aborted if even that takes 15 s). An idle kept-alive connection is
  left to Twisted's idle timeout, as before; a WebSocket's deadline ends with its
  handshake's headers.
- Flow control for WebSockets. daphne queues every incoming message for the application
  (an unbounded asyncio.Queue) and writes every reply to the transport, and after the
  HTTP upgrade nothing stops it reading: the HTTP channel it came from stays the
  transport's producer, and pauses nothing while its request is "in hand". A client that
  sends faster than the application reads, or never reads its replies, grew the process
  by hundreds of MB. `BoundedWebSocketProtocol` becomes the transport's producer itself:
  it stops reading while the transport's send buffer is full (replies backing up), and
  while more than UNREAD_PAUSE messages wait for the application; past UNREAD_CLOSE
  (one read can hold thousands of tiny frames) it closes the socket with 1008. Once the
  application has asked to close, what the client still sends is dropped, not queued.
  An application may close with RFC 6455's own codes too (1008 for a flood, say), which
  autobahn refuses from an application.

daphne offers no setting for any of this. `install_in_daphne()` puts the subclasses in
place of the factories that daphne's `Server.run` builds (module globals it reads then),
when this process is daphne's; chatsite.asgi calls it as daphne imports the application.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from daphne import http_protocol, ws_protocol
from django.conf import settings
from twisted.internet import interfaces, tcp
from twisted.internet.protocol import connectionDone
from twisted.python.failure import Failure
from twisted.web import http

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
UNREAD_PAUSE = 32  # messages waiting for the application: stop reading
UNREAD_RESUME = 8  # ... and read again once it is down to this
UNREAD_CLOSE = 4096  # still arriving past this (already read): close the socket
UNREAD_CHECK_S = 0.02
POLICY_VIOLATION = 1008
# Close codes RFC 6455 (7.4.1) defines for an endpoint, a server, to send.
RFC_6455_SERVER_CODES = frozenset({1001, 1002, 1003, 1007, 1008, 1009, 1011})


def send_now(transport: Any, data: bytes) -> None:
    """`transport.write(data)`, with what the socket takes at once sent now.

    A Twisted TCP transport never sends in `write`: it buffers, registers the socket for
    writing, and sends on the reactor's next turn (`doWrite`), which unregisters it again.
    For an event stream that is, per chunk, two epoll_ctl calls, one more turn of the
    event loop and Twisted's logging context around `doWrite` (docs/benchmarks.md, the
    gateway's write). asyncio's own transports try the socket first; this does the same
    when nothing of the connection's waits in Twisted's buffer, so the order holds. What
    the socket does not take, and any error, goes through that buffer as before: Twisted
    then meets the error itself and closes the connection its own way. Any other
    transport (TLS, a test's) is written to as usual.
    """
    if (
        isinstance(transport, tcp.Connection)
        and transport.connected
        and not (transport.disconnecting or transport._writeDisconnected)
        and not transport._tempDataBuffer
        and transport.offset == len(transport.dataBuffer)
    ):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):
            data = data[sent:]
    if data:
        transport.write(data)


class EagerWriteChannel(http.HTTPChannel):
    """Twisted's HTTP/1.1 channel, sending a response's bytes as soon as it has them (`send_now`)."""

    def write(self, data: bytes) -> None:
        send_now(self.transport, data)

    def writeSequence(self, iovec: Any) -> None:
        send_now(self.transport, b"".join(iovec))


class HeaderDeadlineChannel(EagerWriteChannel):
    """Twisted's HTTP/1.1 channel with a deadline for each request's headers."""

    _header_deadline: Any = None  # the IDelayedCall, while a request's headers are awaited
    _between_requests = True  # no request's headers are in yet (or the last one is done)

    def connectionMade(self) -> None:
        super().connectionMade()
        self._start_header_deadline()

    def dataReceived(self, data: bytes) -> None:
        if self._between_requests and self._header_deadline is None:
            self._start_header_deadline()  # a kept-alive connection's next request begins
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._between_requests = False
        self._cancel_header_deadline()
        super().allHeadersReceived()

    def requestDone(self, request: Any) -> None:
        if self.persistent:
            self._between_requests = True
            # Bytes of the next request may have come while this one was answered; they
            # are played back now, not through dataReceived.
            if any(self._dataBuffer):
                self._start_header_deadline()
        super().requestDone(request)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self._cancel_header_deadline()
        super().connectionLost(reason)

    def _start_header_deadline(self) -> None:
        self._cancel_header_deadline()
        self._header_deadline = self.callLater(settings.CHAT_HEADER_TIMEOUT_S, self._headers_too_slow)

    def _cancel_header_deadline(self) -> None:
        if self._header_deadline is not None:
            if self._header_deadline.active():
                self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        # Typed Any: Twisted types the transport as an interface, without self.
        transport: Any = self.transport
        if transport is None or not self._between_requests:
            return
        peer = transport.getPeer()
        logger.info(
            "Closed a connection from %s: no complete request headers within %g s",
            getattr(peer, "host", peer),
            settings.CHAT_HEADER_TIMEOUT_S,
        )
        transport.write(REQUEST_TIMEOUT)
        self.timeoutConnection()


def header_deadline_protocol(factory: http.HTTPFactory) -> Any:
    """What Twisted's HTTPFactory.protocol builds (`_genericHTTPChannelProtocolFactory`),
    with a HeaderDeadlineChannel inside."""
    return http._GenericHTTPChannelProtocol(HeaderDeadlineChannel())


class HeaderDeadlineHTTPFactory(http_protocol.HTTPFactory):
    protocol = header_deadline_protocol


class BoundedWebSocketProtocol(ws_protocol.WebSocketProtocol):
    """daphne's WebSocket, which stops reading while it cannot keep up (see the module's docstring)."""

    def connectionMade(self) -> None:
        super().connectionMade()
        self._paused_for: set[str] = set()
        self._unread_check: Any = None
        self._network: Any = interfaces.IPushProducer(self.transport, None)  # Any: as above
        # The HTTP channel this socket was upgraded from is the transport's producer, and
        # will never pause it again: this protocol takes over.
        if self._network is not None and interfaces.IConsumer.providedBy(self.transport):
            self.transport.unregisterProducer()
            self.transport.registerProducer(self, True)

    # IPushProducer, for the transport: its send buffer is full, or has room again.
    def pauseProducing(self) -> None:
        self._pause("replies")

    def resumeProducing(self) -> None:
        self._resume("replies")

    def stopProducing(self) -> None:
        pass  # the connection is going: onClose cleans up

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        if self.state != self.STATE_OPEN:
            return  # closing: nobody will read it
        super().onMessage(payload, isBinary)
        unread = self.application_queue.qsize()
        if unread > UNREAD_CLOSE:
            logger.warning("Closed a WebSocket from %s: %d messages unread", self.client_addr, unread)
            self.sendCloseFrame(code=POLICY_VIOLATION)
        elif unread > UNREAD_PAUSE and "unread" not in self._paused_for:
            self._pause("unread")
            self._unread_check = self.factory.reactor.callLater(UNREAD_CHECK_S, self._read_again_once_read)

    def serverClose(self, code: int | None = None) -> None:
        # autobahn's sendClose lets an application close with 1000 or 3000-4999 only (and
        # raises otherwise: the client then sees 1011); the chat consumer closes a flood
        # with 1008, RFC 6455's "policy violation", which servers send.
        if code in RFC_6455_SERVER_CODES:
            self.sendCloseFrame(code=code)
        else:
            super().serverClose(code=code)

    def onClose(self, wasClean: bool, code: int | None, reason: str | None) -> None:
        if getattr(self, "_unread_check", None) is not None and self._unread_check.active():
            self._unread_check.cancel()
        super().onClose(wasClean, code, reason)

    def _read_again_once_read(self) -> None:
        if self.application_queue.qsize() <= UNREAD_RESUME or self.state != self.STATE_OPEN:
            self._unread_check = None
            self._resume("unread")
        else:
            self._unread_check = self.factory.reactor.callLater(UNREAD_CHECK_S, self._read_again_once_read)

    def _pause(self, why: str) -> None:
        if not self._paused_for and self._network is not None:
            self._network.pauseProducing()
        self._paused_for.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and self._network is not None:
            self._network.resumeProducing()


class BoundedWebSocketFactory(ws_protocol.WebSocketFactory):
    protocol = BoundedWebSocketProtocol


def install_in_daphne() -> None:
    """Make daphne's server build its HTTP and WebSocket connections with these limits;
    nothing when this process is not daphne's (tests, other ASGI servers)."""
    server = sys.modules.get("daphne.server")
    if server is None:
        return
    server.HTTPFactory = HeaderDeadlineHTTPFactory  # type: ignore[attr-defined]
    server.WebSocketFactory = BoundedWebSocketFactory  # type: ignore[attr-defined]
