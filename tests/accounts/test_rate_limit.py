"""Requests per minute: a sliding window, in Redis (when REDIS_URL is set) and in the process."""

from __future__ import annotations

import datetime as dt
import os
import uuid

import pytest
import redis
from django.core.cache import caches

from accounts.models import Account
from accounts.rate_limit import LocalRequestLog, RedisRequestLog, RequestLog, request_log
from accounts.services import QuotaExceeded, account_for, quota_for, usage_request_count

REDIS_URL = os.environ.get("REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (a real Redis)")
pytestmark = pytest.mark.services  # the Redis request log: CI's second pass runs it
# 12:00:58 UTC: two seconds before a minute's edge, where a fixed window started afresh.
T0 = dt.datetime(2026, 11, 30, 12, 0, 58, tzinfo=dt.UTC).timestamp()


@pytest.fixture
def redis_caches(settings):
    """The site's cache in Redis, under a key prefix of this test's own, deleted afterwards."""
    prefix = f"chatsite-test-ratelimit-{uuid.uuid4().hex[:12]}"
    settings.CACHES = {"default": {"BACKEND": "chatsite.cache.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": prefix}}
    yield
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    client.close()


@pytest.fixture(params=["local", pytest.param("redis", marks=needs_redis)])
def log(request) -> RequestLog:
    if request.param == "local":
        return LocalRequestLog()
    request.getfixturevalue("redis_caches")
    chosen = request_log()
    assert isinstance(chosen, RedisRequestLog)
    return chosen


def admitted_at(log: RequestLog, times: list[float], limit: int = 5) -> list[float]:
    return [now for now in times if log.admit("alice", limit=limit, now=now).admitted]


def most_in_any_minute(times: list[float]) -> int:
    return max(sum(1 for other in times if start <= other < start + 60) for start in times)


def test_five_per_minute_lets_exactly_five_through_in_any_60_seconds(log):
    # A request every quarter second for three minutes.
    knocks = [T0 + step / 4 for step in range(4 * 180)]

    passed = admitted_at(log, knocks)

    assert most_in_any_minute(passed) == 5
    assert len(passed) == 15  # five each minute: the limit is used, not just respected
    assert passed[:5] == knocks[:5]
    assert passed[5] == T0 + 60


def test_a_minutes_edge_lets_no_second_batch_through(log):
    # From 12:00:59.0 to 12:01:01.9: the fixed window let 10 through, 5 on each side of 12:01.
    knocks = [T0 + 1 + step * 0.1 for step in range(30)]

    assert len(admitted_at(log, knocks)) == 5


def test_a_refused_request_is_not_counted_and_says_when_a_place_frees(log):
    for second in (0, 10, 20, 30, 40):
        assert log.admit("alice", limit=5, now=T0 + second).admitted

    refused = log.admit("alice", limit=5, now=T0 + 45)

    assert not refused.admitted
    assert refused.count == 5
    assert refused.free_in_s == pytest.approx(15)
    assert refused.empty_in_s == pytest.approx(55)
    assert not log.admit("alice", limit=5, now=T0 + 59.9).admitted
    assert log.admit("alice", limit=5, now=T0 + 60).admitted  # the first left; refusals took no place


def test_look_counts_nothing(log):
    log.admit("alice", limit=5, now=T0)

    assert log.look("alice", now=T0 + 30).count == 1
    assert log.look("alice", now=T0 + 30).count == 1
    assert log.look("alice", now=T0 + 60).count == 0
    assert log.look("nobody", now=T0).empty_in_s == 0


def test_keys_are_counted_apart(log):
    assert len(admitted_at(log, [T0] * 3, limit=2)) == 2
    assert log.admit("bob", limit=2, now=T0).admitted


def test_the_local_log_forgets_keys_whose_requests_have_all_left():
    log = LocalRequestLog()
    for number in range(100):
        log.admit(f"user-{number}", limit=5, now=T0)

    log.admit("alice", limit=5, now=T0 + 61)

    assert list(log._times) == ["alice"]


@needs_redis
def test_the_redis_log_expires_with_its_window(redis_caches):
    request_log().admit("alice", limit=5, now=T0)
    cache = caches["default"]
    client = redis.Redis.from_url(REDIS_URL)

    assert 0 < client.pttl(cache.make_key("alice")) <= 60_000
    client.close()


@pytest.fixture(params=["local", pytest.param("redis", marks=needs_redis)])
def site_cache(request, settings):
    if request.param == "redis":
        request.getfixturevalue("redis_caches")
    else:
        settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}


@pytest.mark.django_db
def test_the_plans_limit_refuses_the_next_request_with_retry_after_and_headers(site_cache, alice):
    Account.objects.filter(pk=account_for(alice).pk).update(requests_per_minute=5)
    limits = Account.objects.get(user=alice).limits

    counts = [usage_request_count(user=alice, limits=limits, requested_max_tokens=None) for _ in range(5)]
    with pytest.raises(QuotaExceeded) as refused:
        usage_request_count(user=alice, limits=limits, requested_max_tokens=None)

    assert counts == [1, 2, 3, 4, 5]
    assert refused.value.code == "rate_limit_exceeded"
    assert 55 <= refused.value.retry_after <= 60
    headers = quota_for(alice, limits=limits).headers()
    assert headers["x-ratelimit-limit-requests"] == "5"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 55 <= int(headers["x-ratelimit-reset-requests"].removesuffix("s")) <= 60
