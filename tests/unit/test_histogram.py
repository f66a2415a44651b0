"""The latency histogram: log buckets, quantiles within one bucket (19 %), exact max."""

import random

import pytest

from supervisor.policy.histogram import BUCKETS, Histogram, upper_bound


def test_empty():
    h = Histogram()
    assert (h.count, h.quantile(0.5), h.max) == (0, 0.0, 0.0)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quantiles_within_one_bucket_of_exact(q, seed):
    rng = random.Random(seed)
    values = [rng.lognormvariate(0, 2) for _ in range(5000)]  # ms, over many decades
    h = Histogram()
    for v in values:
        h.record(v)
    exact = sorted(values)[max(0, int(q * len(values) + 0.999999) - 1)]
    got = h.quantile(q)
    assert exact <= got <= exact * 2**0.25 * 1.000001
    assert h.max == max(values) and h.count == 5000
    assert h.total == pytest.approx(sum(values))


@pytest.mark.parametrize(
    ("value", "index"),
    [(0.0, 0), (0.01, 0), (0.0101, 1), (0.02, 4), (0.04, 8), (1.0, 27), (10**9, BUCKETS - 1)],
)
def test_bucket_edges(value, index):
    h = Histogram()
    h.record(value)
    assert h.buckets[index] == 1
    assert value <= upper_bound(index)


def test_never_reports_above_max_and_cumulative_counts():
    h = Histogram()
    for v in (1.0, 1.0, 3.0, 100.0):
        h.record(v)
    assert h.quantile(1.0) == 100.0 and 1.0 <= h.quantile(0.5) <= 1.19
    assert list(h.cumulative([0.5, 1.28, 10.24, 1e9])) == [
        (0.5, 0),
        (1.28, 2),
        (10.24, 3),
        (1e9, 4),
    ]
    other = Histogram()
    other.record(1000.0)
    h.merge(other)
    assert h.count == 5 and h.max == 1000.0
