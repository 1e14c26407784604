"""Which language model a soul uses: Anthropic when a key is set, else the offline model."""

from __future__ import annotations

import os
from collections.abc import Mapping

from soul_runtime.errors import ConfigError
from soul_runtime.models.base import LanguageModel


def make_model(kind: str = "auto", env: Mapping[str, str] | None = None) -> LanguageModel:
    """``auto``: the Anthropic adapter when ``ANTHROPIC_API_KEY`` is set, else the offline model."""
    env = os.environ if env is None else env
    if kind not in ("auto", "offline", "anthropic"):
        raise ConfigError(f"unknown model kind {kind!r}")
    if kind in ("auto", "anthropic"):
        from soul_runtime.models.claude import model_from_env
        model = model_from_env(env)
        if model is not None:
            return model
        if kind == "anthropic":
            raise ConfigError("model 'anthropic' needs ANTHROPIC_API_KEY in the environment")
    from soul_runtime.models.offline import OfflineModel
    return OfflineModel()
