"""Restart decisions with a fake clock (milliseconds) and a seeded generator."""

import random

import pytest

from supervisor.contracts.registry import RestartConfig
from supervisor.policy.restart import RestartState, backoff_ceiling, on_exit, on_stable


def cfg(**kw):
    base = dict(
        policy="always",
        backoff_ms=100,
        max_backoff_ms=1000,
        intensity=3,
        period_ms=10_000,
        reset_after_ms=5_000,
    )
    base.update(kw)
    return RestartConfig(**base)


@pytest.mark.parametrize(
    ("attempts", "ceiling"),
    [(0, 100), (1, 200), (2, 400), (3, 800), (4, 1000), (50, 1000), (10_000, 1000)],
)
def test_backoff_ceiling_doubles_and_caps(attempts, ceiling):
    assert backoff_ceiling(cfg(), attempts) == ceiling


def test_full_jitter_stays_within_ceiling_and_varies():
    rng = random.Random(7)
    delays = []
    state = RestartState()
    c = cfg(intensity=100)
    for i in range(6):
        d, state = on_exit(c, state, now=i * 10.0, uptime_ms=1, clean=False, rng=rng)
        assert d.action == "restart"
        assert 0 <= d.delay_ms <= backoff_ceiling(c, i)
        delays.append(d.delay_ms)
    assert len(set(delays)) == len(delays)
    assert state.attempts == 6 and state.total == 6


def test_same_seed_same_decisions():
    def run(seed):
        rng, state, out = random.Random(seed), RestartState(), []
        for i in range(4):
            d, state = on_exit(cfg(), state, now=i, uptime_ms=0, clean=False, rng=rng)
            out.append(d)
        return out

    assert run(3) == run(3)


@pytest.mark.parametrize(
    ("policy", "clean", "action"),
    [
        ("always", True, "restart"),
        ("always", False, "restart"),
        ("on-failure", True, "stop"),
        ("on-failure", False, "restart"),
        ("never", False, "stop"),
        ("never", True, "stop"),
    ],
)
def test_policy_table(policy, clean, action):
    d, _ = on_exit(
        cfg(policy=policy), RestartState(), now=0, uptime_ms=0, clean=clean, rng=random.Random(1)
    )
    assert d.action == action


def test_intensity_limit_gives_up_then_retries_slowly():
    c = cfg(intensity=3, period_ms=10_000, max_backoff_ms=1000)
    rng, state = random.Random(1), RestartState()
    actions = []
    for t in (0, 100, 200, 300):
        d, state = on_exit(c, state, now=t, uptime_ms=50, clean=False, rng=rng)
        actions.append(d.action)
    assert actions == ["restart", "restart", "restart", "give-up"]
    assert state.failed
    assert d.delay_ms == 1000  # retried only at the slowest pace
    assert "intensity 3" in d.reason


def test_failures_outside_the_period_do_not_count():
    c = cfg(intensity=2, period_ms=1000)
    rng, state = random.Random(1), RestartState()
    for t in (0, 600, 1200, 1800, 2400):  # never more than 2 within any 1000 ms
        d, state = on_exit(c, state, now=t, uptime_ms=10, clean=False, rng=rng)
        assert d.action == "restart", t
    assert not state.failed


def test_stable_uptime_resets_backoff():
    c = cfg(reset_after_ms=5000, intensity=100)
    rng, state = random.Random(1), RestartState()
    for t in range(5):
        _, state = on_exit(c, state, now=t, uptime_ms=10, clean=False, rng=rng)
    assert state.attempts == 5
    d, state = on_exit(c, state, now=100, uptime_ms=6000, clean=False, rng=rng)
    assert d.delay_ms <= backoff_ceiling(c, 0)
    assert state.attempts == 1


def test_on_stable_clears_failure():
    state = RestartState(attempts=4, history=(1.0, 2.0), failed=True, total=9)
    cleared = on_stable(cfg(), state)
    assert cleared == RestartState(attempts=0, history=(), failed=False, total=9)
    assert on_stable(cfg(), cleared) is cleared
