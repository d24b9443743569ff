"""What every app shares and no app owns: logs with the request's id, the database threads
that keep their connections, Prometheus metrics, and SSE framing.

A layer of its own, below the apps and above the inference core (pyproject.toml's
import-linter contracts): the API, the chat app and the wiring all use it, and it
imports none of them.
"""
