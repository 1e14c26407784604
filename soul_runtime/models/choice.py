"""Which language model a soul uses: a built-in one, or the user's, named by import path or entry point.

Built-in names: ``auto`` (Anthropic when ``ANTHROPIC_API_KEY`` is set, else the offline model), ``offline``,
``anthropic`` and ``openai`` (any OpenAI-compatible chat-completions server). The last three are published as a
user's model is (docs/models.md): in the entry-point group ``soul_runtime.models`` of this package's metadata
(``pyproject.toml``), and made through it by :mod:`soul_runtime.plugins`, as is any other name
(``package.module:attr`` or an entry point of another package). Their settings come from ``model_args`` first,
else the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from soul_runtime import plugins
from soul_runtime.errors import ConfigError
from soul_runtime.models.base import AsyncLanguageModel, LanguageModel

BUILTIN_MODELS = ("auto", "offline", "anthropic", "openai")

PUBLISHED = {"offline": "soul_runtime.models.offline:OfflineModel",
             "anthropic": "soul_runtime.models.choice:anthropic_model",
             "openai": "soul_runtime.models.choice:openai_model"}
"""The built-in models' entry points (``[project.entry-points."soul_runtime.models"]`` in ``pyproject.toml`` says
the same; a test compares them with the installed metadata). A source tree run without being installed has no
metadata: the same targets are then loaded by import path."""


def check_model_name(name: object) -> str:
    """``name`` if it is a built-in name or well formed for the resolver (nothing is imported), else ConfigError."""
    return plugins.check_name(name, "model")


def anthropic_model(**args: str) -> LanguageModel:
    """Model ``anthropic``: Claude through the Anthropic API (:func:`soul_runtime.models.claude.model_from_env`)."""
    from soul_runtime.models.claude import model_from_env
    model = model_from_env(os.environ, args)
    if model is None:
        raise ConfigError("model 'anthropic' needs ANTHROPIC_API_KEY in the environment (or api_key in model_args)")
    return model


def openai_model(**args: str) -> LanguageModel:
    """Model ``openai``: an OpenAI-compatible chat-completions server
    (:func:`soul_runtime.models.openai_chat.model_from_settings`)."""
    from soul_runtime.models.openai_chat import model_from_settings
    return model_from_settings(os.environ, args)


def make_model(kind: str = "auto", args: Mapping[str, str] | None = None) -> LanguageModel | AsyncLanguageModel:
    """The model ``kind`` names, made with ``args`` (keyword arguments; for the built-in adapters, settings
    that take precedence over the environment), as it was made: a model with coroutine methods keeps them, so a
    host's turns await them on its event loop (the steps' drivers tell the two kinds of method apart,
    :mod:`soul_runtime.steps`). A caller that wants blocking calls takes its
    :func:`~soul_runtime.models.sync_view.sync_view`."""
    args = plugins.check_args(args or {}, "model_args")
    check_model_name(kind)
    if kind == "auto":
        from soul_runtime.models.claude import model_from_env
        model = model_from_env(os.environ, args)
        if model is not None:
            return model
        if args:
            raise ConfigError(f"the offline model takes no model_args, got {sorted(args)} (model 'auto' found no "
                              "ANTHROPIC_API_KEY)")
        kind = "offline"
    if kind == "offline" and args:
        raise ConfigError(f"the offline model takes no model_args, got {sorted(args)}")
    target = kind
    if kind in PUBLISHED and kind not in plugins.entry_point_names(plugins.MODEL_GROUP):
        target = PUBLISHED[kind]  # not installed (a source tree on PYTHONPATH): the same target by import path
    factory = plugins.load_factory(target, group=plugins.MODEL_GROUP, what="model")
    made = plugins.build(kind, factory, args, (LanguageModel, AsyncLanguageModel), "model")
    if not isinstance(made.model_id, str) or not made.model_id:
        raise ConfigError(f"model {kind!r}: model_id must be a non-empty str, got {made.model_id!r}")
    return made
