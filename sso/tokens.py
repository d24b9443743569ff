"""Checking the provider's ID token: signature against its published keys, issuer, audience,
expiry and the nonce of this log-in. Plain Python (PyJWT); each failure is a TokenRefused."""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from typing import Any

import jwt

from sso.refusals import TokenRefused

# Asymmetric signatures only: "none" and the HMAC family (keyed with the client's secret) are refused.
KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC"}
ALGORITHMS = frozenset(f"{family}{bits}" for family in KEY_TYPES for bits in (256, 384, 512))
REQUIRED_CLAIMS = ["iss", "sub", "aud", "exp", "iat"]
# Clocks differ a little between this server and the provider.
LEEWAY_S = 60


def signing_key(token: str, keys: Sequence[Mapping[str, Any]]) -> jwt.PyJWK:
    """The published key that the token says signed it (by `kid`, else the one of its type)."""
    header = _header(token)
    algorithm = header.get("alg")
    if algorithm not in ALGORITHMS:
        raise TokenRefused("algorithm", repr(algorithm))
    kid = header.get("kid")
    candidates = [
        key
        for key in keys
        if key.get("kty") == KEY_TYPES[algorithm[:2]]
        and key.get("use", "sig") == "sig"
        and key.get("alg", algorithm) == algorithm
        and (kid is None or key.get("kid") == kid)
    ]
    if not candidates:
        raise TokenRefused("unknown_key", f"kid {kid!r}")
    try:
        return jwt.PyJWK(dict(candidates[0]), algorithm=algorithm)
    except jwt.PyJWTError as error:
        raise TokenRefused("unknown_key", str(error)) from None


def id_token_claims(token: str, *, key: jwt.PyJWK, issuer: str, audience: str, nonce: str | None) -> dict[str, Any]:
    """The token's claims once every check passed. `nonce`: the one this log-in sent (None
    only for signed user info, which carries none)."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,
            algorithms=[_header(token)["alg"]],
            audience=audience,
            issuer=issuer,
            leeway=LEEWAY_S,
            options={"require": REQUIRED_CLAIMS},
        )
    except jwt.ExpiredSignatureError:
        raise TokenRefused("expired") from None
    except jwt.ImmatureSignatureError:
        raise TokenRefused("not_yet_valid") from None
    except jwt.InvalidAudienceError:
        raise TokenRefused("audience") from None
    except jwt.InvalidIssuerError:
        raise TokenRefused("issuer") from None
    except jwt.MissingRequiredClaimError as error:
        raise TokenRefused("missing_claim", error.claim) from None
    except jwt.InvalidSignatureError:
        raise TokenRefused("signature") from None
    except jwt.PyJWTError as error:
        raise TokenRefused("malformed", str(error)) from None
    audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
    if len(audiences) > 1 and claims.get("azp") != audience:
        # OpenID Connect Core 3.1.3.7: with several audiences, the authorized party must be us.
        raise TokenRefused("audience", "azp")
    if nonce is not None:
        sent = claims.get("nonce")
        if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), nonce.encode()):
            raise TokenRefused("nonce")
    return claims


def _header(token: str) -> dict[str, Any]:
    try:
        return jwt.get_unverified_header(token)
    except jwt.PyJWTError as error:
        raise TokenRefused("malformed", str(error)) from None
