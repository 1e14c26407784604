"""A model as a host's turns use it: waiting for its answer counts as parked in the host's crowd."""

from __future__ import annotations

from typing import Any

from soul_runtime.batching import Crowd, parked
from soul_runtime.models.base import LanguageModel, ModelWrapper


class ParkedModel(ModelWrapper):
    """A remote model as the host's turns use it: a turn waiting for the model's answer counts as parked in the
    host's crowd, so the other turns' store calls do not wait for it. Otherwise the very same model."""

    def __init__(self, inner: LanguageModel, crowd: Crowd) -> None:
        super().__init__(inner)
        self.inner: LanguageModel = inner
        self.crowd = crowd

    def reply(self, request: Any) -> Any:
        with parked(self.crowd):
            return self.inner.reply(request)

    def decide(self, exchange: Any) -> Any:
        with parked(self.crowd):
            return self.inner.decide(exchange)

    def decide_window(self, window: Any) -> Any:
        with parked(self.crowd):
            return self.inner.decide_window(window)

    def classify_task(self, text: str, known: tuple[str, ...]) -> Any:
        with parked(self.crowd):
            return self.inner.classify_task(text, known)
