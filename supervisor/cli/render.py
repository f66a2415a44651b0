"""Plain-text rendering for the CLI: aligned tables and short state words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from supervisor.contracts.rpc import Catalog
from supervisor.contracts.snapshot import Descriptor, WorkerStatus, ZygoteStatus


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned by the widest cell; the last column is not padded."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [c.ljust(widths[i]) if i < len(row) - 1 else c for i, c in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def reason_text(d: Descriptor, *, with_hint: bool = True) -> str:
    reasons = d.stability.reasons
    if not reasons:
        return ""
    r = reasons[0]
    text = f"{r.code}: {r.message}"
    if with_hint and r.hint:
        text += f" (hint: {r.hint})"
    if len(reasons) > 1:
        text += f" [+{len(reasons) - 1} more]"
    return text


def status_text(cat: Catalog) -> str:
    """The ``toolhost status`` screen."""
    side_rows = []
    for s in cat.sidecars:
        # A worker with no process now (a oneshot or per-call sidecar between calls): "-".
        workers = ",".join(str(w.pid) if w.pid else "-" for w in s.workers) or "-"
        starts = ",".join(_start_text(w) for w in s.workers) or "-"
        side_rows.append(
            [
                s.id,
                s.runtime,
                str(len(s.workers)),
                workers,
                starts,
                str(s.restarts),
                str(s.queued),
                s.confinement or "-",
                (s.lastExitReason or "") if s.runtime != "ready" else "",
            ]
        )
    tool_rows = []
    for d in cat.tools:
        tool_rows.append(
            [
                d.name,
                d.stability.effective,
                "yes" if d.visible else "no",
                d.sidecar or "-",
                reason_text(d, with_hint=False),
            ]
        )
    parts = [f"catalog revision {cat.revision}"]
    if cat.registry.errors:
        parts.append("registry problems:\n" + "\n".join(f"  - {e}" for e in cat.registry.errors))
    parts.append(
        table(
            [
                "SIDECAR",
                "STATE",
                "WORKERS",
                "PIDS",
                "STARTED",
                "RESTARTS",
                "QUEUED",
                "CONFINED",
                "LAST EXIT",
            ],
            side_rows,
        )
        if side_rows
        else "no sidecars configured"
    )
    parts.append(table(["TOOL", "EFFECTIVE", "VISIBLE", "SIDECAR", "REASON"], tool_rows))
    shadowed = [line for s in cat.sidecars for line in shadowed_lines(s.id, s.shadowed)]
    if shadowed:
        parts.append("\n".join(shadowed))
    parts.append(zygote_text(cat.zygote))
    return "\n\n".join(parts)


def shadowed_lines(sidecar: str, rows: Sequence[dict[str, str]]) -> list[str]:
    """One line per entry of an MCP sidecar another sidecar owns (first in registry wins)."""
    return [
        f"shadowed: {r.get('kind')} {r.get('name')} of {sidecar} (owned by {r.get('shadowedBy')})"
        for r in rows
    ]


def _start_text(w: WorkerStatus) -> str:
    """``zygote 4ms``: how a worker started and how long it took to be ready."""
    return w.startedBy + (f" {w.startMs:.0f}ms" if w.startMs is not None else "")


def zygote_text(z: ZygoteStatus | None) -> str:
    """One line about the host's zygote (docs/zygote.md)."""
    if z is None:
        return "zygote: off (every worker is exec'd)"
    if z.state != "ready":
        return f"zygote: {z.state}" + (f" ({z.reason})" if z.reason else "")
    rss = f", {z.rssBytes / 1048576:.1f} MiB RSS" if z.rssBytes else ""
    text = f"zygote: ready, pid {z.pid}{rss}, {z.forks} forks, {z.fallbacks} fallbacks"
    if z.restarts:
        text += f", {z.restarts} restarts"
    if z.preloadFailed:
        text += f"; preload failed: {', '.join(z.preloadFailed)}"
    return text


def catalog_text(cat: Catalog) -> str:
    """Every descriptor with its nine fields' verdict, reasons and hints."""
    blocks = []
    for d in cat.tools:
        st = d.stability
        head = f"{d.name}  [{st.effective}{'' if d.visible else ', hidden'}]"
        head += f"  sidecar={d.sidecar or '-'}  protocol={d.protocol or '-'}"
        lines = [head]
        if d.description:
            lines.append(f"    {d.description.splitlines()[0][:100]}")
        for r in st.reasons:
            lines.append(f"    {r.field}: {r.code}: {r.message}")
            if r.hint:
                lines.append(f"      hint: {r.hint}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks) or "no tools known"


def _mb(n: Any) -> str:
    return f"{(n or 0) / 1048576:.1f}"


def _egress(e: dict[str, Any] | None) -> str:
    """A sidecar's bytes through the egress proxy, in/out (``-``: none)."""
    if not e:
        return "-"
    text = f"{e.get('bytesIn', 0)}/{e.get('bytesOut', 0)}"
    return text + (f" ({e['refused']} refused)" if e.get("refused") else "")


def _latency(row: dict[str, Any]) -> list[str]:
    lat = row.get("latency") or {}
    return [f"{lat.get('p50', 0):.1f}", f"{lat.get('p99', 0):.1f}"]


def stats_text(data: dict[str, Any]) -> str:
    """The ``toolhost stats`` screen: one table of sidecars, one of tools (ms, s, MB)."""
    rows = []
    for sid, s in sorted(data.get("sidecars", {}).items()):
        exits = ",".join(f"{k}:{v}" for k, v in sorted((s.get("exits") or {}).items()))
        rows.append(
            [
                sid,
                str(s.get("calls", 0)),
                str(s.get("success", 0)),
                str(s.get("failed", 0)),
                str(s.get("unavailable", 0)),
                str(s.get("timeouts", 0)),
                *_latency(s),
                f"{s.get('cpuSeconds', 0):.2f}",
                _mb(s.get("rssBytes")),
                _mb(s.get("peakRssBytes")),
                str(s.get("workers", 0)),
                str(s.get("queued", 0)),
                str(s.get("restarts", 0)),
                _egress(s.get("egress")),
                exits or "-",
            ]
        )
    parts = [
        table(
            [
                "SIDECAR",
                "CALLS",
                "OK",
                "FAILED",
                "UNAVAIL",
                "TIMEOUTS",
                "P50MS",
                "P99MS",
                "CPU_S",
                "RSS_MB",
                "PEAK_MB",
                "WORKERS",
                "QUEUED",
                "RESTARTS",
                "EGRESS_IN/OUT",
                "EXITS",
            ],
            rows,
        )
    ]
    tool_rows = []
    for name, t in sorted(data.get("tools", {}).items()):
        tool_rows.append(
            [
                name,
                t.get("sidecar") or "-",
                str(t.get("calls", 0)),
                str(t.get("success", 0)),
                str(t.get("failed", 0)),
                str(t.get("unavailable", 0)),
                *_latency(t),
                f"{(t.get('latency') or {}).get('max', 0):.1f}",
                f"{t.get('cpuSeconds', 0):.3f}",
                str(t.get("bytesIn", 0)),
                str(t.get("bytesOut", 0)),
                "quota-limited" if t.get("limited") else "",
            ]
        )
    if tool_rows:
        headers = ["TOOL", "SIDECAR", "CALLS", "OK", "FAILED", "UNAVAIL", "P50MS", "P99MS"]
        headers += ["MAXMS", "CPU_S", "BYTES_IN", "BYTES_OUT", "NOW"]
        parts.append(table(headers, tool_rows))
    return "\n\n".join(parts)


def reload_text(result: dict[str, Any]) -> str:
    if not result.get("applied"):
        return "registry NOT reloaded; the running one is kept:\n" + "\n".join(
            f"  - {e}" for e in result.get("errors", [])
        )
    lines = [f"registry reloaded (catalog revision {result.get('revision')})"]
    for key in ("added", "removed", "restarted", "unchanged"):
        if result.get(key):
            lines.append(f"  {key}: {', '.join(result[key])}")
    for e in result.get("errors", []):
        lines.append(f"  problem: {e}")
    if result.get("needsRestart"):
        lines.append(
            f"  needs a restart of toolhost: {', '.join(result['needsRestart'])} changed; "
            "the running host keeps the old value"
        )
    return "\n".join(lines)
