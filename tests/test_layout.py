"""The packages as bands and the layering rule of docs/architecture.md ("Packages as bands", "The layering rule"),
checked on every import of every module.

The bands, bottom up, each importing only the bands below it: the core (package ``soul_runtime``: imports neither
``ray`` nor another band), the Ray layer (``actors``: the actors and their plumbing), the applications
(``soul_apps``, and the application modules ``actors`` still holds: ``APP_MODULES``).

Inside them, the layers:

- the core — foundation (errors, config, records, clock, text, ...), ``embedding``, ``models``, ``memory``,
  ``loop`` — never imports ``ray`` or ``actors``;
- the handles' API (``soul_runtime/soul_api.py``, ``soul_runtime/soul_args.py``: every handle method once, with
  its argument checks) sits on the core, and the two transports that run it sit on both: ``actors`` (the Ray
  layer; only the modules of ``RAY_USERS`` talk to Ray) and the HTTP client (``soul_runtime/http_client``, which
  never imports Ray or ``actors`` either);
- the applications sit above ``actors``: the HTTP service (``soul_apps/service``), the command line
  (``soul_apps/cli``) and the benchmarks (``soul_apps/bench``); nothing below them imports them;
- the front door (``soul_runtime/__init__.py``) names the core's types and loads a transport lazily: the HTTP
  client, or the Ray runtime by its entry point (never by an import of ``actors``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# layer -> the layers it may import (besides itself)
FOUNDATION = "soul_runtime"  # errors, config, records, clock, text
API = "soul_runtime.__init__"  # the front door: `connect` finds the Ray runtime by entry point; it names the result types
SERVICE = "soul_apps.service"
HANDLES = "soul_runtime.soul_api"  # soul_api.py and soul_args.py: the handles' methods and checks, once
HTTP_CLIENT = "soul_runtime.http_client"
CORE = {FOUNDATION, "soul_runtime.embedding", "soul_runtime.models", "soul_runtime.memory", "soul_runtime.loop"}
NO_RAY = CORE | {HANDLES, HTTP_CLIENT, API}  # never import ray or actors
APPS = "soul_apps"  # the applications' package itself (its __init__)
CLUSTER = "local cluster management"
CLUSTER_MODULES = ("soul_apps.cluster", "soul_apps.cluster.local_cluster", "soul_apps.cluster.local_runtime", "soul_apps.cluster.listening_ports")
APPLICATIONS = {SERVICE, CLUSTER, "soul_apps.cli", "soul_apps.bench", APPS}
ALLOWED: dict[str, set[str]] = {
    FOUNDATION: set(),
    "soul_runtime.embedding": {FOUNDATION},
    "soul_runtime.models": {FOUNDATION},
    "soul_runtime.memory": {FOUNDATION, "soul_runtime.embedding"},
    "soul_runtime.loop": {FOUNDATION, "soul_runtime.embedding", "soul_runtime.models", "soul_runtime.memory"},
    HANDLES: set(CORE),
    "actors": {*CORE, HANDLES},
    HTTP_CLIENT: {*CORE, HANDLES},
    SERVICE: {*CORE, HANDLES, "actors"},
    CLUSTER: {*CORE, HANDLES, "actors"},
    "soul_apps.bench": {*CORE, HANDLES, "actors", HTTP_CLIENT, SERVICE, CLUSTER, API},
    "soul_apps.cli": {*CORE, HANDLES, "actors", HTTP_CLIENT, SERVICE, CLUSTER, "soul_apps.bench", API},
    API: {FOUNDATION, "soul_runtime.loop", HANDLES, HTTP_CLIENT},
    APPS: set(),
}

# the bands, bottom up
BANDS = ("core", "ray layer", "applications")
APP_MODULES: tuple[str, ...] = ()
"""Application modules the package ``actors`` holds (none)."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _band(module: str) -> str | None:
    top = module.split(".")[0]
    if top == "soul_apps" or any(module == m or module.startswith(m + ".") for m in APP_MODULES):
        return "applications"
    return {"soul_runtime": "core", "actors": "ray layer"}.get(top)


def _layer(module: str) -> str | None:
    if module == "soul_runtime":
        return API
    if any(module == m or module.startswith(m + ".") for m in CLUSTER_MODULES):
        return CLUSTER
    parts = module.split(".")
    if parts[0] == APPS:
        candidate = ".".join(parts[:2])
        return candidate if candidate in ALLOWED else APPS
    if parts[0] == "actors":
        return SERVICE if parts[:2] == ["actors", "service"] else "actors"
    if parts[0] != "soul_runtime":
        return None
    candidate = ".".join(parts[:2])
    if candidate in ("soul_runtime.soul_api", "soul_runtime.soul_args"):
        return HANDLES
    return candidate if candidate in ALLOWED else FOUNDATION


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth of the file (lazy imports count too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != "soul_runtime":  # `from soul_runtime import text` names the module, not the front door
                out.append(target)
            out += [f"{target}.{a.name}" for a in node.names]  # `from pkg import module`
    return out


def _sources() -> list[Path]:
    return sorted(p for d in ("soul_runtime", "actors", "soul_apps") for p in (ROOT / d).rglob("*.py"))


def _upward(path: Path) -> list[str]:
    """The imports of ``path`` that reach a band above its own."""
    mine = _band(_module_name(path))
    assert mine is not None, path
    return [target for target in _imports(path)
            if (theirs := _band(target)) is not None and BANDS.index(theirs) > BANDS.index(mine)]


def test_each_package_is_a_band_and_imports_only_the_bands_below() -> None:
    bad = [f"{path.relative_to(ROOT)} imports {', '.join(up)}" for path in _sources() if (up := _upward(path))]
    assert not bad, "\n".join(bad)
    assert {_band(_module_name(p)) for p in _sources()} == set(BANDS)


def test_the_band_check_sees_an_import_up(tmp_path: Path) -> None:
    """Not vacuous: a core module importing an application, and a Ray-layer module importing one, are caught."""
    probes = [ROOT / "soul_runtime" / "_band_probe.py", ROOT / "actors" / "_band_probe.py"]
    try:
        for probe in probes:
            probe.write_text("def f():\n    from soul_apps.cli import main\n    from soul_apps.service import app\n")
            assert _upward(probe) == ["soul_apps.cli", "soul_apps.cli.main", "soul_apps.service", "soul_apps.service.app"]
    finally:
        for probe in probes:
            probe.unlink(missing_ok=True)


def test_imports_go_one_way() -> None:
    bad = []
    for path in _sources():
        mine = _layer(_module_name(path))
        assert mine is not None
        for target in _imports(path):
            theirs = _layer(target)
            if theirs is None or theirs == mine:
                continue
            if theirs not in ALLOWED[mine]:
                bad.append(f"{path.relative_to(ROOT)} ({mine}) imports {target} ({theirs})")
    assert not bad, "\n".join(bad)


def test_the_core_never_imports_ray_or_the_ray_layer() -> None:
    bad = []
    for path in _sources():
        if _layer(_module_name(path)) not in NO_RAY:
            continue
        for target in _imports(path):
            if target.split(".")[0] in ("ray", "actors"):
                bad.append(f"{path.relative_to(ROOT)} imports {target}")
    assert not bad, "\n".join(bad)


RAY_USERS = {
    "actors/raycalls.py",  # every call into Ray, and the local start
    "actors/client_session.py",  # Ray Client sessions (ray://)
    "actors/ray_addresses.py",  # Ray's loopback switch while it starts, the GCS addresses on this machine
    "soul_apps/service/serve_app.py",  # Ray Serve: the HTTP service's deployment
    "soul_apps/service/loopback.py",  # Ray Serve's HAProxy and replica ports kept on loopback with the service
}


def test_only_the_named_modules_import_ray() -> None:
    users = {str(p.relative_to(ROOT)) for p in _sources()
             if any(t.split(".")[0] == "ray" for t in _imports(p))}
    assert users == RAY_USERS


def test_the_allowed_graph_has_no_cycles() -> None:
    seen: dict[str, int] = {}

    def visit(node: str, stack: tuple[str, ...]) -> None:
        assert node not in stack, f"cycle: {' -> '.join(stack + (node,))}"
        if seen.get(node):
            return
        for dep in ALLOWED[node]:
            visit(dep, stack + (node,))
        seen[node] = 1

    for layer in ALLOWED:
        visit(layer, ())


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The rules are not vacuous: a core module importing the Ray layer is caught."""
    fake = ROOT / "soul_runtime" / "memory" / "_layout_probe.py"
    fake.write_text("def f():\n    from actors import raycalls\n    import ray\n")
    try:
        imports = _imports(fake)
        assert "actors.raycalls" in imports and "ray" in imports
        assert _layer(_module_name(fake)) == "soul_runtime.memory"
        assert "actors" not in ALLOWED["soul_runtime.memory"]
    finally:
        fake.unlink()


def test_nothing_below_the_applications_imports_them() -> None:
    assert set(ALLOWED) == NO_RAY | APPLICATIONS | {"actors", API}
    for layer, allowed in ALLOWED.items():
        if layer not in APPLICATIONS:
            assert not allowed & APPLICATIONS, layer
    assert _layer("soul_apps.service.http_api") == SERVICE and _layer("actors.routing") == "actors"
    assert _layer("soul_apps.cli.main") == "soul_apps.cli" and _layer("soul_runtime.limits") == FOUNDATION
    assert _layer("soul_runtime.soul_args") == HANDLES and _layer("soul_runtime.http_client.wire") == HTTP_CLIENT
