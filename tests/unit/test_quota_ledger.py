"""The quota ledger, table-driven with a fake clock (monotonic ms and wall ms passed in)."""

import pytest

from supervisor.policy.quota import DAY_MS, Ledger, Limits

DAY0 = 20_000 * DAY_MS  # a UTC midnight


def ledger(**limits):
    led = Ledger()
    led.configure({k: Limits(**v) for k, v in limits.items()})
    return led


def run(led, keys, times, wall=DAY0):
    """Admit one call at each time; return None or (rule, retryAfterMs) per call."""
    out = []
    for t in times:
        r = led.admit(keys, t, wall + t)
        out.append(None if r is None else (r.rule, r.retry_after_ms))
    return out


@pytest.mark.parametrize(
    ("limit", "times", "expected"),
    [
        # N calls pass, the N+1th within the minute is refused until the oldest leaves.
        (3, [0, 10, 20, 30], [None, None, None, ("callsPerMinute", 60_000 - 30)]),
        (3, [0, 10, 20, 59_999], [None, None, None, ("callsPerMinute", 1)]),
        # At exactly 60 s the oldest has left: sliding, not fixed, window.
        (3, [0, 10, 20, 60_000, 60_001], [None, None, None, None, ("callsPerMinute", 9)]),
        (1, [0, 30_000, 60_000], [None, ("callsPerMinute", 30_000), None]),
        (2, [0, 0, 0, 0], [None, None, ("callsPerMinute", 60_000), ("callsPerMinute", 60_000)]),
    ],
)
def test_calls_per_minute_sliding_window(limit, times, expected):
    led = ledger(**{"tool:t": {"per_minute": limit}})
    assert run(led, ["tool:t"], times) == expected


def test_refused_calls_are_not_charged():
    led = ledger(**{"tool:t": {"per_minute": 1}})
    assert run(led, ["tool:t"], [0, 100, 200, 300]) == [None] + [
        ("callsPerMinute", 60_000 - t) for t in (100, 200, 300)
    ]
    assert led.usage("tool:t", 300, DAY0)["callsLastMinute"] == 1
    assert run(led, ["tool:t"], [60_000]) == [None]


def test_every_key_must_allow_and_none_is_charged_on_refusal():
    led = ledger(**{"sidecar:s": {"per_minute": 3}, "tool:a": {"per_minute": 1}})
    both = ["sidecar:s", "tool:a"]
    assert run(led, both, [0]) == [None]
    assert run(led, both, [10]) == [("callsPerMinute", 59_990)]  # the tool refuses...
    assert led.usage("sidecar:s", 10, DAY0)["callsLastMinute"] == 1  # ...the sidecar not charged
    assert run(led, ["sidecar:s", "tool:b"], [20, 30]) == [None, None]
    assert run(led, ["sidecar:s", "tool:b"], [40]) == [("callsPerMinute", 60_000 - 40)]


def test_longest_wait_wins():
    led = ledger(**{"sidecar:s": {"per_minute": 1}, "tool:a": {"per_day": 1}})
    assert run(led, ["sidecar:s", "tool:a"], [0]) == [None]
    r = led.admit(["sidecar:s", "tool:a"], 1000, DAY0 + 1000)
    assert r.rule == "callsPerDay" and r.retry_after_ms == DAY_MS - 1000


@pytest.mark.parametrize(
    ("limit", "walls", "expected"),
    [
        (2, [0, 1, 2], [None, None, ("callsPerDay", DAY_MS - 2)]),
        # A new UTC day resets the count.
        (1, [DAY_MS - 1, DAY_MS], [None, None]),
        (1, [5, DAY_MS - 5], [None, ("callsPerDay", 5)]),
    ],
)
def test_calls_per_day_counts_per_utc_day(limit, walls, expected):
    led = ledger(**{"tool:t": {"per_day": limit}})
    out = []
    for i, w in enumerate(walls):
        r = led.admit(["tool:t"], float(i), DAY0 + w)
        out.append(None if r is None else (r.rule, r.retry_after_ms))
    assert out == expected


def test_day_counts_survive_a_restart_only_on_the_same_day():
    led = ledger(**{"tool:t": {"per_day": 3}, "sidecar:s": {"per_minute": 9}})
    run(led, ["tool:t", "sidecar:s"], [0, 1])
    assert led.day_dirty
    day, counts = led.day_counts(DAY0 + 5)
    assert not led.day_dirty
    assert counts == {"tool:t": 2}  # only daily quotas are saved
    again = ledger(**{"tool:t": {"per_day": 3}})
    again.restore_day(day, counts, DAY0 + 1000)
    assert again.admit(["tool:t"], 0, DAY0 + 1000) is None
    assert again.admit(["tool:t"], 1, DAY0 + 1001).rule == "callsPerDay"
    tomorrow = ledger(**{"tool:t": {"per_day": 3}})
    tomorrow.restore_day(day, counts, DAY0 + DAY_MS)
    assert run(tomorrow, ["tool:t"], [0, 1, 2], wall=DAY0 + DAY_MS) == [None, None, None]


def test_max_concurrent_frees_on_release():
    led = ledger(**{"tool:t": {"concurrent": 2}})
    assert led.admit(["tool:t"], 0, DAY0) is None
    assert led.admit(["tool:t"], 0, DAY0) is None
    r = led.admit(["tool:t"], 0, DAY0, busy_retry_ms=37)
    assert (r.rule, r.limit, r.retry_after_ms) == ("maxConcurrent", 2, 37)
    assert led.blocked_ms("tool:t", 0, DAY0) == 0  # never a window: never flips the catalog
    led.release(["tool:t"])
    assert led.admit(["tool:t"], 0, DAY0) is None


@pytest.mark.parametrize(
    ("limits", "calls", "blocked_at", "expected"),
    [
        ({"per_minute": 2}, [0, 1000], 1000, 59_000),
        ({"per_minute": 2}, [0], 1000, 0),
        ({"per_minute": 2}, [0, 1000], 60_000, 0),
        ({"per_day": 1}, [0], 500, DAY_MS - 500),
        ({"concurrent": 1}, [0], 10, 0),
    ],
)
def test_blocked_ms(limits, calls, blocked_at, expected):
    led = ledger(**{"k": limits})
    run(led, ["k"], calls)
    assert led.blocked_ms("k", blocked_at, DAY0 + blocked_at) == expected


def test_keys_without_quota_are_free_and_unknown():
    led = ledger(**{"a": {}, "b": {"per_minute": 1}})
    assert "a" not in led and "b" in led
    assert led.admit(["a", "zzz"], 0, DAY0) is None
    assert led.blocked_ms("zzz", 0, DAY0) == 0 and led.usage("zzz", 0, DAY0) == {}


def test_reconfigure_keeps_counts_and_reshapes_the_window():
    led = ledger(**{"k": {"per_minute": 3}})
    run(led, ["k"], [0, 1, 2])
    led.configure({"k": Limits(per_minute=2)})
    assert led.admit(["k"], 3, DAY0).retry_after_ms == 1 + 60_000 - 3  # kept the newest two
    led.configure({"k": Limits(per_minute=5)})
    assert run(led, ["k"], [4, 5, 6]) == [None, None, None]
    assert led.admit(["k"], 7, DAY0).rule == "callsPerMinute"
    led.configure({})
    assert led.admit(["k"], 8, DAY0) is None
