"""sd_notify over a real datagram socket, and the probe answers."""

import os
import socket

from supervisor.contracts.rpc import HealthCounts, HealthResult
from supervisor.server.health import http_answer, probe
from supervisor.server.systemd import Notifier


def test_notifier_path_and_abstract_sockets(tmp_path):
    path = str(tmp_path / "n.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        n = Notifier({"NOTIFY_SOCKET": path})
        n.ready("3 tools available")
        assert s.recv(100) == b"READY=1\nSTATUS=3 tools available"
        n.status("3 tools available")  # unchanged: not sent again
        n.status("4 tools available")
        assert s.recv(100) == b"STATUS=4 tools available"
    name = f"toolhost-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(b"\0" + name.encode())
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).notify("STOPPING=1")
        assert s.recv(100) == b"STOPPING=1"


def test_notifier_without_socket_or_with_a_dead_one_is_harmless(tmp_path):
    assert Notifier({}).notify("READY=1") is False
    assert Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")}).notify("READY=1") is False


def test_watchdog_interval_is_half_and_only_for_this_pid():
    assert Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "30000000"}).watchdog_s == 15
    other = {"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "100", "WATCHDOG_PID": "1"}
    assert Notifier(other).watchdog_s is None
    mine = {**other, "WATCHDOG_PID": str(os.getpid())}
    assert Notifier(mine).watchdog_s == 0.00005


def _health(critical):
    return HealthResult(
        status="ok",
        uptimeMs=1.0,
        sidecars=HealthCounts(),
        ready=all(v == "available" for v in critical.values()),
        critical=critical,
    )


def test_probes():
    assert probe("live", None, "refused") == (
        False,
        {"probe": "live", "ok": False, "live": False, "error": "refused"},
    )
    ok, body = probe("ready", _health({"a": "available", "b": "unavailable"}))
    assert not ok and body["notReady"] == ["b"] and body["live"] is True
    assert probe("live", _health({"b": "unavailable"}))[0] is True
    assert http_answer("/readyz", _health({"a": "available"}))[0] == 200
    assert http_answer("/readyz", _health({"a": "degraded"}))[0] == 503
    assert http_answer("/healthz", None)[0] == 503
