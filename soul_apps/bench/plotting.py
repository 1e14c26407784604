"""The benchmarks' PNG plots: matplotlib comes with the ``bench`` extra and is imported only to draw one."""

from __future__ import annotations

import importlib
from types import ModuleType

from soul_runtime.errors import ConfigError

HINT = "a plot needs matplotlib: pip install 'soul-runtime[bench]' (or pip install matplotlib)"


def require() -> None:
    """Fail at once, before a long benchmark runs, when its plot could not be drawn."""
    pyplot()


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend, or :class:`ConfigError` saying how to get it."""
    try:
        matplotlib = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        return importlib.import_module("matplotlib.pyplot")
    except ImportError:
        raise ConfigError(HINT) from None
