"""The packages install as the READMEs say, and the READMEs' service examples run against a real ``soul serve``.

How this mirrors a user's install, and where it does not:

- Python: the wheel is built from a copy of this checkout (``pip wheel``, as ``pip install .`` builds it) and
  installed with ``--no-deps --no-index`` into a fresh venv. Its dependencies are not downloaded again: the fresh
  venv sees this test's own site-packages (a ``.pth`` line, listed after the venv's own site-packages), where
  ``pip install -e ".[test,bench,serve]"`` put them; the editable install of the checkout there is not seen (the
  line adds a path, its ``.pth`` files are not run), and ``PYTHONPATH`` is unset, so ``soul_runtime`` and
  ``actors`` are imported from the wheel — checked. The README's service example (its ``curl`` and its Python
  block) runs verbatim with that venv's python, but for the port: the shared ``soul serve`` of the tests listens
  on a free port, not on 8000.
- TypeScript: a copy of ``clients/typescript`` (with ``node_modules`` if the tests already installed its dev
  dependencies there, which saves a download; without it the package's ``prepare`` installs them from the lock
  file) sits in a fresh ``soul-runtime`` folder beside a fresh ``my-app``; the client README's install lines run
  verbatim in bash (``npm pack`` builds ``dist/`` on ``prepare``), then its first example, verbatim but for the
  port, as an ES module under Node.

The server is the one tests/conftest.py's ``served_pair`` shares with the inspector's and the clients' tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.inspector_browser import Served

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(".git", "node_modules", "dist", "build", "*.egg-info", "__pycache__", ".*_cache",
                                 ".venv", "bench-results")
DEFAULT_URL = "http://127.0.0.1:8000"


def _run(args: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    p = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{' '.join(args)} exited {p.returncode}\n{p.stdout[-10000:]}\n{p.stderr[-10000:]}"
    return p.stdout


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
           and not k.startswith(("SOUL_", "RAY_AUTH"))}
    env.update(extra)
    return env


def _blocks(markdown: str, lang: str) -> list[str]:
    """The fenced code blocks of ``lang`` in ``markdown``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", markdown, re.S | re.M)


def _section(markdown: str, heading: str) -> str:
    start = markdown.index(heading)
    end = markdown.find("\n## ", start + len(heading))
    return markdown[start:end if end > 0 else None]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout installed in it."""
    base = tmp_path_factory.mktemp("wheel")
    src, wheels, env_dir = base / "soul-runtime", base / "wheels", base / "venv"
    shutil.copytree(ROOT, src, ignore=IGNORED)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(src)], base, 600,
         _clean_env())  # build isolation, as `pip install .` builds: the build backend pyproject.toml names
    [wheel] = wheels.glob("soul_runtime-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for carried in ("soul_apps/service/ui_dist/index.html", "soul_apps/service/ui_dist/app.js",
                    "soul_apps/service/ui_dist/app.css", "soul_runtime/embedding/data/minilm-l6-v2-vocab.txt",
                    "soul_runtime/embedding/data/minilm-l6-v2-NOTICE.txt"):
        assert carried in names, f"the wheel lacks {carried}"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], base, 300, _clean_env())
    py = env_dir / "bin" / "python"
    own = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base, 60,
                    _clean_env()).strip())
    (own / "deps-of-the-test-venv.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet", "--no-deps", "--no-index",
          str(wheel)], base, 600, _clean_env())
    return env_dir


def test_wheel_installs_and_runs_from_its_own_files(venv: Path, tmp_path: Path) -> None:
    """The installed package is the wheel's (not the checkout's), its ``soul`` command runs, and the default
    embedder embeds from the data the wheel carries."""
    py = venv / "bin" / "python"
    out = json.loads(_run([str(py), "-c", """
import json, soul_runtime, actors
from importlib.resources import files
from soul_runtime.embedding.choice import default_embedder
v = default_embedder().embed(["The production database for Tendril is Postgres 16."])
print(json.dumps({"soul_runtime": soul_runtime.__file__, "actors": actors.__file__, "dim": int(v.shape[1]),
                  "ui": files("soul_apps.service").joinpath("ui_dist/index.html").is_file()}))
"""], tmp_path, 300, _clean_env()))
    for name in ("soul_runtime", "actors"):
        assert out[name].startswith(str(venv)), out
    assert out["ui"] and out["dim"] == 384
    assert "demo" in _run([str(venv / "bin" / "soul"), "--help"], tmp_path, 120, _clean_env())


def test_readme_service_example_with_the_wheel(venv: Path, served_pair: Served, tmp_path: Path) -> None:
    """README.md's service section: its ``curl`` turn, then its Python block over HTTP, as written (the port
    aside), with the wheel's python and a tenant's key in ``SOUL_API_KEY``."""
    section = _section((ROOT / "README.md").read_text(), "## As a service")
    [shell] = _blocks(section, "bash")
    [python] = _blocks(section, "python")
    curl = shell[shell.index("curl "):].replace(DEFAULT_URL, served_pair.url)
    env = _clean_env(SOUL_API_KEY=served_pair.keys["acme"])
    turn = json.loads(_run(["bash", "-c", "set -euo pipefail\n" + curl], tmp_path, 300, env))
    assert turn["turn_id"].startswith("maya/") and turn["reply"], turn
    assert DEFAULT_URL in python
    out = _run([str(venv / "bin" / "python"), "-c", python.replace(DEFAULT_URL, served_pair.url)], tmp_path, 300, env)
    assert "Postgres 16" in out, out


@pytest.mark.skipif(not (shutil.which("node") and shutil.which("npm")), reason="needs Node.js >= 20 and npm")
def test_typescript_package_installs_as_its_readme_says(served_pair: Served, tmp_path: Path) -> None:
    """clients/typescript/README.md: ``npm pack`` in a checkout (dist/ built by ``prepare``), ``npm install`` of
    the tarball into an app, then the README's first example run as written (the port aside)."""
    pkg = ROOT / "clients" / "typescript"
    readme = (pkg / "README.md").read_text()
    [install] = [b for b in _blocks(readme, "sh") if "npm pack" in b]
    example = next(b for b in _blocks(readme, "ts") if '"@soul-runtime/client"' in b)
    checkout = tmp_path / "soul-runtime"
    shutil.copytree(pkg, checkout / "clients" / "typescript", ignore=shutil.ignore_patterns("dist", "node_modules"))
    if (pkg / "node_modules" / "typescript").is_dir():  # the dev dependencies the tests installed: no download
        shutil.copytree(pkg / "node_modules", checkout / "clients" / "typescript" / "node_modules", symlinks=True)
    app = tmp_path / "my-app"
    app.mkdir()
    _run(["npm", "init", "-y"], app, 120)  # the user's own app
    env = _clean_env(npm_config_audit="false", npm_config_fund="false", npm_config_update_notifier="false")
    _run(["bash", "-c", "set -euo pipefail\n" + install], tmp_path, 600, env)
    installed = app / "node_modules" / "@soul-runtime" / "client"
    assert (installed / "dist" / "index.js").is_file() and not installed.is_symlink()
    assert not (pkg / "dist").exists() or "dist" not in _run(["git", "ls-files", "dist"], pkg, 60), \
        "dist/ is committed"
    (app / "example.mjs").write_text(example.replace(DEFAULT_URL, served_pair.url)
                                     + '\nconsole.log(JSON.stringify({ recalled: items.map((i) => i.text) }));\n')
    out = _run(["node", "example.mjs"], app, 300, {**env, "SOUL_API_KEY": served_pair.keys["beta"]})
    first, last = out.strip().splitlines()[0], out.strip().splitlines()[-1]
    assert re.search(r" maya/\d+$", first), out  # console.log(res.reply, res.turn_id)
    assert any("Postgres 16" in t for t in json.loads(last)["recalled"]), out
