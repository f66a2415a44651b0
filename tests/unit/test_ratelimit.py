"""The host-wide restart budget: a reservation token bucket with a fake clock (ms)."""

import pytest

from supervisor.policy.ratelimit import TokenBucket


@pytest.mark.parametrize(
    ("rate", "burst", "times", "waits"),
    [
        # A full bucket lets `burst` go at once, then paces at `rate` in reservation order.
        (10, 3, [0, 0, 0, 0, 0], [0, 0, 0, 100, 200]),
        (10, 1, [0, 100, 150, 400], [0, 0, 50, 0]),
        (2, 2, [0, 0, 0, 1000, 1000, 5000], [0, 0, 500, 0, 500, 0]),
        # Unlimited.
        (0, 1, [0, 0, 0], [0, 0, 0]),
    ],
)
def test_waits(rate, burst, times, waits):
    bucket = TokenBucket(rate, burst, now=0.0)
    got = [round(bucket.reserve(t), 6) for t in times]
    assert got == waits


def test_long_run_rate_never_exceeds_rate():
    bucket = TokenBucket(5, 5, now=0.0)
    # 200 requests at once: the last may go only after (200 - burst) / rate seconds.
    starts = [bucket.reserve(0.0) for _ in range(200)]
    assert max(starts) == pytest.approx((200 - 5) / 5 * 1000)
    assert bucket.granted == 200 and bucket.waited == 195
    # In any window of W ms at most burst + W * rate / 1000 start.
    for window in (100.0, 1000.0, 7000.0):
        for t0 in range(0, 39_000, 500):
            n = sum(1 for s in starts if t0 <= s < t0 + window)
            assert n <= 5 + window * 5 / 1000 + 1e-9


def test_refills_after_quiet_and_caps_at_burst():
    bucket = TokenBucket(1, 3, now=0.0)
    for _ in range(3):
        assert bucket.reserve(0.0) == 0
    assert bucket.available(0.0) == pytest.approx(0)
    assert bucket.available(60_000.0) == 3  # capped
    assert [bucket.reserve(60_000.0) for _ in range(4)] == [0, 0, 0, 1000]
