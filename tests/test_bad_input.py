# mypy: disable-error-code="arg-type"
"""Bad input, property-based: every failure is a SoulError with a clear message, and nothing changes.

Garbage goes into the public API and the file formats (turn text, observed messages,
times, ``k``, store names, ids, vectors, exports, buffer checkpoints, configuration);
each call must raise a :class:`soul_runtime.errors.SoulError` subclass — never a bare
TypeError / KeyError / UnicodeError / sqlite3 error — and the soul's memory afterwards
is byte-identical (export, traces, sequence number). Valid but weird input (unicode,
emoji, RTL text, long text) is accepted. ``REGRESSIONS`` holds the inputs that once broke
the promise (wrong cell types in an import, non-int ids, overflowing times, …).
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soul_runtime.config import MemoryConfig, SoulConfig, TurnConfig
from soul_runtime.embedding.base import check_vectors
from soul_runtime.errors import ConfigError, InvalidInput, NotFound, SoulError
from soul_runtime.limits import TEXT_MAX
from soul_runtime.loop.buffer import ShortTermBuffer
from soul_runtime.loop.soul import Soul
from soul_runtime.memory.export import unpack_export
from soul_runtime.memory.soul_memory import SoulMemory
from soul_runtime.models.offline import OfflineModel
from tests.fakes import HashEmbedder

T0 = 1_780_000_000.0
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                            HealthCheck.too_slow])
TRIED: Counter[str] = Counter()


class World:
    """A soul with some memory (facts, episodes, a procedure) that bad input must leave untouched."""

    def __init__(self, d: Path) -> None:
        self.mem = SoulMemory(d, embedder=HashEmbedder())
        self.soul = Soul("bad-input", d, memory=self.mem, model=OfflineModel())
        for i, t in enumerate(["I'm Maya, a senior SRE on the platform team.", "Yes, that's right.",
                               "Can you draft the postmortem for incident-204? Steps: 1. pull the timeline "
                               "2. summarise impact", "It shipped, save this as a procedure.",
                               "The production database for Tendril is Postgres 16."]):
            self.soul.turn(t, user="Maya", at=T0 + 60 * i)

    def snapshot(self) -> tuple[bytes, int, list[dict[str, Any]], bytes]:
        return (self.mem.export(), self.soul.last_seq, [t.to_dict() for t in self.soul.traces(1000)],
                self.soul.state.buffer.to_bytes())

    def close(self) -> None:
        self.soul.close()
        self.mem.close()


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    w = World(Path(tempfile.mkdtemp(prefix="bad-input-")))
    yield w
    w.close()


def rejects(world: World, kind: str, call: Callable[[], object], *, expect: type[SoulError] = SoulError) -> SoulError:
    """``call`` raises ``expect`` (a SoulError) with a message, and the soul is exactly as before."""
    TRIED[kind] += 1
    before = world.snapshot()
    with pytest.raises(SoulError) as info:
        call()
    assert isinstance(info.value, expect), (type(info.value), info.value)
    assert str(info.value).strip(), "an error needs a message"
    assert world.snapshot() == before, f"{kind}: a rejected call changed the soul"
    return info.value


def rejected(kind: str, call: Callable[[], object], expect: type[SoulError] = SoulError) -> None:
    """Like :func:`rejects`, for pure functions (no soul to compare)."""
    TRIED[kind] += 1
    with pytest.raises(SoulError) as info:
        call()
    assert isinstance(info.value, expect) and str(info.value).strip(), (type(info.value), info.value)


# ---- strategies -------------------------------------------------------------------------
def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


invalid_bytes = st.binary(min_size=1, max_size=64).filter(_invalid_utf8)
with_surrogate = st.builds(lambda a, s, b: a + s + b, st.text(max_size=20), st.sampled_from(["\ud800", "\udfff", "\udc80"]),
                           st.text(max_size=20))
with_control = st.builds(lambda a, c, b: a + c + b, st.text(max_size=20),
                         st.sampled_from([chr(c) for c in range(32) if chr(c) not in "\t\n\r"] + ["\x7f"]),
                         st.text(max_size=20))
blank = st.text(alphabet=" \t\n\r\u00a0\u2003", max_size=10)
too_long = st.builds(lambda n, c: c * n, st.integers(TEXT_MAX + 1, TEXT_MAX + 100_000), st.sampled_from(["a", "é", "😀", "ab "]))
over_budget = st.builds(lambda n: "word " * n, st.integers(6_500, 19_000))  # < max_text_chars, > context budget
not_text = st.one_of(st.none(), st.integers(), st.floats(), st.lists(st.text(max_size=3), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
bad_text = st.one_of(invalid_bytes, with_surrogate, with_control, blank, too_long, over_budget, not_text)
bad_time = st.one_of(st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, -1.5, 32503680001, True, False,
                                      "not a date", "", "2026-13-45", "yesterday", "2026-02-30T10:00"]),
                     st.floats(max_value=-1e-9), st.floats(min_value=32503680001, allow_infinity=False),
                     st.integers(max_value=-1), st.text(alphabet="abcxyz!? ", max_size=12), st.lists(st.integers()),
                     st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
bad_k = st.one_of(st.integers(max_value=0), st.integers(min_value=1001), st.floats(), st.booleans(), st.none(),
                  st.text(max_size=3))
bad_store = st.one_of(st.text(max_size=12).filter(lambda s: s not in ("episodic", "semantic", "procedural")),
                      st.lists(st.sampled_from(["episodic", "EPISODIC", "facts", "", "semantic "]), min_size=1).filter(
                          lambda ss: any(s not in ("episodic", "semantic", "procedural") for s in ss)),
                      st.lists(st.one_of(st.none(), st.integers()), min_size=1))
bad_id = st.one_of(st.text(max_size=140).filter(lambda s: not s or len(s) > 128 or not s[0].isascii()
                                                or not s[0].isalnum() or any(not (c.isascii() and (c.isalnum() or c in "_.:@-")) for c in s)),
                   st.integers(), st.none(), st.binary(max_size=4))
weird_ok = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=300).filter(lambda s: s.strip()),
    st.sampled_from(["😀🎉 deploy went fine 🚀", "שלום, המסד הוא Postgres 16", "مرحبا، قاعدة البيانات هي Postgres",
                     "Zalgo t̷̢̛e̵x̸t", "日本語のテキストです。", "tab\tand\nnewline\r\nok", "\u202eRTL override\u202c",
                     "x" * 20_000, "\ufeffBOM first", "a\u0300\u0301 combining", "ＦＵＬＬＷＩＤＴＨ"]))


# ---- turn text, user, time ------------------------------------------------------------------
@SETTINGS
@given(text=bad_text)
def test_bad_turn_text_is_rejected_and_changes_nothing(world: World, text: Any) -> None:
    rejects(world, "turn text", lambda: world.soul.turn(text, user="Maya", at=T0 + 10_000), expect=InvalidInput)


@SETTINGS
@given(user=bad_id.filter(lambda u: u is not None))
def test_bad_user_is_rejected(world: World, user: Any) -> None:
    rejects(world, "turn user", lambda: world.soul.turn("hello there, how are you?", user=user), expect=InvalidInput)


@SETTINGS
@given(at=bad_time)
def test_bad_times_are_rejected_everywhere(world: World, at: Any) -> None:
    rejects(world, "turn time", lambda: world.soul.turn("The staging database is Postgres 16.", at=at),
            expect=InvalidInput)
    rejects(world, "observe time", lambda: world.soul.observe(
        [{"speaker": "Maya", "text": "The staging database is Postgres 16.", "id": "t1"}], at=at), expect=InvalidInput)
    rejects(world, "message time", lambda: world.soul.observe(
        [{"speaker": "Maya", "text": "The staging database is Postgres 16.", "id": "t1", "at": at}]),
        expect=InvalidInput)
    rejects(world, "recall time", lambda: world.mem.recall("postgres", 5, at=at), expect=InvalidInput)
    rejects(world, "sweep time", lambda: world.mem.sweep(at), expect=InvalidInput)
    rejects(world, "episodes since", lambda: world.mem.episodes(since=at), expect=InvalidInput)


# ---- observed messages ------------------------------------------------------------------------
good_msg = st.fixed_dictionaries({"speaker": st.sampled_from(["Maya", "Ben"]),
                                  "text": st.sampled_from(["The staging database is Postgres 16.", "Sounds good."]),
                                  "id": st.from_regex(r"\Am[0-9]{1,4}\Z")})


@st.composite
def bad_messages(draw: st.DrawFn) -> Any:
    msgs: list[Any] = draw(st.lists(good_msg, min_size=1, max_size=4))
    i = draw(st.integers(0, len(msgs) - 1))
    how = draw(st.sampled_from(["missing", "dup", "nondict", "text", "speaker", "id", "at", "container"]))
    if how == "missing":
        del msgs[i][draw(st.sampled_from(["speaker", "text", "id"]))]
    elif how == "dup":
        msgs.append(dict(msgs[i]))
    elif how == "nondict":
        msgs[i] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2)))
    elif how == "text":
        msgs[i]["text"] = draw(bad_text.filter(lambda t: not isinstance(t, str) or len(t) > TEXT_MAX or not t.strip()
                                               or t != t.encode("utf-8", "replace").decode("utf-8")
                                               or any(ord(c) < 32 and c not in "\t\n\r" or c == "\x7f" for c in t)))
    elif how == "speaker":
        msgs[i]["speaker"] = draw(st.one_of(not_text, with_control, blank, st.just("x" * 201)))
    elif how == "id":
        msgs[i]["id"] = draw(bad_id)
    elif how == "at":
        msgs[i]["at"] = draw(bad_time)
    else:
        return draw(st.one_of(st.text(max_size=5), st.binary(max_size=5), st.integers(), st.none(),
                              st.just({"speaker": "Maya", "text": "hi there", "id": "m1"})))
    return msgs


@SETTINGS
@given(messages=bad_messages())
def test_bad_observed_messages_are_rejected(world: World, messages: Any) -> None:
    rejects(world, "observe messages", lambda: world.soul.observe(messages, at=T0 + 20_000), expect=InvalidInput)


# ---- recall arguments, stores, ids --------------------------------------------------------------
@SETTINGS
@given(k=bad_k, stores=bad_store, query=st.one_of(with_surrogate, st.integers(), st.none(), st.lists(st.text())))
def test_bad_recall_arguments_are_rejected(world: World, k: Any, stores: Any, query: Any) -> None:
    rejects(world, "recall k", lambda: world.mem.recall("postgres", k, at=T0), expect=InvalidInput)
    rejects(world, "recall stores", lambda: world.mem.recall("postgres", 5, at=T0, stores=stores),
            expect=InvalidInput)
    rejects(world, "forget stores", lambda: world.mem.forget(stores=stores), expect=InvalidInput)
    rejects(world, "recall query", lambda: world.mem.recall(query, 5, at=T0), expect=InvalidInput)


@SETTINGS
@given(turn_id=st.one_of(st.text(max_size=40), st.none(), st.integers(-2**63, 2**63 - 1), st.binary(max_size=8)),
       last=st.one_of(st.integers(max_value=0), st.floats(), st.text(max_size=3), st.none()))
def test_unknown_turn_ids_are_not_found(world: World, turn_id: Any, last: Any) -> None:
    if turn_id in {t.turn_id for t in world.soul.traces(1000)}:
        return
    rejects(world, "trace id", lambda: world.soul.trace(turn_id), expect=NotFound)
    rejects(world, "traces last", lambda: world.soul.traces(last), expect=InvalidInput)


def test_named_unknown_ids(world: World) -> None:
    rejects(world, "trace id", lambda: world.soul.trace("x/99"), expect=NotFound)
    rejects(world, "trace id", lambda: world.soul.trace("bad-input/99"), expect=NotFound)
    rejects(world, "fact id", lambda: world.mem.fact_history("nobody", "nothing"), expect=NotFound)
    rejects(world, "soul id", lambda: Soul("../escape", world.mem.dir, memory=world.mem, model=OfflineModel()),
            expect=InvalidInput)


# ---- vectors ----------------------------------------------------------------------------------------
@SETTINGS
@given(data=st.data())
def test_check_vectors_rejects_nan_inf_and_wrong_shapes(data: st.DataObject) -> None:
    dim = data.draw(st.integers(1, 16))
    n = data.draw(st.integers(1, 5))
    arr = np.array(data.draw(st.lists(st.floats(-1e6, 1e6), min_size=n * dim, max_size=n * dim)),
                   dtype=np.float64).reshape(n, dim)
    how = data.draw(st.sampled_from(["nan", "inf", "huge", "dim", "1d", "3d", "str", "obj", "ragged", "bool", "complex"]))
    r, c = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, dim - 1))
    good = arr.copy()
    bad: Any
    if how in ("nan", "inf", "huge"):
        arr[r, c] = {"nan": math.nan, "inf": data.draw(st.sampled_from([math.inf, -math.inf])), "huge": 1e300}[how]
        bad = arr if data.draw(st.booleans()) else arr.tolist()
    elif how == "dim":
        bad = np.zeros((n, dim + data.draw(st.integers(1, 3))))
    elif how == "1d":
        bad = arr.ravel()
    elif how == "3d":
        bad = arr.reshape(1, n, dim)
    elif how == "str":
        bad = [["x"] * dim] * n
    elif how == "obj":
        bad = [[None] * dim] * n
    elif how == "ragged":
        bad = [[0.0] * dim, [0.0] * (dim + 1)]
    elif how == "bool":
        bad = arr > 0
    else:
        bad = arr.astype(np.complex64)
    rejected("vectors", lambda: check_vectors(bad, dim), InvalidInput)
    out = check_vectors(good, dim)  # the same array, before it was spoiled, is fine
    assert out.dtype == np.float32 and out.shape == (n, dim)
    assert np.all(np.isfinite(out)) and np.allclose(np.linalg.norm(out[np.any(out != 0, axis=1)], axis=1), 1, atol=1e-5)


# ---- exports, import, buffer checkpoints ------------------------------------------------------------------
def packable_text(n: int) -> st.SearchStrategy[str]:
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=n)


msgpackable = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                                     packable_text(8), st.binary(max_size=8)),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(packable_text(8), inner, max_size=4)),
                           max_leaves=12)


@st.composite
def bad_exports(draw: st.DrawFn, valid: bytes) -> bytes:
    how = draw(st.sampled_from(["random", "truncated", "flipped", "msgpack", "tag", "section", "width"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    if how == "truncated":
        return valid[:draw(st.integers(0, len(valid) - 1))]
    if how == "flipped":
        b = bytearray(valid)
        i = draw(st.integers(0, min(40, len(b) - 1)))  # the header and the first keys
        b[i] ^= draw(st.integers(1, 255))
        return bytes(b)
    if how == "msgpack":
        return msgpack.packb(draw(msgpackable), use_bin_type=True)
    data = msgpack.unpackb(valid, raw=False, strict_map_key=False)
    layer = draw(st.sampled_from(["episodic", "semantic", "procedural"]))
    if how == "tag":
        data["format"] = draw(st.one_of(st.none(), packable_text(20), st.integers(-2**63, 2**63 - 1)))
    elif how == "section":
        data[layer] = draw(st.one_of(st.none(), st.lists(st.integers(-2**63, 2**63 - 1), max_size=2), packable_text(4)))
    else:
        table = draw(st.sampled_from(sorted(k for k, v in data[layer].items() if isinstance(v, list) and v)))
        row = data[layer][table][0]
        data[layer][table][0] = row + [None] if draw(st.booleans()) else row[:-1]
    return msgpack.packb(data, use_bin_type=True)


@pytest.fixture(scope="module")
def valid_export(world: World) -> bytes:
    return world.mem.export()


@pytest.fixture(scope="module")
def empty_world() -> Iterator[World]:
    d = Path(tempfile.mkdtemp(prefix="bad-import-"))
    w = World.__new__(World)
    w.mem = SoulMemory(d, embedder=HashEmbedder())
    w.soul = Soul("empty", d, memory=w.mem, model=OfflineModel())
    yield w
    w.close()


@SETTINGS
@given(data=st.data())
def test_bad_exports_are_rejected_and_import_changes_nothing(world: World, empty_world: World, valid_export: bytes,
                                                            data: st.DataObject) -> None:
    blob = data.draw(bad_exports(valid_export))
    if blob == valid_export:
        return
    TRIED["export bytes"] += 1
    with pytest.raises(InvalidInput):
        unpack_export(blob)
    rejects(empty_world, "import (empty soul)", lambda: empty_world.mem.import_(blob), expect=InvalidInput)
    rejects(world, "import (soul with memory)", lambda: world.mem.import_(blob), expect=InvalidInput)


def test_import_of_a_valid_export_needs_an_empty_soul(world: World, valid_export: bytes) -> None:
    rejects(world, "import (soul with memory)", lambda: world.mem.import_(valid_export), expect=InvalidInput)
    blobs: list[Any] = [None, "text", 5, [valid_export]]
    for blob in blobs:
        rejects(world, "import (not bytes)", lambda: world.mem.import_(blob), expect=InvalidInput)  # noqa: B023


@SETTINGS
@given(blob=st.one_of(st.binary(max_size=100), st.builds(lambda v: msgpack.packb(v, use_bin_type=True), msgpackable),
                      st.builds(lambda s, m, t: msgpack.packb({"session": s, "max_tokens": m, "turns": t}),
                                packable_text(5), st.one_of(packable_text(3), st.none(), st.lists(st.integers(-2**63, 2**63 - 1))),
                                st.lists(st.lists(packable_text(3), max_size=4), max_size=2))))
def test_bad_buffer_checkpoints_are_rejected(blob: bytes) -> None:
    TRIED["buffer checkpoint"] += 1
    try:
        buf = ShortTermBuffer.from_bytes(blob)
    except InvalidInput as e:
        assert str(e)
        return
    # accepted: then it must be a well-formed buffer
    assert isinstance(buf.session, str) and isinstance(buf.max_tokens, int)
    assert all(isinstance(t.text, str) and isinstance(t.at, (int, float)) for t in buf.turns)
    buf.tokens()


# ---- configuration ------------------------------------------------------------------------------------
_BAD_NUMBERS = st.one_of(st.sampled_from([float("nan"), float("inf"), float("-inf"), -1, -0.5, True, None, "1", [1]]),
                         st.floats(max_value=-1e-9), st.integers(max_value=-1))


@SETTINGS
@given(data=st.data())
def test_invalid_configuration_values_raise_config_error(data: st.DataObject) -> None:
    from actors.settings import RuntimeConfig

    mfield = data.draw(st.sampled_from(list(MemoryConfig.__dataclass_fields__)))
    rejected("MemoryConfig", lambda: MemoryConfig(**{mfield: data.draw(_BAD_NUMBERS)}), ConfigError)
    tfield = data.draw(st.sampled_from(list(TurnConfig.__dataclass_fields__)))
    tbad = data.draw(st.one_of(_BAD_NUMBERS, st.floats(0.1, 100).filter(lambda f: not f.is_integer())))
    rejected("TurnConfig", lambda: TurnConfig(**{tfield: tbad}), ConfigError)
    sbad = data.draw(st.sampled_from([{"memory": 1}, {"turn": "x"}, {"persona": 5}, {"memory": MemoryConfig(),
                                                                                     "turn": {}}]))
    rejected("SoulConfig", lambda: SoulConfig(**sbad), ConfigError)
    dbad = data.draw(st.sampled_from([{"memory": {"bogus": 1}}, {"turn": {"recall_k": 0}}, {"memory": None},
                                      {"memory": {"half_life_days": "x"}}, {"turn": {"context_tokens": 10}}]))
    rejected("SoulConfig.from_dict", lambda: SoulConfig.from_dict(dbad), ConfigError)
    rfield = data.draw(st.sampled_from(["hosts", "episodic_shards", "semantic_shards", "procedural_shards",
                                        "host_capacity", "store_capacity", "host_threads", "max_dedicated"]))
    zero_is_auto = rfield in ("hosts", "episodic_shards", "semantic_shards", "procedural_shards", "host_capacity",
                              "store_capacity")
    rbad = data.draw(st.one_of(_BAD_NUMBERS, st.just(-1 if zero_is_auto else 0), st.integers(min_value=10_001),
                               st.floats(1, 5)))
    rejected("RuntimeConfig", lambda: RuntimeConfig(data_dir="/tmp/x", **{rfield: rbad}), ConfigError)
    other: dict[str, Any] = data.draw(st.sampled_from([{"data_dir": ""}, {"data_dir": None}, {"model": "not a name"}, {"model": None},
                                       {"model": "pkg.mod:"}, {"embedder": "a:b:c"}, {"model_args": {"n": 1}},
                                       {"embedder_args": ["x"]}, {"idle_passivate_s": 0}, {"idle_passivate_s": -1}, {"idle_passivate_s": "x"}]))
    rejected("RuntimeConfig", lambda: RuntimeConfig(**{"data_dir": "/tmp/x", **other}), ConfigError)
    import soul_runtime  # refused before Ray is reached (this unit test may not start Ray)
    abad = data.draw(st.one_of(_BAD_NUMBERS, st.just(0), st.integers(min_value=11), st.floats(1, 5)))
    rejected("connect(connect_attempts)", lambda: soul_runtime.connect("ray://127.0.0.1:1", connect_attempts=abad),
             ConfigError)


# ---- valid weird input is accepted --------------------------------------------------------------------
@pytest.fixture(scope="module")
def accepting() -> Iterator[World]:
    d = Path(tempfile.mkdtemp(prefix="weird-ok-"))
    w = World.__new__(World)
    w.mem = SoulMemory(d, embedder=HashEmbedder())
    w.soul = Soul("weird", d, memory=w.mem, model=OfflineModel())
    yield w
    w.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(text=weird_ok, at=st.one_of(st.floats(0, 32503680000), st.datetimes(datetime(1971, 1, 1), datetime(2999, 1, 1),
                                                                              timezones=st.just(timezone.utc)),
                                   st.sampled_from(["2026-03-02T09:00:00Z", "2026-03-02 09:00", "2026-03-02"])))
def test_valid_weird_input_is_accepted(accepting: World, text: str, at: Any) -> None:
    TRIED["valid weird input"] += 1
    seq = accepting.soul.last_seq
    r = accepting.soul.turn(text, user="Maya", at=at)
    assert r.seq == seq + 1 and accepting.soul.trace(r.turn_id).query == text
    accepting.soul.observe([{"speaker": "Ben", "text": text, "id": f"w{r.seq}"}], at=at)
    assert accepting.soul.last_seq == seq + 2
    accepting.mem.recall(text, 5, at=at)


# ---- known bugs (strict xfail: each is a one-line repro; see the report) -----------------------------------------------
def _bug_import_types(world: World, valid: bytes) -> None:
    data = msgpack.unpackb(valid, raw=False, strict_map_key=False)
    data["semantic"]["facts"][0][0] = None  # a cell of the wrong type in a well-shaped export
    d = Path(tempfile.mkdtemp())
    mem = SoulMemory(d, embedder=HashEmbedder())
    before = mem.export()
    try:
        with pytest.raises(InvalidInput):
            mem.import_(msgpack.packb(data, use_bin_type=True))
        assert mem.export() == before  # and the episodic layer must not have been imported half-way
    finally:
        mem.close()


def _bug_config(factory: Callable[[], object]) -> None:
    with pytest.raises(ConfigError):
        factory()


def _runtime_config(**kw: Any) -> Any:
    from actors.settings import RuntimeConfig
    return RuntimeConfig(data_dir="/tmp/x", **kw)


def _runtime_from_dict(d: Any) -> Any:
    from actors.settings import RuntimeConfig
    return RuntimeConfig.from_dict(d)


REGRESSIONS: dict[str, Callable[[World, bytes], object]] = {
    "import: wrong cell types -> sqlite3 error and half-imported soul": _bug_import_types,
    "trace(dict) -> sqlite3.ProgrammingError": lambda w, v: rejects(w, "bug", lambda: w.soul.trace({}), expect=NotFound),
    "trace(2**63) -> OverflowError": lambda w, v: rejects(w, "bug", lambda: w.soul.trace(2**63), expect=NotFound),
    "traces(10**20) -> OverflowError": lambda w, v: rejects(w, "bug", lambda: w.soul.traces(10**20)),
    "facts(5) -> TypeError": lambda w, v: rejects(w, "bug", lambda: w.mem.facts(5)),
    "fact_history(1, 2) -> TypeError": lambda w, v: rejects(w, "bug", lambda: w.mem.fact_history(1, 2)),
    "procedures([1]) -> sqlite3.ProgrammingError": lambda w, v: rejects(w, "bug", lambda: w.mem.procedures([1])),
    "recall(stores=123) -> TypeError": lambda w, v: rejects(w, "bug", lambda: w.mem.recall("x", at=T0, stores=123)),
    "episodes(sessions_ago='x') -> TypeError": lambda w, v: rejects(w, "bug", lambda: w.mem.episodes(sessions_ago="x")),
    "episodes(sessions_ago=10**30) -> OverflowError": lambda w, v: rejects(w, "bug", lambda: w.mem.episodes(sessions_ago=10**30)),
    "to_timestamp(10**400) -> OverflowError": lambda w, v: rejects(w, "bug", lambda: w.soul.turn("hello there", at=10**400)),
    "turn(seq='5') -> OutOfOrder 'turn 5 arrived, expected 5'": lambda w, v: rejects(
        w, "bug", lambda: w.soul.turn("hello there", seq="5"), expect=InvalidInput),
    "turn(request_id={}) -> sqlite3 error": lambda w, v: rejects(
        w, "bug", lambda: w.soul.turn("hello there", request_id={})),
    "ShortTermBuffer.from_bytes accepts turns of ints": lambda w, v: rejected(
        "bug", lambda: ShortTermBuffer.from_bytes(msgpack.packb({"session": "s", "max_tokens": 1,
                                                                  "turns": [[1, 2, 3, 4, 5]]}))),
    "SoulConfig.from_dict('x') -> AttributeError": lambda w, v: _bug_config(lambda: SoulConfig.from_dict("x")),
    "SoulConfig(persona='\\ud800') accepted": lambda w, v: _bug_config(lambda: SoulConfig(persona="\ud800")),
    "MemoryConfig(max_episode_chars=1.5e3) accepted (float slice index)": lambda w, v: _bug_config(
        lambda: MemoryConfig(max_episode_chars=1500.0)),
    "RuntimeConfig(idle_passivate_s=nan) accepted": lambda w, v: _bug_config(
        lambda: _runtime_config(idle_passivate_s=float("nan"))),
    "RuntimeConfig(namespace=5) accepted": lambda w, v: _bug_config(lambda: _runtime_config(namespace=5)),
    "RuntimeConfig(soul='x') accepted": lambda w, v: _bug_config(lambda: _runtime_config(soul="x")),
    "RuntimeConfig.from_dict(unknown key) -> TypeError": lambda w, v: _bug_config(
        lambda: _runtime_from_dict({"data_dir": "/tmp/x", "bogus": 1})),
    "RuntimeConfig.from_dict({'soul': 'x'}) -> AttributeError": lambda w, v: _bug_config(
        lambda: _runtime_from_dict({"data_dir": "/tmp/x", "soul": "x"})),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regression(world: World, valid_export: bytes, name: str) -> None:
    REGRESSIONS[name](world, valid_export)


@pytest.mark.parametrize("n", [2**63, 2**64, -(2**63) - 1, 10**30, -1])
def test_handle_integers_and_times_past_their_bounds_are_invalid_input(n: int) -> None:
    """The checks every transport's handles make before anything is sent (soul_runtime/soul_args.py, on the
    limits of soul_runtime/limits.py): an integer or a time past its bounds is InvalidInput, never a store's
    error for a number it cannot bind."""
    from soul_runtime import limits, soul_args
    calls: list[Callable[[], object]] = [
        lambda: soul_args.episodes(None, None, None, n), lambda: soul_args.recall("q", n, None, None),
        lambda: soul_args.traces(n), lambda: soul_args.episodes(n, None, None, None),
        lambda: soul_args.episodes(None, n, None, None), lambda: soul_args.recall("q", 10, n, None),
        lambda: soul_args.turn("text", None, n, True), lambda: soul_args.observe([], n, None)]
    for call in calls:
        TRIED["handle integer past its bounds"] += 1
        with pytest.raises(InvalidInput):
            call()
    with pytest.raises(InvalidInput):
        soul_args.episodes(None, None, None, limits.SESSIONS_AGO_MAX + 1)
    with pytest.raises(InvalidInput):
        soul_args.traces(limits.LAST_MAX + 1)
    assert soul_args.episodes(limits.TIME_MIN, limits.TIME_MAX, None, limits.SESSIONS_AGO_MAX)["sessions_ago"] \
        == limits.SESSIONS_AGO_MAX
    assert soul_args.recall("q", limits.K_MAX, None, None)[1] == limits.K_MAX
    assert soul_args.traces(limits.LAST_MAX) == limits.LAST_MAX


# ---- the same promise through the Ray runtime ------------------------------------------------------------------
@pytest.mark.ray
def test_ray_bad_text_and_bad_import_change_nothing(runtime: Any, soul_id: str) -> None:
    s = runtime.soul(soul_id)
    s.turn("I'm Maya, a senior SRE on the platform team.", user="Maya", at=T0)
    s.turn("Yes, that's right.", user="Maya", at=T0 + 60)

    def snap() -> tuple[bytes, list[Any]]:
        return s.export(), [t.to_dict() for t in s.traces(last=100)]

    before = snap()
    for bad in ["", "   ", "a\x00b", "\ud800", b"\xff\xfe", 42, "x" * 100_001]:
        TRIED["ray turn text"] += 1
        with pytest.raises(InvalidInput):
            s.turn(bad, user="Maya", at=T0 + 120)
    for at in [float("nan"), -1, "not a date"]:
        TRIED["ray turn time"] += 1
        with pytest.raises(InvalidInput):
            s.turn("The staging database is Postgres 16.", at=at)
    valid = s.export()
    for blob in [b"", b"\xc1garbage", valid[: len(valid) // 2], msgpack.packb({"format": "nope"}), valid]:
        TRIED["ray import"] += 1
        with pytest.raises(InvalidInput):
            s.import_(blob)  # the last one: a valid export, but the soul is not empty
    with pytest.raises(InvalidInput):
        s.observe([{"speaker": "Maya", "text": "hi there", "id": "m1"}, {"speaker": "Ben", "text": "yo", "id": "m1"}])
    with pytest.raises(NotFound):
        s.trace("x/99")
    assert snap() == before


@pytest.mark.ray
def test_ray_weird_but_valid_text_is_accepted(runtime: Any, soul_id: str) -> None:
    s = runtime.soul(soul_id)
    for text in ["😀🎉 deploy went fine 🚀", "שלום, המסד הוא Postgres 16", "日本語のテキストです。"]:
        TRIED["ray valid weird input"] += 1
        r = s.turn(text, user="Maya", at=T0)
        assert s.trace(r.turn_id).query == text


@pytest.fixture(scope="module", autouse=True)
def _inputs_tried(request: pytest.FixtureRequest) -> Iterator[None]:
    """After this module's tests, whatever their order: how many inputs were tried (printed with -s); when the
    whole module ran, more than 500."""
    yield
    total = sum(TRIED.values())
    print(f"\n[bad input] {total} inputs tried: " + ", ".join(f"{k}={v}" for k, v in sorted(TRIED.items())))
    ran = {item.name.split("[")[0] for item in request.session.items if item.module is request.module}
    whole = {name for name in dir(request.module) if name.startswith("test_")}
    if ran >= whole:
        assert total > 500
