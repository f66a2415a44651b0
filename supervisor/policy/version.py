"""Version compatibility: ``compatibleCore`` ranges against the host version.

A range is comma-separated clauses, each an operator (``>=``, ``>``, ``<=``, ``<``, ``==``,
``!=``, ``~=``, ``^``) and a dotted version; ``*`` or an empty range admits everything. Versions
compare numerically part by part, missing parts counting as 0 and any pre-release suffix ignored.
"""

from __future__ import annotations

import re

from supervisor.contracts.snapshot import VersionState

_CLAUSE = re.compile(
    r"^\s*(>=|<=|==|!=|~=|>|<|\^|=)?\s*v?(\d+(?:\.\d+)*)(?:[-+.]?[A-Za-z][\w.]*)?\s*$"
)


class RangeError(ValueError):
    """The range text cannot be parsed."""


def parse_version(text: str) -> tuple[int, ...]:
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text)
    if not m:
        raise RangeError(f"not a version: {text!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    pa, pb = _pad(a, n), _pad(b, n)
    return (pa > pb) - (pa < pb)


def satisfies(version: str, spec: str) -> bool:
    """True when ``version`` is inside range ``spec``.

    Raises:
        RangeError: ``spec`` or ``version`` cannot be parsed.
    """
    v = parse_version(version)
    spec = spec.strip()
    if spec in ("", "*"):
        return True
    for clause in spec.split(","):
        m = _CLAUSE.match(clause)
        if not m:
            raise RangeError(f"cannot parse range clause {clause.strip()!r}")
        op = m.group(1) or "=="
        ref = tuple(int(p) for p in m.group(2).split("."))
        c = _cmp(v, ref)
        if op in ("==", "="):
            ok = c == 0
        elif op == "!=":
            ok = c != 0
        elif op == ">=":
            ok = c >= 0
        elif op == ">":
            ok = c > 0
        elif op == "<=":
            ok = c <= 0
        elif op == "<":
            ok = c < 0
        elif op == "~=":  # compatible release: >= ref, same prefix but the last part
            prefix = ref[:-1] if len(ref) > 1 else ref
            ok = c >= 0 and _pad(v, len(prefix))[: len(prefix)] == prefix
        else:  # "^": same first non-zero part
            idx = next((i for i, p in enumerate(ref) if p != 0), len(ref) - 1)
            ok = c >= 0 and _pad(v, idx + 1)[: idx + 1] == _pad(ref, idx + 1)[: idx + 1]
        if not ok:
            return False
    return True


SUPPORTED_PROTOCOLS: dict[str, tuple[int, ...]] = {"process-json": (1,)}
"""Major versions of each sidecar protocol this host speaks (others are not judged)."""


def protocol_compatibility(protocol: str, protocol_version: str | None) -> tuple[VersionState, str]:
    """Whether this host speaks ``protocol`` at ``protocol_version`` (its major part decides)."""
    supported = SUPPORTED_PROTOCOLS.get(protocol)
    if protocol_version is None or supported is None:
        return "unknown", ""
    try:
        major = parse_version(protocol_version)[0]
    except RangeError:
        return "unknown", f"protocolVersion {protocol_version!r} is not a version"
    if major in supported:
        return "compatible", ""
    speaks = ", ".join(str(v) for v in supported)
    return (
        "incompatible",
        f"{protocol} protocol {protocol_version} is not supported (toolhost speaks {speaks})",
    )


def compatibility(
    host_version: str,
    compatible_core: str | None,
    *,
    protocol: str | None = None,
    protocol_version: str | None = None,
) -> tuple[VersionState, str]:
    """The snapshot's ``version`` field and a message when it is not ``compatible``.

    ``compatibleCore`` against the host version decides, except that a sidecar protocol version
    this host does not speak makes it ``incompatible`` whatever the range says.
    """
    state, message = _core_compatibility(host_version, compatible_core)
    if protocol is not None:
        pstate, pmessage = protocol_compatibility(protocol, protocol_version)
        if pstate == "incompatible":
            if state == "incompatible":
                return state, f"{message}; {pmessage}"
            return pstate, pmessage
    return state, message


def _core_compatibility(host_version: str, compatible_core: str | None) -> tuple[VersionState, str]:
    if compatible_core is None:
        return "unknown", ""
    try:
        ok = satisfies(host_version, compatible_core)
    except RangeError as exc:
        return "unknown", f"compatibleCore {compatible_core!r}: {exc}"
    if ok:
        return "compatible", ""
    return (
        "incompatible",
        f"compatibleCore {compatible_core!r} does not admit toolhost {host_version}",
    )
