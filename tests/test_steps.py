"""The effects vocabulary and its drivers (soul_runtime/steps.py): what a typed target makes, and how the one
pair of drivers sends answers back and throws errors in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from soul_runtime.loop.soul import MEMORY
from soul_runtime.models.base import MODEL, Exchange
from soul_runtime.steps import Call, Pause, Steps, Target, run_steps, run_steps_async


def test_a_typed_target_makes_the_step_its_driver_performs() -> None:
    ex = Exchange(user_text="hi", reply_text="hello", speaker="maya", message_ids=("m1",), at=1.0)
    assert MODEL.decide(ex) == Call("model", "decide", (ex,))
    assert MEMORY.recall("tea", 5, at=1.0) == Call("memory", "recall", ("tea", 5), {"at": 1.0})
    with pytest.raises(AttributeError):
        Target("memory")._private  # noqa: B018 — only public methods are steps


def _steps(log: list[Any]) -> Steps[str]:
    got = yield Call("t", "first")
    log.append(got)
    try:
        yield Call("t", "fails")
    except KeyError as e:
        log.append(f"caught {e}")
    yield Pause(0.5)
    return "done"


def test_both_drivers_send_answers_back_and_throw_errors_in() -> None:
    def perform(step: Any) -> Any:
        seen.append(step)
        if isinstance(step, Pause):
            return None
        if step.method == "fails":
            raise KeyError("no")
        return 42

    async def perform_async(step: Any) -> Any:
        return perform(step)

    for driver in ("blocking", "async"):
        seen: list[Any] = []
        log: list[Any] = []
        got = run_steps(_steps(log), perform) if driver == "blocking" else \
            asyncio.run(run_steps_async(_steps(log), perform_async))
        assert got == "done" and log == [42, "caught 'no'"], driver
        assert seen == [Call("t", "first"), Call("t", "fails"), Pause(0.5)], driver


def test_an_error_outside_catch_is_not_thrown_in() -> None:
    def perform(step: Any) -> Any:
        raise KeyboardInterrupt

    log: list[Any] = []
    with pytest.raises(KeyboardInterrupt):
        run_steps(_steps(log), perform)
    assert log == []
