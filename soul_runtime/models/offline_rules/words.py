"""Word lists shared by the offline rules, and ``memo``, the cache of their pure functions."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from soul_runtime import text

GENERIC_SPEAKERS = frozenset({"", "user", "human", "you", "me", "speaker", "unknown"})
# chatter on top of the retrieval stop words: words that carry no fact in conversation
STOPWORDS = text.STOPWORDS | frozenset("""
agree always amazing anything awesome bad bit bye can't care cool day even ever everything feel fine get glad go going
gonna good got great guess haha happy hear hello i'll im isn't kind know later let's like lol look looks lot love many
mean more most much myself never new nice now one please pretty right see something soon sound sounds still stuff super
sure talk thank thanks thing things think time today totally wanna way welcome well won't yep yet you'd you've yours
""".split())
OPINION = frozenset("so really very pretty super too great awesome amazing cool nice good bad fine fun special "
                    "important tough hard easy lovely wonderful fantastic beautiful terrible awful true crazy".split())
PRONOUNS = frozenset("it that this them him her you me us those these they he she there something".split())
SECRET = re.compile(r"(?<![a-z0-9])(?:passwords?(?![ _]manager)|passwd|passphrase|secret|api[ _-]?key|token|credential|private key|ssn)", re.I)

F = TypeVar("F", bound=Callable[..., Any])


def memo(fn: F) -> F:
    """``fn`` (a pure function of hashable arguments) with its recent results remembered: a turn's reply and its
    memory decision parse the same message, and the recent history again each turn. A list result is kept as a
    tuple and handed out as a fresh list, so no caller can change what another one gets."""
    @functools.lru_cache(maxsize=8192)
    def cached(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return (tuple(out), True) if isinstance(out, list) else (out, False)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out, was_list = cached(*args, **kwargs)
        return list(out) if was_list else out
    return wrapper  # type: ignore[return-value]
