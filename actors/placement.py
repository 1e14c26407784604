"""Where a soul lives: rendezvous (highest-random-weight) hashing, and the names of the actors. Pure, no Ray.

The one place that maps a soul to its host and its store shards; every client and actor routes through it."""

from __future__ import annotations

import hashlib


def _weight(soul_id: str, bucket: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{bucket}|{soul_id}".encode(), digest_size=8).digest(), "big")


def rendezvous(soul_id: str, buckets: list[str]) -> str:
    """The bucket with the highest weight for this soul; adding a bucket moves only ~1/n souls."""
    if not buckets:
        raise ValueError("no buckets")
    return max(buckets, key=lambda b: _weight(soul_id, b))


def shard_index(soul_id: str, n: int, layer: str = "") -> int:
    names = [f"{layer}{i}" for i in range(n)]
    return names.index(rendezvous(soul_id, names))


def store_name(layer: str, index: int) -> str:
    """The Ray actor name of one store shard."""
    return f"soul-store-{layer}-{index}"


def store_of(soul_id: str, layer: str, shards: int) -> str:
    """The name of the store shard that holds ``soul_id``'s ``layer``, among ``shards`` shards."""
    return store_name(layer, shard_index(soul_id, shards, layer))
