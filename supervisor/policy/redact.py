"""Secret redaction (PROTOCOL 3.5): every vault value handed to a sidecar becomes ``***`` in
whatever the host writes (envelopes, stderr tails, log lines, audit lines, spans).

Pure (no clock, no I/O, no trio): the sidecar SDK masks its own spans with the same class.

What is masked, for each value (base64 and hex of its UTF-8 bytes):

- the value as written, and with any character percent-encoded (``%2F`` or ``%2f``, a space
  also as ``+``): URL query strings and form bodies, whichever characters the encoder escaped;
- its JSON-escaped forms (msgspec's, and ``json.dumps``'s ``\\uXXXX`` one);
- base64, standard and URL-safe, with and without ``=`` padding; inside a longer base64 text
  (``Basic`` credentials, a token in an encoded blob) the characters that only the value
  determines, at each of the three byte offsets, when there are at least
  :data:`MIN_BASE64_CORE` of them;
- hex, lower and upper case.

Values shorter than :data:`MIN_SECRET` characters are not masked in any form: replacing every
``a`` in a text would destroy it and protect nothing.

# Strategy: ``add`` turns every form of every value into a sequence of regex units (one
# character, or a character with its percent-encodings), merges the first ``_HEAD`` units of all
# forms into one trie and compiles it into one alternation, so a text is scanned once whatever
# the number of values and encodings; a longer form's head ends in an empty named group that
# says which rest to match after a hit (rests are compiled once, with their value). Bytes are
# masked as UTF-8 text (invalid bytes kept). The compiled set is replaced whole (one attribute
# store), so a reader on another thread (the SDK's exporter) sees the old set or the new one.
# The regex takes the longest form at a position; a match overlapping the end of another (two
# secrets sharing characters) extends the masked span, so no tail of a secret survives.
# The regex costs ~10-40 ns a character, so it only runs where a match can be: every head has an
# *anchor*, a literal run that each of its matches holds (unreserved characters stay literal in
# any percent-encoding; base64 and hex heads are literal). Anchors of 15+ UTF-8 bytes are looked
# up all at once by the text's aligned 8-byte grams (one C-speed set intersection), shorter ones
# with ``str.find``; the regex then scans windows around the hits, as wide as a head reaches, and
# masks exactly what a scan of the whole text would (bench/redact.py, issue 30).
"""

from __future__ import annotations

import base64
import json
import re
import sys
from array import array
from typing import Any

import msgspec

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.wire import NULL

MASK = "***"
MIN_SECRET = 4
"""Values shorter than this (in characters) are never masked."""
MIN_BASE64_CORE = 8
"""The shortest inner base64 run (value at a byte offset of a longer text) that is masked."""

_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_END = ""  # the trie key marking "a form ends here" (no unit is empty)
_HEAD = 16
"""Units of a form in the shared regex; the rest of a longer form is matched after a hit."""

_GRAM_ANCHOR = 15
"""Anchors of this many UTF-8 bytes are looked up by their aligned 8-byte grams: one pass over
a text for all of them, whatever their number."""
_ANCHOR = 8
"""An anchor is cut from a literal run of a head; runs this long give anchors at least this long."""
_MIN_ANCHOR = 3
"""A form whose head has no literal run this long has no anchor: its set scans whole texts."""
_UNIT_REACH = 12
"""The most characters one unit matches (a character of 4 UTF-8 bytes, each as ``%XX``)."""

_MAX_HITS = 256
"""Past this many anchor hits in a text, it is scanned whole (no windows)."""

Units = tuple[str, ...]


def _pct(ch: str) -> str:
    """``%XX`` for each UTF-8 byte of ``ch``, either hex case."""
    out = []
    for b in ch.encode():
        out.append("%" + "".join(c if c.isdigit() else f"[{c}{c.lower()}]" for c in f"{b:02X}"))
    return "".join(out)


def _url_forms(value: str) -> list[Units]:
    """The value with any of its characters percent-encoded (the plain value included).

    The first character's spellings are separate forms, so every form begins with a literal:
    the compiled alternation then gets the regex engine's first-character prefilter.
    """
    units: list[str] = []
    for c in value:
        if c in _UNRESERVED:
            units.append(re.escape(c))
            continue
        alts = [re.escape(c), _pct(c)]
        if c == " ":
            alts.append(r"\+")
        units.append("(?:" + "|".join(alts) + ")")
    first = value[0]
    if first in _UNRESERVED:
        return [tuple(units)]
    heads = [re.escape(first), _pct(first)] + ([r"\+"] if first == " " else [])
    return [(head, *units[1:]) for head in heads]


def _base64_forms(raw: bytes) -> list[str]:
    out: list[str] = []
    n = len(raw)
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        full = encode(raw).decode()
        out.append(full)  # padded; the unpadded form is its prefix (the trie keeps both)
        out.append(full.rstrip("="))
        for shift in (0, 1, 2):
            enc = encode(b"\0" * shift + raw).decode()
            start = -(-8 * shift // 6)  # the first character with no bit of the prefix
            stop = 8 * (n + shift) // 6  # past the last character with no bit of what follows
            core = enc[start:stop]
            if len(core) >= MIN_BASE64_CORE:
                out.append(core)
    return out


def _forms(value: str) -> list[Units]:
    """Every form of ``value`` as regex units (one character, or one with its escapes)."""
    raw = value.encode()
    texts = {
        msgspec.json.encode(value).decode()[1:-1],
        json.dumps(value)[1:-1],
        raw.hex(),
        raw.hex().upper(),
        *_base64_forms(raw),
    }
    texts.discard(value)
    forms = _url_forms(value)
    forms.extend(tuple(re.escape(c) for c in t) for t in sorted(texts))
    return forms


def _trie(forms: list[Units]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for form in forms:
        node = root
        for unit in form:
            node = node.setdefault(unit, {})
        node[_END] = {}
    return root


def _emit(node: dict[str, Any]) -> str:
    """The regex of a trie: one alternation, the longer form first where forms share a prefix
    (``abc(?:def)?``)."""
    parts = []
    for unit, child in node.items():
        if unit == _END:
            continue
        seq = [unit]
        while len(child) == 1 and _END not in child:  # a chain: no group, no recursion
            ((unit, child),) = child.items()
            seq.append(unit)
        parts.append("".join(seq) + _emit(child))
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
    return f"(?:{body})?" if _END in node else body


def _literal(unit: str) -> str | None:
    """The character a unit matches when it matches exactly one (``re.escape`` of it)."""
    if len(unit) == 1 or (len(unit) == 2 and unit[0] == "\\"):
        return unit[-1]
    return None


def _runs(head: Units) -> list[str]:
    """The maximal runs of literal characters of a head: every match of it holds them all."""
    runs: list[str] = []
    run: list[str] = []
    for unit in head:
        c = _literal(unit)
        if c is None:
            if run:
                runs.append("".join(run))
            run = []
        else:
            run.append(c)
    if run:
        runs.append("".join(run))
    return runs


def _anchors(forms: list[Units]) -> tuple[list[str], list[str]] | None:
    """Literal strings such that every match of every form's head holds one of them: the
    longest literal run of each head when it has :data:`_GRAM_ANCHOR` UTF-8 bytes (looked up by
    8-byte grams), else few shorter ones found with ``str.find``; ``None`` when a head has no
    literal run of :data:`_MIN_ANCHOR` characters.

    The short ones are a greedy cover: the substring shared by the most heads, the longest
    among those (the plain, percent-encoded and JSON forms of a value share one)."""
    long: list[str] = []
    subs: list[set[str]] = []
    for form in forms:
        runs = [r for r in _runs(form[:_HEAD]) if len(r) >= _MIN_ANCHOR]
        if not runs:
            return None
        best = max(runs, key=len)
        if len(best.encode("utf-8", "surrogatepass")) >= _GRAM_ANCHOR:
            long.append(best)
            continue
        cut: set[str] = set()
        for run in runs:
            least = min(len(run), _ANCHOR)
            for i in range(len(run) - least + 1):
                cut.update(run[i:j] for j in range(i + least, len(run) + 1))
        subs.append(cut)
    short: list[str] = []
    left = list(range(len(subs)))
    while left:
        counts: dict[str, int] = {}
        for i in left:
            for sub in subs[i]:
                counts[sub] = counts.get(sub, 0) + 1
        pick = max(counts, key=lambda a: (counts[a], len(a), a))
        short.append(pick)
        left = [i for i in left if pick not in subs[i]]
    return long, short


def _grams(anchors: list[str]) -> dict[int, tuple[str, ...]]:
    """Every 8-byte gram of each anchor (as an int) -> the anchors holding it. An occurrence of
    an anchor of at least 15 bytes holds one of its grams at a text offset divisible by 8."""
    out: dict[int, set[str]] = {}
    for a in anchors:
        raw = a.encode("utf-8", "surrogatepass")
        for i in range(min(8, len(raw) - 7)):
            out.setdefault(int.from_bytes(raw[i : i + 8], sys.byteorder), set()).add(a)
    return {g: tuple(sorted(v)) for g, v in out.items()}


def _minimal(anchors: list[str]) -> tuple[str, ...]:
    """``anchors`` without those holding another one (its hits hold theirs)."""
    kept: list[str] = []
    for a in sorted(set(anchors), key=len):
        if not any(k in a for k in kept):
            kept.append(a)
    return tuple(sorted(kept))


class _Set:
    """One compiled secret set: ``rx`` over every form's first :data:`_HEAD` units; a longer
    form's head ends with an empty named group ``t<n>`` whose ``tails[n]`` matches the rest."""

    def __init__(
        self,
        rx: re.Pattern[str],
        tails: dict[str, re.Pattern[str]],
        anchors: tuple[list[str], list[str]] | None,
        reach: int,
    ) -> None:
        self.rx = rx
        self.tails = tails
        self.scan_all = anchors is None
        self.grams = _grams(anchors[0]) if anchors is not None else {}
        self.gramset = frozenset(self.grams)
        self.finds = _minimal(anchors[1]) if anchors is not None else ()
        self.reach = reach

    def end(self, m: re.Match[str], s: str) -> int:
        """Where the secret matched by ``m`` ends (a long form: its head and what follows)."""
        end = m.end()
        name = m.lastgroup
        if name is not None:
            rest = self.tails[name].match(s, end)
            if rest is not None:
                end = rest.end()  # else a head alone: a cut secret, masked all the same
        return end

    def windows(self, s: str) -> list[tuple[int, int]]:
        """The spans of ``s`` that can hold a match: around each anchor hit, as far as a head
        reaches on either side, merged (all of ``s`` when the set has no anchors)."""
        if self.scan_all:
            return [(0, len(s))]
        anchors = list(self.finds)
        if self.gramset:
            raw = s.encode("utf-8", "surrogatepass")
            seen = self.gramset.intersection(array("Q", raw[: len(raw) & ~7]))
            if seen:
                grams = self.grams
                anchors.extend({a for g in seen for a in grams[g]})
        hits: list[int] = []
        find = s.find
        for a in anchors:
            i = find(a)
            while i >= 0:
                hits.append(i)
                if len(hits) > _MAX_HITS:  # a text full of one anchor: one scan is cheaper
                    return [(0, len(s))]
                i = find(a, i + 1)
        if not hits:
            return []
        hits.sort()
        reach = self.reach
        spans: list[tuple[int, int]] = []
        lo, hi = hits[0] - reach, hits[0] + reach
        for p in hits[1:]:
            if p - reach > hi:
                spans.append((max(lo, 0), hi))
                lo = p - reach
            hi = p + reach
        spans.append((max(lo, 0), hi))
        return spans

    def mask(self, s: str) -> str:
        spans = self.windows(s)
        if not spans:
            return s
        rx = self.rx
        out = []
        last = 0
        for lo, hi in spans:
            pos = max(lo, last)
            while pos < hi:
                m = rx.search(s, pos, hi)
                if m is None:
                    break
                start, end = m.start(), self.end(m, s)
                i = start + 1
                while i < end:  # another secret starting inside this one may run past its end
                    inner = rx.match(s, i)
                    if inner is not None:
                        end = max(end, self.end(inner, s))
                    i += 1
                out.append(s[last:start])
                out.append(MASK)
                last = pos = end
        if not out:
            return s
        out.append(s[last:])
        return "".join(out)


class Redactor:
    """The secrets handed out so far, and how to mask them."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._heads: list[Units] = []
        self._marks: dict[Units, str] = {}  # a long form's head -> its group name
        self._rests: dict[str, list[Units]] = {}
        self._tails: dict[str, re.Pattern[str]] = {}
        self._anchors: tuple[list[str], list[str]] | None = ([], [])  # None: scan texts whole
        self._reach = 0
        self._set: _Set | None = None

    def __bool__(self) -> bool:
        return self._set is not None

    def add(self, value: str) -> None:
        """Mask ``value`` (and its encodings) from now on; idempotent. Recompiles the shared
        regex (heads only: the rest of a long form is compiled once, with its value)."""
        if len(value) < MIN_SECRET or value in self._values:
            return
        heads = list(self._heads)
        tails = dict(self._tails)
        grown: set[str] = set()
        forms = _forms(value)
        for form in forms:
            if len(form) <= _HEAD:
                heads.append(form)
                continue
            head = form[:_HEAD]
            name = self._marks.get(head)
            if name is None:
                name = self._marks[head] = f"t{len(self._marks)}"
                heads.append((*head, f"(?P<{name}>)"))
            self._rests.setdefault(name, []).append(form[_HEAD:])
            grown.add(name)
        for name in grown:
            tails[name] = re.compile(_emit(_trie(self._rests[name])))
        found = _anchors(forms)
        anchors = (
            None
            if found is None or self._anchors is None
            else (self._anchors[0] + found[0], self._anchors[1] + found[1])
        )
        reach = max(
            self._reach,
            *(sum(1 if _literal(u) is not None else _UNIT_REACH for u in f[:_HEAD]) for f in forms),
        )
        compiled = _Set(
            re.compile(_emit(_trie(heads))),
            tails,
            anchors,
            reach,
        )
        self._values.add(value)
        self._heads = heads
        self._tails = tails
        self._anchors = anchors
        self._reach = reach
        self._set = compiled  # one store: a reader on another thread sees the old set or this

    def text(self, s: str) -> str:
        compiled = self._set
        return s if compiled is None else compiled.mask(s)

    def maybe(self, s: str | None) -> str | None:
        return None if s is None else self.text(s)

    def blob(self, b: bytes) -> bytes:
        """``b`` (UTF-8, any invalid bytes kept as they are) with every secret masked."""
        compiled = self._set
        if compiled is None:
            return b
        s = b.decode("utf-8", "surrogateescape")
        masked = compiled.mask(s)
        return b if masked is s else masked.encode("utf-8", "surrogateescape")

    def value(self, v: Any) -> Any:
        """A JSON-like value with every string masked."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {self.text(k): self.value(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [self.value(x) for x in v]
        return v

    def envelope(self, env: Envelope) -> Envelope:
        """``env`` with every secret masked (content, data, error message, stderr, details)."""
        if self._set is None:
            return env
        env.content = self.text(env.content)
        if env.data is not NULL:
            raw = bytes(env.data)
            masked = self.blob(raw)
            if masked is not raw and masked != raw:
                env.data = msgspec.Raw(masked)
        err = env.error
        if err is not None:
            err.message = self.text(err.message)
            err.stderr = self.maybe(err.stderr)
            if err.details is not None:
                err.details = self.value(err.details)
        return env
