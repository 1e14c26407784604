"""The language-model protocol: what a soul needs from a model.

A model is one small class: set ``model_id`` and ``offline`` and implement

* :meth:`LanguageModel.reply` — the answer to the user (the only call on the reply path);
* :meth:`LanguageModel.decide` — the memory decision for one exchange in **one** analysis:
  persist or not, the categories, and (when it persists) the extraction — facts, episode,
  entities, task. It runs after the reply has been returned (see :mod:`soul_runtime.loop.soul`);
* :meth:`LanguageModel.decide_window` — the same decision for a window of observed messages
  at once (``observe``); each message gets its own decision, so provenance stays per message.
  The default judges message by message through :meth:`decide`; a model that can read a
  window in one call (Claude) overrides it;
* :meth:`LanguageModel.classify_task`.

Every call returns its :class:`Usage` (calls, uncached input, output, cache-read and
cache-write tokens) and the id of the model that served it, so each turn trace accounts
for its cost per model. Three implementations ship:

* :class:`soul_runtime.models.offline.OfflineModel` — deterministic, rule-based,
  no network; every reply it writes is labelled ``[offline model]``.
* :class:`soul_runtime.models.claude.AnthropicModel` — the ``anthropic`` SDK, a pinned
  reply model and a (possibly smaller) pinned memory model, one forced tool call per memory
  decision, prompt caching, timeouts and retries.
* :class:`soul_runtime.models.openai_chat.OpenAIChatModel` — any OpenAI-compatible
  chat-completions server through the ``openai`` SDK, the same memory calls.

:class:`AsyncLanguageModel` is the same protocol with coroutine methods. A user's own model is
named by import path or entry point (:mod:`soul_runtime.models.choice`, docs/models.md).
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Any, cast

from soul_runtime.records import Extraction
from soul_runtime.steps import Steps, Target, drive

PERSIST_CATEGORIES = ("preference", "fact", "decision", "plan", "event", "task")


USAGE_KEYS = ("calls", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


@dataclass(frozen=True)
class Usage:
    """Token usage of one or more calls, from the API's ``usage`` (estimates for the offline model).

    ``input_tokens`` are the uncached input tokens; ``cache_read_tokens`` were served from the
    prompt cache and ``cache_write_tokens`` written to it (both also input)."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.calls + other.calls, self.cache_read_tokens + other.cache_read_tokens,
                     self.cache_write_tokens + other.cache_write_tokens)

    @property
    def sent_tokens(self) -> int:
        """All input tokens, cached or not."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens

    def to_dict(self) -> dict[str, int]:
        return {"calls": int(self.calls), "input_tokens": int(self.input_tokens),  # the order of USAGE_KEYS
                "output_tokens": int(self.output_tokens), "cache_read_tokens": int(self.cache_read_tokens),
                "cache_write_tokens": int(self.cache_write_tokens)}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> Usage:
        get = d.get
        return cls(usage_count(get("input_tokens", 0)), usage_count(get("output_tokens", 0)),
                   usage_count(get("calls", 0)), usage_count(get("cache_read_tokens", 0)),
                   usage_count(get("cache_write_tokens", 0)))


def usage_count(v: object) -> int:
    """A count read from a usage dict: an int or float (not a bool) as an int, anything else 0."""
    if type(v) is int:  # the usual case, without the checks below
        return v
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    id: str = ""
    speaker: str = ""


_TAGGED = re.compile(r"^\[(?P<store>\w+)\s+(?P<id>[^\]]+)\]\s*(?P<text>.*)$", re.S)
_DATED = re.compile(r"^(?P<day>\d{1,2} [A-Z][a-z]+ \d{4})(?: \([^)]*\))?: (?P<text>.*)$", re.S)


@dataclass(frozen=True)
class MemoryLine:
    """One of a request's memory lines read back: its layer, its id (an episode's is its day) and its text."""

    store: str
    id: str
    text: str


def read_memory_lines(lines: tuple[str, ...] | list[str]) -> list[MemoryLine]:
    """:attr:`ReplyRequest.memory_lines` as :class:`MemoryLine`: ``[semantic ana:dog] Ana dog: Biscuit`` is a
    fact by its id; ``3 March 2024 (2 days ago): …`` an episode of that day, and an indented line after it
    another episode of the same day. Any other line is an episode without a day."""
    out, day = [], ""
    for line in lines:
        text = line.strip()
        if line[:1].isspace() and day:
            out.append(MemoryLine("episodic", day, text))
        elif m := _TAGGED.match(text):
            out.append(MemoryLine(m.group("store"), m.group("id"), m.group("text")))
        elif m := _DATED.match(text):
            day = m.group("day")
            out.append(MemoryLine("episodic", day, m.group("text")))
        else:
            out.append(MemoryLine("episodic", "", text))
    return out


def memory_text(line: str) -> str:
    """A memory line's text without its ``[store id]`` tag or its date."""
    return read_memory_lines([line.strip()])[0].text


@dataclass(frozen=True)
class ReplyRequest:
    """An assembled context: what the model sees for one reply. ``memory_lines`` are the recalled memories,
    facts and procedures by id first, then episodes under their dates (read them back with
    :func:`read_memory_lines`)."""

    system: str
    memory_lines: tuple[str, ...]
    history: tuple[ChatMessage, ...]
    user_text: str
    user: str
    max_tokens: int


@dataclass(frozen=True)
class ModelReply:
    text: str
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    """The id of the model that wrote it ("" = the model's ``model_id``)."""


@dataclass(frozen=True)
class Exchange:
    """One exchange to judge and extract from.

    ``recalled`` and ``persona`` are what the soul already knows or was told;
    the extractor must never turn them into new memories.
    """

    user_text: str
    reply_text: str
    speaker: str
    message_ids: tuple[str, ...]
    at: float
    persona: str = ""
    recalled: tuple[str, ...] = ()
    history: tuple[ChatMessage, ...] = ()
    known_facts: tuple[tuple[str, str, str], ...] = ()
    """(entity, attribute, value) of the facts recalled for this exchange, so a
    bare correction ("actually, it's Postgres 16") can be resolved."""
    known_tasks: tuple[str, ...] = ()
    """Task classes the soul already has procedures or runs for."""


@dataclass(frozen=True)
class MemoryDecision:
    """The memory decision for one exchange (or one observed message), made in one analysis.

    ``persist`` False means nothing is written (``extraction`` is then empty); ``reason`` is
    one short line for the trace."""

    persist: bool
    categories: tuple[str, ...] = ()
    reason: str = ""
    extraction: Extraction = field(default_factory=Extraction)
    usage: Usage = field(default_factory=Usage)
    model: str = ""


@dataclass(frozen=True)
class ObservedMessage:
    id: str
    speaker: str
    text: str
    at: float
    judge: bool = True
    """False: context only (e.g. shorter than the length filter); no decision is needed for it."""


@dataclass(frozen=True)
class ObserveWindow:
    """Consecutive observed messages judged together (one ``observe`` batch, or a chunk of it)."""

    messages: tuple[ObservedMessage, ...]
    earlier: tuple[ChatMessage, ...] = ()
    """Messages before the window (context only)."""
    persona: str = ""
    history: int = 6
    """How many earlier messages a per-message decision sees (the default :meth:`decide_window`)."""


@dataclass(frozen=True)
class WindowDecision:
    decisions: tuple[MemoryDecision, ...]
    """One per window message, in order (their ``usage`` is zero: the window's is below)."""
    usage: Usage = field(default_factory=Usage)
    model: str = ""


@dataclass(frozen=True)
class TaskClassification:
    task_class: str | None
    confidence: float = 0.0
    usage: Usage = field(default_factory=Usage)


class ModelIdentity:
    """What names a model in traces and usage: ``model_id``, whether it is ``offline``, and the two derived
    names."""

    model_id: str = ""
    offline: bool = False

    @property
    def memory_model_id(self) -> str:
        """The model that makes the memory decisions (the reply model unless the model says otherwise)."""
        return self.model_id

    @property
    def label(self) -> str:
        return f"{self.model_id} (offline)" if self.offline else self.model_id


class LanguageModel(ModelIdentity, abc.ABC):
    """What a soul needs from a language model."""

    model_id: str = ""
    offline: bool = False

    @abc.abstractmethod
    def reply(self, request: ReplyRequest) -> ModelReply:
        """Answer the user given the assembled context."""

    @abc.abstractmethod
    def decide(self, exchange: Exchange) -> MemoryDecision:
        """Is this exchange worth keeping, and if so what does it hold (facts, episode, task)?"""

    def decide_window(self, window: ObserveWindow) -> WindowDecision:
        """One decision per observed message; the default judges them one by one."""
        return drive(window_by_message(window, self.model_id), {"model": self})

    @abc.abstractmethod
    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        """Which known task class (if any) the request belongs to."""



class AsyncLanguageModel(ModelIdentity, abc.ABC):
    """The same protocol as :class:`LanguageModel` with coroutine methods (``async def reply`` ...).

    ``decide_window`` is optional: without it, windows are judged message by message through
    :meth:`decide` (as :meth:`LanguageModel.decide_window` does). A host's turns await its coroutines on the host's event loop; the
    in-process soul's blocking calls run them on the process's step loop (:func:`soul_runtime.steps.drive`)."""

    model_id: str = ""
    offline: bool = False

    @abc.abstractmethod
    async def reply(self, request: ReplyRequest) -> ModelReply:
        """Answer the user given the assembled context."""

    @abc.abstractmethod
    async def decide(self, exchange: Exchange) -> MemoryDecision:
        """Is this exchange worth keeping, and if so what does it hold?"""

    @abc.abstractmethod
    async def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        """Which known task class (if any) the request belongs to."""



class ModelWrapper(LanguageModel):
    """A model that serves through another (``inner``): the same identity, and anything it does not define is
    the inner model's. The wrappers define the four calls."""

    def __init__(self, inner: LanguageModel | AsyncLanguageModel) -> None:
        self.inner = inner
        self.model_id, self.offline = inner.model_id, inner.offline

    @property
    def memory_model_id(self) -> str:
        return self.inner.memory_model_id

    @property
    def label(self) -> str:
        return self.inner.label

    def __getattr__(self, name: str) -> Any:  # anything else the model offers, as it is
        return getattr(self.inner, name)


MODEL = cast(LanguageModel, Target("model"))
"""The model a soul's steps call (``yield MODEL.reply(request)``): the step ``Call("model", "reply", ...)``, which
its driver performs on the soul's model (see :mod:`soul_runtime.steps`)."""


def window_by_message(window: ObserveWindow, model_id: str) -> Steps[WindowDecision]:
    """A window judged message by message through the model's ``decide`` (a model without a window call of its
    own), as steps (:mod:`soul_runtime.steps`)."""
    earlier = list(window.earlier)
    out: list[MemoryDecision] = []
    usage = Usage()
    for m in window.messages:
        if m.judge:
            d = yield MODEL.decide(Exchange(user_text=m.text, reply_text="", speaker=m.speaker, message_ids=(m.id,),
                                            at=m.at, persona=window.persona,
                                            history=tuple(earlier[-window.history:]) if window.history else ()))
            usage = usage + d.usage
            out.append(MemoryDecision(d.persist, d.categories, d.reason, d.extraction, Usage(), d.model))
        else:
            out.append(MemoryDecision(False, reason="context only"))
        earlier.append(ChatMessage("user", m.text, m.id, m.speaker))
    return WindowDecision(tuple(out), usage, model_id)
