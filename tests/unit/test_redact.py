"""The vault redactor (supervisor/policy/redact.py): every handed-out value is masked as written
and in its common encodings (percent-encoding, JSON escapes, base64 standard and URL-safe with
and without padding, also inside a longer base64 text, hex lower and upper), in text, bytes,
JSON-like values and envelopes; values under MIN_SECRET characters are never masked."""

from __future__ import annotations

import base64
import json
import random
import urllib.parse

import msgspec
import pytest

from supervisor.contracts.envelope import Envelope, ErrorInfo
from supervisor.policy.redact import MASK, MIN_SECRET, Redactor

# Characters that every encoding treats differently: '/', '+', '=' (base64 alphabets), a space
# ('+' in forms), '%' and '&' (URL), a quote and a backslash (JSON), and non-ASCII.
SECRET = 'k3y/with+sp ce="q\\%&é'


def redactor(*values: str) -> Redactor:
    r = Redactor()
    for v in values:
        r.add(v)
    return r


def b64(value: str, urlsafe: bool = False, pad: bool = True) -> str:
    raw = value.encode()
    out = (base64.urlsafe_b64encode if urlsafe else base64.b64encode)(raw).decode()
    return out if pad else out.rstrip("=")


def quote_lower(value: str) -> str:
    """Percent-encoding with lower-case hex digits (``%2f``), the rest as written."""
    head, *parts = urllib.parse.quote(value, safe="").split("%")
    return "%".join([head] + [p[:2].lower() + p[2:] for p in parts])


ENCODINGS = {
    "plain": lambda v: v,
    "base64": lambda v: b64(v),
    "base64-nopad": lambda v: b64(v, pad=False),
    "base64url": lambda v: b64(v, urlsafe=True),
    "base64url-nopad": lambda v: b64(v, urlsafe=True, pad=False),
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "quote": lambda v: urllib.parse.quote(v, safe=""),
    "quote-lower": lambda v: quote_lower(v),
    "quote-path": lambda v: urllib.parse.quote(v),  # '/' left as is
    "quote_plus": lambda v: urllib.parse.quote_plus(v),
    "json": lambda v: msgspec.json.encode(v).decode()[1:-1],
    "json-ascii": lambda v: json.dumps(v)[1:-1],
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
@pytest.mark.parametrize("secret", [SECRET, "tok-abcdef", "abcd"])
def test_every_encoding_is_masked_in_text_and_bytes(encoding, secret):
    form = ENCODINGS[encoding](secret)
    r = redactor(secret)
    text = f"before {form} after"
    assert r.text(text) == f"before {MASK} after", (encoding, form)
    assert r.blob(text.encode()) == f"before {MASK} after".encode(), (encoding, form)


@pytest.mark.parametrize("urlsafe", [False, True])
@pytest.mark.parametrize("prefix", ["", "a", "ab", "user:", "Bearer "])
def test_base64_of_a_longer_text_holding_the_value_leaves_no_run_of_it(prefix, urlsafe):
    """``Basic base64(user:secret)``: the value sits at any byte offset of the encoded text."""
    secret = "p4ss/w0rd+long-enough"
    r = redactor(secret)
    encoded = b64(prefix + secret + "!tail", urlsafe=urlsafe)
    masked = r.text(f"Authorization: Basic {encoded}")
    assert MASK in masked
    # What is left around the mask is the prefix's and the tail's own characters: at most
    # three characters of the encoding on each side mix the value with its neighbours.
    before, _, after = masked.partition(MASK)
    head = b64(prefix, urlsafe=urlsafe, pad=False) if prefix else ""
    assert len(before) - len("Authorization: Basic ") <= len(head) + 1
    assert len(after) <= len(b64("!tail")) + 2


def test_envelope_content_data_error_stderr_and_details_are_masked():
    secret = "s3cr3t-Value-42"
    r = redactor(secret)
    data = msgspec.json.encode(
        {"b64": b64(secret), "hex": secret.encode().hex(), "url": f"https://x/?k={secret}"}
    )
    env = Envelope(
        status="failed",
        tool="t.x",
        content=f"token {b64(secret, urlsafe=True, pad=False)}",
        data=msgspec.Raw(data),
        error=ErrorInfo(
            code="failed",
            message=f"bad {urllib.parse.quote(secret)}",
            stderr=f"line {secret.encode().hex().upper()}\n",
            details={"k": [secret, {"nested": b64(secret)}]},
        ),
    )
    out = msgspec.json.encode(r.envelope(env)).decode()
    for enc in ENCODINGS.values():
        assert enc(secret) not in out
    assert out.count(MASK) == 8


@pytest.mark.parametrize("value", ["a", "ab", "abc"])
def test_short_values_are_never_masked(value):
    """Under MIN_SECRET characters a value is ignored in every form: masking every ``a`` (or
    every ``YQ`` of a base64 text) would destroy the output and protect nothing."""
    assert len(value) < MIN_SECRET == 4
    r = redactor(value)
    assert not r
    text = f"{value} {b64(value)} {value.encode().hex()} {value * 3}"
    assert r.text(text) == text
    assert r.blob(text.encode()) == text.encode()


def test_a_value_of_min_secret_characters_is_masked_but_not_its_letters():
    r = redactor("abcd")
    assert r.text("abc abcd bcd abcdabcd") == f"abc {MASK} bcd {MASK}{MASK}"


def test_overlapping_and_nested_values_leave_no_tail():
    r = redactor("abcdef", "cdefgh", "abcdefghij-longer")
    assert r.text("x abcdefgh y") == f"x {MASK} y"  # 'gh' of the second is masked too
    assert r.text("x abcdefghij-longer y") == f"x {MASK} y"
    assert r.text("x cdefgh abcdef y") == f"x {MASK} {MASK} y"


def test_add_is_idempotent_and_the_set_grows():
    r = redactor()
    assert not r and r.text("anything") == "anything"
    r.add("first-secret")
    r.add("first-secret")
    assert r.text("first-secret second-secret") == f"{MASK} second-secret"
    r.add("second-secret")
    assert r.text("first-secret second-secret") == f"{MASK} {MASK}"


def test_regex_metacharacters_in_values_are_literal():
    secret = "a.b*c(d)[e]{2}|f^$"
    r = redactor(secret)
    assert r.text(f"<{secret}>") == f"<{MASK}>"
    assert r.text("aXbbbcdef") == "aXbbbcdef"


def test_text_without_secrets_is_returned_unchanged():
    rng = random.Random(7)
    values = ["".join(rng.choice("abcdefXYZ0123/+=") for _ in range(16)) for _ in range(10)]
    r = redactor(*values)
    text = "".join(rng.choice("ghijklmnopqrstuvw .,;:") for _ in range(20_000))
    assert r.text(text) is text
    blob = text.encode()
    assert r.blob(blob) is blob


def test_many_long_values_compile_and_mask():
    """A PEM-sized value (thousands of characters) and dozens of values: one compile, no
    recursion limit, every one masked."""
    rng = random.Random(3)
    big = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789+/") for _ in range(4000))
    values = [big] + [f"value-{i:03d}-{rng.random()}" for i in range(60)]
    r = redactor(*values)
    text = " | ".join([b64(big), *values[1:], values[7].encode().hex()])
    out = r.text(text)
    assert out == " | ".join([MASK] * (len(values) + 1))
