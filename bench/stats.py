"""Records of a bench run: latency statistics, result rows, plain figures and targets.

# Strategy: every scenario appends :class:`Row` (a latency distribution and/or a rate, with the
# name of the baseline row it is compared to) and :class:`Figure` (one number with a unit, such as
# a cold start in ms) to a :class:`Results`. Ratios and targets are resolved by name once all rows
# exist, so a scenario never needs to know in which order its baselines were measured, and the
# report and the JSON record read the same objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

QUANTILES = tuple(range(0, 101))
"""Percent points kept per row in the JSON record (enough to redraw a CDF)."""


@dataclass
class Stats:
    """A latency distribution in microseconds."""

    n: int
    p50: float
    p90: float
    p99: float
    max: float
    mean: float
    cdf: list[float] = field(default_factory=list)
    """Latency at each percent point 0..100 (µs)."""

    @classmethod
    def of(cls, samples_s: list[float]) -> Stats:
        """Statistics of ``samples_s`` (seconds, at least one)."""
        s = sorted(samples_s)
        n = len(s)
        if n == 0:
            raise ValueError("no samples")

        def at(q: float) -> float:
            return s[min(n - 1, int(q * n))] * 1e6

        return cls(
            n=n,
            p50=at(0.50),
            p90=at(0.90),
            p99=at(0.99),
            max=s[-1] * 1e6,
            mean=sum(s) / n * 1e6,
            cdf=[round(at(q / 100.0), 2) for q in QUANTILES],
        )


Comparison = Literal["le", "ge"]


@dataclass
class Target:
    """A goal from the issue, as a bound on one value of a row or figure.

    ``value <= limit`` (``le``) or ``value >= limit`` (``ge``); ``met`` and ``how_far`` are filled
    in when the value is known (``how_far`` is value / limit).
    """

    label: str
    limit: float
    compare: Comparison = "le"
    value: float | None = None
    met: bool | None = None
    how_far: float | None = None

    def judge(self, value: float | None) -> None:
        """Record ``value`` and whether it meets the bound (None when it could not be measured)."""
        self.value = value
        if value is None:
            self.met = None
            self.how_far = None
            return
        self.met = value <= self.limit if self.compare == "le" else value >= self.limit
        self.how_far = value / self.limit if self.limit else None


@dataclass
class Row:
    """One measured configuration: a latency distribution, a rate, or both.

    Args:
        scenario: Scenario key (``floors``, ``e2e``, ...).
        name: Unique name of the row in the run (``toolhost ndjson``).
        stats: Latency distribution, when per-call latency is meaningful.
        rate: Calls per second over the measured window.
        baseline: Name of the row this one is compared with (``ratio`` = p50 / baseline p50, or
            for rate-only rows baseline rate / rate: always "how many times slower").
        target: The issue's target on the ratio (or on an extra), if any.
        extra: Other figures (host CPU µs per call, MB/s, RSS, ...).
    """

    scenario: str
    name: str
    stats: Stats | None = None
    rate: float | None = None
    baseline: str | None = None
    ratio: float | None = None
    target: Target | None = None
    target_on: str = "ratio"
    """What the target bounds: ``ratio``, or the key of an ``extra`` figure."""
    extra: dict[str, Any] = field(default_factory=dict)
    samples: list[float] = field(default_factory=list, repr=False)
    """Raw latencies in seconds (kept in memory for plots, not written to JSON)."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("samples")
        return out


@dataclass
class Figure:
    """One number that is not a latency distribution (cold start ms, RSS MB, calls failed)."""

    scenario: str
    name: str
    value: float | None
    unit: str
    target: Target | None = None
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Results:
    """Everything a run measured, in order."""

    rows: list[Row] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    """Scenario key -> why it could not run (the run goes on without it)."""

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def figure(self, fig: Figure) -> Figure:
        self.figures.append(fig)
        return fig

    def row(self, name: str) -> Row | None:
        for r in self.rows:
            if r.name == name:
                return r
        return None

    def resolve(self) -> None:
        """Compute every ratio against its baseline and judge every target."""
        for r in self.rows:
            base = self.row(r.baseline) if r.baseline else None
            if base is not None:
                if r.stats is not None and base.stats is not None and base.stats.p50 > 0:
                    r.ratio = r.stats.p50 / base.stats.p50
                elif r.rate and base.rate:
                    r.ratio = base.rate / r.rate
            if r.target is not None:
                value = r.ratio if r.target_on == "ratio" else r.extra.get(r.target_on)
                r.target.judge(value)
        for f in self.figures:
            if f.target is not None:
                f.target.judge(f.value)

    def targets(self) -> list[tuple[str, Target]]:
        """Every target with the name of what it bounds, in report order."""
        out = [(r.name, r.target) for r in self.rows if r.target is not None]
        out += [(f.name, f.target) for f in self.figures if f.target is not None]
        return out


def timed(fn: Callable[[], Any], calls: int, warmup: int) -> list[float]:
    """Run ``fn`` ``warmup`` times, then ``calls`` times; the latencies (s) of the latter."""
    for _ in range(warmup):
        fn()
    out = [0.0] * calls
    clock = time.perf_counter
    for i in range(calls):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def latency_row(
    scenario: str, name: str, samples: list[float], *, baseline: str | None = None, **extra: Any
) -> Row:
    """A row for one-in-flight latencies: stats, and the rate they imply (1 / mean)."""
    stats = Stats.of(samples)
    return Row(
        scenario=scenario,
        name=name,
        stats=stats,
        rate=1e6 / stats.mean if stats.mean else None,
        baseline=baseline,
        extra=dict(extra),
        samples=samples,
    )
