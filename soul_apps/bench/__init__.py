"""Benchmarks: LoCoMo memory quality, latency at scale, embedder comparison, many souls.

May import everything below it (``actors``, ``loop``, ``memory``, ``models``, ``embedding``); only ``cli``
imports ``bench``.
"""

HTTP_CLIENTS = ("httpx", "aiohttp", "soul")
"""The HTTP clients ``soul bench serve``'s callers may use (:mod:`soul_apps.bench.serve`); ``soul``: the project's
own, ``soul_runtime.connect("http://…").async_soul(id).turn`` (:mod:`soul_runtime.http_client`)."""
