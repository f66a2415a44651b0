"""The bench's recovery figure: the wait of a call queued across a worker restart, counted
from when the replacement was ready, never negative (issue 26, item 18: it printed -3.0 ms)."""

from bench.lifecycle import wait_after_ready


def test_a_queued_call_waits_from_the_later_of_sending_and_ready():
    # Killed at 0; the crash answer at 0.002; the next call sent at 0.003 waits for the
    # replacement (ready at 0.080) and is answered at 0.081. The old figure subtracted the
    # restart from the kill (0.081) from the wait from sending (0.078): -3 ms.
    calls = [(0.001, 0.002), (0.003, 0.081)]
    assert abs(wait_after_ready(calls, 0.080) - 0.001) < 1e-9
    # A call sent after the replacement was ready waits only for itself.
    assert abs(wait_after_ready([(0.090, 0.0905)], 0.080) - 0.0005) < 1e-9
    # Calls that ended on the dying worker do not count; none left is no wait.
    assert wait_after_ready([(0.001, 0.002)], 0.080) == 0.0
    for s, d in [(0.0, 0.2), (0.1, 0.15), (0.05, 0.08)]:
        assert wait_after_ready([(s, d)], 0.08) >= 0.0
