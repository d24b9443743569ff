"""Connection limits in a real daphne: the header deadline, and a flooding WebSocket.

Raw sockets, as an attacker's client would send: a request's headers a byte at a time,
and a WebSocket's tiny frames as fast as the kernel takes them, its replies never read.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import threading
import time

import httpx
import pytest

from tests.support.livesite import ChatClient, LiveSite
from tests.support.raw_http import memory

HEADER_TIMEOUT_S = 1.0
# Generous: the deadline is 1 s; seen here, the connection closes 1.0-1.5 s after it opened.
CLOSED_WITHIN_S = 10.0
# Seen here: a flood of one-byte frames is closed within half a second, the process grown by
# under 5 MB. Before the limits it was still open after 30 s and 3.1 M frames, the process
# grown by 530 MB.
FLOOD_FOR_AT_MOST_S = 30.0
GROWTH_BOUND_MB = 100.0


@pytest.fixture(scope="module")
def site(live_sites) -> LiveSite:
    return live_sites.site(
        {"CHAT_ENABLE_SYNTHETIC": "1", "CHAT_MODEL": "synthetic", "CHAT_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)}
    )


def trickle_until_closed(sock: socket.socket, data: bytes, every_s: float, give_up_s: float) -> tuple[float, bytes]:
    """Send `data` a byte every `every_s`; (seconds until the server closed, what it sent)."""
    started, received = time.monotonic(), b""
    sock.settimeout(every_s)
    for byte in data:
        if time.monotonic() - started > give_up_s:
            break
        try:
            sock.send(bytes([byte]))
            chunk = sock.recv(4096)  # waits `every_s` for an answer: the pace of the trickle
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started, received
        if not chunk:
            return time.monotonic() - started, received
        received += chunk
    raise AssertionError(f"still open after {time.monotonic() - started:.1f} s; received {received!r}")


def slow_headers(port: int) -> bytes:
    return f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: {'slow' * 30}\r\n\r\n".encode()


def test_headers_sent_a_byte_at_a_time_are_cut_off_and_normal_requests_still_work(site):
    with socket.create_connection(("127.0.0.1", site.port)) as slow:
        took_s, answer = trickle_until_closed(slow, slow_headers(site.port), every_s=0.3, give_up_s=30)

    # A kept-alive connection may idle past the deadline between requests...
    kept = http.client.HTTPConnection("127.0.0.1", site.port, timeout=10)
    kept.request("GET", "/healthz")
    first = kept.getresponse()
    first.read()
    time.sleep(HEADER_TIMEOUT_S * 2)
    kept.request("GET", "/healthz")
    second = kept.getresponse()
    second.read()
    # ... but its next request's headers have the deadline too.
    took_again_s, answer_again = trickle_until_closed(kept.sock, slow_headers(site.port), every_s=0.3, give_up_s=30)
    kept.close()

    assert HEADER_TIMEOUT_S * 0.9 < took_s < CLOSED_WITHIN_S, took_s
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout")
    assert first.status == second.status == 200
    assert HEADER_TIMEOUT_S * 0.9 < took_again_s < CLOSED_WITHIN_S
    assert answer_again.startswith(b"HTTP/1.1 408")
    assert httpx.get(f"{site.base_url}/healthz", timeout=10).json() == {"status": "ok"}


def open_chat_socket(site: LiveSite, username: str) -> socket.socket:
    """A signed-in user's chat WebSocket, its handshake done by hand."""
    client = ChatClient(site.base_url)
    client.signup(username)
    sent = client.send("Hello")  # makes the conversation; its answer goes on meanwhile
    conversation_id = sent.conversation_url.strip("/").split("/")[-1]
    cookie = "; ".join(f"{name}={value}" for name, value in client.http.cookies.items())
    sock = socket.create_connection(("127.0.0.1", site.port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET /ws/chat/{conversation_id}/ HTTP/1.1\r\nHost: 127.0.0.1:{site.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {key}\r\nOrigin: {site.base_url}\r\nCookie: {cookie}\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def masked_text_frame(payload: bytes) -> bytes:
    mask = b"\x01\x02\x03\x04"
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_a_websocket_flooding_tiny_messages_is_closed_and_the_process_stays_small(site):
    sock = open_chat_socket(site, "flooder")
    pid = site.process.pid
    before_mb = memory(pid)["rss_mb"]
    peak_mb, sampling = [before_mb], threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            peak_mb[0] = max(peak_mb[0], memory(pid)["rss_mb"])

    sampler = threading.Thread(target=sample)
    sampler.start()
    burst = masked_text_frame(b"x") * 10_000  # 70 KB of invalid messages, replies never read
    sock.settimeout(1)  # a server that stops reading blocks the send: go on trying
    started, closed_after_s = time.monotonic(), None
    try:
        while time.monotonic() - started < FLOOD_FOR_AT_MOST_S:
            try:
                sock.sendall(burst)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed_after_s = time.monotonic() - started
                break
    finally:
        sampling.set()
        sampler.join()
        sock.close()

    assert closed_after_s is not None, f"still open after {FLOOD_FOR_AT_MOST_S} s"
    assert peak_mb[0] - before_mb < GROWTH_BOUND_MB, (before_mb, peak_mb[0])
    health = httpx.get(f"{site.base_url}/healthz", timeout=10)
    assert health.status_code == 200
