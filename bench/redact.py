"""What masking vault values costs (issue 30): ``supervisor/policy/redact.py`` against the
value-only redactor it replaced, timed in the same process, round after round.

The baseline (:class:`ValueOnly`) is a faithful copy of the redactor at commit ``a3afa21``: each
value as written and JSON-escaped, one ``str.replace`` pass per form that occurs. The current
redactor also masks percent-encoded, base64 (inside longer base64 too) and hex forms.

Inputs are JSON texts such as an envelope's ``content`` or ``data`` carries (records with prose,
URLs, ids, timestamps, hex digests, UUIDs and a base64 blob), of 4 KiB and 64 KiB, with 10
realistic secrets registered (API keys, tokens, passwords with JSON and URL specials) of which
0, 1 or 10 occur as written; one case registers 60; one times ``blob`` on bytes; one puts the
10 secrets in encoded forms (the baseline masks none of those: its time is a reference only).

Each round times both redactors on the same input, in alternating order, over enough calls to
last ~10 ms each; a case's figure is the median per-call time over the rounds and its ratio the
median of the rounds' ratios (new / baseline). CPU time of this process (``time.process_time``)
is used, steadier than wall time on a shared machine. Run:
``python -m bench.redact [--rounds R] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import random
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from bench.machine import REPO, git_info, machine_info
from supervisor.policy.redact import Redactor

MASK = "***"
MIN_SECRET = 4


class ValueOnly:
    """The value-only redactor of commit a3afa21 (text and blob paths), kept as the baseline."""

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._blobs: list[bytes] = []

    def add(self, value: str) -> None:
        if len(value) < MIN_SECRET or value in self._texts:
            return
        forms = {value, msgspec.json.encode(value).decode()[1:-1]}
        for form in sorted(forms, key=len, reverse=True):
            if form not in self._texts:
                self._texts.append(form)
                self._blobs.append(form.encode())
        order = sorted(range(len(self._texts)), key=lambda i: -len(self._texts[i]))
        self._texts = [self._texts[i] for i in order]
        self._blobs = [self._blobs[i] for i in order]

    def text(self, s: str) -> str:
        for secret in self._texts:
            if secret in s:
                s = s.replace(secret, MASK)
        return s

    def blob(self, b: bytes) -> bytes:
        for secret in self._blobs:
            if secret in b:
                b = b.replace(secret, MASK.encode())
        return b


_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "that",
    "it",
    "was",
    "be",
    "are",
    "have",
    "not",
    "result",
    "status",
    "request",
    "response",
    "page",
    "item",
    "user",
    "account",
    "order",
    "invoice",
    "payment",
    "customer",
    "created",
    "updated",
    "deleted",
    "pending",
    "completed",
    "failed",
    "retry",
    "timeout",
    "server",
    "client",
    "error",
    "warning",
    "note",
    "description",
    "summary",
    "title",
    "value",
    "count",
    "total",
    "amount",
    "currency",
    "region",
    "zone",
    "cluster",
    "node",
]


def secrets(n: int, rng: random.Random) -> list[str]:
    """``n`` values shaped like real vault entries; the first ten are fixed kinds."""

    def pick(alphabet: str, k: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(k))

    kinds: list[Callable[[], str]] = [
        lambda: "sk_live_" + pick(_ALNUM, 24),  # Stripe-like key
        lambda: "ghp_" + pick(_ALNUM, 36),  # GitHub token
        lambda: f"xoxb-{pick('0123456789', 11)}-{pick('0123456789', 13)}-{pick(_ALNUM, 24)}",
        lambda: pick(_ALNUM + "+/", 40),  # AWS-like secret key
        lambda: "AKIA" + pick("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16),
        lambda: pick("0123456789abcdef", 32),  # a hex API key
        lambda: "correct horse battery " + pick("abcdefghijklmnop", 6),  # passphrase
        lambda: 'p@ss/w0rd+"' + pick(_ALNUM, 6) + '"\\é',  # JSON and URL specials
        lambda: pick(_ALNUM, 8) + "-" + pick(_ALNUM, 8),  # a short password
        lambda: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiI" + pick(_ALNUM, 20) + "." + pick(_ALNUM, 16),
    ]
    return [kinds[i % len(kinds)]() for i in range(n)]


def envelope_text(size: int, rng: random.Random) -> str:
    """A JSON text of about ``size`` characters shaped like a tool's result."""

    def prose(k: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(k)).capitalize() + "."

    records: list[dict[str, Any]] = []
    blob = base64.b64encode(rng.randbytes(min(768, size // 16))).decode()
    out = ""
    while len(out) < size:
        i = len(records)
        records.append(
            {
                "id": f"{rng.getrandbits(128):032x}"[:8] + f"-{i:04d}-4abc-9def-{i:012d}",
                "title": prose(4),
                "url": f"https://api.example.com/v2/orders/{rng.randrange(10**7)}?page={i}"
                f"&sort=created&q={urllib.parse.quote(prose(2))}",
                "sha256": f"{rng.getrandbits(256):064x}",
                "created": f"2025-0{1 + i % 9}-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:05Z",
                "amount": round(rng.random() * 1000, 2),
                "note": prose(14),
                "tags": [rng.choice(_WORDS) for _ in range(3)],
            }
        )
        if i == 3:
            records[-1]["thumbnail"] = blob
        out = json.dumps({"status": "succeeded", "items": records})
    return out[:size]


def plant(text: str, forms: list[str], rng: random.Random) -> str:
    """``text`` with each form inserted (JSON-escaped, as a tool's JSON output holds it) at a
    random place between two characters of prose."""
    spots = sorted(rng.sample(range(len(text) // 20, len(text) - 20), len(forms)))
    parts = []
    last = 0
    for spot, form in zip(spots, forms, strict=True):
        parts.append(text[last:spot])
        parts.append(" " + msgspec.json.encode(form).decode()[1:-1] + " ")
        last = spot
    parts.append(text[last:])
    return "".join(parts)


def encoded(value: str, i: int) -> str:
    raw = value.encode()
    forms = [
        lambda: urllib.parse.quote(value, safe=""),
        lambda: base64.b64encode(raw).decode(),
        lambda: base64.urlsafe_b64encode(raw).decode().rstrip("="),
        lambda: raw.hex(),
        lambda: "Basic " + base64.b64encode(b"user:" + raw).decode(),
    ]
    return forms[i % len(forms)]()


def time_calls(fn: Callable[[], object], calls: int) -> float:
    """CPU seconds per call of ``fn`` over ``calls`` calls (garbage collection off)."""
    gc.disable()
    try:
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        return (time.process_time() - t0) / calls
    finally:
        gc.enable()


def calibrate(fn: Callable[[], object], target_s: float = 0.01) -> int:
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - t0 >= target_s / 4 or calls >= 1 << 16:
            break
        calls *= 2
    return max(1, calls * 4)


def cases(rng: random.Random) -> list[dict[str, Any]]:
    """Every case: name, registered values, input (str or bytes), and what it shows."""
    ten = secrets(10, rng)
    sixty = ten + secrets(60, rng)[10:]
    texts = {size: envelope_text(size, rng) for size in (4096, 65536)}
    out: list[dict[str, Any]] = []
    for size, text in texts.items():
        kib = size // 1024
        for present in (0, 1, 10):
            planted = plant(text, ten[:present], rng) if present else text
            out.append(
                {
                    "name": f"text {kib} KiB, 10 registered, {present} present",
                    "values": ten,
                    "input": planted,
                }
            )
    big = texts[65536]
    out.append({"name": "text 64 KiB, 60 registered, 0 present", "values": sixty, "input": big})
    out.append(
        {
            "name": "text 64 KiB, 60 registered, 1 present",
            "values": sixty,
            "input": plant(big, [sixty[37]], rng),
        }
    )
    out.append(
        {"name": "bytes 64 KiB, 10 registered, 0 present", "values": ten, "input": big.encode()}
    )
    out.append(
        {
            "name": "bytes 64 KiB, 10 registered, 10 present",
            "values": ten,
            "input": plant(big, ten, rng).encode(),
        }
    )
    out.append(
        {
            "name": "text 64 KiB, 10 registered, 10 present encoded (baseline masks none)",
            "values": ten,
            "input": plant(big, [encoded(v, i) for i, v in enumerate(ten)], rng),
        }
    )
    return out


def run(rounds: int, only: str | None = None) -> dict[str, Any]:
    rng = random.Random(30)
    rows = []
    for case in cases(rng):
        if only and only not in case["name"]:
            continue
        new, old = Redactor(), ValueOnly()
        for v in case["values"]:
            new.add(v)
            old.add(v)
        data = case["input"]
        fn_new: Callable[[], object]
        fn_old: Callable[[], object]
        if isinstance(data, bytes):
            fn_new, fn_old = partial(new.blob, data), partial(old.blob, data)
        else:
            fn_new, fn_old = partial(new.text, data), partial(old.text, data)
        masks_new = str(fn_new()).count(MASK) if isinstance(data, str) else 0
        same = fn_new() == fn_old()
        calls_new, calls_old = calibrate(fn_new), calibrate(fn_old)
        t_new: list[float] = []
        t_old: list[float] = []
        for r in range(rounds):
            if r % 2 == 0:
                t_old.append(time_calls(fn_old, calls_old))
                t_new.append(time_calls(fn_new, calls_new))
            else:
                t_new.append(time_calls(fn_new, calls_new))
                t_old.append(time_calls(fn_old, calls_old))
        ratios = [a / b for a, b in zip(t_new, t_old, strict=True)]
        row = {
            "case": case["name"],
            "inputChars": len(data),
            "registered": len(case["values"]),
            "baselineUs": statistics.median(t_old) * 1e6,
            "newUs": statistics.median(t_new) * 1e6,
            "ratio": statistics.median(ratios),
            "ratioSpread": [min(ratios), max(ratios)],
            "sameOutputAsBaseline": same,
            "masksNew": masks_new,
            "samplesUs": {
                "baseline": [round(x * 1e6, 2) for x in t_old],
                "new": [round(x * 1e6, 2) for x in t_new],
            },
        }
        rows.append(row)
        print(
            f"{row['case']:<72} {row['baselineUs']:>9.1f} {row['newUs']:>9.1f} "
            f"{row['ratio']:>7.2f}x  ({min(ratios):.2f}-{max(ratios):.2f})",
            flush=True,
        )
    return {
        "schema": "toolhost-bench-redact/1",
        "machine": machine_info(),
        "git": git_info(),
        "rounds": rounds,
        "clock": "time.process_time, per call, median over rounds",
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.redact", description=__doc__)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--only", help="run the cases whose name contains this")
    p.add_argument("--out", help="the JSON record (default bench/results/redact-<commit>.json)")
    args = p.parse_args(argv)
    print(f"{'case':<72} {'base us':>9} {'new us':>9} {'ratio':>8}")
    record = run(args.rounds, args.only)
    commit = (record["git"]["commit"] or "unknown")[:7]
    out = Path(args.out) if args.out else REPO / "bench" / "results" / f"redact-{commit}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"record: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
