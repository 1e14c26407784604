"""The Ray auth token file: where Ray 2.60 looks for it, and keeping it to its owner.

A local ``ray.init()`` with ``RAY_AUTH_MODE`` unset turns token auth on and, when no token
exists, writes ``~/.ray/auth_token`` with the process umask (0644 under the usual 022, and
``~/.ray`` 0755). The embedded default starts Ray under umask 077, so the file Ray writes is
0600; :func:`secure_after_start` checks it afterwards and sets 0600 on a file this start
created if it is looser anyway. A token file that existed before with a looser mode is
reported in one warning line, not changed.
A Ray already loaded in a process keeps the auth settings it first read; :func:`reload_in_ray` makes it
read them again, so a connect uses the token its environment names now (the local runtime's own), not a
stray ``~/.ray/auth_token`` read earlier.
Nothing here imports ray.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

from soul_runtime.owner_only import FILE_MODE, GROUP_OTHER, restrict, write_file

log = logging.getLogger("soul_runtime")


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def token_file(env: Mapping[str, str] | None = None) -> Path | None:
    """The file a local Ray would read its token from, or None (auth disabled, or the token
    given as a value in ``RAY_AUTH_TOKEN``). Precedence as in Ray: value, path, default file."""
    e = os.environ if env is None else env
    if e.get("RAY_AUTH_MODE", "").strip().lower() == "disabled" or e.get("RAY_AUTH_TOKEN", "").strip():
        return None
    path = e.get("RAY_AUTH_TOKEN_PATH", "").strip()
    return Path(path).expanduser() if path else default_token_path()


def token_source(env: Mapping[str, str] | None = None) -> str:
    """Where this environment's token comes from, for an error message (never the token itself)."""
    e = os.environ if env is None else env
    if e.get("RAY_AUTH_TOKEN", "").strip():
        return "the RAY_AUTH_TOKEN variable"
    path = token_file(e)
    return f"the file {path}" if path is not None else "none"


def new_token_file(path: str | os.PathLike[str], token: str | None = None) -> Path:
    """Write a token file (a fresh 256-bit token unless given), mode 0600."""
    return write_file(path, token or secrets.token_hex(32))


def mode_of(path: str | os.PathLike[str]) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def secure_after_start(path: Path | None, existed_before: bool) -> str | None:
    """After a local Ray started: a token file this start created is made 0600 if Ray left it
    looser; a pre-existing loose one gets a warning line (returned)."""
    if path is None:
        return None
    mode = mode_of(path)
    if mode is None or not mode & GROUP_OTHER:
        return None
    if not existed_before:
        restrict(path)
        return None
    line = (f"the Ray auth token {path} is readable beyond its owner (mode {mode:04o}); "
            f"anyone who reads it can reach every soul: chmod {FILE_MODE:o} {path}")
    log.warning(line)
    return line


def reload_in_ray() -> bool:
    """Make a Ray already loaded in this process read its auth settings from the environment again.

    Ray 2.60 reads ``RAY_AUTH_MODE`` into its process-wide config when it is imported, and caches the
    first token it loads (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``) for
    the life of the process; neither follows a later change of the environment. A process that imported
    Ray, or read a token, before it set the variables of the head it connects to (the local runtime's
    :func:`soul_apps.cluster.local_cluster.client_env`) would otherwise offer no token, or a stray one, and be
    refused (``InvalidAuthToken``). Call it before a connect, never while connected. Imports nothing:
    False (nothing to do) when Ray is not loaded."""
    raylet = sys.modules.get("ray._raylet")
    if raylet is None:
        return False
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()
    return True
