"""Models and embedders named by the user, and the environment their settings travel in.

A name is one of

* a built-in short name (``auto``, ``offline``, ``anthropic``, ``openai`` for models; ``default``, ``fast``
  for embedders), handled by :mod:`soul_runtime.models.choice` and :mod:`soul_runtime.embedding.choice`;
* an import path ``package.module:attr`` (``attr`` may be dotted: ``module:Class.factory``);
* the name of an installed entry point in the group ``soul_runtime.models`` / ``soul_runtime.embedders``.

The import path or entry point names a class or a factory; :func:`build` calls it with the configured
arguments (``model_args`` / ``embedder_args``, a dict of str: keyword arguments) and checks what it made.
Every failure is one :class:`~soul_runtime.errors.ConfigError` that says what is wrong.

The settings a model or embedder reads from the environment reach every actor: :func:`settings_env` is
what a client forwards (and what the local runtime's fingerprint covers), the OpenTelemetry variables
(``OTEL_*``, :mod:`soul_runtime.telemetry`) with them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from soul_runtime.errors import ConfigError, SoulError

MODEL_GROUP = "soul_runtime.models"
EMBEDDER_GROUP = "soul_runtime.embedders"

SETTINGS_PREFIXES = ("SOUL_MODEL", "SOUL_EMBEDDER", "SOUL_ANTHROPIC_", "SOUL_OPENAI_", "ANTHROPIC_", "OPENAI_",
                     "OTEL_")
"""Environment variables with these prefixes are model or embedder settings, or OpenTelemetry's (``OTEL_``: every
actor exports its spans where the client does): a client forwards them to every actor. ``SOUL_MODEL_ENV`` (itself
forwarded) names more, comma-separated, for a model that reads others."""
EXTRA_ENV = "SOUL_MODEL_ENV"

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_SHORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def check_name(name: object, what: str) -> str:
    """``name`` if it is well formed (a short name or ``module:attr``), else ConfigError. Nothing is imported."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} must be a non-empty name or 'package.module:attr', got {name!r}")
    if ":" in name:
        module, _, attr = name.partition(":")
        if not _DOTTED.match(module) or not _DOTTED.match(attr):
            raise ConfigError(f"{what} {name!r} is not an import path 'package.module:attr'")
    elif not _SHORT.match(name):
        raise ConfigError(f"{what} {name!r} is not a short name (letters, digits, '_', '.', '-') or an import path "
                          "'package.module:attr'")
    return name


def check_args(args: object, what: str) -> dict[str, str]:
    """``args`` as a dict of str to str (keyword arguments of a factory), else ConfigError."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"{what} must be a dict of str to str, got {type(args).__name__}")
    for k, v in args.items():
        if not isinstance(k, str) or not k.isidentifier() or not isinstance(v, str):
            raise ConfigError(f"{what} must map identifiers to str values, got {k!r}: {v!r}")
    return dict(args)


def entry_point_names(group: str) -> list[str]:
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})


def load_factory(name: str, *, group: str, what: str) -> Callable[..., Any]:
    """What ``name`` (an import path or an entry point of ``group``) names: a class or a factory."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{what} {name!r}: cannot import module {module_name!r} ({e}); it must be importable "
                              "in every process of the runtime (installed, or on PYTHONPATH on every node)") from None
        except Exception as e:  # the module itself fails while it loads
            raise ConfigError(f"{what} {name!r}: importing {module_name!r} failed: {type(e).__name__}: {e}") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConfigError(f"{what} {name!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                                  f"{part!r}")
            obj = getattr(obj, part)
    else:
        found = list(importlib.metadata.entry_points(group=group, name=name))
        if not found:
            installed = entry_point_names(group)
            raise ConfigError(f"unknown {what} {name!r}: not a built-in, not an import path 'package.module:attr', "
                              f"and no installed package registers it in the entry-point group {group!r}"
                              + (f" (registered: {', '.join(installed)})" if installed else ""))
        try:
            obj = found[0].load()
        except Exception as e:
            raise ConfigError(f"{what} {name!r}: loading entry point {found[0].value!r} failed: "
                              f"{type(e).__name__}: {e}") from None
    if not callable(obj):
        raise ConfigError(f"{what} {name!r} names a {type(obj).__name__}, not a class or a factory")
    return obj


def build(name: str, factory: Callable[..., Any], args: Mapping[str, str], base: type | tuple[type, ...],
          what: str) -> Any:
    """``factory(**args)``, checked to be an instance of ``base``."""
    bases = base if isinstance(base, tuple) else (base,)
    wanted = " or ".join(b.__name__ for b in bases)
    if isinstance(factory, type) and not issubclass(factory, bases):
        raise ConfigError(f"{what} {name!r}: class {factory.__qualname__} is not a subclass of {wanted}")
    try:
        obj = factory(**args)
    except SoulError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{what} {name!r} could not be made: {type(e).__name__}: {e}") from e
    except Exception as e:
        how = f" with arguments {sorted(args)}" if args else ""
        raise ConfigError(f"{what} {name!r} could not be made{how}: {type(e).__name__}: {e}") from e
    if not isinstance(obj, bases):
        raise ConfigError(f"{what} {name!r}: the factory returned a {type(obj).__name__}, not a {wanted}")
    return obj


def settings_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The model, embedder and OpenTelemetry settings in ``environ`` (default: this process's): the variables with
    one of :data:`SETTINGS_PREFIXES`, and those ``SOUL_MODEL_ENV`` names."""
    env = os.environ if environ is None else environ
    extra = {n.strip() for n in env.get(EXTRA_ENV, "").split(",") if n.strip()}
    return {k: v for k, v in env.items() if k.startswith(SETTINGS_PREFIXES) or k in extra}
