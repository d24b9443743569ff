"""Why a single sign-on log-in was refused: one text per reason, shown on the refusal page
and kept in the audit trail (by code)."""

from __future__ import annotations

from http import HTTPStatus


class Refusal(Exception):
    """A log-in refused with a reason the person at the browser may read."""

    status = HTTPStatus.FORBIDDEN

    def __init__(self, code: str, message: str, *, status: HTTPStatus | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        if status is not None:
            self.status = status


class TokenRefused(Refusal):
    """The provider's ID token (or signed user info) failed a check; nothing was created."""

    status = HTTPStatus.BAD_REQUEST

    MESSAGES = {
        "malformed": "The sign-in token is not a well-formed ID token.",
        "algorithm": "The sign-in token is signed with an algorithm this site does not accept.",
        "unknown_key": "The sign-in token is signed with a key the provider does not publish.",
        "signature": "The sign-in token's signature is not valid.",
        "expired": "The sign-in token has expired.",
        "not_yet_valid": "The sign-in token is not valid yet: check the clocks of this server and the provider.",
        "audience": "The sign-in token was issued to another application (wrong audience).",
        "issuer": "The sign-in token was issued by another provider (wrong issuer).",
        "nonce": "The sign-in token does not belong to this log-in (its nonce differs: a replayed or stale token).",
        "missing_claim": "The sign-in token lacks a claim every ID token carries.",
        "subject": "The provider's user info is about someone other than its ID token.",
    }

    def __init__(self, code: str, detail: str = "") -> None:
        message = self.MESSAGES[code]
        super().__init__(code, f"{message} ({detail})" if detail else message)


class ProviderUnavailable(Refusal):
    """The provider did not answer, or not as OpenID Connect says."""

    status = HTTPStatus.BAD_GATEWAY

    def __init__(self, detail: str) -> None:
        super().__init__(
            "provider_unavailable", f"The identity provider cannot be reached or answered wrongly: {detail}"
        )
