"""The sampling decision, made before any span object exists (so an unsampled call is cheap).

# Strategy: the standard samplers named by ``OTEL_TRACES_SAMPLER`` (``always_on``,
# ``always_off``, ``traceidratio`` and their ``parentbased_`` forms, the default being
# ``parentbased_always_on``) are decided here, with the same rules as the SDK's samplers: a
# parent-based sampler follows the parent's sampled flag, a root is sampled always, never, or
# when the low 64 bits of its trace id fall under ``ratio * 2**64``. A sampled call then gets a
# real span from the SDK (whose own sampler is set to always-on, the decision being taken); an
# unsampled one gets only ids, enough to propagate a ``traceparent`` with the sampled flag off
# so every downstream process drops it too. Any other sampler (``jaeger_remote``, an entry
# point) is left to the SDK for every span: then :attr:`Sampling.fast` is False.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping

TRACE_ID_LIMIT = (1 << 64) - 1
FAST = {
    "always_on": (False, "on"),
    "always_off": (False, "off"),
    "traceidratio": (False, "ratio"),
    "parentbased_always_on": (True, "on"),
    "parentbased_always_off": (True, "off"),
    "parentbased_traceidratio": (True, "ratio"),
}


class Sampling:
    """The decision rule of ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``.

    Args:
        environ: Where to read the two variables (the process environment by default).
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        name = (env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower()
        rule = FAST.get(name)
        self.name = name
        self.fast = rule is not None
        self.parent_based, self.root = rule if rule is not None else (True, "on")
        ratio = 1.0
        if self.root == "ratio":
            try:
                ratio = float(env.get("OTEL_TRACES_SAMPLER_ARG") or "1.0")
            except ValueError:
                ratio = 1.0
            ratio = min(1.0, max(0.0, ratio))
        self.ratio = ratio
        self.bound = round(ratio * (TRACE_ID_LIMIT + 1))

    def decide(self, trace_id: int, parent_sampled: bool | None) -> bool:
        """Sample a span of ``trace_id`` whose parent is sampled / not / absent (None)?"""
        if parent_sampled is not None and self.parent_based:
            return parent_sampled
        root = self.root
        if root == "on":
            return True
        if root == "off":
            return False
        return trace_id & TRACE_ID_LIMIT < self.bound


def new_trace_id() -> int:
    """A random, valid W3C trace id."""
    return random.getrandbits(128) or 1


def new_span_id() -> int:
    """A random, valid W3C span id."""
    return random.getrandbits(64) or 1


def unsampled_traceparent(trace_id: int) -> str:
    """A ``traceparent`` in ``trace_id`` with a fresh span id and the sampled flag off."""
    return f"00-{trace_id:032x}-{new_span_id():016x}-00"


def parse_traceparent(value: str) -> tuple[int, int, bool] | None:
    """``(trace_id, span_id, sampled)`` of a version-00 W3C ``traceparent``; None if invalid
    (W3C: an invalid header is ignored and the span starts a new trace)."""
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    if len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    if parts[0] == "00" and len(parts) != 4:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
        int(parts[0], 16)
    except ValueError:
        return None
    if parts[1] != parts[1].lower() or parts[2] != parts[2].lower():
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(flags & 1)
