"""The soul handles, blocking and async, over Ray and over HTTP: one API (names, parameters, defaults, annotations;
the async methods are coroutines returning the same types), and plans with the same operations on each transport."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from actors.runtime import AsyncSoulHandle, SoulHandle
from actors.runtime import _Plans as RayPlans
from soul_runtime.http_client.runtime import AsyncHttpSoulHandle, HttpSoulHandle
from soul_runtime.http_client.runtime import _Plans as HttpPlans
from soul_runtime.soul_api import AsyncSoulApi, Plans, SoulApi

EXPECTED = {"turn", "observe", "recall", "facts", "fact_history", "procedures", "episodes", "digests", "trace", "traces",
            "forget", "forget_where", "stats", "export", "import_"}


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def _shape(fn: Any) -> tuple[list[tuple[str, Any, Any, Any]], Any]:
    sig = inspect.signature(fn)
    return ([(p.name, p.kind, p.default, p.annotation) for p in sig.parameters.values()], sig.return_annotation)


def test_the_blocking_and_the_async_api_have_the_same_methods() -> None:
    assert set(_public(SoulApi)) == set(_public(AsyncSoulApi)) == EXPECTED


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_method_has_one_signature_blocking_and_async(name: str) -> None:
    sync, coro = getattr(SoulApi, name), getattr(AsyncSoulApi, name)
    assert not inspect.iscoroutinefunction(sync)
    assert inspect.iscoroutinefunction(coro)
    assert _shape(sync) == _shape(coro)  # the same parameters, defaults, annotations and return type
    assert inspect.signature(sync).return_annotation not in ("None", inspect.Signature.empty) or name == "import_"


@pytest.mark.parametrize("handle,api", [(SoulHandle, SoulApi), (AsyncSoulHandle, AsyncSoulApi),
                                        (HttpSoulHandle, SoulApi), (AsyncHttpSoulHandle, AsyncSoulApi)])
def test_every_transport_s_handle_is_the_api_unchanged(handle: type, api: type) -> None:
    assert issubclass(handle, api)
    assert set(_public(handle)) == set(_public(api))
    for name in EXPECTED:
        assert getattr(handle, name) is getattr(api, name), f"{handle.__name__}.{name} is redefined"


def _protocol_methods() -> dict[str, Any]:
    return {n: getattr(Plans, n) for n in EXPECTED if n in vars(Plans)}


@pytest.mark.parametrize("plans", [RayPlans, HttpPlans])
def test_each_transport_plans_every_operation_with_the_same_arguments(plans: type) -> None:
    ops = _protocol_methods()
    assert set(ops) == EXPECTED
    for name, proto in ops.items():
        assert _shape(getattr(plans, name)) == _shape(proto), f"{plans.__module__}._Plans.{name}"
