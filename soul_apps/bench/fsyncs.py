"""Counting the fsyncs a benchmark's runtime makes on the files of its data dir, in every process.

SQLite (and the runtime's own durable writes) call ``fsync`` / ``fdatasync`` from C, in the actor processes, so
neither Python nor ``/proc/PID/io`` sees them. A shared library of a few lines, compiled here with the system's
C compiler, is preloaded (``LD_PRELOAD``) into the processes started after :meth:`FsyncCounter.env` is applied
(a local Ray started then passes it to its raylet and every worker): its ``fsync`` and ``fdatasync`` add one to a
counter that all those processes map from one file when the file synced (or directory: SQLite syncs the
journal's directory) is under the data dir, then make the real call. Linux only; where no C compiler is found,
:func:`counter` returns None and the benchmark reports fsyncs as not measured.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from soul_runtime.storage_modes import check_storage

COUNTER_ENV = "SOUL_FSYNC_COUNTER"
UNDER_ENV = "SOUL_FSYNC_UNDER"
COUNTER_BYTES = 4096

C_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static long *counter;
static const char *under;
static size_t under_len;
static int tried;

static void setup(void) {
    if (__atomic_exchange_n(&tried, 1, __ATOMIC_ACQ_REL)) return;
    const char *path = getenv("SOUL_FSYNC_COUNTER");
    const char *prefix = getenv("SOUL_FSYNC_UNDER");
    if (!path || !prefix) return;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return;
    under = prefix;
    under_len = strlen(prefix);
    __atomic_store_n(&counter, (long *)m, __ATOMIC_RELEASE);
}

static void count(int fd) {
    setup();
    long *c = __atomic_load_n(&counter, __ATOMIC_ACQUIRE);
    if (!c) return;
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) return;
    target[n] = 0;
    if (strncmp(target, under, under_len) == 0 && (target[under_len] == '/' || target[under_len] == 0))
        __atomic_fetch_add(c, 1, __ATOMIC_RELAXED);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    count(fd);
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    count(fd);
    return real(fd);
}
"""


def build(cache_dir: Path) -> Path | None:
    """The compiled library in ``cache_dir`` (built once per source), or None without Linux or a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        return None
    lib = cache_dir / f"soul-fsyncs-{hashlib.sha256(C_SOURCE.encode()).hexdigest()[:12]}.so"
    if lib.is_file():
        return lib
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = lib.with_suffix(".c")
    src.write_text(C_SOURCE)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(src), "-ldl"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return None
    os.replace(tmp, lib)
    return lib


class FsyncCounter:
    """fsyncs on the files under ``under``, by every process started with :meth:`env` applied."""

    def __init__(self, lib: Path, under: Path, counter_file: Path) -> None:
        self.lib, self.under, self.path = lib, Path(os.path.realpath(under)), counter_file
        counter_file.write_bytes(bytes(COUNTER_BYTES))

    def env(self) -> dict[str, str]:
        preload = " ".join(p for p in (str(self.lib), os.environ.get("LD_PRELOAD", "")) if p)
        return {"LD_PRELOAD": preload, COUNTER_ENV: str(self.path), UNDER_ENV: str(self.under)}

    def read(self) -> int:
        return int.from_bytes(self.path.read_bytes()[:8], sys.byteorder, signed=True)


def counter(under: str | os.PathLike[str], work_dir: str | os.PathLike[str],
            cache_dir: str | os.PathLike[str] | None = None) -> FsyncCounter | None:
    """A counter of the fsyncs under ``under`` (its file in ``work_dir``), or None where none can be built."""
    cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "soul-runtime" / "bench"
    lib = build(cache)
    if lib is None:
        return None
    Path(under).mkdir(parents=True, exist_ok=True)
    return FsyncCounter(lib, Path(under), Path(work_dir) / "fsyncs.counter")


def current() -> int | None:
    """The counter this process runs under (started with :meth:`FsyncCounter.env` applied), else None."""
    path = os.environ.get(COUNTER_ENV)
    if not path or not os.environ.get(UNDER_ENV) or "soul-fsyncs-" not in os.environ.get("LD_PRELOAD", ""):
        return None
    try:
        return int.from_bytes(Path(path).read_bytes()[:8], sys.byteorder, signed=True)
    except OSError:
        return None


def run_counted(module: str, argv: list[str], under: str | os.PathLike[str]) -> None:
    """Run ``python -m module *argv`` again, in this process, with the fsyncs under ``under`` counted (its own
    calls included: for benchmarks that write in process); returns (and nothing is counted) when this process
    already runs under a counter or none can be built. The counter's file is removed by :func:`done`."""
    if current() is not None:
        return
    import tempfile
    c = counter(under, tempfile.mkdtemp(prefix="soul-bench-fsyncs-"))
    if c is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], {**os.environ, **c.env()})


def done() -> None:
    """Remove the counter's file (and its directory) of a process started by :func:`run_counted`."""
    path = os.environ.get(COUNTER_ENV)
    if path and Path(path).parent.name.startswith("soul-bench-fsyncs-"):
        shutil.rmtree(Path(path).parent, ignore_errors=True)


def file_system(path: str | os.PathLike[str]) -> dict[str, str]:
    """The mount ``path`` is on: its mount point, file system type and source (from /proc/self/mounts), so a
    result says what storage it measured (``nfs4``, ``fuse.…``, ``ext4``, ``overlay`` …)."""
    real = os.path.realpath(path)
    best = {"mount_point": "/", "type": "unknown", "source": "unknown"}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best["mount_point"]):
            best = {"mount_point": mount, "type": fields[2], "source": fields[0]}
    return best


def add_storage_args(p: argparse.ArgumentParser) -> None:
    """The storage a benchmark writes to (docs/deploying.md: measuring a shared data dir): ``--data-dir``,
    ``--storage`` and ``--fsyncs``, for ``soul bench scale`` and ``soul bench latency`` alike."""
    p.add_argument("--data-dir", metavar="DIR",
                   help="where the souls' files go (default a fresh temp dir, removed after): a directory on the "
                        "storage to measure, e.g. an NFS or EFS mount")
    p.add_argument("--storage", type=check_storage, default="local", metavar="STORAGE",
                   help="the runtime's storage setting: local (SQLite WAL), a postgresql:// URL (the records in "
                        "PostgreSQL, the data dir holding caches) or shared (rollback journal, for a network file "
                        "system)")
    p.add_argument("--fsyncs", action="store_true",
                   help="count the fsyncs per turn on the data dir (a shim preloaded into the processes that write, "
                        "built with the system's C compiler)")
