"""No CLI command prints a traceback for a hostile registry; doctor lists every problem."""

import json

import pytest

from tests.e2e.conftest import cli

REL = "tools/external.tools.jsonc"

HOSTILE = {
    "deep": "[" * 100_000 + "]" * 100_000,
    "nan": '{"schemaVersion": 2, "sidecars": {"s": {"command": "x", "pool": {"max": NaN}}}}',
    "utf8": b'{"schemaVersion": 2, "sidecars": {"\xff": {}}}',
    "dir": None,
}


def _write(root, kind):
    path = root / REL
    path.parent.mkdir(parents=True, exist_ok=True)
    value = HOSTILE[kind]
    if value is None:
        path.mkdir()
    elif isinstance(value, bytes):
        path.write_bytes(value)
    else:
        path.write_text(value)


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("command", [("status",), ("doctor",), ("init",), ("catalog",)])
def test_cli_never_prints_a_traceback(tmp_path, kind, command):
    root = tmp_path / "app"
    root.mkdir()
    _write(root, kind)
    out = cli(root, *command)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    assert out.returncode != 0 or command == ("init",)


def test_doctor_lists_every_problem_with_paths(tmp_path):
    root = tmp_path / "app"
    root.mkdir()
    (root / "tools").mkdir()
    entry = '{"command": "", "pool": {"max": NaN, "mx": 1}, "protocol": "grpc", "tools": ["t.a"]}'
    (root / REL).write_text('{"schemaVersion": 2, "sidecars": {"s": ' + entry + "}}")
    out = cli(root, "doctor", "--json", "--timeout", "10")
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    (side,) = report["sidecars"]
    assert (
        "sidecars.s.pool.max: NaN is not a number (JSON has no NaN or Infinity)"
        in (side["problems"])
    )
    entry = '{"command": "", "pool": {"max": 0, "mx": 1}, "protocol": "grpc", "tools": ["t.a"]}'
    (root / REL).write_text('{"schemaVersion": 2, "sidecars": {"s": ' + entry + "}}")
    report = json.loads(cli(root, "doctor", "--json", "--timeout", "10").stdout)
    problems = report["sidecars"][0]["problems"]
    for expected in (
        'sidecars.s.command: expected str of length >= 1, got ""',
        "sidecars.s.pool.max: expected int >= 1, got 0",
        "sidecars.s.pool.mx: unknown field",
        'sidecars.s.protocol: invalid value "grpc"',
    ):
        assert expected in problems, problems
