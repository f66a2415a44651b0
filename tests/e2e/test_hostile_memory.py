"""Memory after hostile input, against a real ``toolhost serve`` (issue 12; the full figures come
from ``python -m bench.hostile``, see bench/README.md)."""

import pytest

from bench import hostile


@pytest.mark.slow
def test_a_100_mb_line_is_refused_while_reading_and_its_memory_given_back():
    got = hostile.oversized(line_mb=100, garbage=200)
    assert got["sentMbBeforeRefusal"] <= 17  # refused at maxFrameBytes (16 MiB), not at 100 MB
    assert "frame too large" in got["oversizedAnswer"]
    assert got["garbageLinesRefused"] == 200
    assert got["rssPeakMb"] - got["rssIdleMb"] < 40  # never assembled whole
    # Given back (issue 12 asked for at most 10 MB; issue 26 item 8): the refused frame's
    # buffer is released when it is refused, not when the cyclic collector happens to free the
    # connection (it used to stay, 16 MiB of it, in about one run of three).
    assert got["afterMinusIdleMb"] < 10, got


@pytest.mark.slow
def test_a_connection_flood_is_capped_and_the_bystander_served():
    got = hostile.connections(3000, max_connections=1000)
    assert got["held"] <= 1000 and got["refusedOverloaded"] >= 1900
    assert got["bystanderDuringFlood"] == "success"
