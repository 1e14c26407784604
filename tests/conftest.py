"""Shared fixtures. Unit tests may not start Ray; tests marked ``ray`` share one local runtime."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# keep Ray's session directories out of /tmp/ray and AF_UNIX paths short
_RAY_TMP = tempfile.mkdtemp(prefix="rt", dir="/tmp")
os.environ.setdefault("RAY_TMPDIR", _RAY_TMP)
os.environ.pop("ANTHROPIC_API_KEY", None)  # tests run on the offline model unless they set one up


HANG_S = 1200.0
"""A hang guard, not a time limit (the slowest test takes about 6 minutes on 2 cores): a test still running after
this long has every thread's stack written and the run ends. The dump comes from faulthandler's own thread, which
needs no interpreter lock, so a run stuck in C code (a lock, a socket, Ray's core worker) ends too, saying where.
It goes to the file ``SOUL_HANG_DUMP`` names (.ci/run prints it last), else to the terminal's stderr."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    import faulthandler

    path = os.environ.get("SOUL_HANG_DUMP")
    out = open(path, "w", encoding="utf-8") if path else None  # noqa: SIM115 — open for the test
    if out is not None:
        out.write(f"running {item.nodeid}\n")
        out.flush()
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=out if out is not None else _STDERR[0])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
        if out is not None:
            out.close()


@pytest.fixture(autouse=True)
def _no_ray_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("ray") is None:
        import ray

        def forbidden(*a: object, **k: object) -> None:
            raise AssertionError("unit tests must not start Ray: mark the test with @pytest.mark.ray")
        monkeypatch.setattr(ray, "init", forbidden)


@pytest.fixture(scope="session")
def runtime() -> Iterator[object]:
    """One local Ray runtime (offline model) for all Ray tests of the session; stopped once the last test that
    uses this process's Ray is done (:data:`RAY_MODULES`), not at the end of the session."""
    import soul_runtime
    data = Path(tempfile.mkdtemp(prefix="soul-data-"))
    rt = soul_runtime.connect(data_dir=str(data), host_capacity=8, idle_passivate_s=3600)
    _shared["runtime"].callback(rt.close)
    yield rt
    _shared["runtime"].close()


_counter = iter(range(1_000_000))


@pytest.fixture
def soul_id(request: pytest.FixtureRequest) -> str:
    """A fresh soul id per test (souls share the session runtime)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"{name}-{next(_counter)}"


RAY_MODULES = ("test_bad_input.py", "test_channel.py", "test_cluster_failover.py", "test_faults.py",
               "test_isolation.py", "test_many_souls.py", "test_ordering.py", "test_public_api.py", "test_runtime.py",
               "test_user_models_on_ray.py", "test_inspector.py", "test_typescript_client.py", "test_install.py",
               "test_http_client.py")
"""The modules whose tests use this process's Ray (the session's :func:`runtime`, or runtimes of other namespaces
joined to its Ray), in the order they run: next to each other, where the first of them was collected, so that Ray
stops after the last of them instead of idling through the rest of the session (an idle runtime takes a sixth of
a core: 3-4 s more for each fresh head of tests/test_cluster_heads.py). The modules that share one ``soul serve``
are among them, last (tests/test_http_client.py compares it with the session's runtime)."""
SERVED_PAIR_MODULES = ("test_inspector.py", "test_typescript_client.py", "test_install.py", "test_http_client.py")
"""The modules that share one ``soul serve`` with tenants ``acme`` and ``beta`` (:func:`served_pair`), in the order
of :data:`RAY_MODULES`. Each test there makes souls of its own (fresh ids) and asserts only on them, so the service
need not be started for each module (a start and a stop cost 30 s); a test marked ``stops_shared_service`` runs
last of theirs, and the service stops after the last of them."""
SERVICE_MODULES = ("test_service.py", "test_openapi.py", "test_local_exposure.py")
"""The modules that share tests/test_service.py's ``soul serve`` (:func:`shared_service`), in the order they run:
test_service's own tests on a fresh service first, then test_openapi's (a schemathesis run makes souls of its own),
then test_local_exposure's (the ports it listens on), then test_service's test marked ``stops_shared_service``, which stops it."""
GROUPS = (RAY_MODULES, SERVICE_MODULES)
_shared = {"runtime": contextlib.ExitStack(), "served_pair": contextlib.ExitStack(),
           "shared_service": contextlib.ExitStack()}
_last_user: dict[str, str] = {}
"""The node id of the last test that needs each of :data:`_shared` (set once the tests are ordered)."""


_STDERR: list[int] = [2]
"""The terminal's stderr, as it was before pytest captured the tests' output (see :data:`HANG_S`)."""


def pytest_configure(config: pytest.Config) -> None:
    _STDERR[0] = os.dup(2)
    config.addinivalue_line("markers", "stops_shared_service: stops a soul serve that the modules of its group share "
                                       "(runs last of their tests)")


def _needs(item: pytest.Item, what: str) -> bool:
    if what == "runtime" and item.path.name in RAY_MODULES:
        return True
    return what in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of each of :data:`GROUPS` run next to each other, module by module in the group's order (a test
    marked ``stops_shared_service`` last of the group), where the first of them was collected."""
    for group in GROUPS:
        users = [i for i in items if i.path.name in group]
        if not users:
            continue
        at = items.index(users[0])
        moved = {id(i) for i in users}
        rest = [i for i in items if id(i) not in moved]
        users.sort(key=lambda i: (i.get_closest_marker("stops_shared_service") is not None,
                                  group.index(i.path.name)))  # stable: each module's own order stays
        items[:] = rest[:at] + users + rest[at:]
    for what in _shared:
        last = [i.nodeid for i in items if _needs(i, what)]
        if last:
            _last_user[what] = last[-1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """With ``SOUL_SLOW_IDS`` set (.ci/run), the ids of the tests marked ``slow`` are written to that file, a line
    each, so CI reports the slow part of the suite without collecting it a second time."""
    path = os.environ.get("SOUL_SLOW_IDS")
    if path:
        Path(path).write_text("".join(f"{i.nodeid}\n" for i in session.items if i.get_closest_marker("slow")))


@pytest.fixture(scope="session")
def served_pair() -> Iterator[Any]:
    """``soul serve`` on a fresh data dir with tenants ``acme`` and ``beta`` (:func:`tests.inspector_browser.served`:
    Serve's Python proxy ingress), for the modules of :data:`SERVED_PAIR_MODULES`; stopped by its pid (its runtime by
    ``soul down``) once the last test of theirs is done."""
    from tests.inspector_browser import served
    srv = _shared["served_pair"].enter_context(served(("acme", "beta")))
    yield srv
    _shared["served_pair"].close()


@pytest.fixture(scope="session")
def shared_service() -> Iterator[dict[str, Any]]:
    """tests/test_service.py's ``soul serve`` (tenants acme and beta), for the modules of :data:`SERVICE_MODULES`;
    stopped once the last test of theirs is done."""
    from tests.test_service import running_service
    srv = _shared["shared_service"].enter_context(running_service())
    yield srv
    _shared["shared_service"].close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    for what, stack in _shared.items():
        if _last_user.get(what) == item.nodeid:
            stack.close()  # the last test that needs it is done: it goes now, not at the end of the session


STORAGE_CONTRACT_MODULES = ("test_stores.py", "test_storage_contract.py")
"""Modules whose tests run on both storages: SQLite files, and PostgreSQL rows behind node-local caches."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.module.__name__.rsplit(".", 1)[-1] + ".py" in STORAGE_CONTRACT_MODULES and \
            "pg" not in metafunc.fixturenames:  # a test on PostgreSQL alone takes ``pg``
        metafunc.parametrize("backend", ["local", "postgresql"], indirect=True)


@pytest.fixture(autouse=True)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The storage this process's databases use for the test: ``local`` unless the module is a storage contract
    module (:data:`STORAGE_CONTRACT_MODULES`), whose tests run once on each; a PostgreSQL run gets a fresh
    database of the tests' server (tests/pg.py)."""
    from soul_runtime.memory import pg_cache
    from soul_runtime.memory.sqlite_db import use_storage

    kind = getattr(request, "param", "local")
    if kind == "local":
        yield "local"
        return
    from tests.pg import fresh_database
    url = fresh_database()
    use_storage(url)
    try:
        yield url
    finally:
        use_storage("local")
        pg_cache.forget_known()
