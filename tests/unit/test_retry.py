"""Per-tool retry policy: readOnly tools only; worker-crashed only; maxAttempts."""

import pytest

from supervisor.contracts.manifest import RetryConfig, ToolManifest
from supervisor.policy.retry import max_attempts, retry_delay_ms


def manifest(read_only=True, retry=(3, 50)):
    return ToolManifest(
        name="t",
        read_only=read_only,
        retry=RetryConfig(max_attempts=retry[0], backoff_ms=retry[1]) if retry else None,
    )


@pytest.mark.parametrize(
    ("m", "code", "attempt", "delay"),
    [
        (manifest(), "worker-crashed", 1, 50),
        (manifest(), "worker-crashed", 2, 50),
        (manifest(), "worker-crashed", 3, None),  # out of attempts
        (manifest(), "timeout", 1, None),  # the call's one deadline is spent
        (manifest(), None, 1, None),  # success
        (manifest(), "failed", 1, None),  # the tool's own answer
        (manifest(), "protocol-error", 1, None),
        (manifest(), "overloaded", 1, None),
        (manifest(read_only=False), "worker-crashed", 1, None),
        (manifest(retry=None), "worker-crashed", 1, None),
        (manifest(retry=(1, 0)), "worker-crashed", 1, None),
        (None, "worker-crashed", 1, None),
    ],
)
def test_retry_delay(m, code, attempt, delay):
    assert retry_delay_ms(m, code, attempt) == delay


def test_max_attempts():
    assert max_attempts(manifest()) == 3
    assert max_attempts(manifest(read_only=False)) == 1
    assert max_attempts(None) == 1
