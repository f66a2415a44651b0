"""``HostTemp``: a live host's folder is never swept, a dead one's is, nothing else is."""

import subprocess
import sys
from pathlib import Path

from supervisor.processes.host_temp import HostTemp

HOLD = """
import sys
from supervisor.processes.host_temp import HostTemp
t = HostTemp(sys.argv[1])
print(t.path, flush=True)
sys.stdin.read()
"""


def test_sweep_takes_only_the_folders_of_hosts_that_are_gone(tmp_path: Path) -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None
        live = Path(other.stdout.readline().strip())
        (live / "w").mkdir()
        dead = tmp_path / "toolhost-99999999-abcdefgh"  # a host that died (no lock held)
        (dead / "w").mkdir(parents=True)
        (dead / ".lock").write_text("")
        (dead / "w" / "f").write_text("x")
        strangers = [tmp_path / "toolhost-1-nolock", tmp_path / "toolhost-echo-abc"]
        for p in strangers:
            p.mkdir()
        mine = HostTemp(str(tmp_path))
        assert mine.sweep() == [str(dead)]
        assert live.is_dir() and (live / "w").is_dir()  # its host runs
        assert all(p.is_dir() for p in strangers)  # not a host's folder, or no lock: left
        assert Path(mine.path).is_dir() and not (tmp_path / f".{Path(mine.path).name}").exists()
        other.stdin.close()  # type: ignore[union-attr]
        other.wait(timeout=10)
        assert mine.sweep() == [str(live)]  # its host is gone now
        mine.close()
        assert not Path(mine.path).exists()
        mine.close()  # twice is harmless
    finally:
        other.kill()
        other.wait()
