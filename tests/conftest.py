"""Shared fixtures. Unit tests may not start Ray; tests marked ``ray`` share one local runtime."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# keep Ray's session directories out of /tmp/ray and AF_UNIX paths short
_RAY_TMP = tempfile.mkdtemp(prefix="rt", dir="/tmp")
os.environ.setdefault("RAY_TMPDIR", _RAY_TMP)
os.environ.pop("ANTHROPIC_API_KEY", None)  # tests run on the offline model unless they set one up


@pytest.fixture(autouse=True)
def _no_ray_in_unit_tests(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("ray") is None:
        import ray

        def forbidden(*a: object, **k: object) -> None:
            raise AssertionError("unit tests must not start Ray: mark the test with @pytest.mark.ray")
        monkeypatch.setattr(ray, "init", forbidden)


@pytest.fixture(scope="session")
def runtime() -> Iterator[object]:
    """One local Ray runtime (offline model) for all Ray tests of the session."""
    import soul_runtime
    data = Path(tempfile.mkdtemp(prefix="soul-data-"))
    rt = soul_runtime.connect(data_dir=str(data), host_capacity=8, idle_passivate_s=3600)
    yield rt
    rt.close()


_counter = iter(range(1_000_000))


@pytest.fixture
def soul_id(request: pytest.FixtureRequest) -> str:
    """A fresh soul id per test (souls share the session runtime)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60].strip("-")
    return f"{name}-{next(_counter)}"
