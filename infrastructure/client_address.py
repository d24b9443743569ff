"""The client's IP address, as the log-in throttle (django-axes) counts it.

The connection's peer (REMOTE_ADDR), unless CHAT_CLIENT_IP_HEADER names the header that
the reverse proxy in front sets: then that header's last address, the one the proxy
itself saw (nginx's `$proxy_add_x_forwarded_for` appends it; `X-Real-IP` holds just it).
Addresses before it were written by the client, and so is the whole header when no
proxy is configured: trusting them would let anyone pick their address per attempt.

Written here rather than taken from django-ipware, which django-axes would use: ipware
picks a chain's first public address unless told the exact number of proxies, while the
rule needed here is "the address the nearest proxy saw", a few lines.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest


def client_ip(request: HttpRequest) -> str | None:
    header = settings.CHAT_CLIENT_IP_HEADER
    forwarded = request.META.get(header, "") if header else ""
    nearest = forwarded.rsplit(",", 1)[-1].strip()
    try:
        return str(ipaddress.ip_address(nearest))
    except ValueError:  # no header, or not an address: the peer, never a guess
        return request.META.get("REMOTE_ADDR")
