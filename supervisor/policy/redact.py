"""Secret redaction (PROTOCOL 3.5): every vault value handed to a sidecar becomes ``***`` in
whatever the host writes (envelopes, stderr tails, log lines, audit lines).

Pure. A value is redacted as written and in its JSON-escaped form (a sidecar that puts the secret
into a JSON string gets it escaped). Values shorter than :data:`MIN_SECRET` are not redacted:
replacing every ``a`` in a text would destroy it and protect nothing.
"""

from __future__ import annotations

from typing import Any

import msgspec

from supervisor.contracts.envelope import Envelope
from supervisor.contracts.wire import NULL

MASK = "***"
MIN_SECRET = 4


class Redactor:
    """The secrets handed out so far, and how to mask them."""

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._blobs: list[bytes] = []

    def __bool__(self) -> bool:
        return bool(self._texts)

    def add(self, value: str) -> None:
        """Mask ``value`` from now on (idempotent)."""
        if len(value) < MIN_SECRET or value in self._texts:
            return
        forms = {value, msgspec.json.encode(value).decode()[1:-1]}
        for form in sorted(forms, key=len, reverse=True):
            if form not in self._texts:
                self._texts.append(form)
                self._blobs.append(form.encode())
        # Longest first, so a secret containing another is masked whole.
        order = sorted(range(len(self._texts)), key=lambda i: -len(self._texts[i]))
        self._texts = [self._texts[i] for i in order]
        self._blobs = [self._blobs[i] for i in order]

    def text(self, s: str) -> str:
        for secret in self._texts:
            if secret in s:
                s = s.replace(secret, MASK)
        return s

    def maybe(self, s: str | None) -> str | None:
        return None if s is None else self.text(s)

    def blob(self, b: bytes) -> bytes:
        for secret in self._blobs:
            if secret in b:
                b = b.replace(secret, MASK.encode())
        return b

    def value(self, v: Any) -> Any:
        """A JSON-like value with every string masked."""
        if isinstance(v, str):
            return self.text(v)
        if isinstance(v, dict):
            return {self.text(k): self.value(x) for k, x in v.items()}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return v

    def envelope(self, env: Envelope) -> Envelope:
        """``env`` with every secret masked (content, data, error message, stderr, details)."""
        if not self._texts:
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
