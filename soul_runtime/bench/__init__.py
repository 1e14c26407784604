"""Benchmarks: LoCoMo memory quality, latency at scale, embedder comparison, many souls.

May import everything below it (``actors``, ``loop``, ``memory``, ``models``, ``embedding``); only ``cli``
imports ``bench``.
"""
