"""The ID token checks (sso.tokens), with tokens signed here: good ones pass, each bad one is refused by name."""

from __future__ import annotations

import time

import jwt
import pytest

from sso.refusals import TokenRefused
from sso.tokens import id_token_claims, signing_key
from tests.sso.conftest import CLIENT_ID, ISSUER, FakeProvider, new_key, public_jwk

NONCE = "nonce-of-this-log-in"


@pytest.fixture(scope="module")
def other_key():
    return new_key()


@pytest.fixture
def fake(signing_key):
    return FakeProvider(key=signing_key)


def check(fake: FakeProvider, token: str, *, nonce: str | None = NONCE) -> dict:
    key = signing_key(token, [public_jwk(fake.key, fake.kid)])
    return id_token_claims(token, key=key, issuer=ISSUER, audience=CLIENT_ID, nonce=nonce)


def refusal(fake: FakeProvider, token: str, **kwargs) -> str:
    with pytest.raises(TokenRefused) as refused:
        check(fake, token, **kwargs)
    return refused.value.code


def test_a_good_token_gives_its_claims(fake):
    claims = check(fake, fake.id_token(nonce=NONCE, groups=["/interns"]))
    assert claims["sub"] == "sub-ada"
    assert claims["groups"] == ["/interns"]


def test_a_token_for_another_audience_is_refused(fake):
    assert refusal(fake, fake.id_token(nonce=NONCE, aud="another-app")) == "audience"


def test_a_token_for_several_audiences_needs_this_site_as_authorized_party(fake):
    assert refusal(fake, fake.id_token(nonce=NONCE, aud=[CLIENT_ID, "another-app"])) == "audience"
    assert check(fake, fake.id_token(nonce=NONCE, aud=[CLIENT_ID, "another-app"], azp=CLIENT_ID))["sub"] == "sub-ada"


def test_an_expired_token_is_refused(fake):
    long_ago = int(time.time()) - 3600
    assert refusal(fake, fake.id_token(nonce=NONCE, iat=long_ago, exp=long_ago + 300)) == "expired"


def test_a_token_from_the_future_is_refused(fake):
    later = int(time.time()) + 3600
    assert refusal(fake, fake.id_token(nonce=NONCE, iat=later, exp=later + 300)) == "not_yet_valid"


def test_a_token_signed_with_another_key_under_the_providers_key_id_is_refused(fake, other_key):
    assert refusal(fake, fake.id_token(nonce=NONCE, key=other_key)) == "signature"


def test_a_token_with_a_changed_payload_is_refused(fake):
    header, _, signature = fake.id_token(nonce=NONCE).split(".")
    forged = jwt.utils.base64url_encode(
        b'{"iss":"%s","aud":"%s","sub":"admin","iat":1,"exp":9999999999}' % (ISSUER.encode(), CLIENT_ID.encode())
    )
    assert refusal(fake, f"{header}.{forged.decode()}.{signature}") == "signature"


def test_a_token_from_another_issuer_is_refused(fake):
    assert refusal(fake, fake.id_token(nonce=NONCE, iss="https://evil.example.com")) == "issuer"


def test_a_replayed_token_with_an_earlier_log_ins_nonce_is_refused(fake):
    assert refusal(fake, fake.id_token(nonce="nonce-of-an-earlier-log-in")) == "nonce"
    assert refusal(fake, fake.id_token()) == "nonce"  # none at all


def test_a_token_without_an_expiry_is_refused(fake):
    assert refusal(fake, fake.id_token(nonce=NONCE, exp=None)) == "missing_claim"


def test_unsigned_and_shared_secret_tokens_are_refused(fake):
    unsigned = jwt.encode({"iss": ISSUER, "aud": CLIENT_ID, "sub": "x", "nonce": NONCE}, None, algorithm="none")
    assert refusal(fake, unsigned) == "algorithm"
    hmac_signed = jwt.encode(
        {"iss": ISSUER, "aud": CLIENT_ID, "sub": "x", "nonce": NONCE}, "s3cret" * 6, algorithm="HS256"
    )
    assert refusal(fake, hmac_signed) == "algorithm"


def test_a_token_naming_a_key_the_provider_does_not_publish_is_refused(fake):
    assert refusal(fake, fake.id_token(nonce=NONCE, headers={"kid": "key-9"})) == "unknown_key"


def test_garbage_is_refused_as_malformed(fake):
    assert refusal(fake, "not.a.token") == "malformed"
