"""What the episodic FTS5 tokenizer makes of query words: the keys of its vocabulary."""

from __future__ import annotations

import sqlite3
import threading

from soul_runtime.text import STOPWORDS, stem, words

FTS_TOKENIZE = "porter unicode61"
"""The tokenizer of ``episodes_fts`` (migration 0001): its vocabulary holds these tokens, not ``text.terms``."""
_tokens_lock = threading.Lock()
_tokens_db: list[sqlite3.Connection] = []
_tokens: dict[str, tuple[str, ...]] = {}


def fts_tokens(words: list[str]) -> dict[str, tuple[str, ...]]:
    """What the FTS5 tokenizer makes of each word (``"happy"`` -> ``("happi",)``): the keys of its vocabulary,
    so that a query term's document count can be read from ``episodes_vocab``. An in-memory FTS5 table with the
    same tokenizer does the work; results are cached (bounded)."""
    missing = [w for w in dict.fromkeys(words) if w not in _tokens]
    if missing:
        with _tokens_lock:
            if not _tokens_db:
                con = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                # contentless: the words are not kept, and 'delete-all' empties it at once
                con.execute(f"CREATE VIRTUAL TABLE q USING fts5(x, tokenize='{FTS_TOKENIZE}', content='')")
                con.execute("CREATE VIRTUAL TABLE qv USING fts5vocab(q, 'instance')")
                _tokens_db.append(con)
            con = _tokens_db[0]
            got: dict[int, list[str]] = {}
            con.execute("BEGIN")  # one transaction: FTS5 writes its segment once, not once a word
            try:
                con.execute("INSERT INTO q (q) VALUES ('delete-all')")
                con.executemany("INSERT INTO q (rowid, x) VALUES (?, ?)", list(enumerate(missing)))
                for term, doc in con.execute("SELECT term, doc FROM qv ORDER BY doc, offset"):
                    got.setdefault(int(doc), []).append(str(term))
            finally:
                con.execute("COMMIT")
            if len(_tokens) > 50_000:
                _tokens.clear()
            for i, w in enumerate(missing):
                _tokens[w] = tuple(got.get(i, ()))
    return {w: _tokens.get(w, ()) for w in words}


def query_words(query: str) -> list[str]:
    """The words of ``query`` the lexical search looks for, as written (a possessive's 's dropped), one per
    :func:`~soul_runtime.text.terms` stem and without stop words: FTS5's own stemmer reads them, as it read the
    stored text. Handing it ``terms``' stems instead would stem twice, and a word stemmed twice can miss every
    episode ("microservices" → "microservic" → "microserv", "databases" → "databa")."""
    out: list[str] = []
    seen: set[str] = set()
    for w in words(query):
        w = w[:-2] if w.endswith("'s") else w
        key = stem(w)
        if w not in STOPWORDS and len(w) > 1 and key not in seen:
            seen.add(key)
            out.append(w)
    return out
