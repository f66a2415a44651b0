"""Smoke test of ``toolhost bench --quick``: it runs and writes a valid JSON record.

Timings are never asserted here (the machine is shared and noisy); only the record's shape.
"""

import json
import os
import subprocess
import sys

from bench.cli import SCENARIOS


def test_bench_quick_writes_a_record(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "supervisor", "bench", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,  # a shared, loaded machine; alone it takes well under a minute
        env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path / ".xdg")},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    record = json.loads(out.read_text())
    assert record["schema"] == "toolhost-bench/1"
    assert record["quick"] is True
    assert set(record["scenarios"]) == set(SCENARIOS)
    for key, scenario in record["scenarios"].items():
        assert scenario["ran"], (key, scenario["error"])
        assert scenario["rows"] or scenario["figures"], key
    assert record["machine"]["cpuCount"] >= 1
    assert record["targets"], "the issue's targets are judged in every run"
    for target in record["targets"]:
        assert {"of", "label", "limit", "value", "met"} <= set(target)
    assert "scenario" in proc.stdout  # the printed table
