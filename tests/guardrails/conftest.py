from tests.guardrails.moderation_server import down_url, moderation

__all__ = ["down_url", "moderation"]  # the local moderation service, for every policy test
