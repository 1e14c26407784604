"""Text helpers of the model adapters."""

from __future__ import annotations


def one_line(text: object, limit: int = 200) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters with an ellipsis."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"
