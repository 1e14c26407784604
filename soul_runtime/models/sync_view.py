"""A model's coroutine methods as blocking calls, for code that runs on threads.

A model may implement its methods as coroutines (an :class:`~soul_runtime.models.base.AsyncLanguageModel`,
or a :class:`~soul_runtime.models.base.LanguageModel` with some ``async def`` methods). The runtime calls it as
it is — a soul host awaits its coroutines on its event loop, the in-process soul's blocking driver runs them on
the process's step loop (:mod:`soul_runtime.steps`). Code of a user's that wants blocking calls takes
:func:`sync_view`: each coroutine runs on that step loop (one event loop on a daemon thread, shared by every
caller, so the model's async clients stay on the loop they were opened on) and the calling thread waits for its
answer. Its synchronous methods are called as they are.

:func:`async_methods` is the one place that tells which methods are coroutines.
"""

from __future__ import annotations

import inspect
from typing import Any

from soul_runtime.models.base import (
    AsyncLanguageModel,
    Exchange,
    LanguageModel,
    MemoryDecision,
    ModelReply,
    ModelWrapper,
    ObserveWindow,
    ReplyRequest,
    TaskClassification,
    WindowDecision,
)
from soul_runtime.steps import run

METHODS = ("reply", "decide", "decide_window", "classify_task")


def async_methods(model: object) -> frozenset[str]:
    """The model methods of ``model`` that are coroutine functions."""
    return frozenset(m for m in METHODS if inspect.iscoroutinefunction(getattr(model, m, None)))


def sync_view(model: LanguageModel | AsyncLanguageModel) -> LanguageModel:
    """``model`` itself when none of its methods is a coroutine, else a :class:`SyncView` of it."""
    if isinstance(model, SyncView) or (isinstance(model, LanguageModel) and not async_methods(model)):
        return model
    return SyncView(model)


class SyncView(ModelWrapper):
    """``inner`` with blocking methods: its coroutines run on the process's model loop (:func:`run`)."""

    def __init__(self, inner: LanguageModel | AsyncLanguageModel) -> None:
        super().__init__(inner)
        self.coroutines = async_methods(inner)
        # a window default inherited from LanguageModel would call the inner (async) decide: use ours instead
        own = getattr(type(inner), "decide_window", None)
        self._own_window = own is None or own is LanguageModel.decide_window

    def _call(self, name: str, *args: Any) -> Any:
        fn = getattr(self.inner, name)
        return run(fn(*args)) if name in self.coroutines else fn(*args)

    def reply(self, request: ReplyRequest) -> ModelReply:
        return self._call("reply", request)

    def decide(self, exchange: Exchange) -> MemoryDecision:
        return self._call("decide", exchange)

    def decide_window(self, window: ObserveWindow) -> WindowDecision:
        if self._own_window:
            return super().decide_window(window)
        return self._call("decide_window", window)

    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        return self._call("classify_task", text, known)
