"""The local runtime of the CLI: one Ray head per data dir that outlives a command.

The first ``soul`` command on the embedded default (no ``--address``) starts a
private Ray head on 127.0.0.1 with its own token, recorded in
``DATA_DIR/cluster/head.json`` (mode 0600, the same record ``soul cluster``
keeps), and creates the soul actors as detached actors; later commands attach to
it as a driver (``ray.init(address="127.0.0.1:PORT")``, ~0.1 s) instead of
starting a Ray of their own (~10 s). A head that crashed, was killed or left a
stale record is stopped and replaced; so is one started under other model or
embedder settings (the actors read them when they are created: ``SOUL_MODEL``,
``SOUL_EMBEDDER``, ``ANTHROPIC_*``, ``OPENAI_*`` ..., see
:func:`soul_runtime.plugins.settings_env`) or older code. ``soul down``
stops it, leaving no process behind. ``SOUL_LOCAL_RUNTIME=per-call`` keeps the
old behaviour: a private Ray started and stopped within the one command (unless a
local runtime already holds the data dir: one owner per soul, so the command attaches).

Nothing here imports Ray; :mod:`soul_apps.cluster.local_cluster` starts and stops heads.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MODES = ("background", "per-call")


def mode() -> str:
    """``background`` (default) or ``per-call``, from ``SOUL_LOCAL_RUNTIME``."""
    from soul_runtime.errors import ConfigError
    value = os.environ.get("SOUL_LOCAL_RUNTIME", "").strip() or "background"
    if value not in MODES:
        raise ConfigError(f"SOUL_LOCAL_RUNTIME must be one of {', '.join(MODES)}, got {value!r}")
    return value


def state_dir(data_dir: str) -> Path:
    """Where the data dir's local head is recorded (``soul cluster`` uses the same place by default)."""
    return Path(data_dir) / "cluster"


def fingerprint() -> str:
    """What the actors were created under: a digest of the model and embedder settings (never a key itself) and of the
    code (every module's size and mtime), so an upgrade or an edit replaces a runtime running older code."""
    from soul_runtime.plugins import settings_env
    h = hashlib.sha256()
    for k, v in sorted(settings_env().items()):
        h.update(f"{k}={v}\0".encode())
    root = Path(__file__).resolve().parents[1]
    for pkg in ("actors", "soul_runtime"):
        for f in sorted((root / pkg).rglob("*.py")):
            st = f.stat()
            h.update(f"{f.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:16]


def attach(data_dir: str, *, replace: bool = False) -> tuple[str, bool]:
    """(address for ``connect``, started now) of the data dir's local head, started when needed.

    Sets this process's Ray auth variables for the head's token: its own token file, never a token of the
    user's (``RAY_AUTH_TOKEN``, which Ray prefers to any file, is dropped from this process's environment; a
    ``~/.ray/auth_token`` is not read). A Ray already loaded here reads them again at the connect
    (:func:`actors.auth_token.reload_in_ray`)."""
    from soul_runtime.errors import RuntimeUnavailable

    from . import local_cluster as lc
    try:
        info, started = lc.ensure_head(state_dir(data_dir), fingerprint=fingerprint(), num_cpus=os.cpu_count() or 2,
                                       resources={"soul_slot": 16}, replace=replace)
    except (RuntimeError, ValueError) as e:
        raise RuntimeUnavailable(f"could not start the local runtime: {str(e).splitlines()[0]}") from None
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ.update(lc.client_env(info))
    return info.gcs_address, started


def running(data_dir: str) -> bool:
    from . import local_cluster as lc
    return lc.head_alive(state_dir(data_dir))


def stop(data_dir: str) -> bool:
    """Stop the data dir's local head and everything it started; False when none was recorded."""
    from . import local_cluster as lc
    return lc.stop_head_locked(state_dir(data_dir))
