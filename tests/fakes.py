"""Test doubles shared by the test suite."""

from __future__ import annotations

import re

from soul_runtime.embedding.fast import FastEmbedder

_WORD = re.compile(r"\w+")


class HashEmbedder(FastEmbedder):
    """The project's fast embedder under the id the test suites' stores were written with."""

    embedder_id = "test-hash-64"
