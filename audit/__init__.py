"""The audit trail: an append-only record of who did what to what, from where.

Below accounts in the layers (pyproject.toml), so that accounts, the chat app and the API
all write to it; it imports none of them.
"""
