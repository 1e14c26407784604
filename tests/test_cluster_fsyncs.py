"""The benchmark's fsync counter: real fsync and fdatasync calls from another process, counted when the file (or
directory) synced is under the data dir, not otherwise (no Ray)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from soul_apps.bench import fsyncs

SYNCS = r"""
import os, sys
inside, outside = sys.argv[1:3]
for path, n in ((inside, 3), (outside, 2)):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    for i in range(n):
        os.write(fd, b"x")
        (os.fsync if i % 2 == 0 else os.fdatasync)(fd)
    os.close(fd)
d = os.open(os.path.dirname(inside), os.O_RDONLY)
os.fsync(d)  # a directory under the data dir counts too (SQLite syncs a journal's directory)
os.close(d)
"""


def test_fsyncs_under_the_data_dir_are_counted_in_another_process(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "data-other"  # a sibling with the same prefix does not count
    other.mkdir()
    c = fsyncs.counter(data, tmp_path, cache_dir=tmp_path / "cache")
    if c is None:
        pytest.skip("no C compiler here: the benchmark reports fsyncs as not measured")
    assert c.read() == 0
    env = os.environ | c.env()
    subprocess.run([sys.executable, "-c", SYNCS, str(data / "soul.sqlite"), str(other / "x.sqlite")], env=env,
                   check=True)
    assert c.read() == 4
    (data / "a").mkdir()
    subprocess.run([sys.executable, "-c", SYNCS, str(data / "a" / ".." / "soul.sqlite"), str(other / "y")],
                   env=env, check=True)
    assert c.read() == 8  # the path as the kernel resolves it


@pytest.mark.skipif(not Path("/proc/self/mounts").is_file(), reason="reads /proc/self/mounts (Linux)")
def test_a_result_names_the_mount_its_data_dir_is_on(tmp_path: Path) -> None:
    """The storage a benchmark measured: the deepest mount holding the data dir (one not made yet included), not
    a mount whose path merely starts with the same letters."""
    fs = fsyncs.file_system(tmp_path / "not-made-yet" / "data")
    assert os.stat(fs["mount_point"]).st_dev == os.stat(tmp_path).st_dev
    assert fs["type"] not in ("", "unknown")
    proc = fsyncs.file_system("/proc/self/status")
    assert (proc["mount_point"], proc["type"]) == ("/proc", "proc")
    assert fsyncs.file_system("/procfs-is-not-proc")["mount_point"] != "/proc"
