"""The client's IP address, as the log-in throttle (django-axes) counts it.

Kept under this name for django-axes (AXES_CLIENT_IP_CALLABLE) and the views; the rule
lives in infrastructure.client_address, where the audit trail, below accounts, reads it too.
"""

from __future__ import annotations

from infrastructure.client_address import client_ip

__all__ = ["client_ip"]
