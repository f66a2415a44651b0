"""What an operator is told about confinement (PROTOCOL 7): a short label of a sidecar's walls,
the ``confinement-unavailable`` reason, and which grant would allow what a sidecar was denied.

# Strategy: pure functions of the plan (``policy.confine.resolve``), the facts read from a
# worker and the text of a failure. A sidecar that hits its walls gets an ordinary OS error
# (``EACCES``, ``EPERM``, ``ECONNREFUSED``, a proxy ``403``); its message usually names the path
# or address. :func:`denial_hints` finds those names in the failure's text (Python's
# ``[Errno 13] Permission denied: '/x/y'``, Node's ``EACCES: permission denied, open '/x/y'``,
# ``cat: /x/y: Permission denied``, Go's ``open /x/y: permission denied``) and says which grant
# would allow each, only when the path lies outside the plan's grants (the plan knows them): a
# path inside a read-write grant was not refused by the walls, and a never-granted one (the
# host's state, a secret) is said to be so. Refusals of the egress proxy during the call are
# passed in (the proxy's reason already names the rule).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence

from supervisor.contracts.confine import ConfinementFacts, ConfinePlan, EgressRecord
from supervisor.contracts.snapshot import Reason
from supervisor.policy.confine import never_hit

UNAVAILABLE = "confinement-unavailable"
MAX_HINTS = 5

_PY = re.compile(
    r"\[Errno (?:1|13)\] (?:Permission denied|Operation not permitted): "
    r"(?P<q>['\"])(?P<path>/.*?)(?P=q)"
)
_NODE = re.compile(
    r"\b(?:EACCES|EPERM): (?:permission denied|operation not permitted), "
    r"(?P<op>\w+) '(?P<path>/[^']*)'"
)
_PLAIN = re.compile(
    r"(?:^|[\s:'\"])(?P<path>/[^\s:'\"]+)['\"]?: (?:permission denied|operation not permitted)",
    re.IGNORECASE | re.MULTILINE,
)
_WRITE_OPS = frozenset(
    ("mkdir", "rmdir", "unlink", "rename", "write", "copyfile", "symlink", "link", "chmod")
)
_REFUSED = re.compile(
    r"ECONNREFUSED|ENETUNREACH|Connection refused|Network is unreachable"
    r"|\[Errno (?:101|111)\]",
    re.IGNORECASE,
)
_LOOPBACK = re.compile(r"(?:127\.0\.0\.1|localhost|\[::1\]|::1):(?P<port>\d{1,5})\b")
_EPERM = re.compile(r"Operation not permitted|\bEPERM\b", re.IGNORECASE)


def unavailable_reason(plan: ConfinePlan) -> Reason | None:
    """``sandbox: denied``'s reason for a plan ``host.confinement: required`` cannot meet
    (None: the plan is enforceable, or not required)."""
    if not plan.unavailable:
        return None
    return Reason(
        field="sandbox",
        code=UNAVAILABLE,
        message=(
            f"host.confinement is required and this kernel cannot enforce"
            f" {', '.join(plan.missing)} of sidecar {plan.sidecar}'s profile"
        ),
        hint="; ".join((*plan.fixes, 'or set host.confinement to "best-effort"')),
    )


def walls_reason(sidecar: str, error: str) -> Reason:
    """``sandbox: denied``'s reason when the walls of an enforceable plan could not be made."""
    return Reason(
        field="sandbox",
        code=UNAVAILABLE,
        message=f"host.confinement is required and sidecar {sidecar}'s walls were not made: "
        + error,
        hint='fix the cause, or set host.confinement to "best-effort"',
    )


def facts_label(facts: ConfinementFacts) -> str:
    """``fs+net+seccomp``: the walls a worker has, read from it (``none``: no wall)."""
    parts = []
    if facts.filesystem == "enforced":
        parts.append("fs")
    elif facts.filesystem == "partial":
        parts.append("fs(partial)")
    if facts.network == "isolated":
        parts.append("net")
    elif facts.network == "proxy":
        parts.append("proxy")
    if facts.syscalls == "filtered":
        parts.append("seccomp")
    return "+".join(parts) or "none"


def network_fact(plan: ConfinePlan, walled: bool) -> str:
    """The ``network`` fact of a worker of ``plan``: ``walled`` says its network is held (a
    namespace of its own, or Landlock's TCP rules); a socket filter that allows no socket holds
    it too. ``host``, ``isolated``, or ``proxy`` (it reaches what the host relays)."""
    if plan.network == "host" or not plan.active:
        return "host"
    if walled or plan.socket_filter == "none":
        return "proxy" if plan.allow or plan.loopback else "isolated"
    return "host"


def planned_facts(plan: ConfinePlan) -> ConfinementFacts:
    """What a worker of ``plan`` is expected to get (before one runs: the plan, not a fact)."""
    if not plan.active:
        return ConfinementFacts(mode=plan.mode)
    fs = "none" if plan.landlock_abi < 1 else ("partial" if plan.landlock_abi < 3 else "enforced")
    network = network_fact(plan, bool(plan.netns) or plan.tcp_connect is not None)
    return ConfinementFacts(
        mode=plan.mode,
        filesystem=fs,  # type: ignore[arg-type]
        network=network,  # type: ignore[arg-type]
        syscalls="filtered" if plan.seccomp_arch else "none",
        no_new_privs=True,
        missing=list(plan.missing),
    )


def label(plan: ConfinePlan | None, facts: ConfinementFacts | None, *, denied: bool = False) -> str:
    """The confinement column of ``toolhost status``: ``denied`` (``required`` cannot be met),
    ``off``, else the walls (read from a worker when one ran, else the plan's)."""
    if denied:
        return "denied"
    if plan is None or not plan.active:
        return "off" if facts is None else facts_label(facts)
    return facts_label(facts if facts is not None else planned_facts(plan))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def denied_paths(text: str) -> list[tuple[str, str]]:
    """``(path, operation)`` of every absolute path ``text`` says was refused (``EACCES`` or
    ``EPERM``), in order, once each; the operation is Node's (``open``, ``mkdir``) or empty."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    hits: list[tuple[int, str, str]] = []
    for m in _PY.finditer(text):
        hits.append((m.start(), m.group("path"), ""))
    for m in _NODE.finditer(text):
        hits.append((m.start(), m.group("path"), m.group("op")))
    for m in _PLAIN.finditer(text):
        hits.append((m.start("path"), m.group("path"), ""))
    for _, path, op in sorted(hits):
        norm = posixpath.normpath(path)
        if norm not in seen:
            seen.add(norm)
            found.append((norm, op))
    return found


def path_hint(
    plan: ConfinePlan, path: str, op: str = "", host_private: Sequence[str] = ()
) -> str | None:
    """Which grant would allow ``path`` (None: the walls did not refuse it)."""
    if never_hit(path, plan.never) is not None:
        return (
            f"{path} is never granted to a sidecar (host state or a secret):"
            " no confine grant allows it"
        )
    if any(_under(path, w) for w in plan.write):
        return None
    readable = any(_under(path, r) for r in plan.read)
    if not readable and posixpath.dirname(path) in plan.listed:
        top = posixpath.dirname(path)
        return (
            f"{path} is new at the top of {top}, which holds the host's own files and is granted"
            " entry by entry: nothing can be made there; write into a folder below it, or set"
            ' host.projectDir to a folder of its own (e.g. "workspace")'
        )
    if any(_under(path, p) for p in host_private) and (readable or op in _WRITE_OPS):
        return f"{path} is host-private (registry, manifests, tools/): never writable by a sidecar"
    if readable or op in _WRITE_OPS:
        return f"confine.write would allow {path}"
    return f"confine.read would allow {path} (confine.write to change it)"


def _network_hints(plan: ConfinePlan, text: str) -> list[str]:
    if plan.network == "host":
        return []
    out = []
    if plan.netns and _REFUSED.search(text):
        ports = sorted({int(m.group("port")) for m in _LOOPBACK.finditer(text)})
        ports = [p for p in ports if p not in plan.loopback and p != plan.proxy_port]
        for p in ports:
            out.append(f"confine.network.loopback [{p}] would allow 127.0.0.1:{p}")
        if not ports:
            reach = (
                f"only the egress proxy (127.0.0.1:{plan.proxy_port})"
                if plan.proxy_port
                else "nothing"
            )
            out.append(
                f"the sidecar's network namespace reaches {reach}: confine.network.allow"
                " (through the egress proxy) or confine.network.loopback would allow a connection"
            )
    if plan.socket_filter == "none" and "socket" in text.lower() and _EPERM.search(text):
        out.append(
            'the sidecar has network: "none" (no socket at all): confine.network.allow would'
            " allow outbound connections through the egress proxy"
        )
    return out


def egress_hint(record: EgressRecord) -> str:
    """What the proxy refused and what would allow it (its reason names the rule), or that it
    could not reach an allowed destination (rule ``unreachable``: no grant would help)."""
    if record.rule == "unreachable":
        return f"the egress proxy could not reach {record.host}:{record.port}: {record.reason}"
    text = f"the egress proxy refused {record.host}:{record.port}: {record.reason or record.rule}"
    if record.rule == "no-rule":
        text += f'; confine.network.allow "{record.host}:{record.port}" would allow it'
    return text


def denial_hints(
    plan: ConfinePlan,
    text: str,
    *,
    host_private: Sequence[str] = (),
    refusals: Sequence[EgressRecord] = (),
) -> list[str]:
    """The grants that would allow what a failed call of ``plan``'s sidecar was denied.

    Args:
        plan: The sidecar's plan.
        text: The failure's text (error message, stderr tail).
        host_private: Paths never written (``Registry.host_private``).
        refusals: The egress proxy's refusals of this sidecar during the call.

    Returns:
        At most :data:`MAX_HINTS` one-line hints (empty: nothing the walls refused).
    """
    if not plan.active:
        return []
    hints: list[str] = []
    for path, op in denied_paths(text):
        hint = path_hint(plan, path, op, host_private)
        if hint is not None:
            hints.append(hint)
    hints += _network_hints(plan, text)
    hints += [egress_hint(r) for r in refusals if not r.allowed]
    return list(dict.fromkeys(hints))[:MAX_HINTS]
