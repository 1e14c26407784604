"""Pure text rules of the offline model: no I/O, no clocks, no randomness.

Normalisation, chit-chat and instruction detection, fact-statement patterns,
confirmation / correction / retraction parsing, task / steps / outcome detection
and the first→third person rewriting used for episode summaries. Everything here
is a plain function of its arguments so the offline model is fully deterministic.

One module per kind of reading: ``words`` (shared word lists, ``memo``), ``cleaning``,
``chat``, ``values`` (``Statement``), ``statements``, ``affirmation``, ``correction``,
``retraction``, ``tasks``, ``procedures``, ``episodes``, ``relations``, ``changes``.
"""

from __future__ import annotations

from soul_runtime.models.offline_rules.affirmation import confirmation
from soul_runtime.models.offline_rules.changes import TIME_WORDS, Change, parse_change, strip_change_marker
from soul_runtime.models.offline_rules.chat import (
    _HYPOTHETICAL,
    _INSTRUCTION,
    echoes,
    is_chit_chat,
    is_chit_sentence,
    is_hearsay,
    is_hypothetical,
    is_instruction,
    is_question,
    pastes,
)
from soul_runtime.models.offline_rules.cleaning import (
    attribute_key,
    clean_value,
    content_words,
    entity_key,
    split_clauses,
    split_sentences,
    strip_fillers,
)
from soul_runtime.models.offline_rules.correction import Correction, parse_correction, replace_number
from soul_runtime.models.offline_rules.episodes import cap, entities, is_elliptic, question_gist, to_third_person
from soul_runtime.models.offline_rules.procedures import parse_procedure, similar_task, task_stem, title_class
from soul_runtime.models.offline_rules.reading import (
    as_first_person,
    last_person,
    last_thing,
    parse_predicate,
    read_opening,
    resolve_pronouns,
)
from soul_runtime.models.offline_rules.relations import is_timeish, lemma, parse_relation, trim_time
from soul_runtime.models.offline_rules.retraction import parse_dropped, parse_retraction
from soul_runtime.models.offline_rules.statements import find_name, parse_statements
from soul_runtime.models.offline_rules.tasks import (
    TASK_VERBS,
    default_plan,
    detect_outcome,
    parse_request,
    parse_steps,
    same_task,
    save_requested,
    task_class,
)
from soul_runtime.models.offline_rules.values import Statement
from soul_runtime.models.offline_rules.words import GENERIC_SPEAKERS, OPINION, PRONOUNS, SECRET, STOPWORDS, memo
from soul_runtime.text import collapse, lacks_words, singular
from soul_runtime.text import fold as normalise

__all__ = [
    "collapse",
    "lacks_words",
    "singular",
    "normalise",
    "confirmation",
    "TIME_WORDS",
    "Change",
    "parse_change",
    "strip_change_marker",
    "_HYPOTHETICAL",
    "_INSTRUCTION",
    "echoes",
    "is_chit_chat",
    "is_chit_sentence",
    "is_hearsay",
    "is_hypothetical",
    "is_instruction",
    "is_question",
    "pastes",
    "attribute_key",
    "clean_value",
    "content_words",
    "entity_key",
    "split_clauses",
    "split_sentences",
    "strip_fillers",
    "Correction",
    "parse_correction",
    "replace_number",
    "cap",
    "entities",
    "is_elliptic",
    "question_gist",
    "to_third_person",
    "parse_procedure",
    "similar_task",
    "task_stem",
    "title_class",
    "is_timeish",
    "lemma",
    "parse_relation",
    "trim_time",
    "as_first_person",
    "last_person",
    "last_thing",
    "parse_predicate",
    "read_opening",
    "resolve_pronouns",
    "parse_dropped",
    "parse_retraction",
    "find_name",
    "parse_statements",
    "Statement",
    "GENERIC_SPEAKERS",
    "OPINION",
    "PRONOUNS",
    "SECRET",
    "STOPWORDS",
    "memo",
    "TASK_VERBS",
    "default_plan",
    "detect_outcome",
    "parse_request",
    "parse_steps",
    "same_task",
    "save_requested",
    "task_class",
]
