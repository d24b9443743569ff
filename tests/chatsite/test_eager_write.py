"""daphne's HTTP channel sends a response's bytes at once (`send_now`), on a real socket pair
with Twisted's TCP transport; the reactor is Twisted's MemoryReactor, which never runs, so
whatever reaches the peer was sent by the write itself."""

from __future__ import annotations

import socket

import pytest
from twisted.internet import tcp
from twisted.internet.testing import MemoryReactor, StringTransport
from twisted.web import http

from chatsite.daphne_limits import EagerWriteChannel, HeaderDeadlineChannel, send_now


@pytest.fixture
def connection():
    """A Twisted TCP transport over one end of a socket pair, and the other end."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    peer.settimeout(1)
    reactor = MemoryReactor()
    transport = tcp.Connection(ours, http.HTTPChannel(), reactor)
    transport.connected = True
    yield transport, peer, reactor
    ours.close()
    peer.close()


def received(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += peer.recv(size - len(data))
    return data


def test_bytes_are_sent_by_the_write_itself_when_nothing_waits(connection):
    transport, peer, reactor = connection

    send_now(transport, b"data: one\n\n")
    send_now(transport, b"data: two\n\n")

    assert received(peer, 22) == b"data: one\n\ndata: two\n\n"
    assert transport not in reactor.getWriters()  # nothing left for the reactor's turn


def test_bytes_queue_behind_what_twisted_still_holds_so_the_order_holds(connection):
    transport, peer, reactor = connection
    transport.write(b"first ")  # Twisted's own write: buffered until the reactor's turn

    send_now(transport, b"second")

    peer.setblocking(False)
    with pytest.raises(BlockingIOError):
        peer.recv(100)  # nothing overtook the buffered bytes
    assert transport in reactor.getWriters()
    transport.doWrite()  # the reactor's turn
    assert received(peer, 12) == b"first second"


def test_what_the_socket_cannot_take_now_waits_for_the_reactor(connection):
    transport, peer, reactor = connection
    transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    data = bytes(range(256)) * 4096  # 1 MiB: more than the socket's buffers

    send_now(transport, data)

    assert transport in reactor.getWriters()
    sent_at_once = len(data) - transport._tempDataLen
    assert 0 < sent_at_once < len(data)
    got = received(peer, sent_at_once)
    while transport in reactor.getWriters():
        transport.doWrite()
        got += peer.recv(len(data))
    got += received(peer, len(data) - len(got))
    assert got == data


def test_a_closed_peer_leaves_the_bytes_to_twisted_which_reports_the_loss(connection):
    transport, peer, reactor = connection
    peer.close()

    for _ in range(3):  # the first send may still succeed; a later one meets the reset
        send_now(transport, b"x" * 65536)

    assert transport in reactor.getWriters()
    assert isinstance(transport.doWrite(), Exception)  # Twisted's own way to a connection lost


def test_other_transports_are_written_to_as_usual():
    transport = StringTransport()

    send_now(transport, b"abc")

    assert transport.value() == b"abc"


def test_daphnes_channel_writes_a_response_through_send_now(connection):
    transport, peer, _ = connection
    channel = HeaderDeadlineChannel()
    assert isinstance(channel, EagerWriteChannel)
    channel.transport = transport

    channel.writeSequence([b"5\r\n", b"hello", b"\r\n"])
    channel.write(b"0\r\n\r\n")

    assert received(peer, 15) == b"5\r\nhello\r\n0\r\n\r\n"
