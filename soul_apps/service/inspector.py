"""The memory inspector: the static pages ``soul serve`` serves at ``/ui/``.

The pages are built from ``ui/`` (TypeScript, Preact, esbuild) into ``ui_dist/`` beside this module, which ships in
the package: serving them needs no Node.js. They hold no data and no key: the browser asks for the tenant's key
once per session (kept in its ``sessionStorage``, never in a URL) and reads everything through the ``/v1`` API with
it, so a page can show only what ``/v1`` answers that key. The mount is a route of its own after every ``/v1`` route:
a ``/v1`` request is matched before it is ever tried.

Served by default; ``soul serve --no-inspector`` (or the env ``SOUL_INSPECTOR=off``; ``inspector: false`` in a Serve
config file's ``args``) leaves the mount out: ``/ui/`` is then a 404 and every other route is as it was.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from soul_runtime.errors import InvalidInput

DIST = Path(__file__).with_name("ui_dist")
PREFIX = "/ui"
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
                               "script-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
"""Sent with every file: the pages run only their own script, talk only to their own origin, and are never framed."""
ENV = "SOUL_INSPECTOR"
"""``soul serve``'s default for ``--inspector``/``--no-inspector``: ``on`` or ``off`` (also 1/0, true/false, yes/no)."""
_ON, _OFF = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def parse_env(value: str | None) -> bool:
    """Whether :data:`ENV`'s value asks for the inspector (unset or empty: yes); InvalidInput for a value that is
    neither on nor off."""
    v = (value or "").strip().lower()
    if v in ("", *_ON):
        return True
    if v in _OFF:
        return False
    raise InvalidInput(f"{ENV} must be on or off (1/0, true/false, yes/no), got {value!r}")


class InspectorFiles(StaticFiles):
    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def mount_inspector(app: FastAPI, directory: Path = DIST) -> FastAPI:
    """Serve the built pages at ``/ui/`` (``/ui`` redirects there)."""
    app.mount(PREFIX, InspectorFiles(directory=directory, html=True, check_dir=False), name="inspector")
    return app
