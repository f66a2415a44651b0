"""The outputs of a run: the printed tables, the JSON record and the optional CDF plot."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from bench.stats import Results, Row, Target

SCHEMA = "toolhost-bench/1"


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100_000:
        return f"{v / 1000:.0f}ms"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _num(v: float | None, fmt: str = "{:.0f}") -> str:
    if v is None or (isinstance(v, float) and math.isinf(v)):
        return "-" if v is None else "inf"
    return fmt.format(v)


def _met(t: Target | None) -> str:
    if t is None:
        return ""
    return {True: "yes", False: "NO", None: "?"}[t.met]


def _ratio(r: Row) -> str:
    if r.ratio is None:
        return "-"
    return f"{r.ratio:.2f}x" if r.ratio < 100 else f"{r.ratio:.0f}x"


def print_tables(results: Results, out: TextIO) -> None:
    """The row table, the figure table and the target summary."""
    head = (
        f"{'scenario':10} {'row':44} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} "
        f"{'calls/s':>8} {'cpu/call':>8} {'ratio':>7}  {'vs':26} {'target':46} met"
    )
    print(
        "latency in µs; cpu/call = host CPU µs per call; ratio = p50 / baseline p50 "
        "(rate rows: baseline calls/s / calls/s)",
        file=out,
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in results.rows:
        st = r.stats
        extra = ""
        if r.target is not None and r.target_on != "ratio":
            extra = f" ({r.target_on}={_num(r.extra.get(r.target_on), '{:.2f}')})"
        print(
            f"{r.scenario:10} {r.name[:44]:44} "
            f"{_us(st.p50 if st else None):>7} {_us(st.p90 if st else None):>7} "
            f"{_us(st.p99 if st else None):>7} {_us(st.max if st else None):>7} "
            f"{_num(r.rate):>8} {_num(r.extra.get('hostCpuUsPerCall'), '{:.1f}'):>8} "
            f"{_ratio(r):>7}  {(r.baseline or '')[:26]:26} "
            f"{((r.target.label if r.target else '') + extra)[:46]:46} {_met(r.target)}",
            file=out,
        )
    if results.figures:
        print(file=out)
        head = f"{'scenario':10} {'figure':52} {'value':>10} {'unit':5} {'target':30} met  note"
        print(head, file=out)
        print("-" * len(head), file=out)
        for f in results.figures:
            print(
                f"{f.scenario:10} {f.name[:52]:52} {_num(f.value, '{:.1f}'):>10} {f.unit:5} "
                f"{(f.target.label if f.target else '')[:30]:30} {_met(f.target):4} {f.note}",
                file=out,
            )
    targets = results.targets()
    if targets:
        print(file=out)
        print("targets (how far = value / limit)", file=out)
        for name, t in targets:
            print(
                f"  {_met(t):4} {name[:48]:48} {t.label:48} value {_num(t.value, '{:.2f}'):>9} "
                f"limit {t.limit:g}, how far {_num(t.how_far, '{:.2f}')}",
                file=out,
            )
    for note in results.notes:
        print(f"note: {note}", file=out)
    for key, why in results.errors.items():
        print(f"ERROR in {key}: {why}", file=out)


def record(
    results: Results,
    *,
    scenarios: list[str],
    all_scenarios: list[str],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """The JSON record: machine, commit, settings, every figure, the targets and whether met."""
    by_scenario: dict[str, Any] = {}
    for key in all_scenarios:
        by_scenario[key] = {
            "ran": key in scenarios and key not in results.errors,
            "error": results.errors.get(key),
            "rows": [r.to_json() for r in results.rows if r.scenario == key],
            "figures": [f.to_json() for f in results.figures if f.scenario == key],
        }
    return {
        "schema": SCHEMA,
        **meta,
        "scenarios": by_scenario,
        "targets": [{"of": name, **asdict(t)} for name, t in results.targets()],
        "notes": results.notes,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")


def sanitize(obj: Any) -> Any:
    """Replace inf/nan (a recovery that never came back) by None, for strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitize(v) for v in obj]
    return obj


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


PLOT_GROUPS = (
    ("one call in flight (64 B)", ("floors", "e2e")),
    ("throughput (per-call latency)", ("throughput",)),
    ("foreign baselines (64 B)", ("foreign",)),
    ("payload scaling", ("payload",)),
)


def plot(results: Results, path: Path) -> None:
    """Latency CDFs, one panel per scenario family, log-scaled time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [
        (title, [r for r in results.rows if r.scenario in keys and r.samples])
        for title, keys in PLOT_GROUPS
    ]
    groups = [(t, rows) for t, rows in groups if rows]
    if not groups:
        return
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 3.6 * len(groups)), squeeze=False)
    for ax, (title, rows) in zip(axes[:, 0], groups):
        for r in rows:
            xs = sorted(s * 1e6 for s in r.samples)
            n = len(xs)
            ax.plot(xs, [(i + 1) / n for i in range(n)], label=r.name, linewidth=1.2)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel("latency (µs)")
        ax.set_ylabel("fraction of calls")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
