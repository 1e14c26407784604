"""Files only their owner can read: the data dir, every soul's files, exports, tokens.

Everything the project creates on disk is created under a umask of 077 *and* given an
explicit mode (directories 0700, files 0600), so neither the process umask nor a
third-party writer (SQLite, usearch) leaves a memory readable by another local user.
SQLite gives a database's ``-wal`` and ``-shm`` files the mode of the database file, so
a database created here keeps its journal owner-only as well.

A tree that already has looser modes is reported (:func:`warn_if_loose`), never
changed behind the user's back.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600
GROUP_OTHER = 0o077
SCAN_LIMIT = 5000  # entries looked at by warn_if_loose: enough to tell, cheap at every connect

log = logging.getLogger("soul_runtime")

_lock = threading.Lock()
_depth = 0
_saved_umask = 0


@contextmanager
def private_umask() -> Iterator[None]:
    """Run the block under umask 077. The umask is per process: nested and concurrent
    users share one setting, restored when the last of them leaves."""
    global _depth, _saved_umask
    with _lock:
        if _depth == 0:
            _saved_umask = os.umask(GROUP_OTHER)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                os.umask(_saved_umask)


def make_dir(path: str | os.PathLike[str]) -> Path:
    """``mkdir -p`` where every directory created is 0700 (existing ones are left as they are)."""
    p = Path(path)
    missing = []
    cur = p
    while not cur.exists() and cur != cur.parent:
        missing.append(cur)
        cur = cur.parent
    with private_umask():
        for d in reversed(missing):
            try:
                d.mkdir(mode=DIR_MODE)
            except FileExistsError:  # another creator won the race
                continue
            os.chmod(d, DIR_MODE)
    return p


def create_file(path: str | os.PathLike[str]) -> Path:
    """Make sure ``path`` exists; a file created here is empty and 0600 (an existing one is untouched).

    Used before handing a path to a library that would create it with the default umask."""
    p = Path(path)
    make_dir(p.parent)
    with private_umask():
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            return p
        try:
            os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
    return p


def write_file(path: str | os.PathLike[str], data: bytes | str, *, durable: bool = True,
               replace: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (temp file + rename), mode 0600, parents 0700.

    ``durable``: fsync the file before the rename, and the directory after it. ``replace=False``: only create
    ``path`` (a hard link instead of the rename); if it exists already, it is left as it is."""
    p = Path(path)
    make_dir(p.parent)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with private_umask():
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            try:
                os.fchmod(fd, FILE_MODE)
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:  # a full disk: the partial copy would hold the space it lacks
            tmp.unlink(missing_ok=True)
            raise
    try:
        if replace:
            os.replace(tmp, p)
        else:
            try:
                os.link(tmp, p)  # atomic, and fails if another writer created it first
            except FileExistsError:
                pass
            tmp.unlink()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        dfd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)  # the new directory entry is durable too
        finally:
            os.close(dfd)
    return p


def restrict(path: str | os.PathLike[str]) -> None:
    """Give a file a third-party library wrote its owner-only mode (0600)."""
    os.chmod(path, FILE_MODE)


def loose_entries(root: str | os.PathLike[str], limit: int = SCAN_LIMIT) -> tuple[list[tuple[str, int]], bool]:
    """Entries under ``root`` (root included) with any group/other permission bit, as (path, mode).

    At most ``limit`` entries are looked at; the flag says whether the walk stopped early.
    Symbolic links are not followed."""
    found: list[tuple[str, int]] = []
    seen = 0
    stack = [str(root)]
    try:
        mode = os.lstat(root).st_mode & 0o777
    except OSError:
        return [], False
    if mode & GROUP_OTHER:
        found.append((str(root), mode))
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    seen += 1
                    if seen > limit:
                        return found, True
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if e.is_symlink():
                        continue
                    if st.st_mode & GROUP_OTHER:
                        found.append((e.path, st.st_mode & 0o777))
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
        except OSError:
            continue
    return found, False


def warn_if_loose(root: str | os.PathLike[str], what: str = "data dir") -> str | None:
    """Log one warning line when ``root`` or anything under it is open to group/other; returns the line."""
    found, partial = loose_entries(root)
    if not found:
        return None
    path, mode = found[0]
    count = f"{len(found)}{'+' if partial else ''}"
    line = (f"{what} {root} is readable beyond its owner: {count} entries with group/other access "
            f"(e.g. {path} mode {mode:04o}); new files are created owner-only, existing modes are left "
            f"as they are (fix with: chmod -R go-rwx {root})")
    log.warning(line)
    return line
