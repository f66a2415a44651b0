"""Restart decisions: exponential backoff with full jitter, a cap, reset after stable uptime,
and an intensity limit after which the sidecar is failed and retried only slowly.

# Strategy: the pool's keeper (``pools/keeper.py``) keeps one :class:`RestartState` per sidecar
# and asks :func:`on_exit` what to do whenever a worker ends for a reason that is the worker's
# fault. Time is passed in (ms), and the jitter draws from a generator the caller seeds, so
# every decision is reproducible.
"""

from __future__ import annotations

import random
from typing import Literal

from msgspec import Struct, structs

from supervisor.contracts.registry import RestartConfig

Action = Literal["restart", "stop", "give-up"]


class RestartState(Struct, frozen=True, kw_only=True):
    """What the policy remembers about one sidecar."""

    attempts: int = 0
    """Consecutive failures since the last stable run: the backoff exponent."""
    history: tuple[float, ...] = ()
    """Times (ms) of failures inside the intensity period."""
    failed: bool = False
    """The intensity limit was passed: the sidecar is ``runtime: failed``."""
    total: int = 0
    """All restarts ever, for the snapshot's ``details.restarts``."""


class Decision(Struct, frozen=True, kw_only=True):
    action: Action
    delay_ms: float = 0.0
    reason: str = ""


def backoff_ceiling(cfg: RestartConfig, attempts: int) -> float:
    """The upper bound of the jittered delay after ``attempts`` consecutive failures."""
    if cfg.backoff_ms <= 0:
        return 0.0
    exp = min(attempts, 62)
    return float(min(cfg.max_backoff_ms, cfg.backoff_ms * (2**exp)))


def on_exit(
    cfg: RestartConfig,
    state: RestartState,
    *,
    now: float,
    uptime_ms: float,
    clean: bool,
    rng: random.Random,
) -> tuple[Decision, RestartState]:
    """Decide what follows a worker's unexpected end.

    Args:
        cfg: The sidecar's restart section.
        state: The state after the previous decision.
        now: Current time in milliseconds (any monotonic origin).
        uptime_ms: How long the worker that ended had been running.
        clean: True when it exited with status 0 on its own.
        rng: Seeded generator for the jitter.

    Returns:
        The decision and the new state.
    """
    if cfg.policy == "never" or (cfg.policy == "on-failure" and clean):
        why = "restart policy is never" if cfg.policy == "never" else "exited cleanly"
        return Decision(action="stop", reason=why), state
    attempts = 0 if uptime_ms >= cfg.reset_after_ms > 0 else state.attempts
    history = (*(t for t in state.history if now - t < cfg.period_ms), now)
    total = state.total + 1
    if len(history) > cfg.intensity:
        # Past the intensity limit: failed, and retried only at the slowest pace.
        delay = float(max(cfg.max_backoff_ms, cfg.backoff_ms))
        new = RestartState(attempts=attempts + 1, history=history, failed=True, total=total)
        return (
            Decision(
                action="give-up",
                delay_ms=delay,
                reason=f"{len(history)} restarts within {cfg.period_ms} ms "
                f"(intensity {cfg.intensity})",
            ),
            new,
        )
    delay = rng.uniform(0.0, backoff_ceiling(cfg, attempts))
    new = RestartState(attempts=attempts + 1, history=history, failed=state.failed, total=total)
    return Decision(action="restart", delay_ms=delay, reason="worker ended"), new


def on_stable(cfg: RestartConfig, state: RestartState) -> RestartState:
    """A worker has run ``resetAfterMs`` without trouble: forget the backoff and the failure."""
    if state.attempts == 0 and not state.failed and not state.history:
        return state
    return structs.replace(state, attempts=0, failed=False, history=())
