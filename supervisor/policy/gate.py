"""The policy gate in front of every sidecar: visibility, sandbox and approval (pure).

A tool call is answered here, without a worker, when the tool is invisible (the stability
reasons say why; a ``quota-limited`` tool gets a fresh ``retryAfterMs``), ``denied``, or
``approval-required`` without an approval that is granted and names who granted it. Quotas come
after this gate (``supervisor.calls.quotas``), then the pool.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.rpc import Approval
from supervisor.contracts.snapshot import Descriptor
from supervisor.policy import results
from supervisor.policy.quota import Refusal, refusal_details, refusal_message

REFUSAL_CODES = {"denied": "sandbox-denied", "quota-limited": "quota-limited"}


def refuse(
    desc: Descriptor,
    policy: str,
    approval: Approval | None,
    quota: Callable[[], Refusal | None],
) -> Envelope | None:
    """The refusal of a call of ``desc``, or None when the gate lets it through.

    Args:
        desc: The tool's descriptor now.
        policy: The tool's sandbox *policy* (allowed | approval-required | denied), which a
            ``quota-limited`` snapshot value does not hide.
        approval: What the caller sent.
        quota: The window quota refusing a quota-limited tool now (asked only then): the
            answer names its rule, limit and wait like the ledger's own refusal.
    """
    tool = desc.name
    stab = desc.stability
    if not desc.visible:
        code = REFUSAL_CODES.get(stab.sandbox, "not-visible")
        first = stab.reasons[0].message if stab.reasons else stab.effective
        message = f"{tool} is {stab.effective}: {first}"
        extra: dict[str, object] = {}
        if stab.details.retryAfterMs:
            extra["retryAfterMs"] = stab.details.retryAfterMs
        if stab.sandbox == "quota-limited":
            refusal = quota()
            if refusal is not None:
                message = refusal_message(tool, refusal)
                extra = dict(refusal_details(refusal))
            else:  # the window has just reopened; the timer flips the tool back
                extra["retryAfterMs"] = 1
        return results.unavailable(
            tool,
            code,
            message,
            details={
                "effective": stab.effective,
                "reasons": msgspec.to_builtins(stab.reasons),
                **extra,
            },
            sidecar=desc.sidecar,
        )
    if policy == "approval-required" and not (approval and approval.granted and approval.by):
        unnamed = approval is not None and approval.granted
        return results.unavailable(
            tool,
            "approval-required",
            f"{tool} requires approval: invoke again with approval {{granted: true, by}}"
            + (" (approval.by must name who approved)" if unnamed else ""),
            sidecar=desc.sidecar,
        )
    return None
