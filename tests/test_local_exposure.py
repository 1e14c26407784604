"""The embedded default keeps to the machine and to its owner.

Unit tests: the owner-only file helpers (under umask 000, so an ambient umask cannot make
them pass), the loose-mode warning, the token-file rules, and the /proc socket reader checked
against sockets this test opens itself.
Ray test: ``soul_runtime.connect()`` with no address, run the way a user runs it (a fresh
process, a fresh HOME with no Ray token, a data dir that does not exist yet): every socket
its processes listen on is loopback, the data dir holds nothing group/other can read, and
the token file Ray wrote is 0600.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from actors import auth_token
from soul_apps.cluster import listening_ports
from soul_runtime.owner_only import create_file, loose_entries, make_dir, warn_if_loose, write_file

ROOT = Path(__file__).resolve().parents[1]


def mode(p: str | os.PathLike[str]) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# ---- owner-only files (no Ray) -------------------------------------------------------------

def test_helpers_create_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):  # a plain mkdir/open would give 0777/0666 here
        d = make_dir(tmp_path / "a" / "b" / "c")
        f = write_file(d / "export.soul", b"the soul's memory")
        e = create_file(tmp_path / "a" / "x" / "empty.sqlite")
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", d, tmp_path / "a" / "x")] == [0o700] * 4
    assert mode(f) == 0o600 and f.read_bytes() == b"the soul's memory"
    assert mode(e) == 0o600 and e.stat().st_size == 0
    os.chmod(tmp_path, 0o755)
    before = mode(tmp_path)
    make_dir(tmp_path)
    assert mode(tmp_path) == before == 0o755  # an existing directory keeps its mode
    assert sorted(p.name for p in d.iterdir()) == ["export.soul"]  # no temp file left behind


def test_sqlite_and_index_files_are_owner_only(tmp_path: Path) -> None:
    from soul_runtime.config import MemoryConfig
    from soul_runtime.memory.episodic import EpisodicStore
    from tests.fakes import HashEmbedder

    with umask(0):
        store = EpisodicStore(tmp_path / "souls" / "s1", HashEmbedder(), MemoryConfig())
        store.flush()
        files = sorted(p.name for p in (tmp_path / "souls" / "s1").iterdir())
        store.close()
    assert {"episodic.sqlite", "episodic.sqlite-wal", "episodic.sqlite-shm", "episodic.usearch"} <= set(files)
    assert loose_entries(tmp_path / "souls") == ([], False)


def test_a_loose_data_dir_gets_one_warning_line_and_keeps_its_modes(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    (data / "souls" / "s1").mkdir(parents=True)
    os.chmod(data, 0o755)
    (data / "souls" / "s1" / "episodic.sqlite").write_bytes(b"x")
    os.chmod(data / "souls" / "s1" / "episodic.sqlite", 0o644)
    with caplog.at_level(logging.WARNING, logger="soul_runtime"):
        line = warn_if_loose(data)
    assert line is not None and "\n" not in line and str(data) in line and "chmod -R go-rwx" in line
    assert [r.getMessage() for r in caplog.records] == [line]
    assert mode(data) == 0o755 and mode(data / "souls" / "s1" / "episodic.sqlite") == 0o644  # not "fixed"
    found, partial = loose_entries(data)
    assert not partial and {p for p, _ in found} >= {str(data), str(data / "souls" / "s1" / "episodic.sqlite")}

    tight = make_dir(tmp_path / "tight")
    write_file(tight / "f", "x")
    caplog.clear()
    assert warn_if_loose(tight) is None and not caplog.records


def test_token_file_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".ray" / "auth_token"
    assert auth_token.token_file({}) == default
    assert auth_token.token_file({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "t")}) == tmp_path / "t"
    assert auth_token.token_file({"RAY_AUTH_TOKEN": "abc", "RAY_AUTH_TOKEN_PATH": "x"}) is None
    assert auth_token.token_file({"RAY_AUTH_MODE": "disabled"}) is None

    # a file the start created looser (as Ray writes it under umask 022) is made 0600
    default.parent.mkdir()
    default.write_text("t" * 64)
    os.chmod(default, 0o644)
    assert auth_token.secure_after_start(default, existed_before=False) is None
    assert mode(default) == 0o600
    # one that was there before is reported, not changed
    os.chmod(default, 0o640)
    with caplog.at_level(logging.WARNING, logger="soul_runtime"):
        line = auth_token.secure_after_start(default, existed_before=True)
    assert line and "chmod 600" in line and mode(default) == 0o640
    with umask(0):
        made = auth_token.new_token_file(tmp_path / "new" / "tok")
    assert mode(made) == 0o600 and mode(made.parent) == 0o700 and len(made.read_text()) == 64


def test_socket_reader_sees_what_this_process_listens_on() -> None:
    lo = socket.socket()
    anyv4 = socket.socket()
    v6 = socket.socket(socket.AF_INET6)
    try:
        lo.bind(("127.0.0.1", 0))
        anyv4.bind(("0.0.0.0", 0))
        v6.bind(("::", 0))
        for s in (lo, anyv4, v6):
            s.listen()
        ports = {s.getsockname()[1]: s for s in (lo, anyv4, v6)}
        found = {x.port: x for x in listening_ports.listeners({os.getpid()}) if x.port in ports}
        assert set(found) == set(ports)
        assert found[lo.getsockname()[1]].loopback and found[lo.getsockname()[1]].host == "127.0.0.1"
        assert not found[anyv4.getsockname()[1]].loopback and found[anyv4.getsockname()[1]].host == "every interface"
        assert not found[v6.getsockname()[1]].loopback
        assert os.getpid() in listening_ports.descendants(os.getppid())
    finally:
        for s in (lo, anyv4, v6):
            s.close()


def test_loopback_hook_only_for_a_loopback_service_on_one_node() -> None:
    from soul_apps.service import loopback
    assert loopback.controller_env("127.0.0.1", 1) == {loopback.HOOK_ENV: "soul_apps.service.loopback.bind_loopback",
                                                       loopback.HOST_ENV: "127.0.0.1"}
    assert loopback.controller_env("localhost", 1)[loopback.HOST_ENV] == "127.0.0.1"
    assert loopback.controller_env("127.0.0.1", 2) == {} and loopback.controller_env("0.0.0.0", 1) == {}


def test_loopback_hook_rewrites_servers_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the Serve this project pins: HAProxy's stats and metrics binds and the replica's gRPC address become the
    service's loopback address (the hook warns, and the Ray test below fails, if Serve's template changes)."""
    from ray.serve._private import haproxy, replica

    from soul_apps.service import loopback
    monkeypatch.setattr(haproxy, "HAPROXY_CONFIG_TEMPLATE", haproxy.HAPROXY_CONFIG_TEMPLATE)
    monkeypatch.setattr(replica, "add_port_to_grpc_server", lambda server, address: address)
    monkeypatch.setenv(loopback.HOST_ENV, "127.0.0.1")
    assert all(bind in haproxy.HAPROXY_CONFIG_TEMPLATE for bind in loopback.BINDS)
    loopback.bind_loopback()
    assert "bind 127.0.0.1:{{ config.stats_port }}" in haproxy.HAPROXY_CONFIG_TEMPLATE
    assert "bind 127.0.0.1:{{ config.metrics_port }}" in haproxy.HAPROXY_CONFIG_TEMPLATE
    assert not any(bind in haproxy.HAPROXY_CONFIG_TEMPLATE for bind in loopback.BINDS)
    assert replica.add_port_to_grpc_server(None, "[::]:0") == "127.0.0.1:0"
    assert replica.add_port_to_grpc_server(None, "10.0.0.1:9000") == "10.0.0.1:9000"


# ---- the embedded default, as a user runs it ------------------------------------------------

CHILD = textwrap.dedent("""
    import json, os, sys
    import soul_runtime
    rt = soul_runtime.connect(data_dir=sys.argv[1], hosts=1, episodic_shards=1)
    rt.soul("ada").turn("Our production database is Postgres 16, and I am Ada.", user="ada")
    print(json.dumps({"pid": os.getpid()}), flush=True)
    sys.stdin.readline()   # the test looks at the sockets meanwhile
    rt.close()
    print("closed", flush=True)
""")


class Embedded:
    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="rte", dir="/tmp"))
        self.home = self.base / "home"
        self.home.mkdir()
        self.data = self.base / "data"  # does not exist yet: connect() creates it
        self.ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "SOUL_"))}
        env.update(HOME=str(self.home), RAY_TMPDIR=self.ray_tmp, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, str(self.data)], env=env, cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"the embedded runtime did not start:\n{self.proc.communicate()[1][-3000:]}")
        self.pid = int(json.loads(line)["pid"])
        self.stopped = False

    def stop(self) -> None:
        if not self.stopped:
            out, err = self.proc.communicate("\n", timeout=120)
            self.stopped = True
            assert "closed" in out, err[-3000:]

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def embedded() -> Iterator[Embedded]:
    e = Embedded()
    try:
        yield e
    finally:
        e.cleanup()


@pytest.mark.ray
def test_embedded_default_listens_on_loopback_only(embedded: Embedded) -> None:
    found = listening_ports.listeners(listening_ports.descendants(embedded.pid))
    procs = " ".join(x.process for x in found)
    # not vacuous: the driver, the GCS, the raylet and the runtime's actors all listen somewhere
    assert "gcs_server" in procs and "raylet" in procs, found
    assert sum("LayerShard" in x.process or "SoulHost" in x.process or "RuntimeController" in x.process
               for x in found) >= 5, found
    exposed = [x for x in found if not x.loopback]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(map(str, exposed))


@pytest.mark.ray
def test_embedded_default_token_is_owner_only(embedded: Embedded) -> None:
    token = embedded.home / ".ray" / "auth_token"
    assert token.is_file() and len(token.read_text().strip()) == 64  # Ray wrote it: HOME had none
    assert mode(token) == 0o600 and mode(token.parent) == 0o700


@pytest.mark.ray
def test_embedded_default_data_dir_is_owner_only(embedded: Embedded) -> None:
    embedded.stop()  # closing saves the vector index too
    names = {p.name for p in embedded.data.rglob("*")}
    assert {"episodic.sqlite", "episodic.sqlite-wal", "soul.sqlite", "episodic.usearch"} <= names, names
    found, partial = loose_entries(embedded.data)
    assert not partial and not found, found
    assert mode(embedded.data) == 0o700
    # Ray's own session files (logs hold actor output) were written under umask 077 as well
    logs: list[Any] = [p for p in Path(embedded.ray_tmp).rglob("*") if p.is_file() and not p.is_symlink()]
    assert logs and not [p for p in logs if mode(p) & 0o077]


# ---- `soul serve` on loopback ----------------------------------------------------------------

@pytest.mark.ray
def test_service_on_loopback_listens_on_loopback_only(shared_service: dict[str, Any]) -> None:
    """tests/test_service.py's ``soul serve`` (the default host, 127.0.0.1; the default ingress): every port the
    runtime's processes listen on — the service's own, Serve's controller and proxy, each replica's HTTP and gRPC
    ports, HAProxy's frontend, stats and metrics — is on loopback."""
    from soul_apps.cluster import local_cluster, local_runtime
    info = local_cluster.head_info(local_runtime.state_dir(str(shared_service["data"])))
    assert info is not None
    pids: set[int] = set()
    for pid in json.loads(Path(info.pid_file).read_text())["pids"]:
        pids |= listening_ports.descendants(pid)
    found = listening_ports.listeners(pids)
    port = int(shared_service["url"].rsplit(":", 1)[1])
    log = (Path(shared_service["base"]) / "serve.log").read_text()
    by_port = {x.port: x for x in found}
    # not vacuous: the service's port, Serve's controller and a replica are among them
    assert port in by_port, found
    assert any("ServeController" in x.process for x in found) and any("ServeReplica" in x.process for x in found)
    if "haproxy ingress" in log:  # HAProxy's stats and metrics ports, as `soul serve` printed them when it last started
        printed = [int(p) for p in re.findall(r":(\d+)/(?:stats|metrics)\b", log)]  # (a restart soak starts it again)
        extra = printed[-2:]
        assert len(printed) % 2 == 0 and len(extra) == 2 and set(extra) <= set(by_port), (printed, found)
    exposed = [x for x in found if not x.loopback]
    assert not exposed, f"listening beyond loopback ({len(found)} ports in all):\n" + "\n".join(map(str, exposed))
    print(f"{len(found)} listening ports of the runtime and its service, all on loopback")
