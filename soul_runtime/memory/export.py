"""A soul's export: every layer's tables in one msgpack blob, and the one way to read it and import it.

Light (msgpack only): a client packs an export from the shards' sections without the memory engine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import msgpack

from soul_runtime.errors import InvalidInput
from soul_runtime.records import LAYERS, Store

EXPORT_FORMAT = "soul-runtime/memory@1"


class Importable(Protocol):
    def is_empty(self) -> bool: ...

    def import_layers(self, data: dict[str, Any]) -> None: ...


def pack_export(sections: Mapping[Store, dict[str, Any]]) -> bytes:
    """A soul's export: each layer's tables, msgpack, under the format tag (read back by :func:`unpack_export`)."""
    return bytes(msgpack.packb({"format": EXPORT_FORMAT, **{s.value: sections[s] for s in LAYERS}},
                               use_bin_type=True))


def import_export(memory: Importable, blob: bytes, soul_id: str) -> None:
    """Import an export into a soul's memory (in process or on the store shards): the export is checked whole
    and the soul must have no memories, before any layer is written; so a refused import changes nothing."""
    data = unpack_export(blob)
    if not memory.is_empty():
        raise InvalidInput(f"import needs an empty soul: {soul_id} already has memories")
    memory.import_layers(data)


def unpack_export(blob: bytes) -> dict[str, Any]:
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except Exception as e:
        raise InvalidInput(f"not a soul-runtime export: {e.__class__.__name__}") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise InvalidInput("not a soul-runtime export (missing or unknown format tag)")
    for layer, tables in _SHAPES.items():
        section = data.get(layer)
        if not isinstance(section, dict):
            raise InvalidInput(f"export is missing its {layer} section")
        for table, kinds in tables.items():
            rows = section.get(table)
            if not isinstance(rows, list) or not all(_row_ok(r, kinds) for r in rows):
                raise InvalidInput(f"export's {layer}.{table} is malformed")
    return data


# column kinds of each exported table: i int, f number, s str, b bytes, m msgpack bytes
_SHAPES = {"episodic": {"episodes": "ifssmmmsiisbis", "sessions": "sif", "applied": "sm"},
           "semantic": {"facts": "sssssfmfsm", "observations": "sssssmf", "applied": "sm"},
           "procedural": {"procedures": "simsmfii", "runs": "issmsfms", "applied": "sm"}}


def _cell_ok(v: object, kind: str) -> bool:
    if kind == "i":
        return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
    if kind == "f":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 2**63
    if kind == "s":
        return isinstance(v, str)
    if kind == "b":
        return isinstance(v, bytes)
    if not isinstance(v, bytes):
        return False
    try:
        msgpack.unpackb(v, raw=False)
    except Exception:
        return False
    return True


def _row_ok(row: object, kinds: str) -> bool:
    return isinstance(row, list) and len(row) == len(kinds) and all(_cell_ok(v, k) for v, k in zip(row, kinds,
                                                                                                  strict=True))


__all__ = ["EXPORT_FORMAT", "Importable", "import_export", "pack_export", "unpack_export"]
