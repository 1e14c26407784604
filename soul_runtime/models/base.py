"""The language-model protocol: four operations a soul needs from a model.

A model is one small class: set ``model_id`` and ``offline``, implement
:meth:`LanguageModel.reply`, :meth:`LanguageModel.tag`, :meth:`LanguageModel.extract`
and :meth:`LanguageModel.classify_task`. Every call returns its token usage so the
turn trace can account for it. Two implementations ship:

* :class:`soul_runtime.models.offline.OfflineModel` — deterministic, rule-based,
  no network; every reply it writes is labelled ``[offline model]``.
* :class:`soul_runtime.models.claude.AnthropicModel` — the ``anthropic`` SDK,
  with a pinned model id, tool-use extraction, timeouts and retries.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from soul_runtime.records import Extraction

PERSIST_CATEGORIES = ("preference", "fact", "decision", "plan", "event", "task")


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.calls + other.calls)


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "user" | "assistant"
    content: str
    id: str = ""
    speaker: str = ""


@dataclass(frozen=True)
class ReplyRequest:
    """An assembled context: what the model sees for one reply."""

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
class Tagging:
    persist: bool
    categories: tuple[str, ...] = ()
    reason: str = ""
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class ExtractResult:
    extraction: Extraction
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class TaskClassification:
    task_class: str | None
    confidence: float = 0.0
    usage: Usage = field(default_factory=Usage)


class LanguageModel(abc.ABC):
    """What a soul needs from a language model."""

    model_id: str = ""
    offline: bool = False

    @abc.abstractmethod
    def reply(self, request: ReplyRequest) -> ModelReply:
        """Answer the user given the assembled context."""

    @abc.abstractmethod
    def tag(self, exchange: Exchange) -> Tagging:
        """Does this exchange hold a preference, fact, decision or plan worth keeping?"""

    @abc.abstractmethod
    def extract(self, exchange: Exchange) -> ExtractResult:
        """Facts, an episode summary, and the task with its steps and outcome."""

    @abc.abstractmethod
    def classify_task(self, text: str, known: tuple[str, ...]) -> TaskClassification:
        """Which known task class (if any) the request belongs to."""

    @property
    def label(self) -> str:
        return f"{self.model_id} (offline)" if self.offline else self.model_id
