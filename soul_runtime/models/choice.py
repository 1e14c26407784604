"""Which language model a soul uses: a built-in one, or the user's, named by import path or entry point.

Built-in names: ``auto`` (Anthropic when ``ANTHROPIC_API_KEY`` is set, else the offline model), ``offline``,
``anthropic`` and ``openai`` (any OpenAI-compatible chat-completions server). Any other name is resolved by
:mod:`soul_runtime.plugins`: ``package.module:attr`` or an entry point in the group ``soul_runtime.models``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from soul_runtime import plugins
from soul_runtime.errors import ConfigError
from soul_runtime.models.base import AsyncLanguageModel, LanguageModel
from soul_runtime.models.sync_view import sync_view

BUILTIN_MODELS = ("auto", "offline", "anthropic", "openai")


def check_model_name(name: object) -> str:
    """``name`` if it is a built-in name or well formed for the resolver (nothing is imported), else ConfigError."""
    return plugins.check_name(name, "model")


def make_model(kind: str = "auto", env: Mapping[str, str] | None = None,
               args: Mapping[str, str] | None = None) -> LanguageModel:
    """The model ``kind`` names, made with ``args`` (keyword arguments; for the built-in adapters, settings
    that take precedence over the environment). A model with coroutine methods comes as its
    :func:`~soul_runtime.models.sync_view.sync_view`."""
    env = os.environ if env is None else env
    args = plugins.check_args(args or {}, "model_args")
    check_model_name(kind)
    if kind in ("auto", "anthropic"):
        from soul_runtime.models.claude import model_from_env
        model = model_from_env(env, args)
        if model is not None:
            return model
        if kind == "anthropic":
            raise ConfigError("model 'anthropic' needs ANTHROPIC_API_KEY in the environment (or api_key in "
                              "model_args)")
    elif kind == "openai":
        from soul_runtime.models.openai_chat import model_from_settings
        return model_from_settings(env, args)
    elif kind != "offline":
        factory = plugins.load_factory(kind, group=plugins.MODEL_GROUP, what="model")
        made = plugins.build(kind, factory, args, (LanguageModel, AsyncLanguageModel), "model")
        if not isinstance(made.model_id, str) or not made.model_id:
            raise ConfigError(f"model {kind!r}: model_id must be a non-empty str, got {made.model_id!r}")
        return sync_view(made)
    if args:
        raise ConfigError(f"the offline model takes no model_args, got {sorted(args)}"
                          + (" (model 'auto' found no ANTHROPIC_API_KEY)" if kind == "auto" else ""))
    from soul_runtime.models.offline import OfflineModel
    return OfflineModel()
